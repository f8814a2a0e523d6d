"""Stage 1, data: corpora, near-duplicate-aware splits, the byte tokenizer, the ``data`` config
section and the corpus in a pretrained model's tokens. May import ``bench.core``.
"""
