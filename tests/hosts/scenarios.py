"""Fault scenarios on hosts with their own addresses, with exact accounting.

Most scenarios start a line of three VNs ``a - b - c`` of three replicas each (f = 1), nine
broker hosts, in namespaces of a fresh :class:`~tests.hosts.net.Network`; a publisher on
``a`` publishes at a steady rate for ``duration`` seconds, alternating plain and
confidential publications, while the scenario's faults run; a subscriber on ``c`` collects
what it is delivered. The :class:`Tally` then compares, seq by seq, what was published
with what was delivered.

The scenarios that move links (``rewire``, ``reconf-*``) need a tree where a VN can be
attached elsewhere: ``b`` a hub with leaves ``a``, ``c`` and ``d`` (twelve brokers), where
``d`` moves between ``b`` and ``c``; they have a subscriber on ``c`` (whose path from ``a``
never needs ``d``) and one on ``d``, each with a tally of its own.

The same code runs the short versions in CI (``tests/hosts/test_faults.py``) and the full
versions from the command line (``python -m tests.hosts``, or ``bench/bench_reliability.py``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import re
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.client import Client
from broker.errors import SlowConsumerError, TrellisError, TrellisTimeout
from broker.tools.local import OverlayError, fetch_json
from broker.tools.rebuild_apply import ask_move
from overlay.tree import TopologyError, Tree
from reconfig.rebuild import Move
from tests.hosts.net import HostOverlay, Network, start_host_overlay

VNS = ("a", "b", "c")
REPLICAS = 3
TOPIC = "class = 'rel'"
LINE = Tree(VNS, [("a", "b"), ("b", "c")])
# The shape where a VN can move: d a leaf of the hub b, or (MOVED) a leaf of c.
HUB = Tree((*VNS, "d"), [("a", "b"), ("b", "c"), ("b", "d")])
MOVED = Tree((*VNS, "d"), [("a", "b"), ("b", "c"), ("c", "d")])


@dataclass
class Tally:
    """What was published and what the subscriber got, compared exactly."""

    sent: dict[int, tuple[bytes, bool]] = field(default_factory=dict)  # seq -> (payload, conf)
    refused: int = 0  # publish() raised: the publisher knows these did not go out
    refused_payloads: set[bytes] = field(default_factory=set)  # what those would have carried
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
    longest_publish_s: float = 0.0  # the longest any publish() that returned was held back
    notes: dict[str, Any] = field(default_factory=dict)
    subscriber: str = "c"  # the VN whose subscriber this tally counts
    round_asked: float | None = None  # monotonic time the live round under way was asked
    # monotonic time the moved VN's replicas were killed (rewire), taken just before the
    # kills: they block the event loop until every victim exited, so a publication whose
    # publish() returned after it cannot have reached them
    vn_down: float | None = None
    # Other subscribers' tallies (same publications, their own deliveries), by VN.
    others: dict[str, Tally] = field(default_factory=dict)

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
        """Deliveries whose payload is not what was published with that seq (or, for an
        unconfirmed seq, not one of the payloads whose publish() raised)."""
        return sum(
            1
            for seq, p, _ in self.received
            if (self.sent[seq][0] != p if seq in self.sent else p not in self.refused_payloads)
        )

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


Faults = Callable[[HostOverlay, Network, Tally], Coroutine[Any, Any, None]]


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
    publisher: str = "a",
    subscribers: tuple[str, ...] = ("c",),
    tail: float = 0.0,
    publish_timeout: float = 20.0,
) -> Tally:
    """Publish for ``duration`` s at ``rate``/s from ``publisher``'s VN while ``faults``
    runs (payloads of about ``size`` bytes; every other one confidential unless
    ``confidential`` is False), then collect at each of ``subscribers`` until everything
    arrived there or nothing did for ``settle`` s. With ``tail``, publishing goes on until
    ``tail`` s past the end of the faults (what comes after them is part of the proof; at
    most 300 s in all). The tally is
    the first subscriber's; the others' are in its ``others``."""
    tally = Tally(subscriber=subscribers[0])
    pub = Client(overlay.endpoints(publisher), client_id="steady", request_timeout=publish_timeout)
    sub_clients = [Client(overlay.endpoints(vn), manifest=overlay.manifest) for vn in subscribers]
    received: dict[str, list[tuple[int, bytes, bool]]] = {vn: [] for vn in subscribers}
    arrived: dict[str, dict[int, float]] = {vn: {} for vn in subscribers}
    tally.received, tally.arrived_at = received[subscribers[0]], arrived[subscribers[0]]
    pids = {b: p.pid for b, p in overlay.brokers.items()}
    rss0 = {b: rss_kib(pid) for b, pid in pids.items()}
    fds0 = {b: fd_count(pid) for b, pid in pids.items()}
    peak = 0
    async with contextlib.AsyncExitStack() as stack:
        for client in [pub, *sub_clients]:
            await stack.enter_async_context(client)
        # The collectors share this process with the publisher and every other client: on a
        # busy machine a burst (a partition's backlog, replayed at the heal) can outrun them,
        # and a queue that overflowed (SlowConsumerError) would count as the overlay's loss.
        subs = [
            await stack.enter_async_context(c.subscribe(TOPIC, queue_size=1_000_000))
            for c in sub_clients
        ]
        await pub.advertise(TOPIC)

        async def publish() -> None:
            start = time.monotonic()
            for i in itertools.count():
                now = time.monotonic()
                over = tally.fault_over
                if now - start >= duration and (
                    not tail or (over is not None and now - over >= tail) or now - start > 300
                ):
                    break
                await asyncio.sleep(max(0.0, start + i / rate - now))
                conf = confidential and i % 2 == 1
                payload = f"steady #{i} ".encode().ljust(size, b".")
                asked = time.monotonic()
                try:
                    seq = await pub.publish(
                        {"class": "rel", "i": i}, payload, ack=False, confidential=conf
                    )
                except TrellisError as exc:
                    tally.refused += 1
                    tally.refused_payloads.add(payload)
                    why = f"refused: {type(exc).__name__}: {exc}"[:160]
                    tally.notes[why] = tally.notes.get(why, 0) + 1
                    continue
                tally.sent[seq] = (payload, conf)
                tally.published_at[seq] = time.monotonic()
                tally.longest_publish_s = max(tally.longest_publish_s, time.monotonic() - asked)
            tally.seconds = time.monotonic() - start
            tally.stopped = time.monotonic()
            try:
                await pub.flush(timeout=60.0)
            except TrellisError as exc:
                tally.notes["flush"] = type(exc).__name__

        async def collect(vn: str, sub: Any) -> None:
            got, first = received[vn], arrived[vn]
            last = time.monotonic()
            complete: float | None = None  # when every publication had arrived
            while True:
                now = time.monotonic()
                if publishing.done():
                    if (
                        complete is None
                        and tally.sent
                        and len(tally.sent.keys() & first) >= len(tally.sent)
                    ):
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
                first.setdefault(msg.seq, last)
                got.append((msg.seq, msg.payload, msg.confidential))

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
            await asyncio.gather(*(collect(vn, s) for vn, s in zip(subscribers, subs, strict=True)))
            watcher.cancel()
    tally.peak_rss_growth_kib = peak
    tally.fd_growth = max(
        (fd_count(p.pid) - fds0[b] for b, p in overlay.brokers.items() if p.pid == pids[b]),
        default=0,
    )
    tally.others = {
        vn: dataclasses.replace(
            tally, subscriber=vn, received=received[vn], arrived_at=arrived[vn], others={}
        )
        for vn in subscribers[1:]
    }
    return tally


# -- the faults ------------------------------------------------------------------------


def kill_replicas(
    down: float, at: float = 2.0, mid_round: float | None = None, between_rounds: bool = False
) -> Faults:
    """``kill -9`` replica 1 of every VN (f = 1 each) at ``at`` s; restart them ``down`` s
    later, at the same addresses; they rejoin and catch up. With ``mid_round``, the kill
    waits until a live round has been under way for that long; with ``between_rounds``,
    until none is (see :func:`with_moves`)."""

    async def run(overlay: HostOverlay, network: Network, tally: Tally) -> None:
        await asyncio.sleep(at)
        while mid_round is not None or between_rounds:
            asked = tally.round_asked
            if between_rounds and asked is None:
                break
            if (
                mid_round is not None
                and asked is not None
                and time.monotonic() - asked >= mid_round
            ):
                break
            await asyncio.sleep(0.01)
        victims = [overlay.replicas_of(vn)[1] for vn in sorted(overlay.tree.brokers)]
        tally.fault_start = time.monotonic()
        for b in victims:
            overlay.kill(b)
        tally.faults.append(f"kill -9 {', '.join(victims)} for {down:g} s")
        await asyncio.sleep(down)
        await asyncio.to_thread(overlay.start_many, victims)
        await asyncio.to_thread(wait_rejoined, overlay, victims)
        tally.fault_over = time.monotonic()

    return run


def wait_rejoined(overlay: HostOverlay, restarted: list[str], timeout: float = 30.0) -> None:
    """Wait until every restarted replica is linked to the same brokers as a sibling that
    stayed up (replicas of a VN all link to the same brokers), whatever tree the overlay
    is in now (live rounds may have moved its links since it started)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            links = {b: set(state["links"]) for b, state in overlay.health().items()}
        except OSError:
            links = {}
        apart = []
        for b in restarted:
            sibling = next(s for s in overlay.replicas_of(overlay.vn_of(b)) if s not in restarted)
            if b not in links or links[b] != links.get(sibling):
                apart.append(
                    f"{b} {sorted(links.get(b, ()))} vs {sibling} {sorted(links.get(sibling, ()))}"
                )
        if not apart:
            return
        if time.monotonic() > deadline:
            raise OverlayError(f"not rejoined within {timeout:g} s: {'; '.join(apart)}")
        time.sleep(0.1)


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


async def restart_replica(
    overlay: HostOverlay, broker_id: str, wanted: set[str], settle: float = 15.0
) -> None:
    """``kill -9`` one broker and start it again with the config of ``overlay.tree`` now;
    return once it is linked to every broker of ``wanted`` and its routing tables are as
    large as a sibling's (ready, as an operator's rolling restart waits for a replica
    before the next)."""
    vn = overlay.vn_of(broker_id)
    overlay.kill(broker_id)
    await asyncio.to_thread(overlay.start, broker_id)
    sibling = next(b for b in overlay.replicas_of(vn) if b != broker_id)
    deadline = time.monotonic() + settle
    urls = [overlay.brokers[b].admin_url + "/healthz" for b in (broker_id, sibling)]
    while time.monotonic() < deadline:
        try:
            mine, theirs = await asyncio.to_thread(lambda: [fetch_json(u) for u in urls])
        except OSError:
            await asyncio.sleep(0.25)
            continue
        if wanted <= set(mine["links"]) and (mine["srt"], mine["prt"]) == (
            theirs["srt"],
            theirs["prt"],
        ):
            return
        await asyncio.sleep(0.25)
    raise OverlayError(f"{broker_id} not ready {settle:g} s after its restart")


def rewire(
    down: float, at: float = 2.0, vn: str = "d", to: Tree = MOVED, forget: bool = True
) -> Faults:
    """Restart VN ``vn`` attached elsewhere in the tree (scenario 4b): every broker whose
    neighbour set changes is restarted with the new one, as an operator re-attaching a VN
    would. First the new neighbour VN's replicas, one at a time (they learn to accept
    ``vn``), then every replica of ``vn`` at once (``kill -9``, down ``down`` s, started
    with only its new neighbours), then (with ``forget``) the old neighbour VN's replicas,
    one at a time (they forget ``vn``; without it they keep dialling ``vn`` and are
    refused). At most f replicas of any other VN are down at any moment."""

    async def run(overlay: HostOverlay, network: Network, tally: Tally) -> None:
        await asyncio.sleep(at)
        old = overlay.tree
        gains = sorted(to.neighbours(vn) - old.neighbours(vn))
        loses = sorted(old.neighbours(vn) - to.neighbours(vn))
        tally.fault_start = time.monotonic()
        overlay.tree = to  # every config written from now on is the new tree's

        async def rolling(x: str) -> None:
            """Restart VN x's replicas one at a time; each must link to the VNs that are
            its neighbours in both trees (the others refuse it until they change too)."""
            kept = {r for n in old.neighbours(x) & to.neighbours(x) for r in overlay.replicas_of(n)}
            for b in overlay.replicas_of(x):
                await restart_replica(overlay, b, kept)

        for x in gains:
            await rolling(x)
        tally.faults.append(f"rolling restart of {', '.join(gains)} accepting {vn}")
        victims = overlay.replicas_of(vn)
        tally.vn_down = time.monotonic()
        for b in victims:
            overlay.kill(b)
        tally.notes["vn down at s"] = round(tally.vn_down - tally.fault_start, 1)
        await asyncio.sleep(down)
        await asyncio.to_thread(overlay.start_many, victims)
        tally.faults.append(
            f"kill -9 all of VN {vn} for {down:g} s, restarted as a leaf of {', '.join(gains)}"
            f" instead of {', '.join(loses)}"
        )
        if forget:
            for x in loses:
                await rolling(x)
            tally.faults.append(f"rolling restart of {', '.join(loses)} without {vn}")
        await asyncio.to_thread(overlay.wait_linked, 30.0)
        tally.fault_over = time.monotonic()
        tally.notes["links after"] = " ".join(f"{x}-{y}" for x, y in sorted(to.links))

    return run


def move_d(tree: Tree) -> Move:
    """The next move of VN d: from the hub b to c, or back (one round at the master VN)."""
    return Move("b", "d", "c") if "b" in tree.neighbours("d") else Move("c", "d", "b")


def with_moves(inner: Faults, pause: float = 0.5) -> Faults:
    """``inner`` while VN d moves between b and c, one live round after another (an
    operator's ``RECONF move`` to the master VN's coordinator, ``pause`` s apart) until
    publishing stops (scenario 5). Counts the rounds by outcome; at the end every replica
    of every VN must agree on its neighbour VNs, and they must form a tree."""

    async def run(overlay: HostOverlay, network: Network, tally: Tally) -> None:
        outcomes: collections.Counter[str] = collections.Counter()
        errors: collections.Counter[str] = collections.Counter()

        async def moves() -> None:
            number = 0
            while tally.stopped is None:
                try:
                    tree = await asyncio.to_thread(overlay.live_tree, 3.0)
                except (OSError, TopologyError) as exc:
                    outcomes["tree unreadable"] += 1
                    errors[f"live tree: {exc}"[:120]] += 1
                    await asyncio.sleep(pause)
                    continue
                number += 1
                move = move_d(tree)
                tally.round_asked = time.monotonic()
                ok, error, _ = await ask_move(overlay.describe(), move, f"move {number}", 30.0)
                tally.round_asked = None
                kind = "applied" if ok else _round_failure(error)
                outcomes[kind] += 1
                if not ok:
                    errors[re.sub(r"#\d+", "", error)[:120]] += 1
                await asyncio.sleep(pause)

        await asyncio.gather(inner(overlay, network, tally), moves())
        tally.faults.append("VN d moved b <-> c by live rounds throughout")
        tally.notes["rounds"] = dict(sorted(outcomes.items()))
        tally.notes["round errors"] = dict(errors.most_common(6))
        tally.notes["replicas disagree"] = await asyncio.to_thread(_disagreeing_vns, overlay)
        tree = await asyncio.to_thread(overlay.live_tree, 10.0)
        tally.notes["links after"] = " ".join(f"{x}-{y}" for x, y in sorted(tree.links))

    return run


def _round_failure(error: str) -> str:
    """A failed move by kind: refused (nothing started), aborted (undone), or other."""
    for kind in ("refused", "aborted"):
        if f" {kind}:" in f" {error}":
            return kind
    return "failed"


def _disagreeing_vns(overlay: HostOverlay, timeout: float = 15.0) -> list[str]:
    """VNs whose live replicas do not all have links to the same neighbour VNs (asked
    again until they agree or ``timeout`` passes: links close just after a round)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            health = overlay.health()
        except OSError:  # a broker slow to answer (packet loss): ask again
            health = {}
        views: dict[str, set[frozenset[str]]] = collections.defaultdict(set)
        for b, state in health.items():
            linked = frozenset(overlay.vn_of(p) for p in state["links"])
            views[overlay.vn_of(b)].add(linked)
        bad = sorted(vn for vn, seen in views.items() if len(seen) > 1)
        if (health and not bad) or time.monotonic() > deadline:
            return bad if health else ["unreadable"]
        time.sleep(0.2)


@dataclass(frozen=True)
class Plan:
    faults: Faults
    duration: float  # seconds of publishing
    settle: float  # seconds without a delivery (once publishing is over) that end the run
    rate: float | None = None  # publications per second (None: the caller's)
    size: int = 48
    confidential: bool = True
    settings: dict[str, Any] = field(default_factory=dict)  # every broker's config
    tree: Tree = LINE
    subscribers: tuple[str, ...] = ("c",)
    tail: float = 0.0  # seconds of publishing at least, once the faults are over
    publish_timeout: float = 20.0  # the publisher's request_timeout


HUB_SUBS = ("c", "d")
# Rounds only when asked: every broker takes part, none starts a search of its own.
MOVING: dict[str, Any] = {
    "tree": HUB,
    "subscribers": HUB_SUBS,
    "settings": {"reconfig": {"enabled": True, "interval": 3600.0}},
    "tail": 5.0,
}

SCENARIOS: dict[str, Callable[[bool], Plan]] = {
    # name -> (full version?) -> plan
    "kill": lambda full: Plan(kill_replicas(down=10.0 if full else 3.0), 30 if full else 8, 12),
    # TCP's retransmission back-off reaches several seconds during a 10 s partition: the
    # first packet after the heal may take that long, so the run waits longer for it.
    "partition": lambda full: Plan(partition(10.0), 40 if full else 16, 30),
    "netem": lambda full: Plan(impair(0.05, 0.05, 0.01), 60 if full else 8, 12),
    # A publisher offering 2 MB/s of plain publications into a 10 s partition: the links'
    # send buffers fill (send_buffer_limit), the edge brokers stop reading from it, and its
    # publish() waits for room. Memory stays bounded; nothing is lost. It waits for the
    # partition, TCP's back-off and the drain: 11 s on a quiet machine, over 20 s once on a
    # CI machine twice as slow, hence its own timeout.
    "flood-partition": lambda full: Plan(
        partition(10.0), 16, 30, rate=500.0, size=4096, confidential=False, publish_timeout=60.0
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
    # Publishing goes on 5 s past the restart, however long it took: delivery resumes.
    "vn-restart": lambda full: Plan(
        restart_vn(down=5.0 if full else 3.0), 30 if full else 10, 12 if full else 6, tail=5.0
    ),
    # VN d (a leaf of the hub b) restarted as a leaf of c: c's replicas restarted one by one
    # to accept it, d down, then (full version) b's replicas restarted one by one to forget it.
    "rewire": lambda full: Plan(
        rewire(down=5.0 if full else 2.0, forget=full),
        40 if full else 10,
        12 if full else 6,
        tree=HUB,
        subscribers=HUB_SUBS,
        tail=5.0,
    ),
    # Live rounds moving d between b and c, one after another, during each fault.
    "reconf-kill": lambda full: Plan(
        # The full version kills 0.3 s into a round (a replica killed in a round that
        # completes without it takes its siblings' links when it restarts); CI's kills
        # between two rounds, which the rounds then refuse until the replicas are back.
        with_moves(
            kill_replicas(down=10.0, at=3.0, mid_round=0.3)
            if full
            else kill_replicas(down=3.0, at=3.0, between_rounds=True)
        ),
        40 if full else 14,
        12,
        **MOVING,
    ),
    "reconf-partition": lambda full: Plan(
        with_moves(partition(10.0 if full else 5.0, at=3.0)), 40 if full else 14, 30, **MOVING
    ),
    # Twelve brokers' traffic through the userspace switch, every packet delayed: the
    # switch and the brokers share two cores, so the load is lower than the others'.
    "reconf-netem": lambda full: Plan(
        with_moves(impair(0.05, 0.05, 0.01)),
        60 if full else 30,
        12,
        rate=20.0 if full else 10.0,
        **{**MOVING, "tail": 0.0},  # the impairment lasts the whole run
    ),
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
    vns = sorted(plan.tree.brokers)
    hosts = [f"{vn}.{i}" for vn in vns for i in range(REPLICAS)]
    network = Network.create(hosts)
    overlay: HostOverlay | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="trellis-hosts-") as tmp:
            overlay = start_host_overlay(
                workdir or Path(tmp),
                network,
                plan.tree,
                dict.fromkeys(vns, REPLICAS),
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
                        subscribers=plan.subscribers,
                        tail=plan.tail,
                        publish_timeout=plan.publish_timeout,
                    )
                )
            finally:
                overlay.stop(timeout=5.0)
    finally:
        network.close()
