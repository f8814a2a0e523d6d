"""Offline transformers fixtures: a locally trained tokenizer and tiny random-weight models.

Nothing is downloaded: the BPE tokenizer is trained with ``tokenizers`` on a few KB of the
running Python's standard library, a byte-level tokenizer maps every byte to its own id (the
ids of ``bench.tokenizer.ByteTokenizer``, for parity with lenbench models), and each model is
built from a transformers config with random weights and saved to a temporary directory.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bench.corpora import stdlib_root

__all__ = [
    "ARCHITECTURES",
    "byte_tokenizer",
    "load_adapter",
    "one_sentence",
    "save_model",
    "small_eval",
    "stdlib_docs",
    "train_bpe_tokenizer",
    "train_sentencepiece_tokenizer",
]

SPECIALS = ["<s>", "</s>", "<pad>"]


def _training_text(n_bytes: int = 24_000) -> str:
    root = stdlib_root()
    parts, total = [], 0
    for name in ("textwrap.py", "shlex.py", "bisect.py", "heapq.py", "string.py"):
        path = root / name
        if path.exists():
            text = path.read_text(encoding="utf-8", errors="replace")
            parts.append(text)
            total += len(text)
        if total >= n_bytes:
            break
    return "".join(parts)[:n_bytes]


def _fast(tokenizer, add_bos: bool):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        add_bos_token=add_bos,
    )


def train_bpe_tokenizer(vocab_size: int = 400):
    """A byte-level BPE tokenizer (GPT-2 style) trained on stdlib text, as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_training_text()], trainer=trainer)
    return _fast(tok, add_bos=False)


def train_sentencepiece_tokenizer(vocab_size: int = 400):
    """A SentencePiece-style tokenizer (Metaspace "▁" for spaces, byte fallback) as Llama-2,
    Mistral and their fast tokenizers in transformers have it, trained on stdlib text and
    wrapped in transformers' ``LlamaTokenizerFast``. Decoding a sequence alone drops the space
    its first token starts with (" 1234" -> "1234"), as theirs does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", *SPECIALS],
        initial_alphabet=[f"<0x{i:02X}>" for i in range(256)],
        show_progress=False,
    )
    tok.train_from_iterator([_training_text()], trainer=trainer)
    return LlamaTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        add_bos_token=True,
        add_eos_token=False,
    )


def byte_tokenizer():
    """Every byte b is token b, then <s>=256, </s>=257, <pad>=258: ByteTokenizer's ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = bytes_to_unicode()  # byte -> the printable character ByteLevel uses for it
    vocab = {chars[b]: b for b in range(256)}
    vocab.update({s: 256 + i for i, s in enumerate(SPECIALS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return _fast(tok, add_bos=False)


def _llama(vocab: int, **kw):
    from transformers import LlamaConfig

    base = dict(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return LlamaConfig(**{**base, **kw})


def _config(arch: str, vocab: int):
    from transformers import BloomConfig, GPT2Config, GPTNeoXConfig

    if arch == "llama":
        return _llama(vocab)
    if arch == "llama_yarn":  # ships with YaRN: trained at 32, configured for 128
        return _llama(
            vocab,
            max_position_embeddings=128,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "rope_theta": 10000.0,
            },
        )
    if arch == "neox":  # partial rotary: half of each 16-channel head rotates
        return GPTNeoXConfig(
            vocab_size=vocab,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=64,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
            },
        )
    if arch == "gpt2":
        return GPT2Config(
            vocab_size=vocab,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=1,
        )
    if arch == "bloom":
        return BloomConfig(vocab_size=vocab, hidden_size=32, n_layer=2, n_head=4, seq_length=64)
    raise ValueError(f"unknown fixture architecture {arch!r}; allowed: {', '.join(ARCHITECTURES)}.")


ARCHITECTURES = ("llama", "llama_yarn", "neox", "gpt2", "bloom")


def save_model(arch: str, directory: Path, tokenizer=None, seed: int = 0) -> Path:
    """A random-weight ``arch`` model (and ``tokenizer``, default the BPE one) saved to ``directory``."""
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer if tokenizer is not None else train_bpe_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(arch, len(tokenizer)))
    with torch.no_grad():  # sharper attention than at init, so that position and context matter
        for name, param in model.named_parameters():
            if any(k in name for k in ("q_proj", "k_proj", "query_key_value", "c_attn")):
                param.mul_(6.0)
    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def load_adapter(path, train_length: int | None = None):
    """The saved model at ``path`` loaded as lenbench loads it, in a PretrainedLM."""
    from bench.pretrained.adapter import PretrainedLM
    from bench.pretrained.config import PretrainedConfig, load_pretrained, train_length_of

    model, tokenizer = load_pretrained(PretrainedConfig(path=str(path), train_length=train_length))
    return PretrainedLM(model, tokenizer, train_length_of(model.config, train_length))


def stdlib_docs(n_bytes: int = 3000):
    """Byte-token documents of real text (valid UTF-8, so re-tokenizing is lossless)."""
    from bench.corpora import Document
    from bench.tokenizer import bytes_to_tokens

    names = ("textwrap.py", "shlex.py", "bisect.py", "heapq.py", "string.py", "glob.py")
    root = stdlib_root()
    return [
        Document(name, bytes_to_tokens((root / name).read_bytes()[:n_bytes]))
        for name in names
        if (root / name).exists()
    ]


def small_eval(passkey_lengths=None, **overrides) -> dict:
    """Every metric, small: lengths 1x, 2x, 4x of the training length; ``overrides`` merge per section."""
    from bench.metrics import METRICS

    cfg = {
        "lengths": ["1x", "2x", "4x"],
        "batch_size": 4,
        "nll": {"max_docs": 3, "bootstrap": 20},
        "passkey": {"depths": 2, "trials": 1, "template": "short", "lengths": passkey_lengths},
        "shift_dnll": {"max_docs": 2, "bootstrap": 0, "deltas": [8, "1x"], "lengths": ["1x", "2x"]},
        "order_dnll": {"max_docs": 2, "bootstrap": 0, "block": 8},
        "context_nll": {"max_docs": 2, "bootstrap": 0, "block": 8, "lengths": ["4x"]},
        "attn_entropy": {"max_docs": 2, "lengths": ["1x", "4x"]},
        "position_probe_r2": {
            "lengths": ["2x"],
            "fit_docs": 2,
            "test_docs": 2,
            "positions_per_doc": 16,
        },
    }
    for key, value in overrides.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    assert set(METRICS) <= set(cfg), "a new metric needs a section here"
    return cfg


def one_sentence(message: str) -> None:
    """Assert that an error message is one sentence."""
    assert "\n" not in message and message.endswith(".") and len(message) < 400, message
