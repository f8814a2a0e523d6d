"""``python -m bench.findings [--check]``: write the registry as Markdown to
``reports/FINDINGS.md`` (:func:`bench.findings.registry.findings_markdown`); with ``--check``,
write nothing and exit 1 if the committed page differs from the registry."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.findings.registry import FINDINGS_PAGE, findings_markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.findings", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(FINDINGS_PAGE), help="the page to write")
    parser.add_argument(
        "--check", action="store_true", help="compare with the page instead of writing it"
    )
    args = parser.parse_args(argv)
    text = findings_markdown()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        if current != text:
            print(f"{args.out} is not the registry's page: run python -m bench.findings.")
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
