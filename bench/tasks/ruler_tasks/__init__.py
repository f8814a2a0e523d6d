"""The RULER-style tasks, one declaration each (``bench.tasks.ruler_registry.register_ruler_task``): ``niah``
(the four needle tasks), ``vt`` (variable tracking), ``words`` (common and frequent word
extraction), and the reasoning tasks outside RULER's suite: ``qa`` (qa1-qa3, bAbI-style facts)
and ``kv`` (kv_middle, lost-in-the-middle retrieval). ``bench.tasks.ruler`` imports every module of this folder; a new task is one new module
here (or in a package named in ``extensions``). Built-ins register in this order.
"""

from bench.tasks.ruler_tasks import niah, vt, words, qa, kv  # noqa: F401, I001  (built-ins, in order)
