"""A publication's walk through one broker: accept, route once, deliver and forward.

A client's ``PUBLISH`` and a neighbour's ``FORWARD`` both end in :meth:`Forwarder.route`:
match once against the PRT, send one encoded ``FORWARD`` frame to every matching
neighbour VN and one ``DELIVER`` frame per distinct subscription-id set to local
subscribers, then hand a confidential publication's key shares to
:class:`~broker.daemon.shares.SecureForwarding`.

Every replica of an upstream VN sends a copy, and up to ``f`` of them may be Byzantine. A
forwarded publication is routed once ``f + 1`` replicas of its upstream VN sent identical
content (payload, attributes and security block), in per-publisher order
(:class:`security.agreement.ReplicatedStream`): one of them is honest, so what is routed is
what was published, plain or confidential alike, and no signature needs checking on the way.
A copy that differs is blamed on its sender once the genuine one is agreed. Two timers keep
the stream live and honest: a publication that blocks later, agreed ones for
``copy_patience`` seconds is abandoned (routing tables still settling), and an upstream
replica that sent nothing for ``silence_deadline`` seconds after a publication from its VN
was agreed is blamed as silent.

Live reconfiguration: the replicas of a VN in a round stop reading their inputs (the
publisher, links from outside the neighbourhood) each when its own freeze arrives, so a
publication read in between is routed on the old tables at one replica and on the new ones at
another: each path would get one good copy, fewer than ``f + 1``. So from the round's prepare
on, a broker records what it routes (:meth:`Forwarder.record_routes`), and right after it
installs the new tables, before it reads anything new, it sends each recorded publication to
the neighbour VNs the new tables add for it (:meth:`Forwarder.replay_routes`), in order; the
receivers drop what reached them another way (``SeenPublications``).

Removals behind publications: a replica sends a publisher's publications before the removal
of its advertisement (links are FIFO), but a VN's majority for the removal may include a
replica that never had them (a Byzantine one, or one the publisher had not reached yet) and
so be complete while publications from the VN still wait for their ``f + 1``-th copy.
Applied at once, the removal would travel on ahead of them, the subscribers' edges would
withdraw their subscriptions toward the publisher, and the publications would find no route
(seen: ``trellis pub`` leaving right after its last publication lost 4 of 5 behind a line of
replicated VNs). So a removal of an advertisement waits until the publications from that VN
undecided when it got its majority are decided, or ``copy_patience``
(:meth:`Forwarder.after_undecided`).

Back-pressure: a local subscriber whose send buffer is over its limit loses the delivery
(counted per subscription and reported in a ``NOTICE dropped``); links between brokers
never drop (the daemon stops reading from its clients instead).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from typing import NamedTuple

from broker.daemon.hops import Hop, SeenPublications, VNHop
from broker.daemon.shares import SecureForwarding
from broker.daemon.stats import BrokerStats
from broker.daemon.traffic_log import TrafficLog
from broker.language.filters import Value
from broker.routing.router import Router
from broker.wire.protocol import Forward, Publish, copy_weight, encode_deliver, encode_forward
from security.agreement import (
    COPY_BUDGET,
    COPY_OVERHEAD,
    CopyBudget,
    ReplicatedStream,
    forget_idle_streams,
    worth_logging,
)
from security.errors import InvalidRequest
from security.publication import SecBlock

log = logging.getLogger("trellis.routing")

# Matching latency is timed on one publication in 16: the clock calls cost more than a sample.
_MATCH_SAMPLE_MASK = 15

TrafficClasses = defaultdict[tuple[Hop, ...], int]
"""Publications routed since the window started, by (source hop, *target hops)."""

Content = tuple[bytes, SecBlock | None, tuple[tuple[str, Value], ...], tuple[type, ...]]
"""What copies of one publication must agree on (value types too: ``1 == 1.0 == True``)."""

Copies = ReplicatedStream[str, Forward]
"""One publisher's copies from one upstream VN, by sending replica."""

MAX_STREAMS = 65536
"""Publisher streams (one per publisher and upstream VN) a broker keeps at most by default
(config ``max_publishers``); past it, :meth:`Forwarder.tick` forgets the idle ones that
released least recently (as ``SeenPublications`` forgets publishers). A forgotten stream's
next copy opens a new one."""

# The most publications a broker records during one round (a lease at most): the window
# that needs replaying is the spread of its VN's freeze points, a few publications.
ROUTE_RECORD_LIMIT = 4096


def _copy_bytes(msg: Forward) -> int:
    return copy_weight(msg.payload, msg.attrs, msg.sec) + COPY_OVERHEAD


class RoutedPublication(NamedTuple):
    """A publication as routed while a round was prepared, and the brokers it went to."""

    source: Hop
    publisher: str
    seq: int
    attrs: Mapping[str, Value]
    payload: bytes
    sec: SecBlock | None
    brokers: frozenset[Hop]


def content_of(msg: Forward) -> Content:
    """What makes two copies of a publication the same publication."""
    attrs = msg.attrs
    return msg.payload, msg.sec, tuple(attrs.items()), tuple(map(type, attrs.values()))


class HeldRemoval(NamedTuple):
    """A removal waiting for publications from its VN (:meth:`Forwarder.after_undecided`)."""

    deadline: float
    undecided: dict[tuple[str, str], int]
    """(upstream VN, publisher) -> the highest sequence undecided when it was held."""
    apply: Callable[[], None]


class Forwarder:
    """Routes publications for one broker; counts the traffic classes it carried."""

    def __init__(
        self,
        router: Router[Hop],
        stats: BrokerStats,
        shares: SecureForwarding,
        tlog: TrafficLog | None = None,
        *,
        patience: float = 1.0,
        silence_deadline: float = 2.0,
        max_publishers: int = MAX_STREAMS,
        max_copy_bytes: int = COPY_BUDGET,
    ) -> None:
        self.router = router
        self.stats = stats
        self.shares = shares
        self.seen = SeenPublications(max_publishers=max_publishers)
        self.patience = patience
        self.silence_deadline = silence_deadline
        # (upstream VN, publisher) -> the agreement on that publisher's copies
        self.streams: dict[tuple[str, str], Copies] = {}
        self.max_streams = max_publishers
        # Bytes of undecided copies per upstream replica, over all its streams.
        self.budget: CopyBudget[str, Forward] = CopyBudget(max_copy_bytes, _copy_bytes)
        self.waiting: set[tuple[str, str]] = set()
        # Silence: upstream VN -> its hop; VN -> (when a publication from it was agreed, when
        # its first copy came), one publication at a time; sender -> when its last copy came.
        self.upstream: dict[str, VNHop] = {}
        self.checkpoints: dict[str, tuple[float, float]] = {}
        self.heard_at: dict[str, float] = {}
        self.silent: set[str] = set()
        self.traffic: TrafficClasses = defaultdict(int)
        # Traffic log (SPEC §7): the hot path appends a tuple; a thread formats and writes.
        self.tlog = tlog
        # What was routed since a live round was prepared here (None: no round).
        self.recorded: deque[RoutedPublication] | None = None
        self.held_removals: list[HeldRemoval] = []

    def start_window(self) -> None:
        """Count traffic classes afresh (a reconfiguration window started)."""
        self.traffic = defaultdict(int)

    def publish(self, source: Hop, client_id: str, msg: Publish) -> InvalidRequest | None:
        """A local client's publication; returns why it is refused, or None once routed."""
        self.stats.publications_in += 1
        seen = self.seen
        if not self.router.is_advertised(source, msg.attrs):
            return InvalidRequest(
                f"PUBLISH seq {msg.seq}: the publication matches none of this client's "
                "advertisements; advertise first"
            )
        sec = msg.sec
        if sec is None:
            seen.add(client_id, msg.seq)
            self.route(source, client_id, msg.seq, msg.attrs, msg.payload, sender=client_id)
            return None
        problem = self.shares.check_publish(client_id, msg)
        if problem:
            return InvalidRequest(f"PUBLISH seq {msg.seq}: {problem}")
        seen.add(client_id, msg.seq)
        self.route(
            source,
            client_id,
            msg.seq,
            msg.attrs,
            msg.payload,
            sec.without_share(),
            sender=client_id,
        )
        if sec.share is not None:
            self.shares.share_arrived(client_id, msg.seq, sec.share)
        return None

    def forward(self, source: VNHop, sender: str, msg: Forward) -> None:
        """A neighbour VN's copy of a publication: route it once ``f + 1`` copies agree."""
        self.stats.forwards_in += 1
        now = time.monotonic()
        self.heard_at[sender] = now
        if sender in self.silent:
            self.silent.discard(sender)
        vn = source.peer_id
        tlog = self.tlog
        if tlog is not None:
            tlog.append(
                ("copy", time.time(), msg.publisher, msg.seq, vn, sender, zlib.crc32(msg.payload))
            )
        if source.size < 3:
            # f = 0: the upstream VN tolerates no Byzantine replica, so its first copy is as
            # good as any (each replica sends in order; later copies are duplicates).
            self._route_agreed(source, [(msg.seq, msg)])
            return
        key = (vn, msg.publisher)
        stream = self.streams.get(key)
        if stream is None:
            stream = self.streams[key] = ReplicatedStream(
                (source.size - 1) // 2, budget=self.budget
            )
            self.upstream[vn] = source
        released = stream.offer(sender, msg.seq, content_of(msg), msg, now)
        if stream.blames:
            self._blame(stream)
        if stream.waiting:
            self.waiting.add(key)
        if released:
            if vn not in self.checkpoints:
                self.checkpoints[vn] = (now, stream.first_copy_at)
            self._route_agreed(source, released)
            if self.held_removals:
                self._apply_held(now)

    def after_undecided(self, vn: str, apply: Callable[[], None], now: float) -> None:
        """Run ``apply``, a removal VN ``vn``'s majority agreed on, once every publication
        from ``vn`` that waits for agreement now is decided, or after ``patience`` (one may
        never be: a Byzantine replica's copy alone). At once when none waits."""
        undecided = {
            key: stream.last_undecided
            for key in self.waiting
            if key[0] == vn and (stream := self.streams.get(key)) is not None and stream.waiting
        }
        if undecided:
            self.held_removals.append(HeldRemoval(now + self.patience, undecided, apply))
        else:
            apply()

    def _apply_held(self, now: float) -> None:
        held, self.held_removals = self.held_removals, []
        streams = self.streams
        for removal in held:
            if now >= removal.deadline or all(
                (stream := streams.get(key)) is None or stream.floor >= seq
                for key, seq in removal.undecided.items()
            ):
                removal.apply()
            else:
                self.held_removals.append(removal)

    def resize(self, vn: str, size: int) -> None:
        """Neighbouring VN ``vn`` now has ``size`` replicas (a live attach or detach): its
        copies are agreed by ``f' + 1`` of them from now on."""
        for (source_vn, _), stream in self.streams.items():
            if source_vn == vn:
                released = stream.resize((size - 1) // 2)
                if released:
                    self._route_agreed(self.upstream[vn], released)

    def _route_agreed(self, source: Hop, released: list[tuple[int, Forward]]) -> None:
        digests = self.tlog is not None
        for _seq, msg in released:
            if not self.seen.add(msg.publisher, msg.seq):
                continue  # reached this broker over another VN too (a link moved)
            self.route(
                source,
                msg.publisher,
                msg.seq,
                msg.attrs,
                msg.payload,
                msg.sec,
                sender=None,
                digest=zlib.crc32(msg.payload) if digests else None,
            )

    def _forget_idle_streams(self) -> None:
        """Forget idle streams (:func:`~security.agreement.forget_idle_streams`): what was
        routed stays routed once (``SeenPublications``), so a new stream starts clean."""
        forgotten = forget_idle_streams(self.streams, self.max_streams)
        log.info("forgot %d idle publisher streams (%d kept)", forgotten, len(self.streams))

    def _blame(self, stream: Copies) -> None:
        """Count every blame (``trellis_copy_blame_total``); log a culprit's first
        ``LOGGED_BLAMES`` and every ``LOGGED_EVERY``-th after (:func:`worth_logging`): one
        replica altering every copy logged a line per publication at every replica below."""
        stats = self.stats
        for blame in stream.blames:
            blamed = stats.blame_copy(blame.source, blame.fault)
            if worth_logging(blamed):
                log.warning(
                    "copy of seq %d from %s: %s (%d blamed on %s so far)",
                    blame.seq,
                    blame.source,
                    blame.why,
                    blamed,
                    blame.source,
                )
        stream.blames.clear()

    def tick(self, now: float) -> None:
        """Abandon publications stuck for ``patience`` and blame silent upstream replicas
        (run about every ``patience / 2`` seconds); keep at most :data:`MAX_STREAMS`."""
        if len(self.streams) > self.max_streams:
            self._forget_idle_streams()
        for key in list(self.waiting):
            stream = self.streams.get(key)
            if stream is None or not stream.waiting:
                self.waiting.discard(key)
                continue
            released = stream.expire(now, self.patience)
            if released:
                log.info(
                    "%s from %s: publication(s) before seq %d abandoned after %.1f s "
                    "(fewer than f + 1 replicas sent them)",
                    key[1],
                    key[0],
                    released[0][0],
                    self.patience,
                )
                self._route_agreed(self.upstream[key[0]], released)
            if stream.blames:
                self._blame(stream)
        if self.held_removals:
            self._apply_held(now)
        deadline = self.silence_deadline
        for vn, (agreed, first_copy) in list(self.checkpoints.items()):
            if now - agreed < deadline:
                continue
            del self.checkpoints[vn]
            hop = self.upstream[vn]
            for member, conn in hop.members.items():
                if conn.closing or member in self.silent or conn.opened > first_copy:
                    continue
                if self.heard_at.get(member, 0.0) < first_copy:
                    self.silent.add(member)
                    self.stats.blame_copy(member, "silent")
                    log.warning(
                        "replica %s of %s is silent: no copy since before a publication its "
                        "VN agreed on %.1f s ago",
                        member,
                        vn,
                        now - agreed,
                    )

    def record_routes(self, on: bool) -> None:
        """Start (a round was prepared) or stop (it ended) recording what is routed."""
        self.recorded = deque(maxlen=ROUTE_RECORD_LIMIT) if on else None

    def replay_routes(self) -> int:
        """Right after a round's install: send every publication routed since the prepare
        to the neighbour VNs the new tables add for it, in the order they were routed, with
        its key shares; returns how many copies went out."""
        recorded, self.recorded = self.recorded, None
        sent = 0
        for p in recorded or ():
            targets = self.router.route(p.attrs, p.source)
            added = [h for h in targets if h.is_broker and h not in p.brokers]
            if not added:
                continue
            frame = encode_forward(p.publisher, p.seq, p.attrs, p.payload, p.sec)
            for hop in added:
                self.send_forward(hop, frame, p.publisher, p.seq, p.attrs, p.payload, p.sec)
                sent += 1
            if p.sec is not None:
                self.shares.routed(p.publisher, p.sec.epoch, added, p.sec)
        return sent

    def send_forward(
        self,
        hop: Hop,
        frame: bytes,
        publisher: str,
        seq: int,
        attrs: Mapping[str, Value],
        payload: bytes,
        sec: SecBlock | None,
    ) -> None:
        """Send a publication's encoded ``FORWARD`` frame to a neighbour VN (a hook: an
        equivocating test broker sends its replicas different frames)."""
        hop.send_raw(frame)

    def route(
        self,
        source: Hop,
        publisher: str,
        seq: int,
        attrs: Mapping[str, Value],
        payload: bytes,
        sec: SecBlock | None = None,
        *,
        sender: str | None = None,
        digest: int | None = None,
    ) -> None:
        """Deliver to matching local subscribers and forward toward matching brokers.

        ``sender`` (the client, or the upstream replica whose copy this is) and ``digest``
        (the payload's CRC as received) are for the traffic log only."""
        stats = self.stats
        stats.routed += 1
        if stats.routed & _MATCH_SAMPLE_MASK:
            targets = self.router.route(attrs, source)
        else:
            started = time.perf_counter()
            targets = self.router.route(attrs, source)
            stats.observe_match(time.perf_counter() - started)
        route_key = (source, *targets)  # the traffic class, and the traffic log's route
        if targets:
            self.traffic[route_key] += 1
        forward_frame: bytes | None = None
        deliver_frames: dict[tuple[str, ...], bytes] = {}
        dropped: list[Hop] | None = None
        for hop, keys in targets.items():
            if hop.is_broker:
                if forward_frame is None:
                    forward_frame = encode_forward(publisher, seq, attrs, payload, sec)
                self.send_forward(hop, forward_frame, publisher, seq, attrs, payload, sec)
                stats.count_forward(hop.peer_id)
            elif hop.congested:
                hop.note_dropped(keys)
                stats.deliveries_dropped += 1
                if dropped is None:
                    dropped = []
                dropped.append(hop)
            else:
                # Subscribers with the same subscription ids share one encoded frame.
                key = tuple(keys)
                data = deliver_frames.get(key)
                if data is None:
                    data = deliver_frames[key] = encode_deliver(
                        keys, publisher, seq, attrs, payload, sec=sec
                    )
                hop.deliver_raw(data)
                stats.deliveries += 1
        tlog = self.tlog
        if tlog is not None:
            if dropped is None:
                route = tlog.routes.get(route_key)
                if route is None:
                    route = tlog.define_route(route_key, source, targets)
                tlog.append(
                    (
                        "pub",
                        time.time(),
                        publisher,
                        seq,
                        route,
                        sender,
                        len(payload),
                        sec is not None,
                        digest,
                    )
                )
            else:
                tlog.append(
                    tlog.dropped_pub(
                        time.time(),
                        publisher,
                        seq,
                        source,
                        sender,
                        targets,
                        dropped,
                        len(payload),
                        sec is not None,
                        digest,
                    )
                )
        if sec is not None:
            # After the content, so every hop sees a publication before its key shares.
            self.shares.routed(publisher, sec.epoch, targets, sec)
        recorded = self.recorded
        if recorded is not None:
            brokers = frozenset(h for h in targets if h.is_broker)
            recorded.append(RoutedPublication(source, publisher, seq, attrs, payload, sec, brokers))
