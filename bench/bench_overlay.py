"""End-to-end latency and throughput over a 5-broker line: Trellis against 5 Mosquitto brokers
bridged in a line (SPEC §10), and each against one broker of its own.

Publisher at one end, subscriber at the other, 100-byte payloads, 1 -> 1, clients of the same
class on both sides: Trellis's Python SDK, and aiomqtt (paho-mqtt under asyncio, QoS 0) for
Mosquitto; publisher and subscriber share this process's event loop in both cases. Mosquitto
broker i bridges to broker i + 1 (``topic bench/# out 0``): a bridge forwards everything on
its topic pattern, whether anyone downstream subscribed or not, where Trellis routes by the
subscriptions its neighbours announced. Each run measures, per setup:

* latency: one publication at a time, publish to delivery (median and p99);
* throughput: a burst of publications, deliveries / (last delivery - first publish), and any
  the subscriber never got (Mosquitto drops QoS 0 messages it cannot queue);
* broker CPU per delivered message, all brokers of the setup (``/proc/<pid>/stat``), in the
  burst and one at a time.

Setups alternate within a run; the figures are medians over runs. Not a test::

    .venv/bin/python bench/bench_overlay.py [--quick] [--runs N] [--brokers N]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))
sys.path.insert(0, str(BENCH_DIR))

import aiomqtt  # noqa: E402
from peers import PeerProcess, cpu_seconds, free_port, start_mosquitto  # noqa: E402

from broker.client import Client  # noqa: E402
from broker.tools.local import start_overlay  # noqa: E402
from overlay.tree import broker_names, line_tree  # noqa: E402

PAYLOAD = b"x" * 100
HOST = "127.0.0.1"
TOPIC = "bench/line"
READY_SECONDS = 30.0
IDLE_SECONDS = 5.0
"""A burst ends when everything arrived or nothing more did for this long."""

_clients = itertools.count(1)
"""Client ids are fresh per measurement: brokers refuse a publisher id whose numbering
starts again (subscribers deduplicate by publisher and sequence)."""

Get = Callable[[float], Awaitable[object]]
Publish = Callable[[], Awaitable[None]]


async def run_phases(
    publish: Publish, get: Get, pings: int, stream: int, broker_pids: Sequence[int]
) -> dict[str, float]:
    """Latency one at a time, then a burst; the same for every system."""
    latencies = []
    ping_cpu0 = sum(map(cpu_seconds, broker_pids))
    for _ in range(pings):
        t0 = time.perf_counter()
        await publish()
        await get(5.0)
        latencies.append(time.perf_counter() - t0)
    cpu0 = sum(map(cpu_seconds, broker_pids))
    ping_cpu = cpu0 - ping_cpu0
    t0 = time.perf_counter()
    for _ in range(stream):
        await publish()
    got, last = 0, t0
    while got < stream:
        try:
            await get(IDLE_SECONDS)
        except TimeoutError:
            break
        got += 1
        last = time.perf_counter()
    cpu = sum(map(cpu_seconds, broker_pids)) - cpu0
    latencies.sort()
    return {
        "lat_median_us": statistics.median(latencies) * 1e6,
        "lat_p99_us": latencies[max(0, int(len(latencies) * 0.99) - 1)] * 1e6,
        "msg_per_s": got / (last - t0) if got else 0.0,
        "lost": float(stream - got),
        "broker_cpu_us": cpu / max(got, 1) * 1e6,
        "ping_cpu_us": ping_cpu / max(pings, 1) * 1e6,
    }


async def until_flowing(publish: Publish, get: Get) -> None:
    """Publish every 0.2 s until one arrives (the route is up), then drain the rest."""
    deadline = time.monotonic() + READY_SECONDS
    while True:
        await publish()
        try:
            await get(0.2)
            break
        except TimeoutError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing delivered within {READY_SECONDS:g} s") from None
    while True:
        try:
            await get(0.5)
        except TimeoutError:
            return


async def measure_trellis(
    pub_ep: str, sub_ep: str, pings: int, stream: int, broker_pids: Sequence[int]
) -> dict[str, float]:
    n = next(_clients)
    async with (
        Client(pub_ep, client_id=f"bench-pub-{n}") as pub,
        Client(sub_ep, client_id=f"bench-sub-{n}", queue_size=stream + 10) as sc,
        sc.subscribe("class = 'bench'") as sub,
    ):
        await pub.advertise("class = 'bench'")

        async def publish() -> None:
            await pub.publish({"class": "bench"}, PAYLOAD, ack=False)

        await until_flowing(publish, sub.get)
        return await run_phases(publish, sub.get, pings, stream, broker_pids)


async def measure_mosquitto(
    pub_port: int, sub_port: int, pings: int, stream: int, broker_pids: Sequence[int]
) -> dict[str, float]:
    n = next(_clients)
    async with (
        aiomqtt.Client(HOST, pub_port, identifier=f"bench-pub-{n}", timeout=10) as pub,
        aiomqtt.Client(HOST, sub_port, identifier=f"bench-sub-{n}", timeout=10) as sub,
    ):
        await sub.subscribe("bench/#", qos=0)
        messages: AsyncIterator[aiomqtt.Message] = aiter(sub.messages)

        async def get(timeout: float) -> object:
            return await asyncio.wait_for(anext(messages), timeout)

        async def publish() -> None:
            await pub.publish(TOPIC, PAYLOAD, qos=0)

        await until_flowing(publish, get)
        return await run_phases(publish, get, pings, stream, broker_pids)


def start_mosquitto_line(workdir: Path, count: int) -> list[PeerProcess]:
    """``count`` Mosquitto brokers, broker i bridged to broker i + 1 for ``bench/#`` (out)."""
    ports = [free_port(HOST) for _ in range(count)]
    started: list[PeerProcess] = []
    try:
        for i in reversed(range(count)):  # each bridge's far end is up before it
            bridge = (
                ""
                if i == count - 1
                else (
                    f"connection line{i}\naddress {HOST}:{ports[i + 1]}\n"
                    "topic bench/# out 0\ntry_private true\ncleansession true\n"
                    "notifications false\n"
                )
            )
            started.append(start_mosquitto(workdir / f"m{i}", port=ports[i], extra=bridge))
    except BaseException:
        for peer in started:
            peer.stop()
        raise
    return list(reversed(started))


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def report(results: dict[str, list[dict[str, float]]], runs: int, count: int) -> None:
    med = {
        setup: {m: statistics.median(r[m] for r in rows) for m in rows[0]}
        for setup, rows in results.items()
    }
    labels = {
        "trellis-1": "Trellis, 1 broker",
        "trellis-line": f"Trellis, {count}-broker line",
        "mosquitto-1": "Mosquitto, 1 broker",
        "mosquitto-line": f"Mosquitto, {count}-bridge line",
    }
    print(
        f"\n{'setup':<28} {'latency median':>15} {'p99':>10} {'throughput':>14} "
        f"{'lost':>6} {'broker CPU/msg':>15} {'one at a time':>14}"
    )
    for setup, label in labels.items():
        m = med[setup]
        print(
            f"{label:<28} {m['lat_median_us']:>12,.0f} µs {m['lat_p99_us']:>7,.0f} µs "
            f"{m['msg_per_s']:>8,.0f} msg/s {m['lost']:>6.0f} {m['broker_cpu_us']:>12,.1f} µs"
            f"{m['ping_cpu_us']:>11,.0f} µs"
        )
    t, q = med["trellis-line"], med["mosquitto-line"]
    print(
        f"\nSPEC §10, {count}-broker line, Trellis / Mosquitto (medians of {runs} runs): "
        f"latency {ratio(t['lat_median_us'], q['lat_median_us'])} (goal ≤ 1x), "
        f"throughput {ratio(t['msg_per_s'], q['msg_per_s'])} (goal ≥ 1x), "
        f"broker CPU per message {ratio(t['broker_cpu_us'], q['broker_cpu_us'])}"
    )
    for system in ("trellis", "mosquitto"):
        line, one = med[f"{system}-line"], med[f"{system}-1"]
        print(
            f"{system} line / one broker: latency "
            f"{ratio(line['lat_median_us'], one['lat_median_us'])}, throughput "
            f"{ratio(line['msg_per_s'], one['msg_per_s'])}"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one run, fewer messages")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--brokers", type=int, default=5)
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    pings, stream = (200, 5000) if args.quick else (1000, 20000)
    names = broker_names(args.brokers)
    results: dict[str, list[dict[str, float]]] = {
        "trellis-1": [],
        "trellis-line": [],
        "mosquitto-1": [],
        "mosquitto-line": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        overlay = await asyncio.to_thread(start_overlay, Path(tmp) / "trellis", line_tree(names))
        try:
            line = await asyncio.to_thread(start_mosquitto_line, Path(tmp), args.brokers)
            try:
                trellis_pids = [overlay.brokers[n].pid for n in names]
                mosquitto_pids = [peer.pid for peer in line]
                first, last = overlay.endpoint(names[0]), overlay.endpoint(names[-1])
                for run in range(runs):
                    print(f"run {run + 1} of {runs}", flush=True)
                    results["trellis-1"].append(
                        await measure_trellis(first, first, pings, stream, trellis_pids[:1])
                    )
                    results["mosquitto-1"].append(
                        await measure_mosquitto(
                            line[0].port, line[0].port, pings, stream, mosquitto_pids[:1]
                        )
                    )
                    results["trellis-line"].append(
                        await measure_trellis(first, last, pings, stream, trellis_pids)
                    )
                    results["mosquitto-line"].append(
                        await measure_mosquitto(
                            line[0].port, line[-1].port, pings, stream, mosquitto_pids
                        )
                    )
            finally:
                for peer in line:
                    peer.stop()
        finally:
            await asyncio.to_thread(overlay.stop)
    report(results, runs, args.brokers)


if __name__ == "__main__":
    asyncio.run(main())
