"""``python -m bench.report``: the same as the ``lenbench-report`` console script."""

from bench.report.cli import main

raise SystemExit(main())
