"""The sweeper of ``lenbench -m`` (``hydra/sweeper=lenbench``, the default of ``conf/config.yaml``;
a Hydra plugin, so it lives in the ``hydra_plugins`` namespace package): Hydra's basic sweeper (the Cartesian product of
``hydra.sweeper.params`` and the command line's sweeps), launching only the cells that apply.

A study's product holds cells that do not apply: a scaling method its family has no use for (YaRN
on a learned table), a position outside the cell's arm (the quickstart's 80 cells hold 56 such).
Hydra's basic sweeper composed every cell twice (once to check the batch, once to launch it) and
launched each, and each then only said that it is skipped: about 0.5-0.9 s a cell on 2 cores.
Here each cell is composed once and checked with the job's own test (``bench.job.not_applicable``:
the config's schema and checks, no torch, no corpus); a cell that does not apply writes the
status its job would have written (the sweep's summary counts it alike) and its one-line note,
and is not launched; every other cell, a broken one included (its job reports it), is launched
by the configured launcher as before, numbered 0, 1, ... in sweep order.
"""

# no ``from __future__ import annotations``: Hydra's plugin scan runs this module before it is in
# sys.modules, where a dataclass with string annotations cannot be built
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper, BasicSweeperConf
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

__all__ = ["ApplicableSweeper", "ApplicableSweeperConf", "SKIPPED_DIR"]

log = logging.getLogger("lenbench")

#: the sweep dir's sub-folders holding the statuses of cells not launched: <SKIPPED_DIR>-<k>
SKIPPED_DIR = "not_applicable"


@dataclass
class ApplicableSweeperConf(BasicSweeperConf):
    """``hydra/sweeper=lenbench`` (the default, ``conf/config.yaml``): the basic sweeper's keys."""

    _target_: str = "hydra_plugins.lenbench_sweeper.lenbench_sweeper.ApplicableSweeper"


class ApplicableSweeper(BasicSweeper):
    """:class:`BasicSweeper` that launches only the cells that apply (module doc)."""

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None
        assert self.hydra_context is not None
        from bench.cli import STATUS_FILE
        from bench.job import not_applicable  # imports no torch

        params = self._parse_config()
        params.extend(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        self.overrides = self.split_arguments(parser.parse_overrides(params), self.max_batch_size)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns, launched, skipped = [], 0, 0
        while not self.is_done():
            batch = []
            for cell in self.get_job_batch():
                # composing it checks that it composes, as validate_batch_is_legal did
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(cell))
                status = not_applicable(cfg)
                if status is None:
                    batch.append(cell)
                    continue
                status["job"] = str(cfg.hydra.job.override_dirname)
                out = sweep_dir / f"{SKIPPED_DIR}-{skipped}"
                out.mkdir(parents=True, exist_ok=True)
                (out / STATUS_FILE).write_text(json.dumps(status, indent=1, default=str) + "\n")
                log.info("lenbench: %s", status["message"])
                skipped += 1
            if batch:
                results = self.launcher.launch(batch, initial_job_idx=launched)
                for result in results:
                    _ = result.return_value  # raises where the job did, as the basic sweeper
                launched += len(batch)
                returns.append(results)
        return returns
