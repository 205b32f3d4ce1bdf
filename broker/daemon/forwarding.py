"""A publication's walk through one broker: accept, route once, deliver and forward.

A client's ``PUBLISH`` and a neighbour's ``FORWARD`` both end in :meth:`Forwarder.route`:
match once against the PRT, send one encoded ``FORWARD`` frame to every matching
neighbour VN and one ``DELIVER`` frame per distinct subscription-id set to local
subscribers, then hand a confidential publication's key shares to
:class:`~broker.daemon.shares.SecureForwarding`. Every replica of an upstream VN sends a
copy, so a forwarded publication is routed once, the first valid copy.

Back-pressure: a local subscriber whose send buffer is over its limit loses the delivery
(counted per subscription and reported in a ``NOTICE dropped``); links between brokers
never drop (the daemon stops reading from its clients instead).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections import defaultdict
from collections.abc import Mapping

from broker.daemon.hops import Hop, SeenPublications
from broker.daemon.shares import SecureForwarding
from broker.daemon.stats import BrokerStats
from broker.daemon.traffic_log import TrafficLog
from broker.language.filters import Value
from broker.routing.router import Router
from broker.wire.protocol import Forward, Publish, encode_deliver, encode_forward
from security.errors import InvalidRequest
from security.publication import SecBlock

log = logging.getLogger("trellis.routing")

# Matching latency is timed on one publication in 16: the clock calls cost more than a sample.
_MATCH_SAMPLE_MASK = 15

TrafficClasses = defaultdict[tuple[Hop, ...], int]
"""Publications routed since the window started, by (source hop, *target hops)."""


class Forwarder:
    """Routes publications for one broker; counts the traffic classes it carried."""

    def __init__(
        self,
        router: Router[Hop],
        stats: BrokerStats,
        shares: SecureForwarding,
        tlog: TrafficLog | None = None,
    ) -> None:
        self.router = router
        self.stats = stats
        self.shares = shares
        self.seen = SeenPublications()
        self.traffic: TrafficClasses = defaultdict(int)
        # Traffic log (SPEC §7): the hot path appends a tuple; a thread formats and writes.
        self.tlog = tlog

    def start_window(self) -> None:
        """Count traffic classes afresh (a reconfiguration window started)."""
        self.traffic = defaultdict(int)

    def publish(self, source: Hop, client_id: str, msg: Publish) -> InvalidRequest | None:
        """A local client's publication; returns why it is refused, or None once routed."""
        self.stats.publications_in += 1
        if not self.router.is_advertised(source, msg.attrs):
            return InvalidRequest(
                f"PUBLISH seq {msg.seq}: the publication matches none of this client's "
                "advertisements; advertise first"
            )
        sec = msg.sec
        if sec is None:
            self.route(source, client_id, msg.seq, msg.attrs, msg.payload, sender=client_id)
            return None
        problem = self.shares.check_publish(client_id, msg)
        if problem:
            return InvalidRequest(f"PUBLISH seq {msg.seq}: {problem}")
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

    def forward(self, source: Hop, sender: str | None, msg: Forward) -> None:
        """A neighbour VN's copy of a publication: route the first valid copy only."""
        self.stats.forwards_in += 1
        tlog = self.tlog
        if not self.seen.fresh(msg.publisher, msg.seq):
            if tlog is not None:
                tlog.append(
                    (
                        "copy",
                        time.time(),
                        msg.publisher,
                        msg.seq,
                        source.peer_id,
                        sender,
                        zlib.crc32(msg.payload),
                    )
                )
            return
        if msg.sec is not None and not self.shares.content_valid(
            msg.publisher, msg.seq, msg.attrs, msg.payload, msg.sec, sender
        ):
            if tlog is not None:
                tlog.append(
                    ("sig", time.time(), msg.publisher, msg.seq, source.peer_id, sender, None)
                )
            return
        self.seen.mark(msg.publisher, msg.seq)
        digest = None if tlog is None else zlib.crc32(msg.payload)
        self.route(
            source,
            msg.publisher,
            msg.seq,
            msg.attrs,
            msg.payload,
            msg.sec,
            sender=sender,
            digest=digest,
        )

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
        if targets:
            self.traffic[(source, *targets)] += 1
        forward_frame: bytes | None = None
        deliver_frames: dict[tuple[str, ...], bytes] = {}
        dropped: list[Hop] | None = None
        for hop, keys in targets.items():
            if hop.is_broker:
                if forward_frame is None:
                    forward_frame = encode_forward(publisher, seq, attrs, payload, sec)
                hop.send_raw(forward_frame)
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
                hop.send_raw(data)
                stats.deliveries += 1
        tlog = self.tlog
        if tlog is not None:
            if dropped is None:
                route_key = (source, sender, *targets)
                hops = tlog.hops.get(route_key)
                if hops is None:
                    hops = tlog.hops_fragment(route_key, source, sender, targets, None)
            else:
                hops = tlog.hops_fragment(None, source, sender, targets, dropped)
            tlog.append(
                (
                    "pub",
                    time.time(),
                    publisher,
                    seq,
                    hops,
                    len(payload),
                    sec is not None,
                    digest,
                )
            )
        if sec is not None:
            # After the content, so every hop sees a publication before its key shares.
            self.shares.routed(publisher, sec.epoch, targets, sec)
