"""Where and how a model runs: device resolution and mixed-precision autocast, one of each, the
``accelerate`` set-up of a training run (its CPU backend flag, its accelerator) and the machine
it runs on (CPU flags such as native bf16, a one-line summary for benchmark tables).

Training, evaluation and the lm-eval adapter all call these, so ``device=auto`` and
``precision=bf16`` mean the same thing everywhere.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import platform
import re
import time
import warnings
from pathlib import Path
from typing import Any

from models.lazy import torch

__all__ = [
    "PRECISIONS",
    "autocast",
    "busy_cores",
    "check_device_name",
    "cpu_has_native_bf16",
    "cpu_info",
    "machine_line",
    "machine_summary",
    "make_accelerator",
    "resolve_device",
    "use_cpu_backend",
    "warn_if_emulated_bf16",
]

#: CPU flags that decide training speed here: vector width and native bf16 / AMX matmuls.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")

PRECISIONS = ("fp32", "bf16")


def check_device_name(requested: Any) -> str:
    """``device`` as a name (None or blank: auto), checked for its form without torch (the config
    check path calls it); one sentence if it is none of auto, cpu, cuda, cuda:<i>, mps."""
    name = "auto" if requested is None or str(requested).strip() == "" else str(requested).strip()
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", name):
        raise ValueError(
            f"device {name!r} is unknown; allowed: auto, cpu, cuda, cuda:<index>, mps."
        )
    return name


def resolve_device(requested: Any) -> str:
    """``auto`` (or None) -> cuda if available else cpu; an unavailable device is a config error."""
    name = check_device_name(requested)
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {name!r} is not available on this machine; use device=cpu or auto."
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(
            f"device {name!r} is not available on this machine; use device=cpu or auto."
        )
    return name


@functools.cache
def forward_takes(model_type: type, keyword: str) -> bool:
    """Whether ``model_type.forward`` has a parameter named ``keyword`` (cached per class: it is
    asked on every forward pass)."""
    return keyword in inspect.signature(model_type.forward).parameters


def autocast(device: str | torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for ``precision="bf16"``, nothing for fp32.

    Weights, optimizer state, RoPE angles and softmax statistics stay float32 either way.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is unknown; allowed: {', '.join(PRECISIONS)}.")
    if precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def cpu_info() -> tuple[str | None, set[str] | None]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; None for what Linux does not show."""
    model, flags = None, None
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None, None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model is None:
            model = value.strip()
        elif key.strip() == "flags" and flags is None:
            flags = set(value.split())
    return model, flags


def machine_summary() -> dict[str, Any]:
    """What a benchmark figure depends on: CPU model and flags, cores, torch threads and version,
    OpenMP wait policy, and the GPU when there is one."""
    model, flags = cpu_info()
    model = model or platform.processor() or platform.machine()
    flags = flags or set()
    summary: dict[str, Any] = {
        "cpu": model,
        "cpu_flags": [f for f in CPU_FLAGS if f in flags],
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        summary["gpu"] = torch.cuda.get_device_name(0)
    return summary


def machine_line(summary: dict[str, Any] | None = None) -> str:
    """``machine_summary`` as one line for a benchmark table."""
    m = summary or machine_summary()
    flags = ",".join(m["cpu_flags"]) or "none of " + ",".join(CPU_FLAGS)
    gpu = f", GPU {m['gpu']}" if "gpu" in m else ""
    return (
        f"{m['cpu']} ({m['cores']} cores; flags {flags}), torch {m['torch']} with "
        f"{m['torch_threads']} threads, OMP_WAIT_POLICY {m['omp_wait_policy']}{gpu}"
    )


def busy_cores(interval: float = 0.25) -> float | None:
    """Cores kept busy by other processes right now: the non-idle share of all cores over
    ``interval`` seconds (/proc/stat), times the core count; None where /proc/stat is absent.
    Call it while this process is idle (e.g. before a job starts), or it counts itself."""

    def sample() -> tuple[int, int] | None:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()
        except (OSError, IndexError):
            return None
        if fields[0] != "cpu":
            return None
        values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
        return sum(values), values[3] + values[4]

    first = sample()
    if first is None:
        return None
    time.sleep(interval)
    second = sample()
    if second is None or second[0] <= first[0]:
        return None
    total, idle = second[0] - first[0], second[1] - first[1]
    return (total - idle) / total * (os.cpu_count() or 1)


def cpu_has_native_bf16() -> bool | None:
    """True/False from the CPU flags (AVX512-BF16 or AMX-BF16) where Linux shows them, else None."""
    _, flags = cpu_info()
    if flags is None:
        return None
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def warn_if_emulated_bf16(device: torch.device, precision: str, stacklevel: int) -> None:
    # stacklevel: the frames up to the caller to name (train_model's, for a training run)
    if precision == "bf16" and device.type == "cpu" and cpu_has_native_bf16() is False:
        warnings.warn(
            "train.precision bf16 on this CPU (no AVX512-BF16/AMX-BF16) runs emulated, measured "
            "12-25x slower than fp32; use train.precision=fp32 here.",
            stacklevel=stacklevel,
        )


def use_cpu_backend() -> bool:
    """accelerate's ``cpu`` flag: True when ``ACCELERATE_USE_CPU`` is set, or when several
    processes were launched (``WORLD_SIZE`` > 1) on a machine without CUDA.

    accelerate only sets up multi-CPU (gloo) DDP when told ``cpu=True``; without it, ranks
    started by ``torchrun`` or ``accelerate launch --multi_gpu`` on a CPU box would each train
    alone. ``bench.train.cache`` uses the same flag so that both create one consistent state.
    """
    if os.environ.get("ACCELERATE_USE_CPU", "").strip().lower() in ("1", "true", "yes"):
        return True
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()


def make_accelerator(accelerator: Any, precision: str) -> Any:
    """An accelerator with ``mixed_precision="no"``: we autocast ourselves, because accelerate's
    process-wide state refuses a second, different mixed_precision (a sweep over precision)."""
    from accelerate import Accelerator

    if accelerator is None:
        return Accelerator(mixed_precision="no", cpu=use_cpu_backend())
    mixed = str(getattr(accelerator, "mixed_precision", "no"))
    wanted = {"fp32": "no", "bf16": "bf16"}[precision]
    if mixed not in ("no", wanted):
        raise ValueError(
            f"the accelerator passed in uses mixed_precision={mixed!r} but train.precision is "
            f"{precision!r}; create it with mixed_precision='no' (train.precision sets autocast) "
            f"or {wanted!r}."
        )
    return accelerator
