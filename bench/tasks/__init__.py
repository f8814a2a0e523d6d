"""Stage 2, tasks: the text of passkey and RULER-style examples (generators, their answers, the
fit to a length); one RULER task per module of ``ruler_tasks``. May import ``core`` and ``data``.
"""
