"""Typed configuration: one dataclass per config group, registered in Hydra's ConfigStore.

Hydra checks types while it composes; ranges and rules spanning sections are checked in
``__post_init__`` (a one-sentence ValueError naming key, value and what is allowed; the
validators are ``bench.core.checks``). A job parses its composed config once
(:meth:`JobConfig.from_hydra`) and hands the typed sections down. Field metadata declares what
enters the checkpoint key (``weights``), which data kinds a field belongs to (``kinds``) and which
position families use it (``families``). The groups defined beside what they configure are
imported here: ``data`` (``bench.data.config``), ``train``/``extend`` (``bench.train.config``),
``eval`` (``bench.eval.metrics``) and ``pretrained`` (``bench.pretrained.config``). The launcher
plugins' configs get lenbench's values here too (``hydra/launcher``, end of this module).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra_plugins.hydra_joblib_launcher.config import JobLibLauncherConf
from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from bench.core.checks import (
    config_error,
    integer,
    parse_length,
    parse_section,
    weight_fields,
    weights_dict,
)
from bench.core.runtime import check_device_name
from bench.core.sections import ModelSchema, PositionSchema, ScalingSchema, position_section
from bench.data.config import DataConfig
from bench.eval.metrics import EvalConfig, as_eval_config, eval_config_class
from bench.pretrained.config import PretrainedConfig
from bench.tasks.passkey import PASSKEY_TEMPLATES, min_passkey_length
from bench.train.config import WEIGHT_DECAY_SCOPES, ExtendConfig, TrainConfig
from hydra_plugins.lenbench_sweeper.lenbench_sweeper import ApplicableSweeperConf
from models.discovery import load_extensions
from models.model_config import check_combination
from models.positions import families

__all__ = [
    "SCHEMA_NAME",
    "ArmConfig",
    "WEIGHT_DECAY_SCOPES",
    "DataConfig",
    "ExtendConfig",
    "JobConfig",
    "JoblibLauncher",
    "ModelSchema",
    "PathsConfig",
    "PositionSchema",
    "ScalingSchema",
    "SlurmLauncher",
    "TrainConfig",
    "config_error",
    "weight_fields",
    "weights_dict",
]

SCHEMA_NAME = "lenbench_schema"  # the first entry of conf/config.yaml's defaults list

# --------------------------------------------------------------------------- groups


@dataclass
class ArmConfig:
    """The ``arm`` group: which sweep cells a study arm runs (the arm's file also sets the model,
    train and eval values it needs). An experiment can sweep ``arm=lm,retrieval`` next to
    position and scaling: a cell outside its arm is skipped (not applicable), like a scaling
    that means nothing for a family. ``None`` lists allow every value."""

    name: str = "all"  # the ``arm`` column of every result row
    positions: list[str] | None = None  # position kinds the arm trains
    scalings: list[str] | None = None  # scaling names (conf/scaling/*.yaml) it evaluates
    extends: list[str] | None = None  # extend names (conf/extend/*.yaml) it fine-tunes with
    position_samplings: list[str] | None = None  # train.position_sampling values it trains
    attention_sinks: list[str] | None = None  # model.attention_sink values it trains
    # position kinds it fine-tunes (cells with an extend other than none); None = every one it trains
    finetune_positions: list[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or "/" in self.name:
            raise ValueError(f"arm.name must be a non-empty name without '/', got {self.name!r}.")
        for key in ("positions", "scalings", "extends", "position_samplings", "attention_sinks",
                    "finetune_positions"):  # fmt: skip
            values = getattr(self, key)
            if values is not None and not values:
                raise ValueError(
                    f"arm.{key} is empty, so the arm runs nothing; allowed: a non-empty list of "
                    "names or null (every value)."
                )
            setattr(self, key, None if values is None else [str(v) for v in values])

    def excluded(
        self,
        position: str,
        scaling: str,
        extend: str,
        position_sampling: str = "contiguous",
        attention_sink: str = "none",
    ) -> str | None:
        """Why the cell (position, scaling, extend, training's position sampling, attention
        sink) is not part of this arm, or None if it is."""
        for what, value, allowed in (
            ("position", position, self.positions),
            ("scaling", scaling, self.scalings),
            ("extend", extend, self.extends),
            ("train.position_sampling", position_sampling, self.position_samplings),
            ("model.attention_sink", attention_sink, self.attention_sinks),
        ):
            if allowed is not None and value not in allowed:
                return (
                    f"{what} {value} is not part of arm {self.name} ({what}: {', '.join(allowed)})"
                )
        tuned = self.finetune_positions
        if extend != "none" and tuned is not None and position not in tuned:
            return (
                f"extend {extend} for position {position} is not part of arm {self.name} (it "
                f"fine-tunes only: {', '.join(tuned)})"
            )
        return None


@dataclass
class PathsConfig:
    """Output roots; relative paths are relative to where lenbench was started."""

    results: str = "results"  # <results>/<experiment_name>/<run_id>.parquet
    reports: str = "reports"  # <reports>/<experiment_name>/report.md
    cache: str | None = None  # checkpoints; None = $LENBENCH_CACHE or ~/.cache/lenbench/checkpoints


@dataclass
class JobConfig:
    """One job's whole config: the primary config's keys and one typed section per group."""

    experiment_name: str = "default"  # results and report go to <paths.*>/<experiment_name>
    seed: int = 0  # weight init and training batches (in the checkpoint key), eval sampling
    device: str = "auto"  # cpu | cuda | cuda:<i> | mps | auto
    threads: int | None = (
        None  # torch intra-op threads; None = per core, minus busy ones (bench.job)
    )
    paths: PathsConfig = field(default_factory=PathsConfig)
    # modules or packages of your own (families, scaling methods, metrics, findings, tasks)
    # imported before the config is checked (models.discovery.load_extensions)
    extensions: list[str] = field(default_factory=list)
    model: ModelSchema = field(default_factory=ModelSchema)
    # the family's own dataclass (models.positions.PositionConfig; Family.config), which
    # conf/position/<kind>.yaml selects from the ConfigStore (group schema/position)
    position: Any = None
    scaling: ScalingSchema = field(default_factory=ScalingSchema)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # a transformers model evaluated instead of a trained one (null = train as usual)
    pretrained: PretrainedConfig | None = None
    extend: ExtendConfig = field(default_factory=ExtendConfig)
    arm: ArmConfig = field(default_factory=ArmConfig)

    def __post_init__(self) -> None:
        name = self.experiment_name
        if not isinstance(name, str) or not name.strip() or "/" in name:
            raise ValueError(f"experiment_name must be a non-empty name without '/', got {name!r}.")
        self.seed = integer("seed", self.seed, 0)
        self.threads = integer("threads", self.threads, 1, optional=True)
        check_device_name(self.device)  # its availability needs torch: checked with the job
        self.eval = as_eval_config(self.eval)
        if self.scaling.target_length is not None:
            what = "scaling.target_length"
            tokens = parse_length(self.scaling.target_length, self.train.length, what)
            if tokens < self.train.length:  # else its factor would be clamped to 1: no scaling
                raise ValueError(
                    f"scaling.target_length {self.scaling.target_length} is below train.length "
                    f"{self.train.length}; allowed: at least {self.train.length} (a factor >= 1)."
                )
            self.scaling.target_length = integer(what, tokens, 1)
        self.position = position_section({} if self.position is None else self.position)
        self.position.validate(self.model.head_dim, self.model.d_model)
        check_combination(self.model, self.position)  # else the model's constructor would fail
        probe = getattr(self.eval, "position_probe_r2", None)
        layers = self.model.n_layers
        if self.pretrained is None and probe is not None and probe.enabled:
            if probe.layer is not None and probe.layer > layers:  # else found after training
                raise ValueError(
                    f"eval.position_probe_r2.layer {probe.layer} is out of range for "
                    f"model.n_layers {layers}; allowed: 0..{layers} (0 = embeddings) or null."
                )
        length = self.train.length
        rows = getattr(self.position, "max_positions", 0)  # the learned table's rows
        if self.position.kind == "learned" and 0 < rows < length:
            raise ValueError(
                f"position.max_positions {rows} is smaller than train.length {length}; "
                f"allowed: 0 (= train.length) or at least {length}."
            )
        if self.position.kind == "learned" and self.train.position_sampling != "contiguous":
            # sampled positions reach train.max_position: the table needs that many rows
            needed = self.train.sampled_positions
            if rows == 0:
                self.position.max_positions = needed
            elif rows < needed:
                raise ValueError(
                    f"position.max_positions {rows} is smaller than the {needed} positions "
                    f"train.position_sampling={self.train.position_sampling} draws from "
                    f"(train.max_position); allowed: 0 (= {needed}) or at least {needed}."
                )
        if self.extend.active:
            ext, what = self.extend, "extend.length"
            ext.length = integer(what, parse_length(ext.length, length, what), length)
            ext.batch_size = ext.batch_size or self.train.batch_size
            if ext.passkey_fraction is None:
                ext.passkey_fraction = self.train.passkey_fraction
        fraction, template = self.train.passkey_fraction, self.train.passkey_template
        needed = min_passkey_length(template=template) + len(PASSKEY_TEMPLATES[template].end)
        if fraction > 0 and length + 1 < needed:
            raise ValueError(
                f"train.length {length} is too short for passkey training examples "
                f"(train.passkey_fraction={fraction:g}, template {template!r}); allowed: "
                f"train.length >= {needed - 1} or train.passkey_fraction=0."
            )

    @classmethod
    def from_hydra(cls, cfg: DictConfig | Mapping[str, Any]) -> JobConfig:
        """The typed config of a composed Hydra config (or of nested plain data, checked alike).

        Raises ValueError with one sentence for a wrong type, an unknown key, a missing or an
        out-of-range value.
        """
        if isinstance(cfg, DictConfig) and "hydra" in cfg:
            cfg = cfg.copy()
            with open_dict(cfg):
                del cfg["hydra"]
        extensions = cfg.get("extensions") if hasattr(cfg, "get") else None
        if extensions:  # what they register must be there before any name is checked
            if isinstance(extensions, str) or not isinstance(extensions, Sequence | ListConfig):
                raise ValueError(
                    f"extensions {extensions!r} is invalid; allowed: a list of module names."
                )
            load_extensions(list(extensions))
            if eval_config_class() is not EvalConfig:  # they registered metrics: their sections
                return checked_warmup(cls._with_registered_metrics(cfg))  # by the registry
        return checked_warmup(parse_section(cls, cfg))

    @classmethod
    def _with_registered_metrics(cls, cfg: DictConfig | Mapping[str, Any]) -> JobConfig:
        """:meth:`from_hydra` once extensions registered metrics after this schema was built
        (their sections are set with ``+eval.<metric>.<key>=...``): eval is checked by the
        registry's current eval config, the rest by the schema."""
        values = OmegaConf.to_container(cfg) if isinstance(cfg, DictConfig) else dict(cfg)
        eval_values = values.pop("eval", None)
        job = parse_section(cls, values)
        return replace(job, eval=as_eval_config(eval_values))


def checked_warmup(job: JobConfig) -> JobConfig:
    """``job`` if each schedule it trains with reaches its peak learning rate and then decays:
    ``train.warmup_steps`` below ``train.steps`` (a model lenbench trains) and
    ``extend.warmup_steps`` below ``extend.steps`` (an active fine-tune that updates at all); else
    one sentence. A warmup as long as the run never decays, a longer one never reaches the peak:
    refused, not shortened (a recovery curve's points, shorter runs of the same schedule, are
    built from the checked job, not parsed)."""
    sections = []
    if job.pretrained is None:
        sections.append(("train", job.train.steps, job.train.warmup_steps))
    if job.extend.active and job.extend.steps > 0:
        sections.append(("extend", job.extend.steps, job.extend.warmup_steps))
    for section, steps, warmup in sections:
        if warmup >= steps:
            raise ValueError(
                f"{section}.warmup_steps {warmup} is not below {section}.steps {steps}, so the "
                f"learning rate would {'never reach its peak' if warmup > steps else 'never decay'}; "
                f"allowed: {section}.warmup_steps at most {steps - 1} (or raise {section}.steps)."
            )
    return job


ConfigStore.instance().store(name=SCHEMA_NAME, node=JobConfig)
# each family's own dataclass, which its conf/position/<kind>.yaml extends
# (``defaults: [/schema/position/<kind>@_here_, _self_]``): Hydra then checks that section's
# types and keys (another family's field is an unknown key). A family of an extension package,
# registered after composition, is checked by JobConfig (position_section) instead.
for _kind, _family in families().items():
    ConfigStore.instance().store(
        group="schema/position", name=_kind, node=_family.config(kind=_kind)
    )


# --------------------------------------------------------------------------- launchers
#
# ``hydra/launcher=basic|joblib|submitit_local|submitit_slurm`` select the launcher plugins' own
# configs (``lenbench --cfg hydra -p hydra.launcher`` prints the one chosen):
# - basic (the default): jobs one after another in this process. Best on a 2-core laptop: no
#   worker start cost, corpora stay cached in memory between jobs, torch uses every core per job.
# - joblib: parallel jobs on this machine (hydra-joblib-launcher, loky worker processes); lenbench's
#   values: :class:`JoblibLauncher`.
# - submitit_local: jobs as local submitit processes, the SLURM code path without a cluster (to
#   test a sweep's submitit setup); logs and pickles go to <sweep dir>/.submitit/<job id>/.
# - submitit_slurm: one SLURM job per sweep job; lenbench's values: :class:`SlurmLauncher`.
# lenbench's values are stored under the plugins' names, replacing their nodes, rather than
# written as conf/hydra/launcher/<name>.yaml: a config file named like a ConfigStore node is
# merged into it by Hydra's deprecated automatic schema matching. Your own values go into a
# --config-dir file that extends a launcher explicitly, e.g. DIR/hydra/launcher/my_slurm.yaml:
#     defaults: [submitit_slurm, _self_]
#     partition: gpu
# run with ``lenbench -m --config-dir DIR hydra/launcher=my_slurm ...``.


@dataclass
class JoblibLauncher(JobLibLauncherConf):
    """``hydra/launcher=joblib``: the plugin's config with lenbench's worker count.

    ``n_jobs``: the plugin's -1 starts one worker per core; each costs seconds to start and
    its own copy of the corpus, so lenbench starts 2 (``hydra.launcher.n_jobs=4`` for more).
    Each job sets torch to cpu_count // n_jobs intra-op threads (the top-level ``threads``
    overrides), so workers do not fight. Trap: a torch DataLoader with num_workers > 0 inside
    a loky worker must use multiprocessing_context="fork" (lenbench's training stream needs no
    DataLoader). Two jobs that need the same checkpoint: one trains, the other waits on the
    cache's file lock.
    """

    n_jobs: int = 2


@dataclass
class SlurmLauncher(SlurmQueueConf):
    """``hydra/launcher=submitit_slurm``: the plugin's config with lenbench's per-job resources.

    Set your cluster's values on the command line (``hydra.launcher.partition=gpu
    hydra.launcher.timeout_min=240``) or in a --config-dir launcher (see above), e.g.
    partition, account, qos, constraint (e.g. a100) or setup (shell lines run before the job,
    e.g. ["module load cuda", "source ~/venv/bin/activate"]). ``max_num_timeout`` stays 0: a
    requeued job would retrain from scratch. ``lenbench`` blocks until every job has finished,
    then prints the summary and writes the report: run it inside tmux/screen on the login node,
    with ``paths.cache`` on a shared file system (a local/default.yaml in your --config-dir).

    Several GPUs per job (DDP): Hydra stays outside, the distributed launcher inside. Either
    use submitit tasks (tasks_per_node = gpus_per_node; each task is one rank, see
    submitit.helpers.TorchDistributedEnvironment), or run one ``accelerate launch`` subprocess
    per job with a fixed hydra.run.dir. Never ``accelerate launch lenbench -m ...``: every rank
    would run the whole sweep.
    """

    timeout_min: int = 120  # per job; the small model on train=standard needs ~10-20 min on one GPU
    cpus_per_task: int | None = 8
    gpus_per_node: int | None = 1
    mem_gb: int | None = 32
    name: str = "lenbench-${experiment_name}"
    array_parallelism: int = 32  # jobs running at once


# Hydra's plugin scan (once per process) re-executes the plugins' config modules, which store
# their nodes again: scan first, so that these nodes are stored last.
Plugins.instance()
ConfigStore.instance().store(
    group="hydra/launcher", name="joblib", node=JoblibLauncher, provider="lenbench"
)
# ``hydra/sweeper=lenbench`` (conf/config.yaml's default): the basic sweeper, launching only the
# cells that apply (hydra_plugins/lenbench_sweeper: Hydra instantiates plugins from there only)
ConfigStore.instance().store(
    group="hydra/sweeper", name="lenbench", node=ApplicableSweeperConf, provider="lenbench"
)
ConfigStore.instance().store(
    group="hydra/launcher", name="submitit_slurm", node=SlurmLauncher, provider="lenbench"
)
