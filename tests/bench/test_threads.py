"""The job's default torch thread count: one per core, minus cores other processes keep busy."""

from __future__ import annotations

import pytest
import torch

import bench.job as job_module
from bench.core.runtime import busy_cores


@pytest.fixture
def two_core_default(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(job_module, "default_threads", lambda: 2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    "busy,threads",
    [(None, 2), (0.0, 2), (0.4, 2), (0.6, 1), (1.0, 1), (1.9, 1)],
)
def test_default_threads_leave_the_busy_cores_alone(two_core_default, monkeypatch, busy, threads):
    monkeypatch.setattr(job_module, "busy_cores", lambda: busy)
    assert job_module.configure_threads(None) == threads
    assert torch.get_num_threads() == threads


def test_explicit_threads_win_over_the_load(two_core_default, monkeypatch):
    monkeypatch.setattr(job_module, "busy_cores", lambda: 1.0)
    assert job_module.configure_threads(2) == 2 and torch.get_num_threads() == 2


def test_busy_cores_sees_a_busy_process():
    import subprocess
    import sys

    idle = busy_cores(0.3)
    if idle is None:
        pytest.skip("no /proc/stat on this system")
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)
        loaded = busy_cores(0.5)
    finally:
        spin.kill()
        spin.wait()
    assert loaded is not None and loaded >= 0.7, (idle, loaded)  # one spinning process ~ 1 core
