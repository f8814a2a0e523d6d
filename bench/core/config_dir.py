"""Where lenbench's own Hydra config tree is: ``conf/`` beside the ``bench`` package (a checkout,
an editable install and a wheel all place it there), never the importable module ``conf``: a
user's folder named ``conf/`` on the path (``PYTHONPATH=~/my_code`` holding ``~/my_code/conf``)
would otherwise be that module, and Hydra would find no ``config.yaml`` in it. In ``core`` so that
every stage (the harness's scaling presets, the CLI) reads the same folder."""

from __future__ import annotations

from pathlib import Path

__all__ = ["CONFIG_DIR"]

CONFIG_DIR = Path(__file__).resolve().parents[2] / "conf"
