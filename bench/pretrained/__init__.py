"""Pretrained Hugging Face models through lenbench's metrics and scaling methods.

``config`` holds the ``pretrained`` config section, loading and what lenbench reads off a model's
config; ``adapter`` wraps a transformers causal LM in the interface the metrics use; ``documents``
re-tokenizes the corpus with the model's tokenizer; ``source`` is such a model as the model source
of a lenbench job (``bench.job.run_job``). Submodules are imported on use, so that the config
schema can import ``config`` without transformers.
"""
