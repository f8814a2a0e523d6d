"""Model designs beyond the position family, one module per design (the registry, its switches
and hooks: :mod:`models.designs.registry`). Built-ins register in this order (the order of their
allowed values in messages), then any other module of this folder, alphabetically, at the first
lookup (:func:`models.designs.registry.designs`; the one discovery rule, :mod:`models.discovery`).
"""

from models.designs import (  # noqa: F401, I001  (built-ins, in order)
    sinks,
    qk_norm,
    output_gate,
    ssmax,
    llama4,
    stick_breaking,
    differential,
    forget_gate,
)
