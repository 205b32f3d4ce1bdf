"""Soak (issue 15): a local overlay under steady mixed load and periodic faults for a long
time, sampled to a CSV, with exact end-to-end accounting at the end. Not a test:

    .venv/bin/python bench/bench_soak.py [--minutes 30] [--rate 40] [--fault-every 180]

The overlay is a line of three VNs ``a - b - c`` of three replicas each (nine broker
processes on loopback, ``broker/tools/local.py``). Two flows run for the whole time:
``a -> c`` at ``--rate``/s, every other publication confidential (AES-GCM, key shares
re-split at every hop), and ``c -> a`` plain at half that rate. Every ``--fault-every``
seconds one replica (replica 1 or 2 of a VN, in turn; replica 0 of each VN is never
killed, so its curve is unbroken) is killed with SIGKILL and restarted ``--down`` seconds
later on the same port.

Every ``--sample`` seconds a row goes to the CSV: per broker RSS (KiB), open file
descriptors and asyncio tasks (``trellis_asyncio_tasks`` from ``/metrics``), and the
latency percentiles (publish to delivery, both flows) of the publications delivered in
that window. At the end the publishers stop, the subscribers drain, and every seq is
accounted for (lost, duplicated, reordered, altered, decrypted), and a summary table gives
start, middle and end values and the slope of each curve over the second half of the run.
A PNG of the curves is written too when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import itertools
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.client import Client, Subscription
from broker.errors import SlowConsumerError, TrellisError, TrellisTimeout
from broker.tools.launcher import run_async
from broker.tools.local import LocalOverlay, fetch_text, start_overlay
from overlay.tree import Tree
from tests.hosts.scenarios import Tally, fd_count, rss_kib

VNS = ("a", "b", "c")
REPLICAS = 3
TASKS = re.compile(r'^trellis_asyncio_tasks\{broker="([^"]+)"\} (\S+)$', re.MULTILINE)


@dataclass
class Flow:
    """One publisher, one subscriber, and what passed between them."""

    name: str
    source: str
    sink: str
    rate: float
    confidential: bool
    tally: Tally = field(default_factory=Tally)
    # publish-to-delivery latencies (s) of the current sampling window
    window: list[float] = field(default_factory=list)

    @property
    def topic(self) -> str:
        return f"class = 'soak' and flow = '{self.name}'"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def publish(pub: Client, flow: Flow, until: float) -> None:
    """Publish at ``flow.rate`` until ``until`` (monotonic); the timestamp rides along."""
    start = time.monotonic()
    for i in itertools.count():
        now = time.monotonic()
        if now >= until:
            break
        await asyncio.sleep(max(0.0, start + i / flow.rate - now))
        conf = flow.confidential and i % 2 == 1
        payload = f"{flow.name} #{i} ".encode().ljust(64, b".")
        attrs = {"class": "soak", "flow": flow.name, "i": i, "t": time.monotonic_ns()}
        try:
            seq = await pub.publish(attrs, payload, ack=False, confidential=conf)
        except TrellisError as exc:
            flow.tally.refused += 1
            why = f"refused: {type(exc).__name__}"
            flow.tally.notes[why] = flow.tally.notes.get(why, 0) + 1
            continue
        flow.tally.sent[seq] = (payload, conf)
        flow.tally.published_at[seq] = time.monotonic()
    flow.tally.seconds = time.monotonic() - start
    flow.tally.stopped = time.monotonic()
    try:
        await pub.flush(timeout=60.0)
    except TrellisError as exc:
        flow.tally.notes["flush"] = type(exc).__name__


async def collect(sub: Subscription, flow: Flow, done: asyncio.Event, settle: float) -> None:
    """Receive until publishing is over and everything arrived, or nothing did for
    ``settle`` seconds."""
    tally = flow.tally
    last = time.monotonic()
    while True:
        now = time.monotonic()
        if done.is_set():
            if tally.sent and len(tally.arrived_at) >= tally.published:
                return
            if now - max(last, tally.stopped or last) > settle:
                return
        try:
            msg = await sub.get(0.5)
        except TrellisTimeout:
            continue
        except SlowConsumerError:
            tally.notes["slow_consumer"] = tally.notes.get("slow_consumer", 0) + 1
            continue
        last = time.monotonic()
        sent_ns = msg.attrs.get("t")
        if isinstance(sent_ns, int):
            flow.window.append((time.monotonic_ns() - sent_ns) / 1e9)
        tally.arrived_at.setdefault(msg.seq, last)
        tally.received.append((msg.seq, msg.payload, msg.confidential))


async def inject_faults(
    overlay: LocalOverlay, every: float, down: float, until: float, events: list[str]
) -> None:
    """Kill -9 one replica (1 or 2 of a VN, in turn) every ``every`` s; restart it after
    ``down`` s on the same port and wait for its links."""
    victims = itertools.cycle([f"{vn}.{r}" for r in (1, 2) for vn in ("b", "c", "a")])
    while True:
        await asyncio.sleep(every)
        if time.monotonic() + down + 30 > until:
            return
        victim = next(victims)
        await asyncio.to_thread(overlay.brokers[victim].kill)
        events.append(f"kill -9 {victim}")
        await asyncio.sleep(down)
        await asyncio.to_thread(overlay.start, victim)
        try:
            await asyncio.to_thread(overlay.wait_linked, 30.0)
            events.append(f"{victim} back")
        except TrellisError as exc:
            events.append(f"{victim} restarted, links not all up: {exc}")


def task_counts(overlay: LocalOverlay) -> dict[str, int]:
    """``trellis_asyncio_tasks`` of every live broker (absent: -1)."""
    counts = {}
    for b, proc in overlay.brokers.items():
        counts[b] = -1
        if not proc.alive():
            continue
        with contextlib.suppress(OSError):
            for broker, value in TASKS.findall(fetch_text(proc.admin_url + "/metrics")):
                if broker == b:
                    counts[b] = int(float(value))
    return counts


async def sample(
    overlay: LocalOverlay,
    flows: list[Flow],
    events: list[str],
    every: float,
    writer: Any,
    rows: list[dict[str, Any]],
) -> None:
    """A CSV row every ``every`` s."""
    begun = time.monotonic()
    brokers = overlay.broker_ids
    for n in itertools.count(1):
        await asyncio.sleep(max(0.0, begun + n * every - time.monotonic()))
        lat = [x for f in flows for x in f.window]
        for f in flows:
            f.window = []
        tasks = await asyncio.to_thread(task_counts, overlay)
        row: dict[str, Any] = {
            "t_s": round(time.monotonic() - begun, 1),
            "load1": round(os.getloadavg()[0], 2),
            **{f"published_{f.name}": f.tally.published for f in flows},
            **{f"delivered_{f.name}": len(f.tally.arrived_at) for f in flows},
            "lat_n": len(lat),
            "lat_p50_ms": round(percentile(lat, 0.50) * 1e3, 2),
            "lat_p90_ms": round(percentile(lat, 0.90) * 1e3, 2),
            "lat_p99_ms": round(percentile(lat, 0.99) * 1e3, 2),
            "lat_max_ms": round(max(lat, default=float("nan")) * 1e3, 2),
        }
        for b in brokers:
            proc = overlay.brokers[b]
            alive = proc.alive()
            row[f"rss_kib_{b}"] = rss_kib(proc.pid) if alive else 0
            row[f"fds_{b}"] = fd_count(proc.pid) if alive else 0
            row[f"tasks_{b}"] = tasks.get(b, -1)
        row["events"] = "; ".join(events)
        events.clear()
        writer.writerow(row)
        rows.append(row)
        print(
            f"t={row['t_s']:>6}s load={row['load1']:<5} p50={row['lat_p50_ms']}ms "
            f"p99={row['lat_p99_ms']}ms rss(a.0,b.0,c.0)="
            f"{row['rss_kib_a.0']},{row['rss_kib_b.0']},{row['rss_kib_c.0']} KiB "
            f"fds(sum)={sum(row[f'fds_{b}'] for b in brokers)} "
            f"tasks(sum)={sum(max(0, row[f'tasks_{b}']) for b in brokers)} {row['events']}",
            flush=True,
        )


def slope_per_10min(rows: list[dict[str, Any]], column: str) -> float:
    """Least-squares slope of ``column`` over the second half of the run, per 10 minutes."""
    half = rows[len(rows) // 2 :]
    xs = [float(r["t_s"]) for r in half]
    ys = [float(r[column]) for r in half]
    if len(xs) < 2:
        return float("nan")
    return statistics.linear_regression(xs, ys).slope * 600


def summary(rows: list[dict[str, Any]], brokers: list[str]) -> list[tuple[str, str, str, str, str]]:
    """(curve, start, middle, end, slope over the second half per 10 min)."""
    for r in rows:
        r["fds_sum"] = sum(r[f"fds_{b}"] for b in brokers)
        r["tasks_sum"] = sum(max(0, r[f"tasks_{b}"]) for b in brokers)
    curves = [
        *(f"rss_kib_{vn}.0" for vn in VNS),
        "fds_sum",
        "tasks_sum",
        "lat_p50_ms",
        "lat_p99_ms",
        "load1",
    ]
    first, middle, last = rows[0], rows[len(rows) // 2], rows[-1]
    return [
        (c, str(first[c]), str(middle[c]), str(last[c]), f"{slope_per_10min(rows, c):+.2f}")
        for c in curves
    ]


def plot(rows: list[dict[str, Any]], brokers: list[str], path: Path) -> bool:
    """A PNG of the curves, when matplotlib is installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    t = [r["t_s"] / 60 for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(10, 12), sharex=True)
    for b in brokers:
        axes[0].plot(t, [r[f"rss_kib_{b}"] / 1024 for r in rows], label=b)
        axes[1].plot(t, [r[f"fds_{b}"] for r in rows], label=b)
        axes[2].plot(t, [r[f"tasks_{b}"] for r in rows], label=b)
    for q in ("p50", "p90", "p99"):
        axes[3].plot(t, [r[f"lat_{q}_ms"] for r in rows], label=q)
    for ax, name in zip(axes, ("RSS MiB", "fds", "asyncio tasks", "latency ms"), strict=True):
        ax.set_ylabel(name)
        ax.legend(fontsize=6, ncol=5)
    axes[3].set_xlabel("minutes")
    fig.savefig(path, dpi=80)
    return True


async def soak(args: argparse.Namespace, workdir: Path) -> int:
    tree = Tree(VNS, [("a", "b"), ("b", "c")])
    overlay = await asyncio.to_thread(
        start_overlay, workdir, tree, {}, replicas=dict.fromkeys(VNS, REPLICAS)
    )
    try:
        return await run(args, overlay)
    finally:
        await asyncio.to_thread(overlay.stop)


async def run(args: argparse.Namespace, overlay: LocalOverlay) -> int:
    flows = [
        Flow("ac", "a", "c", args.rate, confidential=True),
        Flow("ca", "c", "a", args.rate / 2, confidential=False),
    ]
    out = Path(args.out)
    events: list[str] = []
    rows: list[dict[str, Any]] = []
    brokers = overlay.broker_ids
    clients = []
    for f in flows:
        pub = Client(overlay.endpoints(f.source), client_id=f"soak-{f.name}", request_timeout=20)
        sub = Client(
            overlay.endpoints(f.sink), client_id=f"soak-{f.name}-sub", manifest=overlay.manifest
        )
        clients.append((f, pub, sub))
    async with contextlib.AsyncExitStack() as stack:
        subs = {}
        for f, pub, sub in clients:
            await stack.enter_async_context(pub)
            await stack.enter_async_context(sub)
            subs[f.name] = await stack.enter_async_context(sub.subscribe(f.topic))
            await pub.advertise(f.topic)
        columns = [
            "t_s",
            "load1",
            *(f"published_{f.name}" for f in flows),
            *(f"delivered_{f.name}" for f in flows),
            "lat_n",
            "lat_p50_ms",
            "lat_p90_ms",
            "lat_p99_ms",
            "lat_max_ms",
            *(f"{m}_{b}" for b in brokers for m in ("rss_kib", "fds", "tasks")),
            "events",
        ]
        start = time.monotonic()
        until = start + args.minutes * 60
        print(
            f"soak: {len(brokers)} brokers, flows a->c {args.rate:g}/s (half confidential) and "
            f"c->a {args.rate / 2:g}/s plain, {args.minutes:g} min, a replica killed every "
            f"{args.fault_every:g} s for {args.down:g} s; CSV {out}",
            flush=True,
        )
        handle = await asyncio.to_thread(out.open, "w", newline="")
        with handle:
            writer = csv.DictWriter(handle, columns)
            writer.writeheader()
            done = asyncio.Event()
            async with asyncio.TaskGroup() as tg:
                sampler = tg.create_task(sample(overlay, flows, events, args.sample, writer, rows))
                faults = tg.create_task(
                    inject_faults(overlay, args.fault_every, args.down, until, events)
                )
                collectors = [
                    tg.create_task(collect(subs[f.name], f, done, settle=30.0)) for f in flows
                ]
                publishers = [tg.create_task(publish(pub, f, until)) for f, pub, _ in clients]
                await asyncio.gather(*publishers)
                done.set()
                await asyncio.gather(*collectors)
                faults.cancel()
                sampler.cancel()
    print()
    print(
        "| flow | load held | published | refused | delivered | lost | duplicated "
        "| reordered | altered | confidential → decrypted |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for f in flows:
        t = f.tally
        print(
            f"| {f.source} → {f.sink} | {t.rate:.1f} msg/s for {t.seconds:.0f} s | "
            f"{t.published} | {t.refused} | {t.delivered} | {t.lost} | {t.duplicated} | "
            f"{t.reordered} | {t.altered} | {t.confidential} → {t.decrypted} |"
        )
        if t.notes:
            print(f"  notes: {t.notes}")
    kills = sum(1 for r in rows for e in r["events"].split("; ") if e.startswith("kill"))
    print(f"\nfaults: {kills} replicas killed with SIGKILL and restarted")
    print("\n| curve | start | middle | end | slope, 2nd half, per 10 min |")
    print("|---|---|---|---|---|")
    for c, a, m, e, s in summary(rows, brokers):
        print(f"| {c} | {a} | {m} | {e} | {s} |")
    png = out.with_suffix(".png")
    print(f"\nplot: {png}" if plot(rows, brokers, png) else "\n(no matplotlib: no plot)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=40.0, help="a -> c msg/s (c -> a: half)")
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between CSV rows")
    parser.add_argument("--fault-every", type=float, default=180.0)
    parser.add_argument(
        "--down", type=float, default=10.0, help="seconds a killed replica stays down"
    )
    parser.add_argument("--out", default="soak.csv", help="the CSV (a PNG beside it)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trellis-soak-") as tmp:
        return run_async(soak(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
