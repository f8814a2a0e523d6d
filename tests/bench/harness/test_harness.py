"""lm-eval adapter: the lenbench model class, the local tasks, the CLI wrapper, the hf cross-run.

Everything runs offline (isolated HF_HOME, HF_*_OFFLINE) on tiny models. Non-vacuous by
construction: a hand-built "oracle" model answers some passkeys right and some wrong, so harness
accuracy must equal the native teacher-forced verdicts at a value strictly between 0 and 1; NLL
checks compare against forward passes computed here, including a scaled (YaRN, factor auto) model
whose numbers differ from the raw one.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.data.tokenizer import ByteTokenizer
from bench.eval.metrics.passkey import passkey_verdicts
from bench.harness import (
    TASKS_DIR,
    LenbenchLM,
    harness_rows,
    parse_scaling,
    passkey_docs,
    passkey_process_results,
    perplexity_docs,
    run_harness,
    task_names,
)
from bench.harness.args import DEFAULT_MAX_BATCH_SIZE, MODEL_ARGS
from bench.harness.cli import _with_include_path
from bench.harness.tasks import training_template
from bench.tasks.passkey import passkey_grid
from models.positions import PositionConfig
from models.transformer import DecoderLM, LMOutput, ModelConfig, ScalingConfig

from fixtures import ROOT

TOK = ByteTokenizer()
QUESTION = "What is the pass key? The pass key is"


# --------------------------------------------------------------------------- fixtures and models


@pytest.fixture(autouse=True)
def offline(tmp_path_factory, monkeypatch):
    """No network, a throwaway HF_HOME, and no `pip list` subprocess in every simple_evaluate."""
    import datasets
    import lm_eval.evaluator

    hf_home = tmp_path_factory.getbasetemp() / "hf_home"
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(lm_eval.evaluator, "add_env_info", lambda results: None)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models on a busy 2-core machine: one thread avoids OpenMP wake-up stalls (~10x faster)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(kind: str = "rope", seed: int = 0, train_length: int = 64) -> DecoderLM:
    torch.manual_seed(seed)
    model = DecoderLM(
        ModelConfig(n_layers=1, d_model=32, n_heads=2), PositionConfig(kind=kind), train_length
    )
    with torch.no_grad():  # sharper attention, so that positions (and scaling) matter
        model.blocks[0].attn.q_proj.weight.mul_(8.0)
        model.blocks[0].attn.kv_proj.weight.mul_(8.0)
    return model.eval()


class PasskeyOracle(DecoderLM):
    """Reads the needle from its input and answers, except for keys divisible by 3 (last digit +1).

    After the question it emits " <answer>. Remember it.\\n" then EOS; anywhere else "x". The
    "KV cache" is simply the token history. Only the last ``TAIL`` positions get a prediction
    (enough for the answer span of teacher forcing and for generation).
    """

    TAIL = 8

    def __init__(self) -> None:
        super().__init__(
            ModelConfig(n_layers=1, d_model=8, n_heads=1), PositionConfig(kind="nope"), 64
        )

    @staticmethod
    def answer(key: int) -> str:
        text = f" {key}"
        return text if key % 3 else text[:-1] + str((int(text[-1]) + 1) % 10)

    @classmethod
    def next_token(cls, text: str) -> int:
        needle = re.search(r"The pass key is (\d+)\. Remember", text)
        asked = text.rfind(QUESTION)
        if needle is None or asked < 0:
            return ord("x")
        script = cls.answer(int(needle.group(1))) + ". Remember it.\n"
        produced = text[asked + len(QUESTION) :]
        if script.startswith(produced):
            return ord(script[len(produced)]) if len(produced) < len(script) else TOK.EOS
        return ord("x")

    def forward(
        self, input_ids, position_ids=None, attention_mask=None, past=None, use_cache=False, **_
    ):
        history = input_ids if past is None else torch.cat([past, input_ids], dim=1)
        n, length = input_ids.shape
        logits = torch.zeros(n, length, TOK.vocab_size)
        logits[..., ord("x")] = 1.0
        for row in range(n):
            ids = [t for t in history[row].tolist()]
            for j in range(max(0, length - self.TAIL), length):
                upto = history.shape[1] - length + j + 1
                text = bytes(t for t in ids[:upto] if t < 256).decode("latin-1")
                logits[row, j, self.next_token(text)] += 5.0
        return LMOutput(logits, history if use_cache else None)


def request(kind: str, *args, doc: dict | None = None):
    from lm_eval.api.instance import Instance

    return Instance(request_type=kind, doc=doc or {}, arguments=tuple(args), idx=0)


def direct_logprob(
    model, context_ids: list[int], continuation_ids: list[int]
) -> tuple[float, bool]:
    """log p(continuation | context) by one forward pass over context + continuation."""
    ids = torch.tensor([context_ids + continuation_ids])
    with torch.no_grad():
        logits = model(ids[:, :-1]).logits[0].double()
    logprobs = logits.log_softmax(-1)[len(context_ids) - 1 :]
    targets = torch.tensor(continuation_ids)
    return float(logprobs.gather(1, targets[:, None]).sum()), bool(
        (logprobs.argmax(-1) == targets).all()
    )


def native_bits_per_byte(model, texts: list[str], prefix: int = TOK.EOS) -> float:
    """Sum NLL of every byte (the first given the prefix token) / ln 2 / bytes, one forward per text."""
    total_nll, total_bytes = 0.0, 0
    for text in texts:
        ids = list(text.encode("utf-8"))
        inputs = torch.tensor([[prefix] + ids[:-1]])
        with torch.no_grad():
            logits = model(inputs).logits[0]
        total_nll += float(F.cross_entropy(logits.double(), torch.tensor(ids), reduction="sum"))
        total_bytes += len(ids)
    return total_nll / math.log(2) / total_bytes


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory) -> dict:
    """A lenbench `text` data config whose every file is in the test split."""
    root = tmp_path_factory.mktemp("corpus")
    line = "def área(x):\n    return x * 3  # café au lait\n"
    for i in range(4):
        (root / f"doc{i}.txt").write_text(f"# file {i}\n" + line * (30 + 5 * i), encoding="utf-8")
    (root / "short.txt").write_text("too short\n", encoding="utf-8")
    return {
        "name": "text",
        "paths": [str(root)],
        "split_fractions": {"train": 0.0, "validation": 0.0, "test": 1.0},
    }


def samples_by_doc(results: dict, task: str) -> list[dict]:
    return sorted(results["samples"][task], key=lambda s: s["doc_id"])


# --------------------------------------------------------------------------- registration and args


def test_registration_keeps_lm_eval_builtin_models():
    from lm_eval.api.registry import get_model

    assert get_model("lenbench") is LenbenchLM
    # registering first must not hide lm-eval's lazily registered models
    assert get_model("hf").__name__ == "HFLM"


def test_parse_scaling_string_friendly_arguments():
    assert parse_scaling(None) is None and parse_scaling("none") is None
    # a conf/scaling preset: the same meaning as lenbench's `scaling=yarn`
    yarn = parse_scaling("yarn", beta_fast="16")
    assert yarn.method == "yarn" and yarn.name == "yarn" and not yarn.logn
    assert yarn.params["factor"] == "auto" and yarn.params["beta_fast"] == 16.0
    assert parse_scaling("yarn", factor=4).params["factor"] == 4
    both = parse_scaling("linear", factor=4, logn="true")
    assert both.logn and both.name == "linear+logn" and both.params == {"factor": 4}
    assert parse_scaling("logn") == ScalingConfig(name="logn", method="default", logn=True)
    longrope = parse_scaling("longrope", short_factor="1:1.5", long_factor="ramp", factor=4)
    assert (
        longrope.params["short_factor"] == [1.0, 1.5] and longrope.params["long_factor"] == "ramp"
    )
    mapping = parse_scaling({"name": "y4", "method": "yarn", "params": {"factor": 4}})
    assert mapping == ScalingConfig(name="y4", method="yarn", params={"factor": 4})
    from omegaconf import OmegaConf  # a Hydra job hands over its cfg.scaling as a DictConfig

    hydra_cfg = OmegaConf.create(
        {"name": "lr", "method": "longrope", "params": {"short_factor": [1, 2]}}
    )
    assert parse_scaling(hydra_cfg).params == {"short_factor": [1, 2]}
    with pytest.raises(ValueError, match="unknown; allowed: .*yarn"):
        parse_scaling("yarnn", factor=4)
    with pytest.raises(ValueError, match=r"\['alpha'\] are unknown for scaling method 'yarn'"):
        parse_scaling("yarn", factor=4, alpha=2)
    with pytest.raises(ValueError, match="unknown for scaling none"):
        parse_scaling(None, factor=4)


def test_a_user_config_dir_preset_reaches_the_harness(tmp_path):
    """A preset in a user's config folder (as ``lenbench --config-dir`` reads it) is a harness
    scaling too, typed like lenbench's group; controls: without the folder the name is unknown,
    and a preset with a misspelt key is one sentence naming it."""
    from bench.harness.cli import HarnessArgError, check_arguments

    (tmp_path / "scaling").mkdir()
    (tmp_path / "scaling" / "yarn_logn.yaml").write_text(
        "name: yarn_logn\nmethod: yarn\nparams: {factor: 4, beta_fast: 16}\nlogn: true\n"
    )
    scaling = parse_scaling("yarn_logn", config_dir=str(tmp_path))
    assert scaling == ScalingConfig(
        name="yarn_logn", method="yarn", params={"factor": 4, "beta_fast": 16}, logn=True
    )
    with pytest.raises(ValueError, match="scaling 'yarn_logn' is unknown"):
        parse_scaling("yarn_logn")
    argv = ["run", "--model", "lenbench", "--model_args"]
    with pytest.raises(HarnessArgError, match="scaling='yarn_logn' is unknown"):
        check_arguments([*argv, "pretrained=x,scaling=yarn_logn"])
    with pytest.raises(HarnessArgError, match="checkpoint 'x' was not found"):  # preset found
        check_arguments([*argv, f"pretrained=x,scaling=yarn_logn,config_dir={tmp_path}"])
    (tmp_path / "scaling" / "typo.yaml").write_text("method: yarn\nparam: {factor: 4}\n")
    with pytest.raises(ValueError, match="scaling.param is an unknown key"):
        parse_scaling("yarn_logn", config_dir=str(tmp_path))
    with pytest.raises(ValueError, match="config_dir '/nonexistent' is not a folder"):
        parse_scaling("yarn", config_dir="/nonexistent")


def test_model_arguments_validate_early_and_unavailable_device_is_an_error():
    model = tiny_model()
    lm = LenbenchLM.create_from_arg_obj(
        {"pretrained": model, "scaling": "yarn", "factor": "auto"},
        {"batch_size": "auto", "device": None},
    )
    assert lm.batch_rows == DEFAULT_MAX_BATCH_SIZE and lm.max_length is None
    assert lm.get_model_info()["scaling"]["method"] == "yarn"
    with pytest.raises(ValueError, match="does not apply to position family 'alibi'"):
        LenbenchLM(pretrained=tiny_model("alibi"), scaling="yarn", factor=2)
    with pytest.raises(ValueError, match="prefix_token 'cls' is unknown"):
        LenbenchLM(pretrained=model, prefix_token="cls")
    with pytest.raises(ValueError, match="batch_size 'zero' is invalid"):
        LenbenchLM(pretrained=model, batch_size="zero")
    with pytest.raises(ValueError, match="precision 'fp8' is unknown"):
        LenbenchLM(pretrained=model, precision="fp8")
    with pytest.raises(ValueError, match="device 'gpu' is unknown"):
        LenbenchLM(pretrained=model, device="gpu")
    if (
        not torch.cuda.is_available()
    ):  # bench.core.runtime.resolve_device: no silent fallback to cpu
        with pytest.raises(ValueError, match="device 'cuda:0' is not available"):
            LenbenchLM(pretrained=model, device="cuda:0")
    # every LenbenchLM argument is named in the error for an unknown (non-scaling) model argument
    own = set(inspect.signature(LenbenchLM.__init__).parameters) - {"self", "scaling_params"}
    assert own == set(MODEL_ARGS)


# --------------------------------------------------------------------------- LM methods


def test_loglikelihood_equals_direct_forward_and_is_greedy():
    model = tiny_model()
    lm = LenbenchLM(pretrained=model, batch_size=2)
    context, continuation = "def área(x):\n    return", " x * 3"
    ctx_ids, cont_ids = list(context.encode()), list(continuation.encode())
    requests = [
        request("loglikelihood", context, continuation),
        request("loglikelihood", "", continuation),  # empty context: the EOS prefix token
        request("loglikelihood", context[:-3], continuation),  # another length, same call
        request("loglikelihood", context, ""),
    ]
    results = lm.loglikelihood(requests)
    expected = direct_logprob(model, ctx_ids, cont_ids)
    assert results[0][0] == pytest.approx(expected[0], rel=1e-5) and results[0][1] == expected[1]
    assert results[1][0] == pytest.approx(direct_logprob(model, [TOK.EOS], cont_ids)[0], rel=1e-5)
    assert results[2][0] == pytest.approx(
        direct_logprob(model, ctx_ids[:-3], cont_ids)[0], rel=1e-5
    )
    assert results[0][0] != pytest.approx(results[2][0])  # negative control: context matters
    assert results[3] == (0.0, True)

    # is_greedy against a model whose greedy continuation is known
    oracle = LenbenchLM(pretrained=PasskeyOracle())
    prompt = "The pass key is 4711. Remember it. 4711 is the pass key.\n" + QUESTION
    greedy = oracle.loglikelihood(
        [request("loglikelihood", prompt, " 4711"), request("loglikelihood", prompt, " 4712")]
    )
    assert greedy[0][1] and not greedy[1][1]
    assert greedy[0][0] > greedy[1][0]


def test_no_silent_truncation_beyond_max_length():
    lm = LenbenchLM(pretrained=tiny_model(), max_length=16)
    assert lm.loglikelihood([request("loglikelihood", "a" * 10, "b" * 7)])  # 16 input tokens: fits
    with pytest.raises(ValueError, match="17 tokens exceeds max_length 16"):
        lm.loglikelihood([request("loglikelihood", "a" * 10, "b" * 8)])
    with pytest.raises(ValueError, match="exceeds max_length 16"):
        lm.generate_until(
            [request("generate_until", "a" * 17, {"until": ["\n"], "max_gen_toks": 2})]
        )


def test_loglikelihood_rolling_one_pass_and_windows():
    model = tiny_model()
    text = "x = [i * i for i in range(10)]  # squares of the first ten\n"[:48]
    assert len(text.encode()) == 48
    ids = list(text.encode())
    whole = LenbenchLM(pretrained=model).loglikelihood_rolling(
        [request("loglikelihood_rolling", text)]
    )[0]
    assert -whole / math.log(2) / 48 == pytest.approx(native_bits_per_byte(model, [text]), rel=1e-5)
    bos = LenbenchLM(pretrained=model, prefix_token="bos").loglikelihood_rolling(
        [request("loglikelihood_rolling", text)]
    )
    assert bos[0] == pytest.approx(
        -native_bits_per_byte(model, [text], TOK.BOS) * math.log(2) * 48, rel=1e-5
    )

    # max_length 16: three disjoint windows, inputs s[16k : 16k+16] of s = [EOS] + ids
    seen = []
    hook = model.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    try:
        windowed = LenbenchLM(pretrained=model, max_length=16).loglikelihood_rolling(
            [request("loglikelihood_rolling", text)]
        )[0]
    finally:
        hook.remove()
    s = [TOK.EOS] + ids
    expected = sum(
        direct_logprob(model, s[16 * k : 16 * k + 1], s[16 * k + 1 : 16 * k + 17])[0]
        for k in range(3)
    )
    assert windowed == pytest.approx(expected, rel=1e-5)
    assert max(seen) == 16
    assert windowed != pytest.approx(whole, rel=1e-4)  # negative control: windows lose context


def test_generate_until_stops_and_cuts():
    oracle = PasskeyOracle()
    lm = LenbenchLM(pretrained=oracle, batch_size=4)
    prompt = "The pass key is 4711. Remember it. 4711 is the pass key.\n" + QUESTION
    wrong = "The pass key is 57. Remember it.\n" + QUESTION  # 57 % 3 == 0: the oracle says 58
    cases = [
        (prompt, {"until": ["."], "max_gen_toks": 30}, " 4711"),
        (prompt, {"until": ["\n"], "max_gen_toks": 30}, " 4711. Remember it."),
        (prompt, {"until": ["Rem", "."], "max_gen_toks": 30}, " 4711"),  # the earliest stop wins
        (prompt, {"until": [], "max_gen_toks": 3}, " 47"),
        (prompt, {"until": "zzz", "max_gen_toks": 50}, " 4711. Remember it.\n"),  # stops at EOS
        (wrong, {"until": ["."], "max_gen_toks": 30}, " 58"),
    ]
    out = lm.generate_until([request("generate_until", c, g) for c, g, _ in cases])
    assert out == [want for _, _, want in cases]
    with pytest.raises(ValueError, match="decodes greedily only"):
        lm.generate_until(
            [request("generate_until", prompt, {"do_sample": True, "temperature": 1.0})]
        )


def test_generate_until_equals_kv_cache_greedy_decoding():
    model = tiny_model(seed=3)
    lm = LenbenchLM(pretrained=model, batch_size=8)
    prompts = [
        "def f(x):\n    return",
        "class A:\n    pass\n",
        "import os\nimport",
        "import re\nimport",  # same length as the previous one: one batch of two rows
        "def g(y):\n    yield",
    ]
    out = lm.generate_until(
        [request("generate_until", p, {"until": [], "max_gen_toks": 12}) for p in prompts]
    )
    for p, text in zip(prompts, out, strict=True):
        with torch.no_grad():
            ids = model.generate_greedy(torch.tensor([list(p.encode())]), 12)[0].tolist()
        if TOK.EOS in ids:
            ids = ids[: ids.index(TOK.EOS)]
        assert text == TOK.decode(ids)


# --------------------------------------------------------------------------- run factor (issue 11, item 2)


def test_auto_factor_is_one_per_run_for_the_longest_request_unless_oracle():
    """A static ``factor: auto`` is set once, for the longest request (or ``eval_length``), and
    used for every request, as lenbench's own metrics do; ``oracle=true`` keeps one per length."""
    model = tiny_model(seed=1)  # trained length 64
    line = "x = [i * i for i in range(10)]  # squares\n"
    texts = [(line * 8)[:128], (line * 8)[:256]]
    requests = [request("loglikelihood_rolling", t) for t in texts]

    def expected(factors):
        out = []
        for text, factor in zip(texts, factors, strict=True):
            model.set_scaling(ScalingConfig(name="yarn", method="yarn", params={"factor": factor}))
            out.append(-native_bits_per_byte(model, [text]) * math.log(2) * len(text))
            model.set_scaling(None)
        return out

    run = LenbenchLM(pretrained=model, scaling="yarn").loglikelihood_rolling(requests)
    assert run == pytest.approx(expected([4.0, 4.0]), rel=1e-5)  # 256 / 64 for both texts
    oracle = LenbenchLM(pretrained=model, scaling="yarn", oracle="true")
    assert oracle.scaling.label == "yarn (oracle)"
    per_length = oracle.loglikelihood_rolling(requests)
    assert per_length == pytest.approx(expected([2.0, 4.0]), rel=1e-5)  # control: today's rule
    assert per_length[0] != pytest.approx(run[0], rel=1e-4)  # the two rules differ below 256
    told = LenbenchLM(pretrained=model, scaling="yarn", eval_length=512)
    assert told.loglikelihood_rolling(requests) == pytest.approx(expected([8.0, 8.0]), rel=1e-5)
    with pytest.raises(ValueError, match="eval_length=512 .* oracle=true"):
        LenbenchLM(pretrained=model, scaling="yarn", oracle=True, eval_length=512)


# --------------------------------------------------------------------------- task data


def test_passkey_docs_match_the_native_grid():
    docs = passkey_docs(length=300, depths=3, trials=2, seed=5, version=1.0, data={"ignored": True})
    examples = passkey_grid([300], [0.0, 0.5, 1.0], 2, 5)
    assert len(docs) == len(examples) == 6
    for doc, ex in zip(docs, examples, strict=True):
        assert (
            list(doc["prompt"].encode()) == ex.prompt_ids
            and list(doc["answer"].encode()) == ex.answer_ids
        )
        assert doc["key"] == ex.key and doc["depth"] == ex.depth and doc["eval_length"] == 300
    # A longer number is wrong for both metrics (the key must end); text after the key is fine.
    assert passkey_process_results(docs[0], [docs[0]["answer"] + "9"]) == {
        "acc": 0,
        "acc_parsed": 0,
    }
    assert passkey_process_results(docs[0], [docs[0]["answer"] + ". The"]) == {
        "acc": 1,
        "acc_parsed": 1,
    }
    assert passkey_process_results(docs[0], [docs[0]["answer"].strip()]) == {
        "acc": 0,
        "acc_parsed": 1,
    }
    with pytest.raises(ValueError, match="filler 'corpus' is not supported"):
        passkey_docs(length=300, filler="corpus")
    with pytest.raises(ValueError, match="passkey depths"):
        passkey_docs(length=300, depths=[1.5])


def test_perplexity_docs_tile_one_document_set_at_every_length(tmp_path):
    """The native protocol: every length reads the same documents and scores the same bytes (the
    first ``span`` of each, in windows of the length). Before, each length chose its own
    documents (19 at 256 tokens, 12 at 8192) and read one window of each."""
    (tmp_path / "a.txt").write_bytes(b"a" * 255 + "é".encode() + b"b" * 400)  # é across byte 256
    (tmp_path / "b.txt").write_bytes("ü".encode() * 300)
    (tmp_path / "c.txt").write_bytes(b"c" * 700)
    (tmp_path / "d.txt").write_bytes(b"short")
    (tmp_path / "e.txt").write_bytes(b"e" * 300)  # long enough for 256, not for the span
    data = {
        "name": "text",
        "paths": [str(tmp_path)],
        "split_fractions": {"train": 0, "validation": 0, "test": 1},
    }
    by_length = {n: perplexity_docs(length=n, data=data, span=512, version=1.0) for n in (256, 512)}
    for n, docs in by_length.items():
        assert {d["id"].split("#")[0] for d in docs} == {"b.txt", "c.txt"}, n
        assert all(len(d["text"].encode()) == n and d["eval_length"] == n for d in docs)
        assert len(docs) == 2 * 512 // n
    joined = {
        n: {doc_id: "".join(d["text"] for d in docs if d["id"].startswith(doc_id)) for doc_id in ("b.txt", "c.txt")}
        for n, docs in by_length.items()
    }  # fmt: skip
    assert joined[256] == joined[512]  # the same bytes at both lengths
    assert joined[512]["c.txt"] == "c" * 512
    with pytest.raises(ValueError, match="span 512 is not a multiple of the task length 300"):
        perplexity_docs(length=300, data=data, span=512)
    with pytest.raises(ValueError, match="no document with 5000 bytes"):
        perplexity_docs(length=1000, data=data, span=5000)


def test_passkey_docs_use_the_template_asked_for():
    short = passkey_docs(length=256, depths=2, trials=2, seed=1, template="short")
    examples = passkey_grid([256], [0.0, 1.0], 2, 1, template="short")
    assert [list(d["prompt"].encode()) for d in short] == [e.prompt_ids for e in examples]
    assert [list(d["answer"].encode()) for d in short] == [e.answer_ids for e in examples]
    assert {d["template"] for d in short} == {"short"}
    landmark = passkey_docs(length=256, depths=2, trials=2, seed=1)  # the default
    assert {d["template"] for d in landmark} == {"landmark"}
    assert landmark[0]["prompt"] != short[0]["prompt"]


def test_training_template_of_a_checkpoint_and_its_finetunes():
    meta = {"weights_config": {"train": {"passkey_template": "short"}}}
    assert training_template(meta) == "short"
    assert training_template({"weights_config": {"parent": meta["weights_config"]}}) == "short"
    assert training_template({"key": None}) is None


def test_harness_passkey_uses_the_checkpoints_training_template(tmp_path):
    """A checkpoint trained with the short template: run_harness and lenbench-harness give its
    passkey tasks short-template prompts (the native metric's), unless the metadata names one;
    the harness verdicts equal the native ones on the same examples."""
    from bench.core.sections import position_weights
    from bench.harness.cli import _with_training_template
    from bench.schema import PositionSchema
    from bench.train.checkpoints import key_of, save_checkpoint

    model = tiny_model(seed=3)
    position = dataclasses.asdict(model.position_cfg)
    config = {
        "model": dataclasses.asdict(model.model_cfg),
        "position": position_weights(PositionSchema.from_stored(position)),
        "train": {"length": model.train_length, "passkey_template": "short"},
    }
    key = key_of(config)
    save_checkpoint(model, key, config, tmp_path)
    results = run_harness(
        key, "lenbench_passkey_256", cache_root=tmp_path, limit=4, log_samples=True
    )
    samples = samples_by_doc(results, "lenbench_passkey_256")
    examples = passkey_grid([256], [round(d / 9, 6) for d in range(10)], 10, 0, template="short")[
        :4
    ]
    assert [s["arguments"][0][0] for s in samples] == [
        bytes(e.prompt_ids).decode() for e in examples
    ]
    native = passkey_verdicts(model, examples, batch_size=4)
    assert [bool(s["acc"]) for s in samples] == native
    # the metadata names a template: it wins
    named = run_harness(
        key, "lenbench_passkey_256", cache_root=tmp_path, limit=1, log_samples=True,
        metadata={"template": "landmark"},
    )  # fmt: skip
    assert samples_by_doc(named, "lenbench_passkey_256")[0]["doc"]["template"] == "landmark"
    # the CLI wrapper adds it to --metadata
    argv = ["--model", "lenbench", "--model_args", f"pretrained={key},cache_root={tmp_path}"]
    out = _with_training_template(argv)
    assert out[-2:] == ["--metadata", '{"template": "short"}']
    given = [*argv, "--metadata", '{"template": "landmark"}']
    assert _with_training_template(given) == given


def test_task_files_are_indexed():
    names = set(task_names())
    for length in (256, 512, 1024, 2048, 4096, 8192, 16384):
        assert {f"lenbench_passkey_{length}", f"lenbench_ppl_{length}"} <= names
    assert {"lenbench_passkey", "lenbench_ppl"} <= names
    assert not any(n.startswith("_") for n in names)  # the templates are not tasks


# --------------------------------------------------------------------------- end to end vs native


def test_harness_passkey_accuracy_equals_native_verdicts():
    oracle = PasskeyOracle()
    limit = 24
    results = run_harness(
        oracle, "lenbench_passkey_256", limit=limit, batch_size=8, log_samples=True
    )
    examples = passkey_grid([256], [round(d / 9, 6) for d in range(10)], 10, 0)[:limit]
    native = passkey_verdicts(oracle, examples, batch_size=8)
    samples = samples_by_doc(results, "lenbench_passkey_256")
    assert [s["doc"]["key"] for s in samples] == [e.key for e in examples]
    assert [s["arguments"][0][0] for s in samples] == [
        bytes(e.prompt_ids).decode() for e in examples
    ]
    assert [bool(s["acc"]) for s in samples] == native
    acc = results["results"]["lenbench_passkey_256"]["acc,none"]
    assert acc == pytest.approx(sum(native) / limit)
    assert 0.0 < acc < 1.0  # non-vacuous: the oracle fails keys divisible by 3
    rows = {r["metric"]: r for r in harness_rows(results)}
    assert rows["harness/lenbench_passkey_256/acc"] == {
        "metric": "harness/lenbench_passkey_256/acc",
        "value": acc,
        "n": limit,
        "eval_length": 256,
    }


def test_harness_bits_per_byte_equals_native_nll(text_corpus):
    model = tiny_model(seed=1)
    tasks = ["lenbench_ppl_256", "lenbench_ppl_512", "lenbench_passkey_256"]
    metadata = {"data": text_corpus, "span": 512}
    results = run_harness(model, tasks, limit=3, batch_size=2, metadata=metadata)
    for length in (256, 512):
        texts = [d["text"] for d in perplexity_docs(length=length, **metadata)][:3]
        assert len(texts) == 3 and all(len(t.encode()) == length for t in texts)
        got = results["results"][f"lenbench_ppl_{length}"]
        bpb = native_bits_per_byte(model, texts)
        assert got["bits_per_byte,none"] == pytest.approx(bpb, rel=1e-5)
        assert got["byte_perplexity,none"] == pytest.approx(2.0**bpb, rel=1e-5)
    examples = passkey_grid([256], [round(d / 9, 6) for d in range(10)], 10, 0)[:3]
    native = passkey_verdicts(model, examples, batch_size=2)
    assert results["results"]["lenbench_passkey_256"]["acc,none"] == pytest.approx(sum(native) / 3)

    # YaRN with factor auto: one factor for the run's longest request (512 / 64 = 8), as natively
    scaled = run_harness(
        model,
        "lenbench_ppl_512",
        scaling={"method": "yarn", "params": {"factor": "auto"}},
        limit=3,
        batch_size=2,
        metadata=metadata,
    )
    assert model.scaling == ScalingConfig()  # run_harness restores a model instance's scaling
    texts = [d["text"] for d in perplexity_docs(length=512, **metadata)][:3]
    model.set_scaling(ScalingConfig(name="yarn", method="yarn", params={"factor": "auto"}), 512)
    assert model.scaling.params["factor"] == 8.0
    scaled_native = native_bits_per_byte(model, texts)
    model.set_scaling(None)
    scaled_bpb = scaled["results"]["lenbench_ppl_512"]["bits_per_byte,none"]
    assert scaled_bpb == pytest.approx(scaled_native, rel=1e-5)
    assert scaled_bpb != pytest.approx(
        results["results"]["lenbench_ppl_512"]["bits_per_byte,none"], rel=1e-3
    )
    rows = {r["metric"]: r for r in harness_rows(scaled)}
    assert rows["harness/lenbench_ppl_512/bits_per_byte"]["eval_length"] == 512
    assert rows["harness/lenbench_ppl_512/bits_per_byte"]["n"] == 3


def test_harness_rows_groups_filters_and_stderr():
    results = {
        "results": {
            "lenbench_passkey": {
                "alias": "lenbench_passkey",
                "acc,none": 0.5,
                "acc_stderr,none": "N/A",
            },
            "lenbench_passkey_256": {"alias": " - 256", "acc,none": 0.25, "acc_stderr,none": 0.1},
            "lenbench_passkey_512": {"alias": " - 512", "acc,none": 0.75, "acc_stderr,none": "N/A"},
            "gsm8k": {"alias": "gsm8k", "exact_match,strict-match": 0.1, "sample_len": 7},
        },
        "group_subtasks": {"lenbench_passkey": ["lenbench_passkey_256", "lenbench_passkey_512"]},
        "n-samples": {
            "lenbench_passkey_256": {"original": 100, "effective": 4},
            "lenbench_passkey_512": {"original": 100, "effective": 4},
            "gsm8k": {"original": 1319, "effective": 7},
        },
        "configs": {"lenbench_passkey_512": {"metadata": {"length": 512}}},
    }
    rows = {r["metric"]: r for r in harness_rows(results)}
    assert set(rows) == {
        "harness/lenbench_passkey/acc",
        "harness/lenbench_passkey_256/acc",
        "harness/lenbench_passkey_512/acc",
        "harness/gsm8k/exact_match/strict-match",
    }
    assert (
        rows["harness/lenbench_passkey/acc"]["n"] == 8
        and rows["harness/lenbench_passkey/acc"]["eval_length"] is None
    )
    assert rows["harness/lenbench_passkey_256/acc"]["ci_lo"] == pytest.approx(0.25 - 0.196)
    assert (
        rows["harness/lenbench_passkey_512/acc"]["eval_length"] == 512
        and "ci_lo" not in rows["harness/lenbench_passkey_512/acc"]
    )
    assert rows["harness/gsm8k/exact_match/strict-match"] == {
        "metric": "harness/gsm8k/exact_match/strict-match",
        "value": 0.1,
        "n": 7,
        "eval_length": None,
    }


# --------------------------------------------------------------------------- CLI


def test_include_path_is_added_only_when_missing():
    ours = ["--include_path", str(TASKS_DIR)]
    assert _with_include_path(["--model", "lenbench"]) == ["--model", "lenbench", *ours]
    assert _with_include_path(["run", "--tasks", "x"]) == ["run", "--tasks", "x", *ours]
    assert _with_include_path(["ls", "tasks"]) == ["ls", "tasks", *ours]
    assert _with_include_path(["--include_path", "/mine", "--tasks", "x"]) == [
        "--include_path",
        "/mine",
        "--tasks",
        "x",
    ]
    assert _with_include_path(["--include_path=/mine"]) == ["--include_path=/mine"]
    assert _with_include_path([]) == [] and _with_include_path(["-h"]) == ["-h"]


def save_tiny_checkpoint(model: DecoderLM, cache_root: Path) -> str:
    """Store ``model`` in a checkpoint cache through bench.train.checkpoints; return its key."""
    from dataclasses import asdict

    from bench.core.sections import position_weights
    from bench.schema import PositionSchema
    from bench.train.checkpoints import key_of, save_checkpoint

    position = asdict(model.position_cfg)
    config = {
        "model": asdict(model.model_cfg),
        "position": position_weights(PositionSchema.from_stored(position)),
        "train": {"length": model.train_length},
        "note": "bench.harness test checkpoint",
    }
    key = key_of(config)
    save_checkpoint(model, key, config, cache_root)
    return key


def test_model_loads_checkpoint_by_key_or_path(tmp_path):
    model = tiny_model(seed=2)
    key = save_tiny_checkpoint(model, tmp_path / "ckpt")
    by_key = LenbenchLM.create_from_arg_string(
        f"pretrained={key},cache_root={tmp_path / 'ckpt'},scaling=linear,factor=2",
        {"batch_size": 1, "device": "cpu"},
    )
    by_path = LenbenchLM(pretrained=str(tmp_path / "ckpt" / key / "model.pt"))
    assert by_key.get_model_info()["lenbench_key"] == key == by_path.meta["key"]
    assert by_key.model.scaling.params == {"factor": 2}
    for loaded in (by_key.model, by_path.model):
        for name, tensor in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[name], tensor)
    with pytest.raises(ValueError, match=r"\['fcator'\] are unknown for scaling method 'linear'"):
        LenbenchLM.create_from_arg_string(
            f"pretrained={key},cache_root={tmp_path},fcator=2,scaling=linear"
        )
    with pytest.raises(ValueError, match="was not found"):
        LenbenchLM(pretrained=str(tmp_path / "missing"))


def test_cli_wrapper_runs_lenbench_model_offline(tmp_path, text_corpus):
    import json

    model = tiny_model(seed=2)
    key = save_tiny_checkpoint(model, tmp_path / "ckpt")
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    args = [
        "--model", "lenbench",
        "--model_args", f"pretrained={key},cache_root={tmp_path / 'ckpt'},scaling=linear,factor=2",
        "--tasks", "lenbench_passkey_256,lenbench_ppl_512",
        "--metadata", json.dumps({"data": text_corpus, "span": 512}),
        "--limit", "2", "--batch_size", "2", "--device", "cpu",
        "--output_path", str(tmp_path / "out"),
    ]  # fmt: skip
    code = "import sys; from bench.harness.cli import main; sys.exit(main())"  # = lenbench-harness
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert any(
        "lenbench_passkey_256" in line and "acc" in line for line in proc.stdout.splitlines()
    )
    (written,) = (tmp_path / "out").rglob("results*.json")
    results = json.loads(written.read_text())
    rows = {r["metric"]: r for r in harness_rows(results)}
    assert rows["harness/lenbench_passkey_256/acc"]["n"] == 2
    # the number crossed the whole CLI path intact: linear factor 2 applied, as computed here
    texts = [d["text"] for d in perplexity_docs(length=512, data=text_corpus, span=512)][:2]
    model.set_scaling(ScalingConfig(name="linear", method="linear", params={"factor": 2}))
    expected = native_bits_per_byte(model, texts)
    model.set_scaling(None)
    assert rows["harness/lenbench_ppl_512/bits_per_byte"]["value"] == pytest.approx(
        expected, rel=1e-5
    )
    raw = native_bits_per_byte(model, texts)  # negative control: the unscaled model differs
    assert abs(rows["harness/lenbench_ppl_512/bits_per_byte"]["value"] - raw) > 20 * 1e-5 * raw


# --------------------------------------------------------------------------- lm-eval's own hf model


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (the ByteLevel alphabet)."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return dict(zip(range(256), chars, strict=True))


def save_tiny_hf_model(directory: Path) -> None:
    """A randomly initialised 1-layer Llama with a byte-level (no merges) tokenizer, all local."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {char: b for b, char in bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<eos>"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<eos>", bos_token="<eos>", pad_token="<eos>"
    )
    fast.save_pretrained(directory)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=257,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=256,
        eos_token_id=256,
        pad_token_id=256,
    )
    LlamaForCausalLM(config).save_pretrained(directory)


def test_tasks_run_on_lm_eval_hf_model(tmp_path, text_corpus):
    pytest.importorskip("transformers")
    import lm_eval
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    save_tiny_hf_model(tmp_path / "tiny-llama")
    manager = TaskManager(
        include_path=str(TASKS_DIR),
        include_defaults=False,
        metadata={"data": text_corpus, "span": 512},
    )
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(tmp_path / "tiny-llama"), "dtype": "float32"},
        tasks=["lenbench_passkey_256", "lenbench_ppl_256"],
        limit=2,
        batch_size=2,
        device="cpu",
        bootstrap_iters=0,
        task_manager=manager,
        log_samples=True,
    )
    samples = samples_by_doc(results, "lenbench_passkey_256")
    examples = passkey_grid([256], [round(d / 9, 6) for d in range(10)], 10, 0)[:2]
    assert [s["arguments"][0][0] for s in samples] == [
        bytes(e.prompt_ids).decode() for e in examples
    ]
    assert results["results"]["lenbench_passkey_256"]["acc,none"] in (0.0, 0.5, 1.0)

    # bits per byte recomputed with the HF model itself: prefix token (its BOS) + the text's bytes
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tiny-llama")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny-llama", dtype=torch.float32).eval()
    texts = [d["text"] for d in perplexity_docs(length=256, data=text_corpus, span=512)][:2]
    nll, n_bytes = 0.0, 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text.encode())  # the tokenizer really is byte-level
        with torch.no_grad():
            logits = hf(torch.tensor([[256] + ids[:-1]])).logits[0]
        nll += float(F.cross_entropy(logits.double(), torch.tensor(ids), reduction="sum"))
        n_bytes += len(text.encode())
    got = results["results"]["lenbench_ppl_256"]["bits_per_byte,none"]
    assert got == pytest.approx(nll / math.log(2) / n_bytes, rel=1e-4)
    assert 6.0 < got < 10.0  # a random byte model: about log2(257) bits per byte


# --------------------------------------------------------------------------- CLI argument errors


@pytest.mark.parametrize(
    "model_args, tasks, message",
    [
        ("pretrained={key},cache_root={root},fcator=2,scaling=linear", "lenbench_ppl_256",
         "model argument(s) fcator are unknown"),
        ("pretrained={key},cache_root={root},scaling=bogus", "lenbench_ppl_256",
         "scaling='bogus' is unknown"),
        ("cache_root={root}", "lenbench_ppl_256", "model argument pretrained is missing"),
        ("pretrained={root}/notes", "lenbench_ppl_256", "is not a lenbench checkpoint"),
        ("pretrained={root}/missing", "lenbench_ppl_256", "was not found"),
        ("pretrained={key},cache_root={root}", "lenbench_ppl_123", "are not lenbench tasks"),
        ("pretrained={key},cache_root={root},factor", "lenbench_ppl_256", "has no value"),
    ],
)  # fmt: skip
def test_harness_cli_bad_arguments_are_one_sentence_before_any_model_loads(
    tmp_path, monkeypatch, capsys, model_args, tasks, message
):
    import bench.harness.cli as cli_module

    key = save_tiny_checkpoint(tiny_model(seed=2), tmp_path)
    (tmp_path / "notes").mkdir()
    monkeypatch.setattr(cli_module, "_with_training_template", _fail_if_called)
    argv = ["--model", "lenbench", "--model_args", model_args.format(key=key, root=tmp_path),
            "--tasks", tasks, "--device", "cpu"]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        cli_module.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lenbench-harness: error: ") and "\n" not in err and message in err, err


def _fail_if_called(*args, **kwargs):
    raise AssertionError("the arguments must be refused before anything else runs")


def test_harness_model_args_win_over_cli_device_and_batch_size(tmp_path):
    """lm-eval passes --device/--batch_size next to --model_args: the README's own
    ``device=cpu,batch_size=2`` in model_args gave "got multiple values" before."""
    key = save_tiny_checkpoint(tiny_model(seed=2), tmp_path)
    lm = LenbenchLM.create_from_arg_string(
        f"pretrained={key},cache_root={tmp_path},device=cpu,batch_size=2",
        {"batch_size": 8, "device": "cpu", "max_batch_size": None},
    )
    assert lm.batch_rows == 2


def test_harness_cli_bad_model_argument_value_is_one_sentence(tmp_path, capsys):
    """A value the model refuses when lm-eval builds it (batch_size=abc): one sentence, exit 2."""
    from bench.harness.cli import main as harness_main

    key = save_tiny_checkpoint(tiny_model(seed=2), tmp_path)
    argv = ["--model", "lenbench", "--model_args",
            f"pretrained={key},cache_root={tmp_path},batch_size=abc",
            "--tasks", "lenbench_passkey_256", "--limit", "1", "--device", "cpu"]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        harness_main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("lenbench-harness: error: ") and "batch_size" in err, err


def test_model_argument_numbers_are_read_as_the_methods_types(tmp_path):
    """lm-eval's CLI hands ``sink_tokens=-2`` over as -2.0: the number is read as the method's
    int, so the error names sink_tokens and its allowed values (it blamed ``window: got 'auto'``);
    controls: lm-eval really sends a float, an integral float works as the int, a fractional one
    is one sentence naming the parameter."""
    from lm_eval._cli.utils import key_val_to_dict

    sent = key_val_to_dict("scaling=streaming,sink_tokens=-2,eval_length=1e3")
    assert sent["sink_tokens"] == -2.0 and isinstance(sent["sink_tokens"], float)
    assert isinstance(sent["eval_length"], float)
    model = tiny_model()
    with pytest.raises(ValueError, match=r"sink_tokens must be an integer >= 0, got -2\.") as info:
        LenbenchLM.create_from_arg_obj({"pretrained": model, **sent}, {"device": "cpu"})
    assert "window" not in str(info.value)
    lm = LenbenchLM.create_from_arg_obj(
        {"pretrained": model, "scaling": "streaming", "sink_tokens": 2.0, "eval_length": 1e3},
        {"device": "cpu", "batch_size": 8.0},
    )
    assert lm.scaling.params["sink_tokens"] == 2 and type(lm.scaling.params["sink_tokens"]) is int
    assert lm.eval_length == 1000 and lm.batch_rows == 8
    assert parse_scaling("streaming", sink_tokens="3", window="AUTO").params == {
        "sink_tokens": 3,
        "window": "auto",
    }
    with pytest.raises(ValueError, match=r"sink_tokens=2\.5 of scaling method 'streaming' is "
                       r"invalid; allowed: an integer\.$"):  # fmt: skip
        parse_scaling("streaming", sink_tokens=2.5)
    with pytest.raises(ValueError, match=r"window='wide' .* allowed: an integer or auto\.$"):
        parse_scaling("rerope", window="wide")
    assert parse_scaling("yarn", factor=4.0, beta_fast="16").params["beta_fast"] == 16.0  # floats


def _cuda_missing(monkeypatch, missing: bool = True) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: not missing)


def test_harness_cli_without_device_runs_on_cpu_when_cuda_is_missing(tmp_path, monkeypatch, capsys):
    """No --device and no CUDA: lm-eval's default cuda:0 must not stop the run (it failed naming
    lenbench's ``device=``); cpu is used and one line says so. Controls: an explicit --device
    cuda (or model argument device=cuda) is one sentence naming it; with CUDA, or for another
    model, nothing is added."""
    from bench.harness.cli import HarnessArgError, _with_default_device, check_arguments
    from bench.harness.cli import main as harness_main

    _cuda_missing(monkeypatch)
    key = save_tiny_checkpoint(tiny_model(seed=2), tmp_path)
    argv = ["--model", "lenbench", "--model_args", f"pretrained={key},cache_root={tmp_path}",
            "--tasks", "lenbench_passkey_256", "--limit", "1"]  # fmt: skip
    assert _with_default_device(argv) == [*argv, "--device", "cpu"]
    assert capsys.readouterr().err.strip().splitlines() == [
        "lenbench-harness: no --device given and CUDA is not available: running on cpu."
    ]
    harness_main(argv)  # runs to the end on cpu
    out = capsys.readouterr()
    assert "lenbench_passkey_256" in out.out and "running on cpu" in out.err

    for extra, where in (
        (["--device", "cuda"], "--device 'cuda'"),
        (["--device=cuda:0"], "--device 'cuda:0'"),
    ):
        with pytest.raises(HarnessArgError, match=f"^{where} asks for CUDA, which this machine"):
            check_arguments([*argv, *extra])
        assert _with_default_device([*argv, *extra]) == [*argv, *extra]
    with_arg = [*argv[:3], argv[3] + ",device=cuda", *argv[4:]]
    with pytest.raises(
        HarnessArgError, match="^model argument device 'cuda' asks for CUDA.*device=cpu"
    ):
        check_arguments(with_arg)
    config = tmp_path / "run.yaml"
    config.write_text("device: cuda:1\n")
    with pytest.raises(HarnessArgError, match=f"^device in {config} 'cuda:1' asks for CUDA"):
        check_arguments([*argv, "--config", str(config)])
    check_arguments([*argv, "--device", "cpu"])  # cpu asked for: fine
    hf = ["--model", "hf", "--model_args", "pretrained=x", "--tasks", "lenbench_passkey_256"]
    assert _with_default_device(hf) == hf
    _cuda_missing(monkeypatch, missing=False)
    assert _with_default_device(argv) == argv
    check_arguments([*argv, "--device", "cuda"])


def test_harness_cli_streaming_sink_tokens_error_names_it(tmp_path, capsys):
    """The README's CLI path end to end: ``sink_tokens=-2`` is one sentence naming sink_tokens
    (control: ``sink_tokens=2`` passes the model's checks and evaluates)."""
    from bench.harness.cli import main as harness_main

    key = save_tiny_checkpoint(tiny_model(seed=2), tmp_path)
    argv = ["--model", "lenbench", "--tasks", "lenbench_passkey_256", "--limit", "1",
            "--device", "cpu", "--model_args"]  # fmt: skip
    base = f"pretrained={key},cache_root={tmp_path},scaling=streaming"
    with pytest.raises(SystemExit) as info:
        harness_main([*argv, base + ",sink_tokens=-2"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == "lenbench-harness: error: streaming: sink_tokens must be an integer >= 0, got -2."
    harness_main([*argv, base + ",sink_tokens=2"])
    assert "lenbench_passkey_256" in capsys.readouterr().out


# --------------------------------------------------------------------------- RULER-style tasks


def test_ruler_docs_match_the_native_grid():
    from bench.harness import ruler_docs
    from bench.tasks.ruler import RULER_TASKS, ruler_grid

    for task in RULER_TASKS:
        docs = ruler_docs(task=task, lengths=[256, 512], depths=2, trials=2, seed=4, version=1.0)
        native = [e for x in (256, 512) for e in ruler_grid([task], [x], [0.0, 1.0], 2, 4)]
        assert [d["prompt"] for d in docs] == [bytes(e.prompt_ids).decode() for e in native]
        assert [d["answer"] for d in docs] == [e.answer_text for e in native]
        assert [d["eval_length"] for d in docs] == [
            len(e.prompt_ids) + len(e.answer_ids) for e in native
        ]
    other = ruler_docs(task="niah_multikey", lengths=[512], params={"keys": 2})
    assert len(re.findall(r"\n[a-z]{4}:\d{5}\.\n", other[0]["prompt"])) == 2  # two needles


def test_a_ruler_length_without_its_metric_is_refused_in_one_sentence():
    """lm-eval aggregates only the metrics a YAML declares: a length without acc_<L> is refused
    before any example is built (control: a declared length works)."""
    from bench.harness import ruler_docs

    with pytest.raises(
        ValueError, match=r"^ruler length 300 has no per-length metric.*allowed: 64,"
    ):
        ruler_docs(task="vt", lengths=[256, 300])
    assert ruler_docs(task="vt", lengths=256, depths=1, trials=1)


def test_ruler_task_files_are_the_generated_ones():
    from bench.harness.tasks import TASK_LENGTHS, ruler_task_files
    from bench.tasks.ruler import RULER_TASKS

    files = ruler_task_files()
    for name, text in files.items():
        assert (TASKS_DIR / name).read_text() == text, f"{name}: rerun write_ruler_task_files"
    assert "_lenbench_ruler.yaml" in files
    names = set(task_names())
    for task in RULER_TASKS:  # one task per RULER task, reporting per length
        assert f"lenbench_ruler_{task}" in names
        assert not {f"lenbench_ruler_{task}_{x}" for x in TASK_LENGTHS} & names
        assert f"lenbench_ruler_{task}.yaml" in files
    assert {"lenbench_ruler", "lenbench_reasoning"} <= names
    assert not [p.name for p in TASKS_DIR.glob("lenbench_ruler_*.yaml") if p.name not in files]


def test_harness_ruler_scores_equal_native():
    """The oracle (right on some examples, wrong on others) through lm-eval: acc and match per
    example equal the native teacher-forced verdicts and greedy match scores."""
    from bench.eval.metrics.context import EvalContext
    from bench.eval.metrics.ruler import generated_scores, teacher_forced_verdicts
    from bench.tasks.ruler import ruler_grid

    from fixtures.ruler import RulerOracle

    oracle = RulerOracle()
    ctx = EvalContext(oracle, batch_size=4, progress=False)
    limit = 6
    for task in ("niah_multikey", "vt", "fwe"):
        name = f"lenbench_ruler_{task}"
        results = run_harness(
            oracle, name, limit=limit, batch_size=4, log_samples=True, metadata={"lengths": [256]}
        )
        samples = samples_by_doc(results, name)
        examples = ruler_grid([task], [256], [0.0, 0.5, 1.0], 4, 0)[:limit]
        assert [s["arguments"][0][0] for s in samples] == [
            bytes(e.prompt_ids).decode() for e in examples
        ]
        forced = teacher_forced_verdicts(ctx, examples)
        _, match = generated_scores(ctx, examples, extra_tokens=8)
        assert [bool(s["acc"]) for s in samples] == forced
        assert [s["match"] for s in samples] == pytest.approx(match)
        assert 0 < sum(forced) < limit or task != "niah_multikey"


def test_harness_ruler_on_a_checkpoint_equals_native(tmp_path):
    """A saved lenbench checkpoint (a real network, through the cache) scored by lm-eval and by
    the native greedy path: the same acc and match per example."""
    from bench.core.sections import position_weights
    from bench.eval.metrics.context import EvalContext
    from bench.eval.metrics.ruler import generated_scores
    from bench.tasks.ruler import ruler_grid
    from bench.train.checkpoints import key_of, save_checkpoint

    model = tiny_model(seed=5, train_length=256)
    config = {
        "model": dataclasses.asdict(model.model_cfg),
        "position": position_weights(model.position_cfg),
        "train": {"length": model.train_length},
    }
    key = key_of(config)
    save_checkpoint(model, key, config, tmp_path)
    name = "lenbench_ruler_vt"
    results = run_harness(
        key, name, cache_root=tmp_path, limit=4, log_samples=True, metadata={"lengths": [256]}
    )
    samples = samples_by_doc(results, name)
    examples = ruler_grid(["vt"], [256], [0.0, 0.5, 1.0], 4, 0)[:4]
    exact, match = generated_scores(EvalContext(model, batch_size=4, progress=False), examples, 40)
    assert [bool(s["acc"]) for s in samples] == exact
    assert [s["match"] for s in samples] == pytest.approx(match)


def test_one_ruler_task_reports_each_length_as_its_own_rows():
    """One lm-eval task over two lengths: per-length rows (eval_length, n) whose values equal the
    mean of that length's samples, beside the overall row; the group sums the counts. Control: a
    per-length metric name without its count (an ordinary ``acc_5`` of another task) stays as is."""
    from fixtures.ruler import RulerOracle

    results = run_harness(
        RulerOracle(),
        ["lenbench_ruler_vt", "lenbench_ruler_fwe"],
        batch_size=4,
        log_samples=True,
        metadata={"lengths": [256, 512], "depths": 1, "trials": 3},
    )
    rows = harness_rows(results)
    vt = {r["eval_length"]: r for r in rows if r["metric"] == "harness/lenbench_ruler_vt/acc"}
    assert set(vt) == {None, 256, 512}
    samples = samples_by_doc(results, "lenbench_ruler_vt")
    for length in (256, 512):
        at = [s["acc"] for s in samples if s["doc"]["eval_length"] == length]
        assert vt[length]["n"] == len(at) == 3
        assert vt[length]["value"] == pytest.approx(np.mean(at))
    assert vt[None]["n"] == 6
    assert not [r for r in rows if "/n_" in r["metric"] or r["metric"].endswith("_256")]
    other = harness_rows(
        {"results": {"x": {"acc_5,none": 0.5}}, "n-samples": {"x": {"effective": 2}}}
    )
    assert other == [{"metric": "harness/x/acc_5", "value": 0.5, "n": 2, "eval_length": None}]


def test_a_task_named_for_a_length_keeps_it():
    """The audit's case: --tasks lenbench_passkey_1024 --metadata '{"length": 512}' ran 512-token
    prompts in rows labelled lenbench_passkey_1024 (lm-eval merges the metadata over the task's).
    Refused; controls: the same length, the unnumbered task with a length, a HF model's args."""
    from bench.harness.cli import HarnessArgError, check_arguments

    argv = ["--model", "hf", "--model_args", "pretrained=x", "--tasks"]
    with pytest.raises(HarnessArgError, match=r"--metadata length 512 would run lenbench_passkey"):
        check_arguments([*argv, "lenbench_passkey_1024", "--metadata", '{"length": 512}'])
    with pytest.raises(HarnessArgError, match="lenbench_ppl_256"):
        check_arguments([*argv, "lenbench_ppl_256", '--metadata={"length": 1024}'])
    check_arguments([*argv, "lenbench_passkey_1024", "--metadata", '{"length": 1024}'])
    check_arguments([*argv, "lenbench_passkey", "--metadata", '{"length": 512}'])
    check_arguments([*argv, "lenbench_passkey_1024", "--metadata", '{"trials": 1}'])
