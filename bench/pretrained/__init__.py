"""Pretrained Hugging Face models through lenbench's metrics and scaling methods.

``source`` holds the ``pretrained`` config section and loading; ``adapter`` wraps a transformers
causal LM in the interface the metrics use; ``documents`` re-tokenizes the corpus with the model's
tokenizer; ``job`` runs one lenbench job on such a model. Submodules are imported on use, so that
the config schema can import ``source`` without transformers.
"""
