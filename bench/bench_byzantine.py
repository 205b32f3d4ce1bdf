"""Exact delivery under Byzantine replicas, in a loop (issue 11, must-show 1).

For each configuration a line of three VNs of real broker processes starts once; then, for
``--runs`` rounds, a fresh publisher at the first VN runs the issue's two reproductions
against a subscriber on every replica of the last VN: 50 plain publications at 50/s, and
80 with every fourth plain and the rest confidential (the SDK's default key refresh). The
configurations put one replica of every VN in each fault mode with r = 3 (so the fault sits
at the publisher's edge, in the middle and at the subscriber's edge at once), and two of
five per VN with r = 5 (f = 2), in three mixed pairs and in each mode twice (two replicas
altering alike send identical bad copies, still fewer than f + 1), and one replica of every
VN that stops reading its links (``stall``). Every run's deliveries
are compared with what was published: altered, lost, duplicated and reordered publications
are counted.
Not a test:

    .venv/bin/python bench/bench_byzantine.py [--runs 20] [--only corrupt] [--share-form pass]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.tools.local import start_overlay
from overlay.tree import broker_names, line_tree
from tests.support import exact_exchange
from tests.system.test_byzantine_delivery import MODES, bad_replicas

CONFIGS: list[tuple[str, int, list[str]]] = [
    *((mode, 3, [mode]) for mode in MODES),
    ("stall", 3, ["stall"]),  # reads nothing of its links once a publication came
    ("r5: corrupt+replay", 5, ["corrupt", "replay"]),
    ("r5: equivocate+delay", 5, ["equivocate", "delay"]),
    ("r5: drop+reorder", 5, ["drop", "reorder"]),
    *((f"r5: {mode} x2", 5, [mode, mode]) for mode in MODES),
]


async def _runs(overlay: object, runs: int, share_form: str) -> tuple[Counter[str], int]:
    totals: Counter[str] = Counter()
    published = 0
    for run in range(runs):
        for name, count, plain_every, rate in (("plain", 50, 1, 50.0), ("mixed", 80, 4, 100.0)):
            exchange = await exact_exchange(
                overlay,  # type: ignore[arg-type]
                f"{name}-{run}",
                count,
                plain_every=plain_every,
                rate=rate,
                share_form=share_form,
            )
            totals.update(exchange.faults())
            published += len(exchange.sent)
    return totals, published


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="rounds per configuration")
    parser.add_argument("--only", help="run the configurations whose name contains this")
    parser.add_argument(
        "--share-form",
        choices=("record", "pass"),
        default="pass",
        help="how the publishers' key shares travel (Client share_form)",
    )
    args = parser.parse_args()
    print(f"key shares by the {args.share_form}")
    names = broker_names(3)
    print(
        f"{'configuration':<22} {'runs':>4} {'published':>9} {'altered':>7} {'lost':>5} "
        f"{'dup':>4} {'reord':>5} {'seconds':>7}"
    )
    bad = 0
    for label, replicas, modes in CONFIGS:
        if args.only and args.only not in label:
            continue
        with tempfile.TemporaryDirectory(prefix="trellis-byz-") as tmp:
            overlay = start_overlay(
                Path(tmp),
                line_tree(names),
                {"heartbeat_interval": 1.0},
                replicas=dict.fromkeys(names, replicas),
                overrides=bad_replicas(modes, replicas),
            )
            started = time.monotonic()
            try:
                totals, published = asyncio.run(_runs(overlay, args.runs, args.share_form))
            finally:
                overlay.stop()
        bad += sum(totals.values())
        print(
            f"{label:<22} {args.runs:>4} {published:>9} {totals['altered']:>7} "
            f"{totals['lost']:>5} {totals['duplicated']:>4} {totals['reordered']:>5} "
            f"{time.monotonic() - started:>7.1f}",
            flush=True,
        )
    print("all exact" if bad == 0 else f"{bad} faulty deliveries")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
