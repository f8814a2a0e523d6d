"""Every ``lenbench`` command the README shows composes and validates as a job.

The README's code blocks are parsed; each ``lenbench ...`` line (with ``\\`` continuations) is
composed by Hydra with its overrides (the first value of a sweep list, hydra.* keys with the
Hydra config) and parsed into a typed JobConfig, which is what every job does first: a command
that would stop with an error (a key that does not exist, two options that exclude each other)
fails here. Placeholders in angle brackets are filled with a plausible value.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from bench.schema import JobConfig

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_commands() -> list[str]:
    text = README.read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("lenbench ") or line == "lenbench":
                commands.append(line)
    return commands


def _first(value: str) -> str:
    """The first value of a sweep list ``a,b`` (not of a list literal ``[a,b]``)."""
    return value if value.startswith("[") else value.split(",")[0]


def _overrides(command: str) -> tuple[list[str], list[str]]:
    """(job overrides, hydra overrides) of one command line."""
    args = [os.path.expandvars(a) for a in shlex.split(command)[1:]]  # as the shell does
    job, hydra = [], []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("-m", "--multirun"):
            continue
        if arg == "--cfg":
            skip = True
            continue
        key, _, value = arg.partition("=")
        arg = f"{key}={_first(value)}" if value else arg
        arg = re.sub(r"<[^>]+>", "placeholder", arg)
        (hydra if key.startswith("hydra") else job).append(arg)
    return job, hydra


COMMANDS = readme_commands()


def test_the_readme_shows_commands():
    assert len(COMMANDS) >= 15, COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_composes_and_validates(command: str):
    job, hydra = _overrides(command)
    if not any(a.startswith("+experiment=") for a in job) and command.strip() == "lenbench":
        job = ["+experiment=quickstart"]  # what lenbench with no arguments runs
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=job)
        if hydra:
            compose("config", overrides=[*job, *hydra], return_hydra_config=True)
    JobConfig.from_hydra(cfg)
