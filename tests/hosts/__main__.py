"""Run the fault scenarios on hosts with their own addresses and print the table.

python -m tests.hosts                      # every scenario, full versions
python -m tests.hosts --short kill netem   # some, as CI runs them
"""

from __future__ import annotations

import argparse
import json
import sys

from tests.hosts.net import HostsUnavailable
from tests.hosts.scenarios import SCENARIOS, run_scenario

COLUMNS = (
    "scenario",
    "subscriber",
    "msg/s",
    "published",
    "refused",
    "unconfirmed",
    "delivered",
    "lost",
    "duplicated",
    "reordered",
    "confidential",
    "decrypted",
    "rss+KiB",
    "catch-up s",
    "loss window",
    "faults",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.hosts", description=__doc__)
    parser.add_argument("scenarios", nargs="*", choices=[[], *SCENARIOS], default=[])
    parser.add_argument("--short", action="store_true", help="the short versions CI runs")
    parser.add_argument("--rate", type=float, default=100.0, help="publications per second")
    parser.add_argument("--json", action="store_true", help="one JSON object per scenario")
    args = parser.parse_args(argv)
    rows = []
    for name in args.scenarios or list(SCENARIOS):
        try:
            tally = run_scenario(name, full=not args.short, rate=args.rate)
        except HostsUnavailable as exc:
            print(f"cannot run: {exc}", file=sys.stderr)
            return 2
        for one in [tally, *tally.others.values()]:  # a row per subscriber
            row = {
                "scenario": name,
                "subscriber": one.subscriber,
                **one.row(),
                "rss+KiB by broker": one.rss_growth_kib,
                "rss+KiB curve (s, KiB)": one.rss_curve,
            }
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(" | ".join(f"{c}={row[c]}" for c in COLUMNS), flush=True)
    if not args.json:
        print()
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "---|" * len(COLUMNS))
        for row in rows:
            print("| " + " | ".join(str(row[c]) for c in COLUMNS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
