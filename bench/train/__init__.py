"""Stage 4, train: the trainer and its config, batches, optimiser, resume, fine-tuning at length
and the checkpoint cache. May import ``core``, ``data``, ``tasks`` and ``eval`` (stopping checks).
"""
