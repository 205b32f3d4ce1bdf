"""End-to-end latency and throughput over a 5-broker line versus a single broker.

Publisher at one end, subscriber at the other, 100-byte payloads, 1 -> 1; the same client
code against one broker is the peer measured in the same run. Not a test:

    .venv/bin/python bench/bench_overlay.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.client import Client
from broker.tools.local import start_overlay
from overlay.tree import broker_names, line_tree

PAYLOAD = b"x" * 100


async def measure(pub_ep: str, sub_ep: str, pings: int, stream: int) -> dict[str, float]:
    async with (
        Client(pub_ep, client_id="bench-pub") as pub,
        Client(sub_ep, client_id="bench-sub", queue_size=stream + 10) as sc,
        sc.subscribe("class = 'bench'") as sub,
    ):
        await pub.advertise("class = 'bench'")
        # Wait for the subscription to reach the publisher's broker.
        while True:
            await pub.publish({"class": "bench", "warm": 1}, PAYLOAD)
            try:
                await sub.get(0.2)
                break
            except Exception:
                continue
        while sub.pending:
            await sub.get(1)
        latencies = []
        for _ in range(pings):
            t0 = time.perf_counter()
            await pub.publish({"class": "bench"}, PAYLOAD, ack=False)
            await sub.get(5)
            latencies.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(stream):
            await pub.publish({"class": "bench"}, PAYLOAD, ack=False)
        for _ in range(stream):
            await sub.get(30)
        elapsed = time.perf_counter() - t0
    latencies.sort()
    return {
        "lat_median_us": statistics.median(latencies) * 1e6,
        "lat_p99_us": latencies[int(len(latencies) * 0.99) - 1] * 1e6,
        "msg_per_s": stream / elapsed,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--brokers", type=int, default=5)
    args = parser.parse_args()
    runs = 1 if args.quick else 3
    pings, stream = (200, 5000) if args.quick else (1000, 20000)
    names = broker_names(args.brokers)
    results: dict[str, list[dict[str, float]]] = {"line": [], "single": []}
    with tempfile.TemporaryDirectory() as tmp:
        overlay = await asyncio.to_thread(start_overlay, Path(tmp), line_tree(names))
        try:
            for _ in range(runs):
                results["single"].append(
                    await measure(
                        overlay.endpoint(names[0]), overlay.endpoint(names[0]), pings, stream
                    )
                )
                results["line"].append(
                    await measure(
                        overlay.endpoint(names[0]), overlay.endpoint(names[-1]), pings, stream
                    )
                )
        finally:
            await asyncio.to_thread(overlay.stop)
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in results.items()}
    print(f"{'setup':<22} {'latency median':>15} {'p99':>10} {'throughput':>14}")
    for key, label in (("single", "1 broker"), ("line", f"{args.brokers}-broker line")):
        m = med[key]
        print(
            f"{label:<22} {m['lat_median_us']:>12.0f} µs {m['lat_p99_us']:>7.0f} µs "
            f"{m['msg_per_s']:>10,.0f} msg/s"
        )
    line, single = med["line"], med["single"]
    print(
        f"ratio line/single: latency {line['lat_median_us'] / single['lat_median_us']:.2f}x, "
        f"throughput {line['msg_per_s'] / single['msg_per_s']:.2f}x "
        f"(medians of {runs} runs)"
    )


if __name__ == "__main__":
    asyncio.run(main())
