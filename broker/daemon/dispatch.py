"""The daemon's core: connections, the frames they carry, and the broker's shared state.

Connections are ``asyncio.Protocol`` objects: frames are handled synchronously as they are
read, and replies are gathered per connection and flushed once per slice of reading, so a
burst of publications costs one ``write`` per receiving connection, not one per message.

Reading is time-sliced: one connection's frames are handled for at most ``read_slice``
seconds at a time. A read that holds more (a storm of thousands of requests in one burst)
keeps the rest, in order, pauses that transport and goes on at the loop's next turn, after
every other connection with something to read had its turn; so one client's storm delays
the others by a slice, not by its whole burst. When several connections have a backlog,
they share one ``read_slice`` per turn of the loop (each handles at least one frame), so
a hundred storming clients delay the others by about one slice, not a hundred. Reading
is also held for reasons (a
congested broker link, a reconfiguration freeze), each on its own: the backlog goes on only
once no reason is left, and the transport reads again only once the backlog is done too.
A :class:`Connection` dispatches each frame by the role its handshake gave it (client,
broker link, control connection); the :class:`Broker` holds what they share and hands
each job to the module that holds it: routing decisions to :mod:`broker.routing.router`,
publications to :mod:`broker.daemon.forwarding`, key shares to
:mod:`broker.daemon.shares`, topology knowledge to :mod:`broker.daemon.links`, live
reconfiguration to :mod:`broker.daemon.reconfig_agent`.

Back-pressure policy (documented in the README):

* A publisher is never slowed by a slow subscriber. Each client connection has a bounded
  send buffer (``send_buffer_limit``); while it is over the limit the broker drops
  deliveries to that connection, counts them per subscription, and once the buffer drains
  sends a ``NOTICE dropped`` frame with the counts (the SDK raises ``SlowConsumerError``).
* Publications between brokers are never dropped. While a link to a neighbour broker is
  over its limit, the broker stops reading from its local clients, so TCP flow control
  pushes back on the publishers at the edge.
* There is no unbounded queue inside the broker: work is done as frames are read, and a
  connection with frames read but not yet handled is not read further.

Overlay links: each broker lists its neighbours; the one with the smaller id dials, the
other accepts only configured neighbours and refuses a link that would close a cycle in
the topology it knows from link-state announcements (``LINKSTATE``, flooded on change).
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, cast

from broker.daemon import membership
from broker.daemon.config import BrokerConfig, NeighbourConfig, vn_of
from broker.daemon.faults import build_forwarding
from broker.daemon.hops import Entry, Hop, VNHop
from broker.daemon.links import LinkStates, load_saved_links, save_links
from broker.daemon.reconfig_agent import MARK, MARK_ASK, Tables
from broker.daemon.reconfig_faults import reconfig_agent
from broker.daemon.sessions import (
    RECENT_FRAME_BYTES,
    Sessions,
    recent_deliveries,
)
from broker.daemon.shares import DISABLED
from broker.daemon.stats import BrokerStats
from broker.daemon.tls import BrokerTLS
from broker.daemon.topic_guard import TopicGuard
from broker.daemon.waves import RoutingWaves
from broker.errors import LimitExceeded, SlowConsumerError, TLSError
from broker.language.filters import Filter
from broker.routing.router import LinkTables, Owned, Router
from broker.wire.protocol import (
    MARK_NOTICE,
    MARKS_OPTION,
    PROTOCOL_VERSION,
    REPLICAS_OPTION,
    RESUMED_OPTION,
    Ack,
    Advertise,
    Error,
    Forward,
    FrameDecoder,
    Hello,
    LinkState,
    Message,
    Notice,
    Pass,
    Ping,
    Pong,
    Publish,
    Reconf,
    Role,
    Share,
    Shares,
    Subscribe,
    Sync,
    Unadvertise,
    Unsubscribe,
    Welcome,
    check_client_key,
    encode,
    encode_filter,
    error_for,
    forward_growth,
    key_growth,
    unforwardable,
    unroutable,
)
from broker.wire.resend import RecentFrames
from reconfig.live import Reply, RoundStats, vouch_quorum
from security.agreement import MarkRequests
from security.errors import InvalidRequest, NotAuthorized, ProtocolError, TrellisError
from security.tls import describe_tls_error
from security.topics_credentials import Credentials
from security.topics_identity import load_trusted_tdns

VOTE_LIMIT = "max_vote_bytes_per_source"
"""The limit a neighbour replica's routing entries waiting for its VN's majority are under."""

log = logging.getLogger("trellis.broker")
proto_log = logging.getLogger("trellis.protocol")
link_log = logging.getLogger("trellis.overlay")

Actions = list[tuple[Hop, Message]]

# Heartbeats are not counted as control traffic (tests wait for control traffic to settle).
_HEARTBEATS = (Ping, Pong)
_KEYED = (Advertise, Unadvertise, Subscribe, Unsubscribe)  # a client's keys are checked as ids

LAG_FACTOR = 4
"""A lagging replica's link (see Broker.link_congested) is closed past this many times
``send_buffer_limit`` queued to it."""

NOT_READING = "not reading"
"""Why a client is not read: more than ``send_buffer_limit`` is queued to it
(``slow_consumer = "drop"``), so its requests' replies would queue without bound."""

# A neighbour that cannot be dialled: warn once it fails for this long, then this often.
_LINK_WARN_AFTER = 2.0
_LINK_WARN_EVERY = 30.0
_REMOVALS = {"adv": ("UNADVERTISE", "advertisement"), "sub": ("UNSUBSCRIBE", "subscription")}


class UnknownState(InvalidRequest):
    """A neighbour referred to routing state this broker does not hold."""

    code = "unknown_state"


MAX_PUBLISHER_SESSIONS = 65_536
"""Publishers whose last session a broker remembers (the one whose session it saw first is
forgotten first)."""


class PublisherSession:
    """A publisher's last session here and the highest seq it published in it (updated in
    place on every publication)."""

    __slots__ = ("seq", "session")

    def __init__(self, session: str, seq: int) -> None:
        self.session = session
        self.seq = seq


PROBE_GRACE = 2.0
"""Seconds a client's connection has to answer the PING sent when another session presents
its id, before that session may take the id (:meth:`Broker.still_answers`)."""


class Connection(asyncio.Protocol):
    """One TCP connection: a local client, or a link to a neighbour broker."""

    def __init__(self, broker: Broker, dial_peer: str | None = None) -> None:
        self.broker = broker
        self.decoder = FrameDecoder(broker.config.max_frame)
        self.transport: asyncio.Transport | None = None
        self.peer_id: str | None = None
        self.is_broker = dial_peer is not None
        self.dial_peer = dial_peer
        self.vnhop: VNHop | None = None
        # A control connection carries live-reconfiguration requests, not routing.
        self.control = False
        self.peer = "?"
        self.out: list[bytes] = []
        # Frames in ``out`` that are not deliveries, on a connection that keeps its recent
        # deliveries (see take_out).
        self.unkept: list[bytes] = []
        self.congested = False
        # A broker link over its limit whose VN's other replicas keep up (see
        # Broker.link_congested): not waited for, closed past LAG_FACTOR x the limit.
        self.lagging = False
        self.dropped: dict[str, int] = {}
        self.closing = False
        # Reading: frames read but not yet handled (a suspended decoder pass), bytes that
        # arrived behind them, and what holds reading ("congestion", "freeze", NOT_READING;
        # see hold()).
        # A backlog pauses the transport too, but is worked through slice by slice.
        self.backlog: Iterator[Message] | None = None
        self.unread: list[bytes] = []
        self.holds: set[str] = set()
        self.reading_paused = False
        self.slice_scheduled = False
        self.credentials = Credentials()  # secured-topic rights from HELLO (topic_guard.py)
        # The client's publishing session (HELLO option "session"; kept across reconnects)
        self.session: str | None = None
        # A client's edge VN changed membership: the version this connection was told of, and
        # the one the client said it follows (``NOTICE membership`` both ways).
        self.membership_due = -1
        self.membership_seen = -1
        # A client that said in HELLO it answers ``NOTICE mark`` (see Broker.freeze), and
        # whether it has published: only a publisher's stream needs a common freeze point.
        self.marks = False
        self.published = False
        # A client's PUBLISH frames are refused when their FORWARD would not fit max_frame,
        # its ADVERTISE and SUBSCRIBE frames when they would not under a global key.
        self.forward_limit = self.key_limit = broker.config.max_frame
        # The highest seq this connection published (a client without a session: its seqs
        # must increase on the connection).
        self.max_seq = 0
        self.last_seen = time.monotonic()
        self.opened = self.last_seen
        # When a PING asked whether this client still answers (another session presented
        # its id: Broker.still_answers).
        self.probed: float | None = None
        # An unfinished frame seen by the heartbeat: since when, and the decoder's progress
        # then (see Broker.heartbeat: a frame must complete within three intervals).
        self.partial_since: float | None = None
        self.partial_mark = 0
        # Bytes of the filters a client's routing state holds, by (kind, id), and in all
        # (max_filter_bytes_per_client; kept on the session hop, like the state itself).
        self.filter_bytes: dict[tuple[str, str], int] = {}
        self.filter_total = 0
        # A client's session (broker.daemon.sessions): the connection its routing state is
        # held by when that is not this one (the first connection of a session resumed
        # here; see session_hop), the one that carries a parked session's traffic once it
        # resumed, whether this one's session is parked, whether its loss keeps the session
        # (no clean close), and the plain deliveries it was sent last (they may be lost in
        # flight when it drops).
        self.resumes: Connection | None = None
        self.successor: Connection | None = None
        self.parked = False
        self.lingers = False
        self.recent: RecentFrames | None = None
        loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.handshake: asyncio.Future[None] = loop.create_future()

    @property
    def session_hop(self) -> Connection:
        """The router's hop for this client's requests and deliveries: this connection, or
        the one that held its session before it resumed here (no reference to itself: a
        cycle would keep every closed connection until the cyclic collector runs)."""
        return self.resumes or self

    def __repr__(self) -> str:
        kind = "broker" if self.is_broker else "client"
        return f"<{kind} {self.peer_id or '?'} {self.peer}>"

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        limit = self.broker.config.send_buffer_limit
        self.transport.set_write_buffer_limits(high=limit, low=limit // 2)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.broker.connections.add(self)
        self.broker.stats.connections_opened += 1

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.last_seen = time.monotonic()
        if self.backlog is not None:
            # Read before the pause took effect (a TLS record decrypted with the last one):
            # handled after the backlog, never before it.
            self.unread.append(data)
            return
        self.backlog = self.decoder.feed(data)
        if self.holds:  # read before the hold took effect: not one frame until released
            self.sync_reading()
            return
        self.work()

    def work(self) -> None:
        """Handle the backlog's frames, in order, for up to ``read_slice`` seconds; then
        pause reading and let the loop serve the other connections before the rest.

        The decoder's pass over one read is suspended between slices, so nothing is
        buffered twice; bytes read meanwhile wait in ``unread`` for the next pass."""
        # One turn of the loop gives read_slice in all to the connections with a backlog.
        share = self.broker.config.read_slice / (1 + len(self.broker.waiting))
        clock, handle = time.perf_counter, self.handle
        deadline = clock() + share
        try:
            while self.backlog is not None:
                for msg in self.backlog:
                    handle(msg)
                    if self.closing or self.holds or clock() > deadline:
                        return  # the backlog keeps the rest (finally: pause, schedule)
                if self.unread:
                    data = b"".join(self.unread)
                    self.unread.clear()
                    self.backlog = self.decoder.feed(data)
                else:
                    self.backlog = None
        except TrellisError as exc:
            self.drop_backlog()
            self.fail(exc)
        except Exception as exc:  # a bug must cost one connection, never the broker
            log.exception("internal error on %r", self)
            self.drop_backlog()
            self.fail(exc)
        finally:
            if self.closing:
                self.drop_backlog()
            self.broker.flush()
            self.sync_reading()

    def next_slice(self) -> None:
        """The loop's turn came back to this connection's backlog."""
        self.slice_scheduled = False
        self.broker.waiting.discard(self)
        if self.closing or self.holds or self.backlog is None:
            return  # closed, or held: release() schedules the rest
        self.last_seen = time.monotonic()  # unread because of us, not silent
        self.work()

    def drop_backlog(self) -> None:
        """Forget what was read and not handled (the connection is closing)."""
        self.backlog = None
        self.unread.clear()

    def hold(self, reason: str) -> None:
        """Stop reading this connection (and handling its backlog) for ``reason``, until
        :meth:`release`: each reason holds it on its own (a congested link and a
        reconfiguration freeze may overlap)."""
        self.holds.add(reason)
        self.sync_reading()

    def release(self, reason: str) -> None:
        """Drop one reason to hold reading; read again (after the backlog) if none is left."""
        self.holds.discard(reason)
        self.sync_reading()

    def sync_reading(self) -> None:
        """Pause the transport while a reason holds it or a backlog waits, resume it
        otherwise, and schedule the backlog's next slice if nothing holds it."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        # A half-closed connection (a slow consumer being closed) is read, and what it
        # sends ignored, until the client closes: see close_slow_consumer().
        paused = not self.closing and (bool(self.holds) or self.backlog is not None)
        if paused != self.reading_paused:
            self.reading_paused = paused
            if paused:
                transport.pause_reading()
            else:
                transport.resume_reading()
        if self.closing:
            return
        if self.backlog is not None and not self.holds and not self.slice_scheduled:
            self.slice_scheduled = True
            self.broker.waiting.add(self)
            asyncio.get_running_loop().call_soon(self.next_slice)

    def eof_received(self) -> bool:
        # A paused transport reads no EOF (TLS keeps a close_notify until reading
        # resumes), so the backlog is empty here: the stream ended after every frame.
        try:
            self.decoder.check_eof()
        except ProtocolError as exc:
            self.fail(exc)
            self.broker.flush()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and not self.closing:
            self.lingers = True  # reset, not closed: the client may come back for its session
        self.closing = True
        self.drop_backlog()  # a reset loses what was in flight, as TCP's buffers would
        if not self.handshake.done():
            self.handshake.set_exception(ProtocolError(f"connection closed ({exc or 'EOF'})"))
            self.handshake.exception()  # retrieved: the dialer may have given up waiting
        self.broker.connection_closed(self)
        if not self.closed.done():
            self.closed.set_result(None)

    def note_dropped(self, keys: list[str]) -> None:
        for key in keys:
            self.dropped[key] = self.dropped.get(key, 0) + 1

    def pause_writing(self) -> None:
        # A resumed session's deliveries are routed to its first connection: it drops them.
        self.congested = self.session_hop.congested = True
        self.broker.stats.congestion_events += 1
        if self.is_broker:
            self.broker.link_congested(self, True)
        elif self.control:
            # A coordinator reads every answer at once; one that does not would have them
            # queued without bound (an answer may weigh half a frame): not read until it
            # drains, and closed past lag_limit (see flush).
            self.hold(NOT_READING)
        elif self.broker.config.slow_consumer == "disconnect":
            # Not from inside the write that filled the buffer: the broker may be routing.
            asyncio.get_running_loop().call_soon(self.close_slow_consumer)
        else:
            # Its deliveries are dropped from now on, but what it asks for is answered: a
            # client that sends requests and never reads the replies would have them queued
            # without bound. So it is not read either until it drains (TCP holds the rest).
            self.hold(NOT_READING)

    def close_unread_control(self) -> None:
        """A control connection whose answers are not read, ``control_lag_limit`` of them
        queued: closed, what is queued dropped (its requests were read before it stopped)."""
        proto_log.warning(
            "closing %r: more than %d bytes of answers queued to a control connection that "
            "does not read them",
            self,
            self.broker.control_lag_limit,
        )
        if self.transport is not None:
            self.transport.abort()
        self.close()

    def close_slow_consumer(self) -> None:
        """``slow_consumer = "disconnect"``: close a client whose send buffer is full with
        ERROR slow_consumer and withdraw its routing state at once.

        The ERROR waits behind what is queued, so the connection is half-closed (FIN after
        the queue) and read until the client closes: closing a socket that still receives
        (the client's PINGs) would reset it and lose the ERROR. A client that has not
        closed within three heartbeat intervals is aborted (its buffer freed)."""
        if self.closing or not self.congested or self.transport is None:
            return
        limit = self.broker.config.send_buffer_limit
        self.broker.stats.slow_consumers_closed += 1
        err = error_for(
            SlowConsumerError(
                f"more than send_buffer_limit ({limit} bytes) queued to this client: it "
                "does not read its deliveries fast enough (slow_consumer = 'disconnect')"
            )
        )
        proto_log.warning("closing %r: %s: %s", self, err.code, err.message)
        self.send(err)
        self.flush()
        self.closing = True
        self.drop_backlog()
        self.sync_reading()  # read (and ignore) until the client closes
        transport = self.transport
        if transport.can_write_eof():
            transport.write_eof()
        else:  # TLS: no half-close
            transport.close()
        self.broker.connection_closed(self)
        grace = 3 * self.broker.config.heartbeat_interval
        asyncio.get_running_loop().call_later(grace, transport.abort)

    def resume_writing(self) -> None:
        hop = self.session_hop
        self.congested = hop.congested = False
        if self.is_broker:
            self.broker.link_congested(self, False)
        elif NOT_READING in self.holds:
            self.release(NOT_READING)
        if hop.dropped:
            dropped, hop.dropped = hop.dropped, {}
            self.send(Notice("dropped", {"subscriptions": dropped}))
            self.broker.flush()

    # -- sending --------------------------------------------------------------------------

    def send(self, msg: Message) -> None:
        self.send_raw(encode(msg))

    def send_raw(self, data: bytes) -> None:
        successor = self.successor
        if successor is not None:
            successor.send_raw(data)
            return
        if self.parked:
            self.broker.sessions.buffer(self, data)
            return
        if not self.out:
            self.broker.dirty.append(self)
        self.out.append(data)
        if self.recent is not None:
            self.unkept.append(data)

    def deliver_raw(self, data: bytes) -> None:
        """An encoded DELIVER frame, kept among the recent deliveries (sent again if the
        session resumes after a loss: it may not have arrived) when :meth:`flush` writes
        it. The hottest send of all: :meth:`send_raw` is inlined."""
        if self.successor is not None:
            self.successor.deliver_raw(data)
            return
        if self.parked:
            if self.recent is not None:
                self.recent.keep_written([data], [], RECENT_FRAME_BYTES)
            self.broker.sessions.buffer(self, data)
            return
        out = self.out
        if not out:
            self.broker.dirty.append(self)
        out.append(data)

    def take_out(self) -> list[bytes]:
        """The frames queued to write (``out`` starts afresh), the deliveries among them
        kept among the recent ones: once per write, not per delivery (broker.wire.resend)."""
        out = self.out
        self.out = []
        if self.recent is not None:
            if out:
                self.recent.keep_written(out, self.unkept, RECENT_FRAME_BYTES)
            self.unkept = []
        return out

    def flush(self) -> None:
        if not self.out:
            return
        out = self.take_out()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            try:
                transport.write(b"".join(out) if len(out) > 1 else out[0])
            except RuntimeError:
                # uvloop closed the handle under a transport not yet marked closing (the
                # peer reset it); connection_lost follows. Raising here would end whatever
                # task was flushing (the heartbeat's close: the whole broker).
                log.debug("%r: write after the connection was lost", self)
                return
            if self.lagging and transport.get_write_buffer_size() > self.broker.lag_limit:
                self.broker.close_lagging(self)
            elif self.control and (
                transport.get_write_buffer_size() > self.broker.control_lag_limit
            ):
                self.close_unread_control()

    def fail(self, exc: Exception, rid: int = 0) -> None:
        """Report ``exc`` in an ERROR frame and close this connection only."""
        err = error_for(exc, rid)
        proto_log.warning("closing %r: %s: %s", self, err.code, err.message)
        self.broker.stats.protocol_errors += 1
        self.send(err)
        self.close()

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        self.drop_backlog()
        self.flush()
        if self.transport is not None:
            self.transport.close()

    # -- frames ---------------------------------------------------------------------------

    def handle(self, msg: Message) -> None:
        if type(msg) is Publish and not self.is_broker and self.peer_id is not None:
            self.broker.publish(self, msg)
        elif self.peer_id is None:
            self.handshake_step(msg)
        elif self.control:
            self.handle_control(msg)
        elif self.is_broker:
            self.handle_broker(msg)
        else:
            self.handle_client(msg)

    def handshake_step(self, msg: Message) -> None:
        name = type(msg).__name__.upper()
        if self.dial_peer is not None:
            if type(msg) is Welcome:
                self.broker.link_welcomed(self, msg)
            elif type(msg) is Error:
                raise ProtocolError(f"broker {self.dial_peer} refused the link: {msg.message}")
            else:
                raise ProtocolError(f"{name} before WELCOME on a broker link")
        elif type(msg) is Hello:
            self.broker.hello(self, msg)
        else:
            raise ProtocolError(f"{name} before HELLO: the first frame must be HELLO")

    def handle_client(self, msg: Message) -> None:
        broker = self.broker
        router = broker.router
        if type(msg) is Publish:
            broker.publish(self, msg)
            return
        if type(msg) is Pass:
            # The root split of the keys this client publishes under (before their PUBLISH).
            assert self.peer_id is not None
            if not broker.shares.enabled:
                self.reject(0, InvalidRequest(f"PASS: {DISABLED}"))
                return
            broker.shares.passes.pass_arrived(msg, self.peer_id)
            return
        if type(msg) not in _HEARTBEATS:
            broker.stats.count_in(type(msg).__name__.lower())
        if isinstance(msg, _KEYED):
            check_client_key(msg)
            if self.decoder.last > self.key_limit and isinstance(msg, Advertise | Subscribe):
                name = type(msg).__name__.upper()
                self.reject(msg.rid, unroutable(name, self.decoder.last, self.key_limit))
                return
        match msg:
            case Subscribe(rid, sub_id, flt):
                if broker.topic_guard is not None:
                    try:
                        broker.topic_guard.check(self.credentials, "subscribe", flt)
                    except NotAuthorized as exc:
                        self.reject(rid, exc)
                        return
                if self.over_limit(rid, "subscriptions", sub_id, flt):
                    return
                broker.execute(router.subscribe(self.session_hop, sub_id, flt))
                self.ack_in_force(rid)
            case Unsubscribe(rid, sub_id):
                if router.knows_subscription(self.session_hop, sub_id):
                    self.release_filter("subscriptions", sub_id)
                    broker.execute(router.unsubscribe(self.session_hop, sub_id))
                    self.ack(rid)
                else:
                    self.reject(rid, InvalidRequest(f"UNSUBSCRIBE: no subscription '{sub_id}'"))
            case Advertise(rid, adv_id, flt):
                if broker.topic_guard is not None:
                    try:
                        broker.topic_guard.check(self.credentials, "publish", flt)
                    except NotAuthorized as exc:
                        self.reject(rid, exc)
                        return
                if self.over_limit(rid, "advertisements", adv_id, flt):
                    return
                broker.execute(router.advertise(self.session_hop, adv_id, flt))
                self.ack_in_force(rid)
            case Unadvertise(rid, adv_id):
                if router.knows_advertisement(self.session_hop, adv_id):
                    self.release_filter("advertisements", adv_id)
                    broker.execute(router.unadvertise(self.session_hop, adv_id))
                    self.ack(rid)
                else:
                    self.reject(rid, InvalidRequest(f"UNADVERTISE: no advertisement '{adv_id}'"))
            case Ping(token):
                self.send(Pong(token))
            case Pong():
                pass
            case Notice(membership.OP, data):
                version = data.get("version")
                if type(version) is not int:
                    raise ProtocolError("NOTICE membership needs an integer 'version'")
                self.membership_seen = max(self.membership_seen, version)
            case Notice(kind, data) if kind == MARK_NOTICE:
                round_id = data.get("round")
                if type(round_id) is not str:
                    raise ProtocolError("NOTICE mark needs a string 'round'")
                broker.marked(self, round_id)
            case Hello():
                raise ProtocolError("HELLO received twice on one connection")
            case _:
                raise ProtocolError(
                    f"{type(msg).__name__.upper()} is not a message a client may send"
                )

    def handle_control(self, msg: Message) -> None:
        match msg:
            case Reconf(membership.OP, data):
                self.answer_step(self.broker.adopt_membership(data, sender=self.peer_id or ""))
            case Reconf(op, data):
                self.broker.reconfig.control_request(
                    op, data, self.answer_step, sender=self.peer_id or ""
                )
            case Ping(token):
                self.send(Pong(token))
            case Pong():
                pass
            case _:
                raise ProtocolError(
                    f"{type(msg).__name__.upper()} is not valid on a control connection"
                )

    def handle_broker(self, msg: Message) -> None:
        broker = self.broker
        router = broker.router
        hop = self.vnhop
        assert hop is not None
        if type(msg) is Forward:
            peer = self.peer_id
            assert peer is not None
            broker.forwarder.forward(hop, peer, msg)
            return
        if type(msg) is Shares:
            assert self.peer_id is not None
            broker.shares.batch_arrived(msg, self.peer_id, self)
            return
        if type(msg) is Pass:
            assert self.peer_id is not None
            broker.shares.passes.pass_arrived(msg, self.peer_id)
            return
        if type(msg) is Share:
            broker.shares.share_arrived(msg.publisher, msg.seq, msg.record, self.peer_id)
            return
        if type(msg) not in _HEARTBEATS:
            broker.stats.count_in("link_" + type(msg).__name__.lower())
        assert self.peer_id is not None
        match msg:
            case Advertise(_, key, flt):
                self.vote_to_add(hop, "adv", key, flt, router.advertise)
            case Unadvertise(_, key):
                known = router.knows_advertisement(hop, key)
                self.vote_to_remove(hop, "adv", key, known, router.unadvertise)
            case Subscribe(_, key, flt):
                self.vote_to_add(hop, "sub", key, flt, router.subscribe)
            case Unsubscribe(_, key):
                known = router.knows_subscription(hop, key)
                self.vote_to_remove(hop, "sub", key, known, router.unsubscribe)
            case Sync(token, False):
                member = self.peer_id
                waits = hop.wave_entries(member)
                broker.waves.asked(
                    self,
                    hop.peer_id,
                    token,
                    settled=(lambda: not hop.unsettled(member, waits)) if waits else None,
                )
            case Sync(token, True):
                broker.waves.answered(self, token)
            case LinkState():
                broker.linkstate_received(self, msg)
            case Reconf(op, data):
                if op != "marker":
                    raise ProtocolError(f"RECONF {op} is not valid on a broker link")
                broker.reconfig.marker(self.peer_id, data)
            case Ping(token):
                # A link is read whatever is queued to it: one that PINGs and never reads
                # had a PONG queued for each. What is queued shows this broker alive.
                if not self.congested:
                    self.send(Pong(token))
            case Pong():
                pass
            case Error(_, code, message):
                if warned := self.broker.stats.warnings.note(self.peer_id):
                    link_log.warning(
                        "broker %s reports %s: %s (%d such warnings)",
                        self.peer_id,
                        code,
                        message,
                        warned,
                    )
            case _:
                raise ProtocolError(f"{type(msg).__name__.upper()} is not valid on a broker link")

    def vote_to_add(
        self,
        hop: VNHop,
        kind: str,
        key: str,
        flt: Filter,
        apply: Callable[[VNHop, str, Filter], Actions],
    ) -> None:
        """Count this replica's vote for a routing entry; apply it at the VN's majority."""
        if self.vote(hop, (kind, key, flt)):
            self.broker.execute(apply(hop, key, flt))
        self.broker.waves.recheck()

    def vote(self, hop: VNHop, entry: Entry) -> bool:
        """``hop.vote`` for this replica; a vote past its allowance of entries that wait for
        the VN's majority is refused with ``limit_exceeded`` (the link stays)."""
        assert self.peer_id is not None
        try:
            return hop.vote(self.peer_id, entry)
        except LimitExceeded as exc:
            stats = self.broker.stats.over_limit
            stats[VOTE_LIMIT] = stats.get(VOTE_LIMIT, 0) + 1
            self.reject(0, exc)
            return False

    def vote_to_remove(
        self, hop: VNHop, kind: str, key: str, known: bool, apply: Callable[[VNHop, str], Actions]
    ) -> None:
        """Count a vote to remove an entry and apply it at the VN's majority; refuse
        removals of state nobody announced. (A removal already applied still takes late
        replicas' votes; it used to take every vote after the first as late, so with
        replicated VNs nothing was ever withdrawn past the client's edge VN.)"""
        assert self.peer_id is not None
        removal = "un" + kind
        if not known and not hop.has_votes(kind, key) and not hop.has_votes(removal, key):
            message, what = _REMOVALS[kind]
            self.reject(0, UnknownState(f"{message} of unknown {what} '{key}'"))
            return
        if self.vote(hop, (removal, key)) and known:
            if kind == "adv":
                self.remove_behind_publications(hop, key, apply)
            else:
                self.broker.execute(apply(hop, key))
        self.broker.waves.recheck()

    def remove_behind_publications(
        self, hop: VNHop, key: str, apply: Callable[[VNHop, str], Actions]
    ) -> None:
        """Withdraw an advertisement of neighbour VN ``hop`` after the publications from it
        still waiting for agreement (:meth:`Forwarder.after_undecided`): applied earlier,
        the removal would overtake them, and the subscriptions it withdraws downstream
        would leave them no route. Skipped if meanwhile the VN's majority announced the
        advertisement again."""
        broker = self.broker
        router = broker.router
        flt = router.advertisement(hop, key)

        def remove() -> None:
            if router.advertisement(hop, key) == flt and not hop.has_quorum(("adv", key, flt)):
                broker.execute(apply(hop, key))

        broker.forwarder.after_undecided(hop.peer_id, remove, time.monotonic())

    def answer_step(self, reply: Reply) -> None:
        """Answer a reconfiguration step on this control connection."""
        if not self.closing:
            self.send(Reconf("reply", reply.to_data()))
            self.broker.flush()

    def ack(self, rid: int) -> None:
        if rid:
            self.send(Ack(rid))

    def ack_in_force(self, rid: int) -> None:
        """Acknowledge a routing request once the routing state it caused is in force
        across the overlay (:mod:`broker.daemon.waves`)."""
        if rid:
            self.broker.waves.start(lambda: None if self.closing else self.ack(rid))

    def over_limit(self, rid: int, kind: str, key: str, flt: Filter) -> bool:
        """Refuse a new advertisement or subscription past this client's configured limits:
        how many it holds (a replaced one does not count), and the bytes of their filters
        (each may be up to a frame: the count alone would let one client hold gigabytes)."""
        router, hop = self.broker.router, self.session_hop
        ads, subs = router.held_by(hop)
        held, known = (
            (subs, router.knows_subscription(hop, key))
            if kind == "subscriptions"
            else (ads, router.knows_advertisement(hop, key))
        )
        config = self.broker.config
        name = f"max_{kind}_per_client"
        limit: int = getattr(config, name)
        size = len(encode_filter(flt))
        total = hop.filter_total - hop.filter_bytes.get((kind, key), 0) + size
        if known or held < limit:
            if total <= config.max_filter_bytes_per_client:
                hop.filter_bytes[(kind, key)] = size
                hop.filter_total = total
                return False
            name, limit = "max_filter_bytes_per_client", config.max_filter_bytes_per_client
            why = (
                f"its filter of {size} bytes would bring this client's filters to {total} "
                f"bytes, over the broker's limit ({name} = {limit})"
            )
        else:
            why = f"this client holds {held} {kind}, the broker's limit ({name} = {limit})"
        stats = self.broker.stats.over_limit
        stats[name] = stats.get(name, 0) + 1
        self.reject(rid, LimitExceeded(f"{kind[:-1]} '{key}' refused: {why}"))
        return True

    def release_filter(self, kind: str, key: str) -> None:
        """A subscription or advertisement is withdrawn: its bytes leave the budget."""
        hop = self.session_hop
        hop.filter_total -= hop.filter_bytes.pop((kind, key), 0)

    def reject(self, rid: int, exc: TrellisError) -> None:
        """Refuse one request but keep the connection: the frame itself was valid."""
        self.broker.stats.requests_rejected += 1
        proto_log.info("rejected a request from %r: %s", self, exc.message)
        self.send(Error(rid, exc.code, exc.message))


class Broker:
    """Shared state of one broker: routing, connections, overlay links, statistics."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.vn = vn_of(config)
        self.router: Router[Hop] = Router(self.vn, covering=config.covering)
        self.connections: set[Connection] = set()
        self.clients: dict[str, Connection] = {}
        # Publisher id -> its last session and highest seq there, oldest session first: a new
        # session of a known publisher must number past the old one's.
        self.publisher_sessions: OrderedDict[str, PublisherSession] = OrderedDict()
        self.links: dict[str, Connection] = {}
        # Set once a live membership change resized this broker's own VN: the NOTICE its
        # clients were sent, repeated in WELCOME (what a client that connects later follows).
        self.vn_membership: dict[str, Any] | None = None
        self.directory: dict[str, NeighbourConfig] = {
            **{n.id: n for n in config.peers},
            **{n.id: n for n in config.neighbours},
        }
        # Current neighbours; reconfiguration changes them, within the directory of peers.
        saved = load_saved_links(
            config.links_file, [n.id for n in config.neighbours], self.directory
        )
        self.neighbours: dict[str, NeighbourConfig] = {peer: self.directory[peer] for peer in saved}
        self.vnhops: dict[str, VNHop] = {}
        for n in self.neighbours.values():
            self.vnhop_for(n)
        # VNs linked for a reconfiguration in progress, not yet part of routing (changed in
        # place: the routing waves hold it).
        self.standby_vns: set[str] = set()
        self.waves = RoutingWaves(
            self.vnhops, self.flush, config.routing_wave_timeout, self.standby_vns
        )
        # Neighbour VNs taken from f + 1 siblings while running: their links skip the cycle
        # check, which this broker's link states (stale while it had no link) could fail.
        self.adopted_vns: set[str] = set()
        self.dialers: dict[str, asyncio.Task[None]] = {}
        self.frozen = False
        self.frozen_hood: set[str] = set()
        self.paused: list[Connection] = []
        # The round prepared here and its VNs (its marks hold a publisher or a link from
        # outside where they are read), and the streams asked for a mark of it and not yet
        # read up to it.
        self.mark_round: str | None = None
        self.mark_hood: set[str] = set()
        self.marking: set[Connection] = set()
        # Marks asked of this broker by the replicas of neighbour VNs in their rounds.
        self.link_marks: MarkRequests[tuple[str, str], str] = MarkRequests()
        self.linkstates = LinkStates(config.id, self.vn)
        # Broker links over send_buffer_limit; those of them the broker waits for (its
        # local clients are not read meanwhile); how far a lagging one may fall behind.
        self.over_limit: set[Connection] = set()
        self.congested_links: set[Connection] = set()
        self.lag_limit = LAG_FACTOR * config.send_buffer_limit
        # (a control connection's answer may weigh half a frame: two of them always fit)
        self.control_lag_limit = max(self.lag_limit, 2 * config.max_frame)
        self.dirty: list[Connection] = []
        # Connections whose backlog waits for its next slice (they share read_slice).
        self.waiting: set[Connection] = set()
        self.stats = BrokerStats()
        self.forwarder = build_forwarding(config, self.vn, self.router, self.stats, self.neighbours)
        self.shares = self.forwarder.shares
        self.reconfig = reconfig_agent(self, config)
        self.tls = BrokerTLS(config) if config.tls else None
        self.topic_guard = (
            None
            if config.topic_trust is None
            else TopicGuard(load_trusted_tdns(config.topic_trust))
        )
        self.sessions: Sessions[Connection] = Sessions(
            config.session_linger, config.session_buffer, self.end_session
        )

    def save_links(self) -> None:
        """Record the current neighbours in ``links_file`` (blocking: call off the loop)."""
        save_links(self.config.links_file, list(self.neighbours))

    def vnhop_for(self, neighbour: NeighbourConfig) -> VNHop:
        """The router hop of ``neighbour``'s VN (made on first use)."""
        hop = self.vnhops.get(neighbour.vn_id)
        if hop is None:
            hop = self.vnhops[neighbour.vn_id] = VNHop(
                neighbour.vn_id, neighbour.vn_size, self.config.max_vote_bytes_per_source
            )
        return hop

    # -- what live reconfiguration and the admin endpoint see (narrow protocols) ----------

    @property
    def broker_id(self) -> str:
        return self.config.id

    @property
    def replica(self) -> int:
        return self.config.replica

    @property
    def covering(self) -> bool:
        return self.config.covering

    @property
    def max_frame(self) -> int:
        return self.config.max_frame

    def neighbour_vns(self) -> list[str]:
        return sorted(str(h.peer_id) for h in self.router.neighbours if h.is_broker and h.peer_id)

    def link_ids(self) -> Collection[str]:
        return self.links.keys()

    def standby(self) -> Collection[str]:
        return self.standby_vns

    def links_down(self) -> list[str]:
        return sorted(peer for peer in self.neighbours if peer not in self.links)

    def traffic_classes(self) -> Mapping[tuple[Hop, ...], int]:
        return self.forwarder.traffic

    def start_traffic_window(self) -> None:
        self.forwarder.start_window()

    def owned_entries(self) -> tuple[Owned, Owned]:
        return self.router.owned_entries(self.vn)

    def link_tables(self) -> LinkTables:
        return self.router.link_tables()

    def accept_standby(self, vns: set[str]) -> None:
        self.standby_vns |= vns
        self._take_neighbours(vns)

    def _take_neighbours(self, vns: set[str]) -> None:
        """Every broker of ``vns`` (from the directory) becomes a neighbour."""
        for peer in self.directory.values():
            if peer.vn_id in vns:
                self.neighbours[peer.id] = peer
                self.vnhop_for(peer)

    def end_standby(self, vns: set[str]) -> None:
        self.standby_vns -= vns

    def record_routes(self, on: bool) -> None:
        self.forwarder.record_routes(on)

    def replay_routes(self) -> int:
        return self.forwarder.replay_routes()

    def adopt(self, vns: set[str]) -> None:
        self.adopted_vns |= vns
        self._take_neighbours(vns)

    def dial(self, peers: Sequence[NeighbourConfig]) -> None:
        for peer in peers:
            self.start_dialer(peer)

    def send_on_link(self, peer_id: str, msg: Message) -> None:
        conn = self.links.get(peer_id)
        if conn is not None:
            conn.send(msg)

    def install_hood(
        self, hood: set[str], neighbours: set[str], held: Tables, sent: dict[str, dict[str, Filter]]
    ) -> None:
        hops = {vn: self.vnhops[vn] for vn in neighbours}
        for hop in hops.values():
            hop.forget()
        actions: Actions = list(self.router.install_hood(hood, hops, held, sent))
        self.execute(actions)
        self.shares.routing_changed()

    def counters(self) -> dict[str, int]:
        s = self.stats
        return {
            "routed": s.routed,
            "forwarded": sum(s.forwarded.values()),
            "published": s.publications_in,
            "delivered": s.deliveries,
            "copies_in": s.forwards_in,
        }

    @property
    def round_stats(self) -> RoundStats:
        return self.reconfig.stats

    def reconfig_state(self) -> dict[str, Any]:
        return self.reconfig.describe()

    def table_sizes(self) -> tuple[int, int]:
        return self.router.srt_size, self.router.prt_size

    def publisher_streams(self) -> int:
        return len(self.forwarder.streams)

    def connection_counts(self) -> tuple[int, int]:
        return len(self.clients), len(self.links)

    @property
    def vn_size(self) -> int:
        """Replicas of this broker's VN: the manifest in force says, after live changes."""
        manifest = self.shares.manifest
        members = manifest.members.get(self.vn) if manifest is not None else None
        return len(members) if members else self.config.vn_size

    def health(self) -> dict[str, object]:
        """The broker's state at a glance (``/healthz``): ``degraded`` while a link to a
        current neighbour is down, naming it in ``missing_links``."""
        missing = self.links_down()
        manifest = self.shares.manifest
        return {
            "status": "degraded" if missing else "ok",
            "id": self.config.id,
            "clients": len(self.clients),
            "clients_unread": sum(1 for c in self.clients.values() if NOT_READING in c.holds),
            "clients_switching": sum(
                1 for c in self.clients.values() if c.membership_seen < c.membership_due
            ),
            "links": sorted(self.links),
            "links_lagging": sorted(str(c.peer_id) for c in self.over_limit if c.lagging),
            "missing_links": missing,
            "srt": self.router.srt_size,
            "prt": self.router.prt_size,
            "control_in": sum(self.stats.messages_in.values()),
            "publications_in": self.stats.publications_in,
            "deliveries": self.stats.deliveries,
            "manifest_version": None if manifest is None else manifest.version,
            "splits_by_scheme": {
                f"{vn}/{r}": n for (vn, r), n in sorted(self.shares.splits_by_scheme.items())
            },
        }

    def adopt_membership(self, data: Mapping[str, Any], sender: str) -> Reply:
        """The operator's request to adopt a new manifest version (live attach/detach,
        :mod:`broker.daemon.membership`); only under this broker's own id."""
        if sender != self.config.id:
            return Reply(False, f"{self.config.id}: membership changes under the broker's own id")
        try:
            notice = membership.adopt(self, data)
        except TrellisError as exc:
            return Reply(False, f"{self.config.id}: {exc.message}")
        if notice is not None:
            # This broker's own VN changed: its clients follow (they count f + 1 of these).
            self.vn_membership = notice
            version = int(notice["version"])
            for client in self.clients.values():
                client.membership_due = version
                client.send(Notice(membership.OP, notice))
        self.flush()
        return Reply(True)

    # -- handshakes -----------------------------------------------------------------------

    def hello(self, conn: Connection, msg: Hello) -> None:
        if msg.version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"unsupported protocol version {msg.version}; this broker speaks {PROTOCOL_VERSION}"
            )
        if self.tls is not None and conn.transport is not None:
            if msg.role is Role.BROKER:
                self.tls.check_broker(conn.transport, msg.id)
            else:
                self.tls.check_client(conn.transport, msg.id)
        if msg.role is Role.BROKER and msg.options.get("control"):
            if msg.id not in self.directory and msg.id != self.config.id:
                raise NotAuthorized(f"unknown broker '{msg.id}': not a peer of '{self.config.id}'")
            conn.control = True
            conn.peer_id = msg.id
        elif msg.role is Role.BROKER:
            self.accept_link(conn, msg.id)
        else:
            if self.topic_guard is not None:
                certified = None
                if self.tls is not None and conn.transport is not None:
                    certified = self.tls.client_key(conn.transport)
                conn.credentials = self.topic_guard.admit(msg.id, msg.options, certified)
            session = msg.options.get("session")
            conn.session = session if isinstance(session, str) and session else None
            conn.marks = msg.options.get(MARKS_OPTION) is True
            self.attach_client(conn, msg.id)
        options: dict[str, Any] = {
            "max_frame": self.config.max_frame,
            "vn": self.vn,
            "replica": self.config.replica,
            "vn_size": self.vn_size,
        }
        if self.vn_membership is not None and not conn.is_broker:
            options[membership.OP] = self.vn_membership
        elif self.vn_size > 1 and not conn.is_broker:
            options[REPLICAS_OPTION] = self.replica_endpoints()
        resumed = None
        if not conn.is_broker and conn.peer_id is not None:
            resumed = self.sessions.resume(conn.peer_id, conn.session)
            if resumed is not None:
                advertisements, subscriptions = self.router.held_keys(resumed[0])
                options[RESUMED_OPTION] = {
                    "advertisements": advertisements,
                    "subscriptions": subscriptions,
                }
        conn.send(Welcome(PROTOCOL_VERSION, self.config.id, options))
        if conn.is_broker:
            self.link_up(conn)
        elif resumed is not None:
            self.resume_session(conn, *resumed)

    def replica_endpoints(self) -> list[list[str]]:
        """This broker's VN as ``[broker id, endpoint]`` pairs for a client's WELCOME: a
        client given fewer endpoints than a majority of the VN connects to the others too
        (otherwise what it publishes or subscribes is held by too few replicas to be
        forwarded). Its own endpoint is left empty: the client dialled it already. A sibling
        is listed where clients dial it (``client_endpoints``) when that is not where
        brokers do (containers behind published ports)."""
        dial = self.config.client_endpoints
        siblings = {
            n.id: dial.get(n.id, n.endpoint) for n in self.directory.values() if n.vn_id == self.vn
        }
        return [[self.config.id, ""], *([b, siblings[b]] for b in sorted(siblings))]

    def attach_client(self, conn: Connection, client_id: str) -> None:
        old = self.clients.get(client_id)
        if (
            old is not None
            and old is not conn
            and (old.session is None or old.session != conn.session)
            and self.still_answers(old)
        ):
            # Another client (two given one id, or someone using another's id) must not
            # close a live connection and take its subscriptions: only the same session may
            # (its reconnection), or anyone once the old connection stopped answering (a
            # client restarted while its old connection was left half-open).
            raise NotAuthorized(
                f"client id '{client_id}' is in use by a live connection of another session; "
                "every client needs its own id"
            )
        if old is not None and old is not conn:
            log.info(
                "client %s connected again from %s; closing its old session", client_id, conn.peer
            )
            # The same session from a new connection: the old one is stale (its loss not
            # noticed yet), and what it holds passes to the new one (resume_session).
            old.lingers = old.session is not None and old.session == conn.session
            old.fail(ProtocolError(f"client id '{client_id}' connected again: session taken over"))
            if not old.lingers and old.transport is not None:
                # Another session took the id of a connection that stopped answering: what
                # is queued to it would wait on TCP's retransmission back-off.
                old.transport.abort()
            self.connection_closed(old)
        conn.peer_id = client_id
        conn.forward_limit = self.config.max_frame - forward_growth(client_id)
        conn.key_limit = self.config.max_frame - key_growth(self.config.id, client_id)
        if self.sessions.linger > 0:
            conn.recent = recent_deliveries()
        self.clients[client_id] = conn
        if self.congested_links:  # a newcomer is held back with the other clients
            conn.hold("congestion")
        if self.frozen:
            self.hold_back(conn)
        log.debug("client %s connected from %s", client_id, conn.peer)

    def still_answers(self, old: Connection) -> bool:
        """Whether a client's connection shows life now that another session presents its
        id. The heartbeat alone would keep a half-open connection (its client restarted
        after a crash or a cut) for two intervals, refusing the restarted client meanwhile;
        so the first conflicting HELLO sends the old connection a PING, and a later one
        (the SDK retries) finds it dead once that PING went unanswered for
        :data:`PROBE_GRACE` (at most one heartbeat interval). Silence this broker caused
        (a freeze, back-pressure, a backlog not yet read) never counts: such a connection
        answers."""
        now = time.monotonic()
        if now - old.last_seen > 2 * self.config.heartbeat_interval:
            return False
        if old.probed is None or old.last_seen >= old.probed:
            old.probed = now
            old.send(Ping(int(now)))
            return True
        grace = min(PROBE_GRACE, self.config.heartbeat_interval)
        unread = old.reading_paused or bool(old.holds) or bool(self.congested_links)
        return now - old.probed < grace or unread or old in self.paused

    def accept_link(self, conn: Connection, peer_id: str) -> None:
        if peer_id == self.config.id:
            raise ProtocolError(f"a broker cannot link to itself ('{peer_id}')")
        if peer_id not in self.neighbours:
            raise NotAuthorized(
                f"unknown broker '{peer_id}': not a configured neighbour of '{self.config.id}'"
            )
        vn = self.neighbours[peer_id].vn_id
        trusted = vn in self.standby_vns or vn in self.adopted_vns
        cycle = [] if trusted else self.linkstates.cycle_through(self.neighbours[peer_id].vn_id)
        if cycle:
            raise ProtocolError(
                f"link {self.config.id}-{peer_id} would close a cycle in the overlay: "
                + " - ".join(cycle)
            )
        old = self.links.get(peer_id)
        if old is not None:
            link_log.info("broker %s linked again; replacing its old link", peer_id)
            old.close()
            self.connection_closed(old)
        conn.is_broker = True
        conn.peer_id = peer_id

    def link_welcomed(self, conn: Connection, msg: Welcome) -> None:
        if msg.broker_id != conn.dial_peer:
            raise ProtocolError(
                f"expected broker '{conn.dial_peer}' at {conn.peer}, found '{msg.broker_id}'"
            )
        old = self.links.get(msg.broker_id)
        if old is not None and old is not conn:
            old.close()
            self.connection_closed(old)
        conn.peer_id = msg.broker_id
        self.link_up(conn)
        if not conn.handshake.done():
            conn.handshake.set_result(None)

    # -- links and topology ---------------------------------------------------------------

    def link_up(self, conn: Connection) -> None:
        assert conn.peer_id is not None
        self.links[conn.peer_id] = conn
        link_log.info("link %s-%s up (%s)", self.config.id, conn.peer_id, conn.peer)
        for state in self.linkstates.replay():
            conn.send(state)
        self.announce_links()
        if self.frozen:
            self.hold_back(conn)
        hop = self.vnhop_for(self.neighbours[conn.peer_id])
        conn.vnhop = hop
        first = not hop.members
        hop.members[conn.peer_id] = conn
        self.rejudge_lag(hop)
        self.reconfig.links_changed()
        if hop.peer_id in self.standby_vns:
            return  # routing starts when the reconfiguration installs this link
        if first:
            self.execute(self.router.add_neighbour(hop))
        else:
            # Another replica of a VN we already route to: bring it up to date alone.
            for entry in self.router.state_for(hop):
                conn.send(entry)

    def linked_vn(self, peer_id: str) -> str | None:
        """The VN of a current neighbour (None once a reconfiguration removed it)."""
        neighbour = self.neighbours.get(peer_id)
        return neighbour.vn_id if neighbour is not None else None

    def announce_links(self) -> None:
        """Flood this broker's current neighbour set (standby links not included)."""
        msg = self.linkstates.announce(
            [b for b in self.links if self.linked_vn(b) not in self.standby_vns]
        )
        for link in self.links.values():
            link.send(msg)

    def linkstate_received(self, source: Connection, msg: LinkState) -> None:
        if self.linkstates.learn(msg):
            for link in self.links.values():
                if link is not source:
                    link.send(msg)

    def link_congested(self, conn: Connection, congested: bool) -> None:
        """Pause reading from local clients while a broker link is over its limit and
        what is queued to it may have no other way: its VN has no spare replica (f = 0),
        or more than f of its replicas' links are over. A replica lagging alone (at most f
        of its VN's) is not waited for: its siblings carry the same publications, and a
        faulty replica that reads its link at a trickle while answering PINGs held every
        publisher of this broker back for good (until 2026-11-29). Its link stays open,
        and is closed once LAG_FACTOR x send_buffer_limit is queued to it."""
        before = bool(self.congested_links)
        if congested:
            self.over_limit.add(conn)
        else:
            self.over_limit.discard(conn)
            conn.lagging = False
            self.congested_links.discard(conn)
        hop = conn.vnhop
        if hop is not None:
            self.judge_lag(hop)
        elif congested:
            self.congested_links.add(conn)
        if conn.lagging and congested:
            assert hop is not None
            link_log.info(
                "link %s-%s over send_buffer_limit; its VN %s has replicas to spare: not "
                "waited for (the others carry the same publications)",
                self.config.id,
                conn.peer_id,
                hop.peer_id,
            )
        self.hold_for_links(before)

    def judge_lag(self, hop: VNHop) -> None:
        """Whether the links over their limit to ``hop``'s replicas may lag: while those
        replicas and the ones not linked at all are at most f, the others carry what is
        queued to them."""
        group = [c for c in self.over_limit if c.vnhop is hop]
        behind = len(group) + max(0, hop.size - len(hop.members))
        lagging = behind <= (hop.size - 1) // 2
        for member in group:
            member.lagging = lagging
            if lagging:
                self.congested_links.discard(member)
            else:
                self.congested_links.add(member)

    def rejudge_lag(self, hop: VNHop) -> None:
        """A replica of ``hop`` linked or unlinked: those lagging may lag no longer."""
        if self.over_limit:
            before = bool(self.congested_links)
            self.judge_lag(hop)
            self.hold_for_links(before)

    def hold_for_links(self, before: bool) -> None:
        """Hold or release the local clients if waiting for links started or ended."""
        after = bool(self.congested_links)
        if before != after:
            for client in list(self.clients.values()):
                if after:
                    client.hold("congestion")
                else:
                    client.release("congestion")

    def close_lagging(self, conn: Connection) -> None:
        """A lagging replica's link is over ``lag_limit``: closed (it is re-dialled; what
        was queued to it is lost to it alone, its VN's other replicas had it too)."""
        conn.lagging = False  # (closing flushes it once more)
        self.stats.lagging_links_closed += 1
        link_log.warning(
            "link %s-%s closed: %d bytes queued to it (over %d, %d x send_buffer_limit) while "
            "the other replicas of its VN kept up",
            self.config.id,
            conn.peer_id,
            conn.transport.get_write_buffer_size() if conn.transport is not None else 0,
            self.lag_limit,
            LAG_FACTOR,
        )
        conn.fail(ProtocolError("lagging replica: more than its VN's siblings queued to it"))
        if conn.transport is not None:
            conn.transport.abort()

    def freeze(self, hood: set[str]) -> int:
        """Stop reading from local clients and from links outside ``hood`` (TCP holds the
        rest), so that the neighbourhood's own links can be drained; returns how many
        streams are read up to a mark of the round: those asked for one now, and those whose
        mark arrived before this replica froze (the siblings' ``f + 1`` asked first).

        The replicas of this VN each freeze when their own freeze arrives, at different
        points of what they read from outside; a publication read in between would be
        routed on the old tables at one replica and on the new ones at another, one good
        copy on each path. So a publisher that answers marks, and every link from outside
        the neighbourhood, is not stopped at once but asked for a mark of the prepared round
        (``NOTICE mark`` to a client, a ``RECONF marker`` of wave 4 on a link) and read up to
        it (:meth:`marked`). The client, or the broker at the other end, writes one mark to
        every replica of this VN at one point of what it sends them once ``f + 1`` asked (one
        of them honest, and frozen), so every honest replica stops at the same publication
        of each stream."""
        self.frozen = True
        self.frozen_hood = hood
        round_id = self.mark_round
        early = 0
        for conn in list(self.connections):
            if conn.transport is None or conn.closing or conn.control or conn.peer_id is None:
                continue
            if "freeze" in conn.holds:
                early += 1  # read up to its mark already (before this replica froze)
                continue
            if conn.is_broker:
                if self.linked_vn(conn.peer_id) in hood:
                    continue  # drained by the round's markers
                if round_id is not None:
                    self.marking.add(conn)
                    conn.send(Reconf("marker", {"round": round_id, "wave": MARK_ASK}))
                    continue
            elif round_id is not None and conn.marks and conn.published:
                self.marking.add(conn)
                conn.send(Notice(MARK_NOTICE, {"round": round_id}))
                continue
            self.hold_back(conn)
        return len(self.marking) + early

    def expect_marks(self, round_id: str | None, hood: Collection[str] = ()) -> None:
        """A round over the VNs ``hood`` was prepared here (its marks now hold publishers
        and links from outside ``hood``), or it ended."""
        self.mark_round = round_id
        self.mark_hood = set(hood)

    def marked(self, conn: Connection, round_id: str) -> None:
        """A publisher's or an outside link's mark was read: hold it there if the mark is of
        the prepared round (even before this replica froze: ``f + 1`` replicas asked for it,
        one of them honest and frozen, so the other honest ones hold at the same point)."""
        if round_id != self.mark_round or "freeze" in conn.holds:
            return  # a round that ended, or a second mark
        self.marking.discard(conn)
        conn.hold("freeze")
        self.paused.append(conn)
        self.reconfig.links_changed()

    def link_mark_asked(self, peer_id: str, round_id: str) -> None:
        """A replica of a neighbour VN frozen for a live round (this broker is outside its
        neighbourhood) asks for a mark: once ``f + 1`` replicas of that VN asked, write one
        to each of them, after everything routed to them so far (key shares included)."""
        asker = self.neighbours.get(peer_id)
        hop = self.vnhops.get(asker.vn_id) if asker is not None else None
        if hop is None or not self.link_marks.ask(
            (hop.peer_id, round_id), peer_id, vouch_quorum(hop.size)
        ):
            return
        if self.shares.pending:
            self.shares.flush(write=False)
        hop.send(Reconf("marker", {"round": round_id, "wave": MARK}))

    def link_marked(self, peer_id: str, round_id: str) -> None:
        """A mark on a link from outside the neighbourhood of the prepared round."""
        conn = self.links.get(peer_id)
        if conn is not None and self.linked_vn(peer_id) not in self.mark_hood:
            self.marked(conn, round_id)

    def marks_owed(self) -> int:
        """Streams (publishers, links from outside) asked for a mark and not yet read up
        to it."""
        return len(self.marking)

    def marks_progress(self) -> int:
        """Bytes read so far of the streams that owe a mark."""
        return sum(conn.decoder.consumed for conn in self.marking)

    def hold_unmarked(self) -> None:
        """Stop reading the streams whose mark did not come in time, where they are."""
        owed, self.marking = self.marking, set()
        for conn in owed:
            if not conn.closing:
                self.hold_back(conn)

    def hold_back(self, conn: Connection) -> None:
        """While frozen, pause a client or a link that leaves the neighbourhood."""
        if conn.is_broker and self.linked_vn(conn.peer_id or "") in self.frozen_hood:
            return
        if conn.transport is not None:
            conn.hold("freeze")
            self.paused.append(conn)

    def unfreeze(self) -> None:
        """Read again from everything :meth:`freeze` or a mark paused (clients stay held
        while a broker link is congested)."""
        self.frozen = False
        self.marking.clear()
        paused, self.paused = self.paused, []
        now = time.monotonic()
        for conn in paused:
            conn.last_seen = now
            conn.release("freeze")

    def retire(self, vn: str) -> None:
        """Drop neighbour VN ``vn`` after a reconfiguration removed its link: stop dialling
        it, refuse its reconnections and close its links without withdrawing anything
        (the router no longer routes through it)."""
        self.adopted_vns.discard(vn)
        hop = self.vnhops.get(vn)
        for peer_id in [p for p, n in self.neighbours.items() if n.vn_id == vn]:
            self.stop_dialer(peer_id)
            del self.neighbours[peer_id]
            conn = self.links.get(peer_id)
            if conn is not None:
                if hop is not None and hop.members.get(peer_id) is conn:
                    del hop.members[peer_id]
                conn.close()
        if hop is not None:
            hop.forget()

    def start_dialer(self, neighbour: NeighbourConfig) -> None:
        """Keep a link to ``neighbour`` open from this side (the side with the smaller id)."""
        if self.config.id < neighbour.id and neighbour.id not in self.dialers:
            task = asyncio.get_running_loop().create_task(self.maintain_link(neighbour))
            self.dialers[neighbour.id] = task

    def stop_dialer(self, peer_id: str) -> None:
        task = self.dialers.pop(peer_id, None)
        if task is not None:
            task.cancel()

    # -- routing --------------------------------------------------------------------------

    def execute(self, actions: Actions) -> None:
        """Send the control messages a routing change produced."""
        for hop, msg in actions:
            if not hop.closing:
                hop.send(msg)

    def connection_closed(self, conn: Connection) -> None:
        if conn not in self.connections:
            return
        self.connections.discard(conn)
        if conn in self.over_limit:  # the clients it held back are read again
            self.link_congested(conn, False)
        if conn.peer_id is not None:
            if conn.is_broker and self.links.get(conn.peer_id) is conn:
                del self.links[conn.peer_id]
                link_log.info("link %s-%s down", self.config.id, conn.peer_id)
                self.announce_links()
                self.reconfig.links_changed()
            elif not conn.is_broker and self.clients.get(conn.peer_id) is conn:
                del self.clients[conn.peer_id]
        if conn in self.marking:  # a freeze waits for no mark from it any more
            self.marking.discard(conn)
            self.reconfig.links_changed()
        hop = conn.vnhop
        if hop is not None:
            self.waves.lost(conn)
        if hop is None:
            if conn.is_broker or not conn.lingers or not self.park_session(conn):
                session = conn.session_hop
                session.successor = None
                self.shares.link_gone(session)
                self.execute(self.router.remove_hop(session))
        elif hop.members.get(conn.peer_id or "") is conn:
            del hop.members[conn.peer_id or ""]
            self.rejudge_lag(hop)
            if not hop.members:
                # The whole neighbouring VN is gone: withdraw what was learned through it.
                hop.forget()
                self.execute(self.router.remove_hop(hop))
        self.flush()

    def park_session(self, conn: Connection) -> bool:
        """Keep the session of a client connection just lost (broker.daemon.sessions);
        False when it is not kept (sessions off, no session token)."""
        hop = conn.session_hop
        sessions = self.sessions
        if not sessions.can_park(hop) or hop.parked:
            return False
        # What was queued and not written joins the recent deliveries (and is among the
        # recent shares, its SHARES frames numbered certificates the way the lost
        # connection did).
        conn.take_out()
        recent = hop.recent
        inflight = recent.take() if recent is not None else []
        hop.successor = None
        hop.parked = True
        hop.closing = False
        hop.congested = False
        self.stats.sessions_parked += 1
        sessions.park(hop, inflight)
        self.shares.resend_recent(hop)
        return True

    def resume_session(self, conn: Connection, hop: Connection, frames: list[bytes]) -> None:
        """A client connected and its session, parked here on ``hop``, resumed: ``conn``
        carries it on, starting with the deliveries kept for it (its WELCOME listed what the
        session holds, so the client withdraws what it dropped while away)."""
        self.stats.sessions_resumed += 1
        hop.parked = False
        hop.successor = conn
        conn.resumes = hop
        conn.recent = hop.recent
        for frame in frames:
            conn.send_raw(frame)

    def end_session(self, hop: Connection) -> None:
        """A parked session not resumed in time (or overflowing): withdraw its routing state."""
        self.stats.sessions_ended += 1
        hop.parked = False
        hop.successor = None
        hop.closing = True
        self.shares.link_gone(hop)
        self.execute(self.router.remove_hop(hop))
        self.flush()

    def publish(self, source: Connection, msg: Publish) -> None:
        """A local client's publication: route it, then acknowledge or refuse it."""
        assert source.peer_id is not None
        if source.decoder.last > source.forward_limit:
            source.reject(msg.rid, unforwardable(source.decoder.last, source.forward_limit))
            return
        source.published = True
        session = source.session
        known = self.publisher_sessions.get(source.peer_id) if session is not None else None
        if known is not None and known.session == session and msg.seq > known.seq:
            # The usual case, with one lookup: the next seq of a session known here.
            problem = self.forwarder.publish(source.session_hop, source.peer_id, msg)
            if problem is None:
                known.seq = msg.seq
        else:
            verdict = self.sequence(source, msg.seq)
            if verdict is False:
                # Sent again by a client whose session resumed (it may have died with the
                # lost connection): routed once.
                if msg.rid:
                    source.send(Ack(msg.rid))
                return
            problem = (
                verdict
                if isinstance(verdict, InvalidRequest)
                else self.forwarder.publish(source.session_hop, source.peer_id, msg)
            )
            if problem is None:
                if session is not None:
                    self.note_published(source.peer_id, session, msg.seq)
                else:
                    source.max_seq = max(source.max_seq, msg.seq)
        if problem is not None:
            source.reject(msg.rid, problem)
        elif msg.rid:
            source.send(Ack(msg.rid))

    def sequence(self, source: Connection, seq: int) -> bool | InvalidRequest:
        """Whether publication ``seq`` may follow what ``source`` published: True; False when
        this broker routed it already (sent again by a client whose session resumed:
        acknowledged, not routed twice); or why it is refused.

        Subscribers deliver each publisher's publications in seq order from 1 and
        deduplicate by (publisher, seq): a seq that does not increase within its session (or
        its connection, without one), or that numbers into an earlier session's seqs, would
        be acknowledged here and then dropped downstream, silently."""
        if seq < 1:
            return InvalidRequest(f"PUBLISH seq {seq}: a publisher's seqs start at 1")
        if source.session is None:
            last, where = source.max_seq, "connection"
        else:
            known = self.publisher_sessions.get(source.peer_id or "")
            if known is None or seq > known.seq:
                return True
            last, where = known.seq, "session"
            if known.session != source.session:
                return InvalidRequest(
                    f"PUBLISH seq {seq}: publisher '{source.peer_id}' published up to seq "
                    f"{last} in an earlier session, and subscribers deduplicate by (publisher, "
                    "seq); a publisher that restarts under the same client id must continue "
                    f"its numbering past {last} (Client(first_seq=...), trellis pub --first-seq)"
                )
            if not self.forwarder.seen.fresh(source.peer_id or "", seq):
                return False
        if seq > last:
            return True
        return InvalidRequest(
            f"PUBLISH seq {seq}: this {where} already published seq {last}; a "
            "publisher's seqs must increase"
        )

    def note_published(self, publisher: str, session: str, seq: int) -> None:
        """Remember ``seq`` as published in ``session``. On every publication, so the entry
        of the session already known is updated in place (the map is ordered by when each
        session was first seen, which bounds it as well as recency did: an active publisher
        whose entry fell out is noted again at its next publication)."""
        sessions = self.publisher_sessions
        known = sessions.get(publisher)
        if known is not None and known.session == session:
            known.seq = seq  # past known.seq: sequence() let it through
            return
        sessions.pop(publisher, None)
        sessions[publisher] = PublisherSession(session, seq)
        if len(sessions) > MAX_PUBLISHER_SESSIONS:
            sessions.popitem(last=False)

    def flush(self) -> None:
        if self.shares.pending:
            self.shares.flush(write=False)
        dirty = self.dirty
        if dirty:
            self.dirty = []
            for conn in dirty:
                conn.flush()

    # -- background work ------------------------------------------------------------------

    async def watch_copies(self) -> None:
        """Keep replicated streams moving: abandon stuck publications, blame silent replicas."""
        interval = min(self.config.copy_patience, self.config.silence_deadline) / 2
        while True:
            await asyncio.sleep(interval)
            self.forwarder.tick(time.monotonic())
            self.flush()

    def stalled_frame(self, conn: Connection, now: float, limit: float) -> bool:
        """Close ``conn`` (and say True) when a frame it began has not completed for
        ``limit`` seconds: a byte now and then resets the silence timer, so a trickle could
        otherwise hold up to ``max_frame`` bytes of buffer open forever."""
        decoder = conn.decoder
        if decoder.buffered == 0 or conn.backlog is not None:
            conn.partial_since = None  # (a backlog waits on this broker, not on the peer)
            return False
        if conn.partial_since is None or decoder.consumed != conn.partial_mark:
            conn.partial_since = now
            conn.partial_mark = decoder.consumed
            return False
        if now - conn.partial_since <= limit:
            return False
        conn.fail(
            ProtocolError(
                f"a frame begun {now - conn.partial_since:.1f} s ago is still incomplete "
                f"({decoder.buffered} bytes): a frame must arrive within 3 heartbeat intervals"
            )
        )
        return True

    async def heartbeat(self) -> None:
        """Ping quiet peers (and every peer a freeze leaves unread) and close the ones
        silent for three intervals."""
        interval = self.config.heartbeat_interval
        tick = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            # A tick this late means the broker itself was busy (e.g. working through a
            # storm of requests): what peers sent meanwhile waits unread, so the delay is
            # not their silence.
            late = now - tick - interval
            tick = now
            if late > interval / 2:
                for conn in self.connections:
                    conn.last_seen += late
                    if conn.partial_since is not None:
                        conn.partial_since += late
            paused = set(self.paused)
            congested = bool(self.congested_links)
            for conn in list(self.connections):
                if conn in paused:
                    # Not read during a reconfiguration freeze: its silence is ours. And ours
                    # must not look like death to it: a freeze lasts up to a lease, which
                    # may be more than three intervals, and a neighbour outside the round
                    # that closed the link would lose what this broker routes before the
                    # link is back and its subscriptions are relearned. Its PONGs wait
                    # unread like the rest.
                    conn.send(Ping(int(now)))
                    continue
                if (
                    congested and conn.peer_id is not None and not conn.is_broker
                ) or NOT_READING in conn.holds:
                    # Not read while a broker link is congested (back-pressure), or while
                    # it does not read what it is sent: its silence is ours too.
                    conn.last_seen = now
                    continue
                if self.stalled_frame(conn, now, 3 * interval):
                    continue
                silent = now - conn.last_seen
                if conn.peer_id is None:
                    if now - conn.opened > self.config.hello_timeout:
                        conn.fail(ProtocolError(f"no HELLO within {self.config.hello_timeout:g} s"))
                elif silent > 3 * interval:
                    conn.lingers = True  # lost, not closed by the client: its session waits
                    conn.fail(ProtocolError(f"peer silent for {silent:.1f} s (heartbeat timeout)"))
                    # A silent peer will not read what is queued to it: a graceful close
                    # would wait for TCP to deliver it (minutes of retransmission back-off
                    # after a partition) before the link is withdrawn and re-dialled.
                    if conn.transport is not None:
                        conn.transport.abort()
                elif silent > interval:
                    conn.send(Ping(int(now)))
            self.flush()

    def link_tls(self) -> dict[str, Any]:
        """``create_connection`` arguments for dialling a broker: mutual TLS when on."""
        if self.tls is None:
            return {}
        return {
            "ssl": self.tls.link,
            "ssl_handshake_timeout": self.config.tls_handshake_timeout,
        }

    async def maintain_link(self, neighbour: NeighbourConfig) -> None:
        """Keep the link to a neighbour this broker dials open, with jittered backoff."""
        host, _, port = neighbour.endpoint.rpartition(":")
        loop = asyncio.get_running_loop()
        attempt = 0
        failing_since: float | None = None
        warned_at: float | None = None
        while True:
            try:
                async with asyncio.timeout(self.config.hello_timeout):
                    _, conn = await loop.create_connection(
                        lambda: Connection(self, dial_peer=neighbour.id),
                        host,
                        int(port),
                        **self.link_tls(),
                    )
                if self.tls is not None and conn.transport is not None:
                    try:
                        self.tls.check_broker(conn.transport, neighbour.id)
                    except TrellisError:
                        conn.close()
                        raise
                conn.send(Hello(PROTOCOL_VERSION, Role.BROKER, self.config.id, {}))
                self.flush()
                async with asyncio.timeout(self.config.hello_timeout):
                    await asyncio.shield(conn.handshake)
                if warned_at is not None:
                    link_log.info(
                        "link %s-%s up after %d failed attempts",
                        self.config.id,
                        neighbour.id,
                        attempt,
                    )
                attempt = 0
                failing_since = warned_at = None
                await conn.closed
            except (OSError, TrellisError, TimeoutError) as exc:
                if isinstance(exc, ssl.SSLError | TLSError):
                    exc = TLSError(f"TLS: {describe_tls_error(exc)}")
                link_log.debug("link %s-%s: %s", self.config.id, neighbour.id, exc)
                # Warn once the failure outlasts a start-up race, then at most every
                # _LINK_WARN_EVERY seconds: not at every backoff attempt.
                now = loop.time()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= _LINK_WARN_AFTER and (
                    warned_at is None or now - warned_at >= _LINK_WARN_EVERY
                ):
                    warned_at = now
                    link_log.warning(
                        "cannot link %s-%s at %s for %.0f s (%d attempts): %s",
                        self.config.id,
                        neighbour.id,
                        neighbour.endpoint,
                        now - failing_since,
                        attempt + 1,
                        str(exc) or type(exc).__name__,
                    )
            attempt += 1
            cap = min(self.config.link_backoff_max, 0.05 * 2**attempt)
            await asyncio.sleep(random.uniform(cap / 2, cap))
