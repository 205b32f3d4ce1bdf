"""Fault scenarios on hosts with their own addresses, with exact accounting.

Each scenario starts a line of three VNs ``a - b - c`` of three replicas each (f = 1), nine
broker hosts, in namespaces of a fresh :class:`~tests.hosts.net.Network`; a publisher on
``a`` publishes at a steady rate for ``duration`` seconds, alternating plain and
confidential publications, while the scenario's faults run; a subscriber on ``c`` collects
what it is delivered. The :class:`Tally` then compares, seq by seq, what was published
with what was delivered.

The same code runs the short versions in CI (``tests/hosts/test_faults.py``) and the full
versions from the command line (``python -m tests.hosts``, or ``bench/bench_reliability.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.client import Client
from broker.errors import SlowConsumerError, TrellisError, TrellisTimeout
from overlay.tree import Tree
from tests.hosts.net import HostOverlay, Network, start_host_overlay

VNS = ("a", "b", "c")
REPLICAS = 3
TOPIC = "class = 'rel'"


@dataclass
class Tally:
    """What was published and what the subscriber got, compared exactly."""

    sent: dict[int, tuple[bytes, bool]] = field(default_factory=dict)  # seq -> (payload, conf)
    refused: int = 0  # publish() raised: the publisher knows these did not go out
    received: list[tuple[int, bytes, bool]] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    seconds: float = 0.0
    stopped: float | None = None  # monotonic time publishing stopped
    fault_start: float | None = None  # monotonic time the first fault was injected
    fault_over: float | None = None  # monotonic time the last fault ended (heal, restart)
    published_at: dict[int, float] = field(default_factory=dict)
    arrived_at: dict[int, float] = field(default_factory=dict)  # first arrival per seq
    peak_rss_growth_kib: int = 0
    # (seconds since the start, largest RSS growth of any original broker), every 10 s
    rss_curve: list[tuple[int, int]] = field(default_factory=list)
    rss_growth_kib: dict[str, int] = field(default_factory=dict)  # peak, per broker
    fd_growth: int = 0
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def published(self) -> int:
        return len(self.sent)

    @property
    def delivered(self) -> int:
        """Distinct published seqs delivered."""
        return len({seq for seq, _, _ in self.received} & set(self.sent))

    @property
    def duplicated(self) -> int:
        return len(self.received) - len({seq for seq, _, _ in self.received})

    @property
    def reordered(self) -> int:
        seqs = [seq for seq, _, _ in self.received]
        return sum(1 for x, y in itertools.pairwise(seqs) if y <= x)

    @property
    def unconfirmed(self) -> int:
        """Delivered publications whose publish() raised (the publisher was told it may
        have failed; the seq it had taken was delivered all the same)."""
        return len({seq for seq, _, _ in self.received} - set(self.sent))

    @property
    def lost(self) -> int:
        return len(set(self.sent) - {seq for seq, _, _ in self.received})

    @property
    def altered(self) -> int:
        return sum(1 for seq, p, _ in self.received if self.sent.get(seq, (None,))[0] != p)

    @property
    def confidential(self) -> int:
        return sum(1 for _, conf in self.sent.values() if conf)

    @property
    def decrypted(self) -> int:
        """Confidential publications delivered with the payload byte for byte as published."""
        return len(
            {seq for seq, p, conf in self.received if conf and self.sent.get(seq) == (p, True)}
        )

    @property
    def rate(self) -> float:
        return self.published / self.seconds if self.seconds else 0.0

    @property
    def catch_up(self) -> float | None:
        """Seconds from the end of the last fault until every publication published before
        it that arrived at all had arrived."""
        if self.fault_over is None:
            return None
        before = [
            self.arrived_at[seq]
            for seq, t in self.published_at.items()
            if t <= self.fault_over and seq in self.arrived_at
        ]
        return round(max([0.0, *(t - self.fault_over for t in before)]), 1)

    @property
    def rate_during_fault(self) -> float | None:
        """Publications per second the publisher got out while the fault lasted."""
        if self.fault_start is None or self.fault_over is None:
            return None
        span = self.fault_over - self.fault_start
        n = sum(1 for t in self.published_at.values() if self.fault_start <= t <= self.fault_over)
        return round(n / span, 1) if span > 0 else None

    @property
    def loss_window(self) -> str:
        """When the lost publications were published, in seconds from the fault's start."""
        lost = [self.published_at[s] for s in set(self.sent) - set(self.arrived_at)]
        if not lost or self.fault_start is None:
            return "-"
        return f"{min(lost) - self.fault_start:+.1f}..{max(lost) - self.fault_start:+.1f} s"

    def row(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "refused": self.refused,
            "unconfirmed": self.unconfirmed,
            "delivered": self.delivered,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "reordered": self.reordered,
            "altered": self.altered,
            "confidential": self.confidential,
            "decrypted": self.decrypted,
            "msg/s": round(self.rate, 1),
            "msg/s during fault": self.rate_during_fault,
            "rss+KiB": self.peak_rss_growth_kib,
            "fd+": self.fd_growth,
            "catch-up s": self.catch_up,
            "loss window": self.loss_window,
            "faults": "; ".join(self.faults),
            **self.notes,
        }


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def fd_count(pid: int) -> int:
    try:
        return len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except OSError:
        return 0


Faults = Callable[[HostOverlay, Network, Tally], Awaitable[None]]


async def exchange(
    overlay: HostOverlay,
    network: Network,
    faults: Faults,
    *,
    duration: float,
    rate: float,
    settle: float = 30.0,
    size: int = 48,
    confidential: bool = True,
) -> Tally:
    """Publish for ``duration`` s at ``rate``/s while ``faults`` runs (payloads of about
    ``size`` bytes; every other one confidential unless ``confidential`` is False), then
    collect until everything arrived or nothing did for ``settle`` s."""
    tally = Tally()
    pub = Client(overlay.endpoints(VNS[0]), client_id="steady", request_timeout=20.0)
    sub_client = Client(overlay.endpoints(VNS[-1]), manifest=overlay.manifest)
    pids = {b: p.pid for b, p in overlay.brokers.items()}
    rss0 = {b: rss_kib(pid) for b, pid in pids.items()}
    fds0 = {b: fd_count(pid) for b, pid in pids.items()}
    peak = 0
    async with pub, sub_client, sub_client.subscribe(TOPIC) as sub:
        await pub.advertise(TOPIC)

        async def publish() -> None:
            start = time.monotonic()
            for i in itertools.count():
                now = time.monotonic()
                if now - start >= duration:
                    break
                await asyncio.sleep(max(0.0, start + i / rate - now))
                conf = confidential and i % 2 == 1
                payload = f"steady #{i} ".encode().ljust(size, b".")
                try:
                    seq = await pub.publish(
                        {"class": "rel", "i": i}, payload, ack=False, confidential=conf
                    )
                except TrellisError as exc:
                    tally.refused += 1
                    why = f"refused: {type(exc).__name__}: {exc}"[:160]
                    tally.notes[why] = tally.notes.get(why, 0) + 1
                    continue
                tally.sent[seq] = (payload, conf)
                tally.published_at[seq] = time.monotonic()
            tally.seconds = time.monotonic() - start
            tally.stopped = time.monotonic()
            try:
                await pub.flush(timeout=60.0)
            except TrellisError as exc:
                tally.notes["flush"] = type(exc).__name__

        async def collect() -> None:
            last = time.monotonic()
            complete: float | None = None  # when every publication had arrived
            while True:
                now = time.monotonic()
                if publishing.done():
                    if complete is None and tally.sent and tally.delivered >= tally.published:
                        complete = now
                    # Quiet for ``settle`` s since the last delivery, the end of publishing
                    # and the end of the faults, whichever came last.
                    since = max(last, tally.stopped or last, tally.fault_over or last)
                    if now - since > settle or (complete is not None and now - complete > 1.0):
                        return
                try:
                    msg = await sub.get(0.5)
                except TrellisTimeout:
                    continue
                except SlowConsumerError:
                    tally.notes["slow_consumer"] = tally.notes.get("slow_consumer", 0) + 1
                    continue
                last = time.monotonic()
                tally.arrived_at.setdefault(msg.seq, last)
                tally.received.append((msg.seq, msg.payload, msg.confidential))

        async def watch_memory() -> None:
            nonlocal peak
            begun = time.monotonic()
            while True:
                if time.monotonic() - begun >= 10 * len(tally.rss_curve):
                    tally.rss_curve.append((10 * len(tally.rss_curve), peak))
                for b, pid in pids.items():
                    if overlay.brokers[b].pid == pid:
                        grown = rss_kib(pid) - rss0[b]
                        tally.rss_growth_kib[b] = max(tally.rss_growth_kib.get(b, 0), grown)
                        peak = max(peak, grown)
                await asyncio.sleep(0.25)

        async with asyncio.TaskGroup() as tg:
            publishing = tg.create_task(publish())
            watcher = tg.create_task(watch_memory())
            tg.create_task(faults(overlay, network, tally))
            await collect()
            watcher.cancel()
    tally.peak_rss_growth_kib = peak
    tally.fd_growth = max(
        (fd_count(p.pid) - fds0[b] for b, p in overlay.brokers.items() if p.pid == pids[b]),
        default=0,
    )
    return tally


# -- the faults ------------------------------------------------------------------------


def kill_replicas(down: float, at: float = 2.0) -> Faults:
    """``kill -9`` replica 1 of every VN (f = 1 each) at ``at`` s; restart them ``down`` s
    later, at the same addresses; they rejoin and catch up."""

    async def run(overlay: HostOverlay, network: Network, tally: Tally) -> None:
        await asyncio.sleep(at)
        victims = [overlay.replicas_of(vn)[1] for vn in VNS]
        tally.fault_start = time.monotonic()
        for b in victims:
            overlay.kill(b)
        tally.faults.append(f"kill -9 {', '.join(victims)} for {down:g} s")
        await asyncio.sleep(down)
        await asyncio.to_thread(overlay.start_many, victims)
        await asyncio.to_thread(overlay.wait_linked, 30.0)
        tally.fault_over = time.monotonic()

    return run


def partition(seconds: float, at: float = 2.0) -> Faults:
    """Cut every packet between VN ``a`` and VN ``b`` for ``seconds``, then heal."""

    async def run(overlay: HostOverlay, network: Network, tally: Tally) -> None:
        await asyncio.sleep(at)
        tally.fault_start = time.monotonic()
        network.cut(overlay.replicas_of("a"), overlay.replicas_of("b"))
        tally.faults.append(f"partition a|b for {seconds:g} s")
        await asyncio.sleep(seconds)
        network.heal()
        tally.fault_over = time.monotonic()
        tally.notes["switch_cut_packets"] = network.stats()["cut"]

    return run


def impair(loss: float, delay: float, jitter: float) -> Faults:
    """Loss, delay and jitter on every packet between any two hosts, for the whole run."""

    async def run(overlay: HostOverlay, network: Network, tally: Tally) -> None:
        tally.fault_start = time.monotonic()
        network.impair_all(loss=loss, delay=delay, jitter=jitter)
        tally.faults.append(
            f"{loss:.0%} loss, {delay * 1000:g} ± {jitter * 1000:g} ms on every link"
        )

    return run


async def no_faults(overlay: HostOverlay, network: Network, tally: Tally) -> None:
    """Nothing goes wrong (the baseline: memory, rate)."""
    tally.faults.append("none")


def restart_vn(down: float, at: float = 2.0, vn: str = "b") -> Faults:
    """``kill -9`` every replica of ``vn`` at ``at`` s and restart them ``down`` s later."""

    async def run(overlay: HostOverlay, network: Network, tally: Tally) -> None:
        await asyncio.sleep(at)
        victims = overlay.replicas_of(vn)
        tally.fault_start = time.monotonic()
        for b in victims:
            overlay.kill(b)
        tally.faults.append(f"kill -9 all of VN {vn} for {down:g} s")
        await asyncio.sleep(down)
        await asyncio.to_thread(overlay.start_many, victims)
        await asyncio.to_thread(overlay.wait_linked, 30.0)
        tally.fault_over = time.monotonic()

    return run


@dataclass(frozen=True)
class Plan:
    faults: Faults
    duration: float  # seconds of publishing
    settle: float  # seconds without a delivery (once publishing is over) that end the run
    rate: float | None = None  # publications per second (None: the caller's)
    size: int = 48
    confidential: bool = True
    settings: dict[str, Any] = field(default_factory=dict)  # every broker's config


SCENARIOS: dict[str, Callable[[bool], Plan]] = {
    # name -> (full version?) -> plan
    "kill": lambda full: Plan(kill_replicas(down=10.0 if full else 3.0), 30 if full else 8, 12),
    # TCP's retransmission back-off reaches several seconds during a 10 s partition: the
    # first packet after the heal may take that long, so the run waits longer for it.
    "partition": lambda full: Plan(partition(10.0), 40 if full else 16, 30),
    "netem": lambda full: Plan(impair(0.05, 0.05, 0.01), 60 if full else 8, 12),
    # A publisher offering 2 MB/s of plain publications into a 10 s partition: the links'
    # send buffers fill (send_buffer_limit), the edge brokers stop reading from it, and its
    # publish() waits for room. Memory stays bounded; nothing is lost.
    "flood-partition": lambda full: Plan(
        partition(10.0), 16, 30, rate=500.0, size=4096, confidential=False
    ),
    # The same offered load without the partition: what the overlay carries anyway.
    "flood": lambda full: Plan(no_faults, 16, 12, rate=500.0, size=4096, confidential=False),
    # Longer than the heartbeat deadline (3 x heartbeat_interval): the links close. The
    # short version shortens the heartbeat (1 s) rather than lengthening the partition.
    "long-partition": lambda full: (
        Plan(partition(40.0), 70, 30)
        if full
        else Plan(
            partition(8.0), 18, 12, settings={"heartbeat_interval": 1.0, "hello_timeout": 2.0}
        )
    ),
    # No fault: the memory curve of steady traffic (every broker's RSS sampled).
    "steady": lambda full: Plan(no_faults, 150 if full else 8, 12),
    "vn-restart": lambda full: Plan(restart_vn(down=5.0 if full else 3.0), 30 if full else 14, 12),
}


def run_scenario(
    name: str,
    *,
    full: bool = False,
    rate: float = 50.0,
    workdir: Path | None = None,
    settings: dict[str, Any] | None = None,
) -> Tally:
    """One scenario on a fresh network and overlay, all removed afterwards."""
    plan = SCENARIOS[name](full)
    hosts = [f"{vn}.{i}" for vn in VNS for i in range(REPLICAS)]
    network = Network.create(hosts)
    overlay: HostOverlay | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="trellis-hosts-") as tmp:
            overlay = start_host_overlay(
                workdir or Path(tmp),
                network,
                Tree(VNS, [("a", "b"), ("b", "c")]),
                dict.fromkeys(VNS, REPLICAS),
                {"admin_port": 0, **plan.settings, **(settings or {})},
            )
            try:
                return asyncio.run(
                    exchange(
                        overlay,
                        network,
                        plan.faults,
                        duration=plan.duration,
                        rate=plan.rate or rate,
                        settle=plan.settle,
                        size=plan.size,
                        confidential=plan.confidential,
                    )
                )
            finally:
                overlay.stop(timeout=5.0)
    finally:
        network.close()
