"""``python -m bench.harness`` = ``lenbench-harness``."""

from bench.harness.cli import main

main()
