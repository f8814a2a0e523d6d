"""Position families, one module per group: ``classic`` (sinusoidal, learned, RoPE, ALiBi, NoPE),
``zoo`` (relative biases: T5, KERPLE, FIRE, Sandwich), ``rotary`` (p-RoPE, HoPE, xPos), ``cope``
(contextual), ``hybrid`` (per-layer patterns). :func:`models.positions.families` imports every
module of this folder (the one discovery rule, :mod:`models.discovery`); the base class, config
and registry are in :mod:`models.positions`. Built-ins register in this order, then any other
module here.
"""

from models.families import classic, zoo, rotary, cope, hybrid  # noqa: F401, I001  (built-ins, in order)
