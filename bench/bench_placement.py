"""Live replica attach and detach under load (issue 14, must-show 4).

A line b0 - b1 - b2 of VNs with 3 replicas each; a publisher at b0 sends at a steady rate
(every other publication confidential) to a subscriber at b2. In each run one replica
attaches to b1 (3 -> 4) and then detaches again (4 -> 3) with ``trellis placement apply``'s
code, and the script measures how long each change took (until every broker acknowledged
the switch, and for an attach until the new replica linked to all its neighbours) and the
delivery latency (publish to delivery, one clock) before, during and after each change.
The baseline is the same run's latency before any change: the ratios compare with it.
Every run also checks that the subscriber got each publication exactly once, in order.
``--vn b0`` (the publisher's edge VN) or ``--vn b2`` (the subscriber's) resizes an edge VN
instead, whose client follows the change. Not a test:

    .venv/bin/python bench/bench_placement.py [--runs 3] [--rate 100] [--vn b1|b0|b2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.client import Client
from broker.tools.local import start_overlay, stop_overlay
from broker.tools.placement_apply import LocalReplicas
from overlay.tree import line_tree

PHASES = ("before", "attach", "after attach", "detach", "after detach")


@dataclass
class RunResult:
    attach: float
    detach: float
    latency: dict[str, list[float]]
    exact: bool


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def one_run(workdir: Path, rate: float, settle: float, vn: str) -> RunResult:
    overlay = start_overlay(
        workdir, line_tree(["b0", "b1", "b2"]), {}, replicas={"b0": 3, "b1": 3, "b2": 3}
    )
    replicas = LocalReplicas(workdir)
    try:
        pub = Client(overlay.endpoints("b0"), client_id="pub")
        sub = Client(overlay.endpoints("b2"), client_id="sub", manifest=overlay.manifest_path)
        phase = ["before"]
        sent: dict[int, tuple[float, str]] = {}
        latency: dict[str, list[float]] = {p: [] for p in PHASES}
        # (seq, when delivered): a delivery may come before its publish call returns
        received: list[tuple[int, float]] = []
        stop = asyncio.Event()
        async with pub, sub, sub.subscribe("class = 'load'") as subscription:
            await pub.advertise("class = 'load'")
            await asyncio.to_thread(overlay.wait_quiet)

            async def publish() -> None:
                i = 0
                start = time.perf_counter()
                while not stop.is_set() and i < 100_000:
                    at, when = time.perf_counter(), phase[0]
                    seq = await pub.publish(
                        {"class": "load", "i": i}, b"x" * 64, confidential=i % 2 == 0
                    )
                    sent[seq] = (at, when)
                    i += 1
                    await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))

            async def receive() -> None:
                while True:
                    try:
                        msg = await subscription.get(3.0)
                    except Exception:
                        if stop.is_set():
                            return
                        continue
                    received.append((msg.seq, time.perf_counter()))

            def changes() -> tuple[float, float]:
                time.sleep(settle)
                phase[0] = "attach"
                attach = replicas.attach(vn).seconds
                phase[0] = "after attach"
                time.sleep(settle)
                phase[0] = "detach"
                detach = replicas.detach(vn).seconds
                phase[0] = "after detach"
                time.sleep(settle)
                return attach, detach

            tasks = [asyncio.create_task(publish()), asyncio.create_task(receive())]
            try:
                attach, detach = await asyncio.to_thread(changes)
            finally:
                stop.set()
                await asyncio.gather(*tasks)
        for seq, at in received:
            published, when = sent[seq]
            latency[when].append(at - published)
        exact = [seq for seq, _ in received] == sorted(sent)
        return RunResult(attach, detach, latency, exact)
    finally:
        stop_overlay(workdir)
        for proc in replicas.started.values():
            proc.stop()
        overlay.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=100.0, help="publications per second")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds of each steady phase")
    parser.add_argument(
        "--vn",
        choices=("b0", "b1", "b2"),
        default="b1",
        help="the VN resized: b1 forwards only, b0 serves the publisher, b2 the subscriber",
    )
    args = parser.parse_args()
    results = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="trellis-bench-placement-") as tmp:
            result = asyncio.run(one_run(Path(tmp), args.rate, args.settle, args.vn))
        results.append(result)
        lat = result.latency
        print(
            f"run {run + 1}: attach {result.attach:.2f} s, detach {result.detach:.2f} s, "
            f"exact delivery {result.exact}, deliveries "
            + ", ".join(f"{p} {len(lat[p])}" for p in PHASES),
            flush=True,
        )
    attach = statistics.median(r.attach for r in results)
    detach = statistics.median(r.detach for r in results)
    print(
        f"\nmedians of {args.runs} runs at {args.rate:g} publications/s (half confidential), "
        f"resizing {args.vn}:"
    )
    print(f"  time to attach a replica (3 -> 4, until linked): {attach:.2f} s")
    print(f"  time to detach a replica (4 -> 3, until stopped): {detach:.2f} s")
    print("  delivery latency, ms       median     p99   median/before")
    base = None
    for p in PHASES:
        med = statistics.median(quantile(r.latency[p], 0.5) for r in results) * 1000
        p99 = statistics.median(quantile(r.latency[p], 0.99) for r in results) * 1000
        base = base or med
        print(f"  {p:<22} {med:9.1f} {p99:8.1f}   {med / base:6.2f}x")
    print(f"  exact delivery in every run: {all(r.exact for r in results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
