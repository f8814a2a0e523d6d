"""Stage 3, eval: scoring a model at each length (``evaluate``), the metric registry and its
metrics, model sources. Knows nothing of training. May import ``core``, ``data`` and ``tasks``.
"""
