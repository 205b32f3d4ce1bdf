"""Overload (issue 15): each kind of overload against a real overlay of two brokers
``a - b``, with the limit that bounds it, and a witness client that must keep being served.
Not a test:

    .venv/bin/python bench/bench_overload.py [--runs 3] [CASE ...]

Cases (the load always enters at broker ``a``):

* ``slow-drop``, ``slow-disconnect``: a subscriber that never reads while a publisher
  streams 4 KiB publications to it and to a subscriber that reads (``slow_consumer`` =
  ``drop``, the default, or ``disconnect``);
* ``flood``: a publisher writing PUBLISH frames as fast as its socket takes them;
* ``sub-storm-one``: 100,000 subscriptions in one burst from one client (default
  ``max_subscriptions_per_client``: 10,000 accepted), ``sub-storm-one-raised`` the same with
  the limit at 100,000, ``sub-storm-many``: 100 clients × 1,000 at once; nothing at ``b``
  wants them, so they stay at ``a``; ``sub-storm-wanted-N``: N subscriptions that a
  publisher at ``b`` wants, so each crosses the link (and is checked for covering against
  every one forwarded before it: quadratic);
* ``adv-storm-one``, ``adv-storm-many``: the same with advertisements (flooded to ``b``);
* ``many-publishers``: 1,000 connections publishing 1 msg/s each for 20 s to one subscriber.

Per case it prints the load held, both brokers' RSS before / peak during / after, the
witness's publish-to-delivery round trip (median) alone and under the load (and the
ratio; under the load also its p99 and its longest: a stall is one long round trip, which
a median or a percentile of round trips hides), and what was dropped or refused. The load
runs in a child process (this script, ``--load CASE``) so that the witness, in this one,
is not slowed by the load generator.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.client import Client
from broker.errors import SlowConsumerError, TrellisTimeout
from broker.language.grammar import parse_filter
from broker.tools.launcher import run_async
from broker.tools.local import LocalOverlay, fetch_json, start_overlay
from broker.wire.protocol import Advertise, Ping, encode
from overlay.tree import Tree
from tests.fuzz_wire import Witness
from tests.overload import (
    Flooder,
    MemoryWatch,
    Stalled,
    StormResult,
    hello,
    median_ms,
    quantile,
    round_trips,
    storm,
)

CASES: dict[str, dict[str, Any]] = {
    "slow-drop": {"settings": {}},
    "slow-disconnect": {"settings": {"slow_consumer": "disconnect"}},
    "flood": {"settings": {}},
    "sub-storm-one": {"settings": {}, "kind": "sub", "clients": 1, "each": 100_000},
    "sub-storm-one-raised": {
        "settings": {"max_subscriptions_per_client": 100_000},
        "kind": "sub",
        "clients": 1,
        "each": 100_000,
    },
    "sub-storm-many": {"settings": {}, "kind": "sub", "clients": 100, "each": 1000},
    # The same subscriptions wanted across the link (a publisher at b advertises them all):
    # each is forwarded to b, after a covering check against every one forwarded before.
    "sub-storm-wanted-500": {"settings": {}, "kind": "sub", "clients": 1, "each": 500, "want": 1},
    "sub-storm-wanted-1000": {
        "settings": {},
        "kind": "sub",
        "clients": 1,
        "each": 1000,
        "want": 1,
    },
    "adv-storm-one": {"settings": {}, "kind": "adv", "clients": 1, "each": 100_000},
    "adv-storm-many": {"settings": {}, "kind": "adv", "clients": 100, "each": 1000},
    "many-publishers": {"settings": {}},
}


# -- the load (child process) -----------------------------------------------------------


async def load_stream(endpoint: str, count: int) -> dict[str, Any]:
    host, _, port = endpoint.rpartition(":")
    stalled = Stalled(host, int(port), "stalled", "class = 'stream'")
    received = 0
    slow = 0
    start = time.monotonic()
    async with (
        Client(endpoint, client_id="streamer") as pub,
        Client(endpoint, client_id="reader") as sub_client,
        sub_client.subscribe("class = 'stream'", queue_size=count + 10) as sub,
    ):
        await pub.advertise("class = 'stream'")

        async def read() -> None:
            nonlocal received, slow
            while received < count:
                try:
                    await sub.get(5.0)
                except SlowConsumerError:
                    slow += 1
                    continue
                except TrellisTimeout:
                    return
                received += 1

        reader = asyncio.create_task(read())
        for i in range(count):
            await pub.publish({"class": "stream", "i": i}, b"s" * 4096, ack=i % 20 == 19)
        await pub.flush(timeout=60.0)
        seconds = time.monotonic() - start
        await reader
    frames = await asyncio.to_thread(stalled.read_rest, 10.0)
    stalled.close()
    last = frames[-1] if frames else None
    return {
        "published": count,
        "msg/s": round(count / seconds),
        "reader got": received,
        "reader slow-consumer errors": slow,
        "stalled got": sum(1 for m in frames if type(m).__name__ == "Deliver"),
        "stalled's last frame": getattr(last, "code", type(last).__name__),
    }


def load_flood(endpoint: str, seconds: float) -> dict[str, Any]:
    host, _, port = endpoint.rpartition(":")
    flooder = Flooder(host, int(port), "flooder", "class = 'flood'")
    flooder.start()
    time.sleep(seconds)
    rate = flooder.finish()
    return {"published (written to TCP)": flooder.sent, "msg/s": round(rate)}


def load_storm(endpoint: str, kind: str, clients: int, each: int) -> dict[str, Any]:
    host, _, port = endpoint.rpartition(":")
    from concurrent.futures import ThreadPoolExecutor

    start = time.monotonic()
    failed: list[str] = []

    def one(i: int) -> StormResult:
        try:
            return storm(host, int(port), f"storm-{i}", each, kind, timeout=300.0)[0]
        except OSError as exc:  # e.g. no WELCOME within 10 s: the broker was busy
            failed.append(type(exc).__name__)
            return StormResult(sent=each)

    with ThreadPoolExecutor(max_workers=min(clients, 100)) as pool:
        results = list(pool.map(one, range(clients)))
    seconds = time.monotonic() - start
    acked = sum(r.acked for r in results)
    errors: dict[str, int] = {}
    for r in results:
        for code, n in r.errors.items():
            errors[code] = errors.get(code, 0) + n
    return {
        "sent": clients * each,
        "acked": acked,
        "refused": errors,
        "seconds": round(seconds, 1),
        "answered/s": round((acked + sum(errors.values())) / seconds),
        "clients that failed": dict(Counter(failed)),
    }


async def load_many(endpoint: str, publishers: int, seconds: float) -> dict[str, Any]:
    clients = [Client(endpoint, client_id=f"small-{i}") for i in range(publishers)]
    got: set[tuple[str, int]] = set()
    sent = 0
    async with (
        Client(endpoint, client_id="all") as sub_client,
        sub_client.subscribe("class = 'small'", queue_size=100_000) as sub,
        contextlib.AsyncExitStack() as stack,
    ):
        opened = time.monotonic()
        for pub in clients:
            await stack.enter_async_context(pub)
            await pub.advertise("class = 'small'")
        opened = time.monotonic() - opened

        async def trickle(pub: Client, offset: float) -> None:
            nonlocal sent
            await asyncio.sleep(offset)
            for i in range(int(seconds)):
                await pub.publish({"class": "small", "i": i}, b"x" * 64, ack=False)
                sent += 1
                await asyncio.sleep(1.0)

        async def collect() -> None:
            while True:
                try:
                    d = await sub.get(5.0)
                except TrellisTimeout:
                    return
                got.add((d.publisher, d.seq))

        collector = asyncio.create_task(collect())
        start = time.monotonic()
        await asyncio.gather(*(trickle(p, i / publishers) for i, p in enumerate(clients)))
        rate = sent / (time.monotonic() - start)
        await collector
    return {
        "connections opened in s": round(opened, 1),
        "published": sent,
        "msg/s": round(rate),
        "delivered": len(got),
    }


def run_load(args: argparse.Namespace) -> int:
    case = CASES[args.load]
    if args.load.startswith("slow"):
        out = run_async(load_stream(args.endpoint, 5000))
    elif args.load == "flood":
        out = load_flood(args.endpoint, 8.0)
    elif "storm" in args.load:
        out = load_storm(args.endpoint, case["kind"], case["clients"], case["each"])
    else:
        out = run_async(load_many(args.endpoint, 1000, 20.0))
    print(json.dumps(out), flush=True)
    return 0


# -- one case (parent process) ----------------------------------------------------------


def measure(case: str, workdir: Path) -> dict[str, Any]:
    spec = CASES[case]
    overlay: LocalOverlay = start_overlay(
        workdir, Tree(("a", "b"), [("a", "b")]), {"shutdown_timeout": 1.0, **spec["settings"]}
    )
    wanter: Pinging | None = None
    try:
        a, b = overlay.brokers["a"], overlay.brokers["b"]
        witness = Witness(a.host, a.port)
        alone = round_trips(witness, 200)
        if spec.get("want"):
            # A publisher at b that wants every stormed subscription (each crosses a - b).
            wanter = Pinging(hello(b.host, b.port, "wanter"))
            wanter.sock.sendall(encode(Advertise(0, "all", parse_filter("class = 'storm'"))))
        watch = MemoryWatch([a.pid, b.pid])
        load = subprocess.Popen(
            [sys.executable, __file__, "--load", case, "--endpoint", a.endpoint],
            stdout=subprocess.PIPE,
            text=True,
        )
        under: list[float] = []
        while load.poll() is None:
            under += round_trips(witness, 20)
            time.sleep(0.01)
        out, _ = load.communicate(timeout=600)
        result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"load": "failed"}
        if spec.get("want") or spec.get("kind") == "adv":  # until b holds what a does
            begun = time.monotonic()
            key = "prt" if spec["kind"] == "sub" else "srt"
            while time.monotonic() < begun + 120:
                ha, hb = (
                    fetch_json(a.admin_url + "/healthz", 30),
                    fetch_json(b.admin_url + "/healthz", 30),
                )
                if hb[key] >= ha[key] - 2:
                    break
                time.sleep(0.5)
            result["b caught up s after the burst"] = round(time.monotonic() - begun, 1)
            result["tables a (srt, prt)"] = (ha["srt"], ha["prt"])
            result["tables b (srt, prt)"] = (hb["srt"], hb["prt"])
        memory = watch.finish()
        after = round_trips(witness, 200)
        traffic = fetch_json(a.admin_url + "/api/topology", 30)["traffic"]
        witness.close()
        result.update(
            {
                "rss a KiB before/peak/after": memory[a.pid],
                "rss b KiB before/peak/after": memory[b.pid],
                "witness ms alone": round(median_ms(alone), 3),
                "witness ms under load": round(median_ms(under), 3),
                "witness n under load": len(under),
                "witness p99 ms under load": round(quantile(under, 0.99) * 1e3, 1),
                "witness max ms under load": round(max(under, default=0) * 1e3, 1),
                "witness ms after": round(median_ms(after), 3),
                "ratio": round(median_ms(under) / median_ms(alone), 1),
                "dropped deliveries": traffic["deliveries_dropped"],
                "slow consumers closed": traffic["slow_consumers_closed"],
                "over limit": traffic["over_limit"],
            }
        )
        return result
    finally:
        if wanter is not None:
            wanter.close()
        overlay.stop()


class Pinging:
    """A raw client connection kept alive by a PING a second (it reads nothing)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._ping, daemon=True)
        self.thread.start()

    def _ping(self) -> None:
        while not self.stop.wait(1.0):
            with contextlib.suppress(OSError):
                self.sock.sendall(encode(Ping(0)))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", default=list(CASES), help=", ".join(CASES))
    parser.add_argument("--runs", type=int, default=1, help="runs per case (medians printed)")
    parser.add_argument("--load", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        return run_load(args)
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"no case {', '.join(unknown)}; the cases are {', '.join(CASES)}")
    for case in args.cases:
        runs = []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="trellis-overload-") as tmp:
                result = measure(case, Path(tmp))
            runs.append(result)
            print(f"{case} run {i + 1}: {json.dumps(result)}", flush=True)
        if args.runs > 1:
            ratios = [r["ratio"] for r in runs]
            under = [r["witness ms under load"] for r in runs]
            p99 = [r["witness p99 ms under load"] for r in runs]
            worst = [r["witness max ms under load"] for r in runs]
            print(
                f"{case} median of {args.runs}: witness under load {statistics.median(under)} ms, "
                f"p99 {statistics.median(p99)} ms, max {statistics.median(worst)} ms, "
                f"ratio {statistics.median(ratios)}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
