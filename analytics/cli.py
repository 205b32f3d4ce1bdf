"""``trellis analytics``: the traffic-log job from the command line.

``trellis analytics run --logs DIR --out DIR [--window 60s] [--master local[*]] [--json]``
runs :mod:`analytics.job` (Spark local mode by default), shows progress on stderr and prints
a short summary (or the JSON summary with ``--json``). ``trellis analytics export --logs DIR``
prints the logs as JSON Lines (the flat records of the schema). The ``trellis`` command runs
this module as ``python -m analytics.cli`` so that no other command loads PySpark.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from analytics.job import add_arguments, log_directory, run_cli


def build_parser() -> argparse.ArgumentParser:
    """The ``trellis analytics`` parser."""
    parser = argparse.ArgumentParser(
        prog="trellis analytics", description="traffic-log analytics on Spark (SPEC §7)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="compute traffic classes, local views, failures and trust feedback per window",
    )
    add_arguments(run)
    export = sub.add_parser("export", help="print traffic logs as JSON Lines (flat records)")
    export.add_argument(
        "--logs", type=log_directory, required=True, help="traffic-log directory (searched deeply)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2: bad arguments or no logs)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "export":
            from analytics.schema import export_jsonl

            export_jsonl(args.logs, sys.stdout)
            return 0
        return run_cli(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
