"""Pretrained Hugging Face models through lenbench's metrics and scaling methods.

``config`` holds the ``pretrained`` config section, loading and what lenbench reads off a model's
config; ``adapter`` wraps a transformers causal LM in the interface the metrics use (the
attention functions it registers with transformers are ``attention``); ``source``
is such a model as the model source of a lenbench job (``bench.job.run_job``); the corpus in the
model's tokens is ``bench.data.pretrained_documents``. Submodules are imported on use, so that the
config schema can import ``config`` without transformers. Stage 7 of ``bench``: may import
``core``, ``data`` and ``eval`` (the metrics it runs).
"""
