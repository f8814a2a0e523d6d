"""The RULER-style tasks, one declaration each (``bench.ruler.register_ruler_task``): ``niah``
(the four needle tasks), ``vt`` (variable tracking), ``words`` (common and frequent word
extraction). ``bench.ruler`` imports every module of this folder; a new task is one new module
here (or in a package named in ``extensions``). Built-ins register in this order.
"""

from bench.ruler_tasks import niah, vt, words  # noqa: F401, I001  (built-ins, in order)
