"""The broker daemon: clients, overlay links, routing, graceful shutdown.

Connections are ``asyncio.Protocol`` objects: every frame is handled synchronously in
``data_received`` and replies are gathered per connection and flushed once per read, so a
burst of publications costs one ``write`` per receiving connection, not one per message.

Back-pressure policy (documented in the README):

* A publisher is never slowed by a slow subscriber. Each client connection has a bounded
  send buffer (``send_buffer_limit``); while it is over the limit the broker drops
  deliveries to that connection, counts them per subscription, and once the buffer drains
  sends a ``NOTICE dropped`` frame with the counts (the SDK raises ``SlowConsumerError``).
* Publications between brokers are never dropped. While a link to a neighbour broker is
  over its limit, the broker stops reading from its local clients, so TCP flow control
  pushes back on the publishers at the edge.
* There is no unbounded queue inside the broker: work is done as frames are read.

Overlay links: each broker lists its neighbours; the one with the smaller id dials, the
other accepts only configured neighbours and refuses a link that would close a cycle in
the topology it knows from link-state announcements (``LINKSTATE``, flooded on change).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, cast

from broker.daemon.config import BrokerConfig, NeighbourConfig, vn_of
from broker.daemon.shares import SecureForwarding
from broker.daemon.stats import BrokerStats
from broker.errors import InvalidRequest, NotAuthorized, ProtocolError, TrellisError
from broker.routing.router import Router
from broker.wire.protocol import (
    PROTOCOL_VERSION,
    Ack,
    Advertise,
    Error,
    Forward,
    FrameDecoder,
    Hello,
    LinkState,
    Message,
    Notice,
    Ping,
    Pong,
    Publish,
    Reconf,
    Role,
    Share,
    Subscribe,
    Unadvertise,
    Unsubscribe,
    Welcome,
    encode,
    encode_deliver,
    encode_forward,
    error_for,
)
from security.publication import signature_valid

log = logging.getLogger("trellis.broker")
proto_log = logging.getLogger("trellis.protocol")
link_log = logging.getLogger("trellis.overlay")


# Matching latency is timed on one publication in 16: the clock calls cost more than a sample.
_MATCH_SAMPLE_MASK = 15
# Heartbeats are not counted as control traffic (tests wait for control traffic to settle).
_HEARTBEATS = (Ping, Pong)
_REMOVALS = {"adv": ("UNADVERTISE", "advertisement"), "sub": ("UNSUBSCRIBE", "subscription")}


class UnknownState(InvalidRequest):
    """A neighbour referred to routing state this broker does not hold."""

    code = "unknown_state"


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
        self.congested = False
        self.dropped: dict[str, int] = {}
        self.closing = False
        self.last_seen = time.monotonic()
        self.opened = self.last_seen
        loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.handshake: asyncio.Future[None] = loop.create_future()

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
        try:
            for msg in self.decoder.feed(data):
                self.handle(msg)
        except TrellisError as exc:
            self.fail(exc)
        except Exception as exc:  # a bug must cost one connection, never the broker
            log.exception("internal error on %r", self)
            self.fail(exc)
        finally:
            self.broker.flush()

    def eof_received(self) -> bool:
        try:
            self.decoder.check_eof()
        except ProtocolError as exc:
            self.fail(exc)
            self.broker.flush()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if not self.handshake.done():
            self.handshake.set_exception(ProtocolError(f"connection closed ({exc or 'EOF'})"))
            self.handshake.exception()  # retrieved: the dialer may have given up waiting
        self.broker.connection_closed(self)
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self.congested = True
        self.broker.stats.congestion_events += 1
        if self.is_broker:
            self.broker.link_congested(self, True)

    def resume_writing(self) -> None:
        self.congested = False
        if self.is_broker:
            self.broker.link_congested(self, False)
        if self.dropped:
            dropped, self.dropped = self.dropped, {}
            self.send(Notice("dropped", {"subscriptions": dropped}))
            self.broker.flush()

    # -- sending --------------------------------------------------------------------------

    def send(self, msg: Message) -> None:
        self.send_raw(encode(msg))

    def send_raw(self, data: bytes) -> None:
        if not self.out:
            self.broker.dirty.append(self)
        self.out.append(data)

    def flush(self) -> None:
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out) if len(self.out) > 1 else self.out[0])
        self.out.clear()

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
        if type(msg) not in _HEARTBEATS:
            broker.stats.count_in(type(msg).__name__.lower())
        match msg:
            case Subscribe(rid, sub_id, flt):
                broker.execute(router.subscribe(self, sub_id, flt))
                self.ack(rid)
            case Unsubscribe(rid, sub_id):
                if router.knows_subscription(self, sub_id):
                    broker.execute(router.unsubscribe(self, sub_id))
                    self.ack(rid)
                else:
                    self.reject(rid, InvalidRequest(f"UNSUBSCRIBE: no subscription '{sub_id}'"))
            case Advertise(rid, adv_id, flt):
                broker.execute(router.advertise(self, adv_id, flt))
                self.ack(rid)
            case Unadvertise(rid, adv_id):
                if router.knows_advertisement(self, adv_id):
                    broker.execute(router.unadvertise(self, adv_id))
                    self.ack(rid)
                else:
                    self.reject(rid, InvalidRequest(f"UNADVERTISE: no advertisement '{adv_id}'"))
            case Ping(token):
                self.send(Pong(token))
            case Pong():
                pass
            case Hello():
                raise ProtocolError("HELLO received twice on one connection")
            case _:
                raise ProtocolError(
                    f"{type(msg).__name__.upper()} is not a message a client may send"
                )

    def handle_control(self, msg: Message) -> None:
        match msg:
            case Reconf():
                self.broker.reconfig.control_request(self, msg)
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
        if type(msg) is Forward:
            broker.forward(self, msg)
            return
        if type(msg) is Share:
            broker.secure.share_arrived(msg.publisher, msg.seq, msg.record, self)
            return
        if type(msg) not in _HEARTBEATS:
            broker.stats.count_in("link_" + type(msg).__name__.lower())
        hop = self.vnhop
        assert hop is not None
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
            case LinkState():
                broker.linkstate_received(self, msg)
            case Reconf():
                broker.reconfig.link_message(self, msg)
            case Ping(token):
                self.send(Pong(token))
            case Pong():
                pass
            case Error(_, code, message):
                link_log.warning("broker %s reports %s: %s", self.peer_id, code, message)
            case _:
                raise ProtocolError(f"{type(msg).__name__.upper()} is not valid on a broker link")

    def vote_to_add(self, hop: VNHop, kind: str, key: str, flt: Any, apply: Any) -> None:
        """Count this replica's vote for a routing entry; apply it at the VN's majority."""
        assert self.peer_id is not None
        if hop.vote(self.peer_id, (kind, key, flt)):
            hop.forget("un" + kind, key)
            self.broker.execute(apply(hop, key, flt))

    def vote_to_remove(self, hop: VNHop, kind: str, key: str, known: bool, apply: Any) -> None:
        """Count a vote to remove an entry; refuse removals of state nobody announced."""
        assert self.peer_id is not None
        removal = "un" + kind
        if hop.has_votes(removal, key):
            hop.vote(self.peer_id, (removal, key))  # a late replica's copy of an applied removal
        elif not known and not hop.has_votes(kind, key):
            message, what = _REMOVALS[kind]
            self.reject(0, UnknownState(f"{message} of unknown {what} '{key}'"))
        elif hop.vote(self.peer_id, (removal, key)):
            hop.forget(kind, key)
            self.broker.execute(apply(hop, key))

    def ack(self, rid: int) -> None:
        if rid:
            self.send(Ack(rid))

    def reject(self, rid: int, exc: TrellisError) -> None:
        """Refuse one request but keep the connection: the frame itself was valid."""
        self.broker.stats.requests_rejected += 1
        proto_log.info("rejected a request from %r: %s", self, exc.message)
        self.send(Error(rid, exc.code, exc.message))


class SeenPublications:
    """Which (publisher, seq) this broker has already routed, within a sliding window.

    Copies of one publication arrive from every replica of the upstream VN, in any order
    across replicas; a window of ``horizon`` sequence numbers per publisher bounds memory.
    """

    def __init__(self, horizon: int = 65536) -> None:
        self.horizon = horizon
        self._seen: dict[str, set[int]] = {}
        self._floor: dict[str, int] = {}

    def fresh(self, publisher: str, seq: int) -> bool:
        """Whether (publisher, seq) has not been routed yet."""
        if seq < self._floor.get(publisher, 0):
            return False
        seen = self._seen.get(publisher)
        return seen is None or seq not in seen

    def mark(self, publisher: str, seq: int) -> None:
        """Record (publisher, seq) as routed."""
        seen = self._seen.setdefault(publisher, set())
        seen.add(seq)
        if len(seen) > 2 * self.horizon:
            floor = max(seen) - self.horizon
            self._floor[publisher] = floor
            self._seen[publisher] = {s for s in seen if s >= floor}


class VNHop:
    """A neighbouring virtual node as one hop of the router.

    Messages to it go to every replica whose link is up. Routing messages from it take
    effect only once a majority of its replicas sent the same entry, so a Byzantine
    minority can neither inject nor withdraw routing state.
    """

    is_broker = True
    closing = False

    def __init__(self, vn: str, size: int) -> None:
        self.peer_id = vn
        self.size = size
        self.quorum = size // 2 + 1
        self.members: dict[str, Connection] = {}
        self._votes: dict[tuple[Any, ...], set[str]] = {}

    def __repr__(self) -> str:
        return f"<vn {self.peer_id} {sorted(self.members)}/{self.size}>"

    def send(self, msg: Message) -> None:
        for conn in self.members.values():
            if not conn.closing:
                conn.send(msg)

    def send_raw(self, data: bytes) -> None:
        for conn in self.members.values():
            if not conn.closing:
                conn.send_raw(data)

    def vote(self, member: str, entry: tuple[Any, ...]) -> bool:
        """Count ``member``'s vote for ``entry``; True exactly when it reaches the quorum."""
        voters = self._votes.setdefault(entry, set())
        if member in voters:
            return False
        voters.add(member)
        return len(voters) == self.quorum

    def has_votes(self, *prefix: Any) -> bool:
        n = len(prefix)
        return any(e[:n] == prefix for e in self._votes)

    def forget(self, *prefix: Any) -> None:
        """Drop the votes on entries starting with ``prefix`` (their outcome is applied)."""
        n = len(prefix)
        for entry in [e for e in self._votes if e[:n] == prefix]:
            del self._votes[entry]


class Broker:
    """Shared state of one broker: routing, connections, overlay links, statistics."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.vn = vn_of(config)
        self.byzantine = config.byzantine
        self.router: Router[Any] = Router(self.vn, covering=config.covering)
        self.connections: set[Connection] = set()
        self.clients: dict[str, Connection] = {}
        self.links: dict[str, Connection] = {}
        self.directory: dict[str, NeighbourConfig] = {
            **{n.id: n for n in config.peers},
            **{n.id: n for n in config.neighbours},
        }
        # Current neighbours; reconfiguration changes them, within the directory of peers.
        self.neighbours: dict[str, NeighbourConfig] = {
            peer: self.directory[peer] for peer in self.saved_links()
        }
        self.vnhops: dict[str, VNHop] = {}
        for n in self.neighbours.values():
            self.vnhop_for(n)
        # VNs linked for a reconfiguration in progress, not yet part of routing.
        self.standby_vns: set[str] = set()
        self.dialers: dict[str, asyncio.Task[None]] = {}
        self.frozen = False
        self.frozen_hood: set[str] = set()
        self.paused: list[Connection] = []
        # Traffic classes seen since the last window: (source hop, *target hops) -> count.
        self.traffic: defaultdict[tuple[Any, ...], int] = defaultdict(int)
        # broker id -> (version, its VN, its live links)
        self.linkstate: dict[str, tuple[int, str, frozenset[str]]] = {}
        self.seen = SeenPublications()
        self.secure = SecureForwarding(self)
        self.congested_links: set[Connection] = set()
        self.dirty: list[Connection] = []
        self.stats = BrokerStats()
        from broker.daemon.reconfig_agent import ReconfigAgent

        self.reconfig = ReconfigAgent(self)

    def saved_links(self) -> list[str]:
        """The neighbours to start with: those in ``links_file`` when it exists (the tree
        as the last reconfiguration left it), else the configured ones."""
        path = self.config.links_file
        configured = [n.id for n in self.config.neighbours]
        if path is None or not path.exists():
            return configured
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))["neighbours"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring links file %s: %s", path, exc)
            return configured
        if not isinstance(saved, list) or not all(isinstance(p, str) for p in saved):
            log.warning("ignoring links file %s: 'neighbours' is not a list of ids", path)
            return configured
        unknown = [p for p in saved if p not in self.directory]
        if unknown:
            log.warning("ignoring links file %s: unknown brokers %s", path, unknown)
            return configured
        return saved

    def save_links(self) -> None:
        """Record the current neighbours in ``links_file`` (atomically)."""
        path = self.config.links_file
        if path is None:
            return
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"neighbours": sorted(self.neighbours)}) + "\n", encoding="utf-8")
        tmp.replace(path)

    def vnhop_for(self, neighbour: NeighbourConfig) -> VNHop:
        """The router hop of ``neighbour``'s VN (made on first use)."""
        hop = self.vnhops.get(neighbour.vn_id)
        if hop is None:
            hop = self.vnhops[neighbour.vn_id] = VNHop(neighbour.vn_id, neighbour.vn_size)
        return hop

    # -- handshakes -----------------------------------------------------------------------

    def hello(self, conn: Connection, msg: Hello) -> None:
        if msg.version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"unsupported protocol version {msg.version}; this broker speaks {PROTOCOL_VERSION}"
            )
        if msg.role is Role.BROKER and msg.options.get("control"):
            if msg.id not in self.directory and msg.id != self.config.id:
                raise NotAuthorized(f"unknown broker '{msg.id}': not a peer of '{self.config.id}'")
            conn.control = True
            conn.peer_id = msg.id
        elif msg.role is Role.BROKER:
            self.accept_link(conn, msg.id)
        else:
            self.attach_client(conn, msg.id)
        options = {
            "max_frame": self.config.max_frame,
            "vn": self.vn,
            "replica": self.config.replica,
            "vn_size": self.config.vn_size,
        }
        conn.send(Welcome(PROTOCOL_VERSION, self.config.id, options))
        if conn.is_broker:
            self.link_up(conn)

    def attach_client(self, conn: Connection, client_id: str) -> None:
        old = self.clients.get(client_id)
        if old is not None and old is not conn:
            log.info(
                "client %s connected again from %s; closing its old session", client_id, conn.peer
            )
            old.fail(ProtocolError(f"client id '{client_id}' connected again: session taken over"))
            self.connection_closed(old)
        conn.peer_id = client_id
        self.clients[client_id] = conn
        if self.frozen:
            self.hold_back(conn)
        log.debug("client %s connected from %s", client_id, conn.peer)

    def accept_link(self, conn: Connection, peer_id: str) -> None:
        if peer_id == self.config.id:
            raise ProtocolError(f"a broker cannot link to itself ('{peer_id}')")
        if peer_id not in self.neighbours:
            raise NotAuthorized(
                f"unknown broker '{peer_id}': not a configured neighbour of '{self.config.id}'"
            )
        standby = self.neighbours[peer_id].vn_id in self.standby_vns
        cycle = [] if standby else self.cycle_through(peer_id)
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
        for broker_id, (version, vn, neighbours) in self.linkstate.items():
            conn.send(LinkState(broker_id, vn, version, sorted(neighbours)))
        self.announce_links()
        if self.frozen:
            self.hold_back(conn)
        hop = self.vnhop_for(self.neighbours[conn.peer_id])
        conn.vnhop = hop
        first = not hop.members
        hop.members[conn.peer_id] = conn
        if hop.peer_id in self.standby_vns:
            return  # routing starts when the reconfiguration installs this link
        if first:
            self.execute(self.router.add_neighbour(hop))
        else:
            # Another replica of a VN we already route to: bring it up to date alone.
            for msg in self.router.state_for(hop):
                conn.send(msg)

    def linked_vn(self, peer_id: str) -> str | None:
        """The VN of a current neighbour (None once a reconfiguration removed it)."""
        neighbour = self.neighbours.get(peer_id)
        return neighbour.vn_id if neighbour is not None else None

    def announce_links(self) -> None:
        """Flood this broker's current neighbour set (versioned by wall clock, so a
        restarted broker's announcements supersede its earlier ones)."""
        version = max(time.time_ns(), self.linkstate.get(self.config.id, (0,))[0] + 1)
        mine = frozenset(b for b in self.links if self.linked_vn(b) not in self.standby_vns)
        self.linkstate[self.config.id] = (version, self.vn, mine)
        msg = LinkState(self.config.id, self.vn, version, sorted(mine))
        for link in self.links.values():
            link.send(msg)

    def linkstate_received(self, source: Connection, msg: LinkState) -> None:
        known = self.linkstate.get(msg.broker_id)
        if msg.broker_id == self.config.id or (known and known[0] >= msg.version):
            return
        self.linkstate[msg.broker_id] = (msg.version, msg.vn, frozenset(msg.neighbours))
        for link in self.links.values():
            if link is not source:
                link.send(msg)

    def topology_edges(self) -> set[frozenset[str]]:
        """VN links whose replicas both announce them (a dead broker's stale claims do
        not count); the overlay is a tree of VNs, replicas of neighbours all linked."""
        edges = set()
        for a, (_, vn_a, neighbours) in self.linkstate.items():
            for b in neighbours:
                other = self.linkstate.get(b)
                if other is not None and a in other[2] and vn_a != other[1]:
                    edges.add(frozenset((vn_a, other[1])))
        return edges

    def cycle_through(self, peer_id: str) -> list[str]:
        """The VN path from here to ``peer_id``'s VN in the known overlay, if one exists."""
        me = self.vn
        peer_id = self.neighbours[peer_id].vn_id
        adjacency: dict[str, set[str]] = {}
        for edge in self.topology_edges():
            a, b = tuple(edge)
            if {a, b} == {me, peer_id}:
                continue
            adjacency.setdefault(a, set()).add(b)
            adjacency.setdefault(b, set()).add(a)
        parent: dict[str, str] = {me: me}
        frontier = [me]
        while frontier:
            nxt = []
            for node in frontier:
                for other in adjacency.get(node, ()):
                    if other not in parent:
                        parent[other] = node
                        nxt.append(other)
            frontier = nxt
        if peer_id not in parent:
            return []
        path = [peer_id]
        while path[-1] != me:
            path.append(parent[path[-1]])
        return path[::-1]

    def link_congested(self, conn: Connection, congested: bool) -> None:
        """Pause reading from local clients while any broker link is over its limit."""
        before = bool(self.congested_links)
        if congested:
            self.congested_links.add(conn)
        else:
            self.congested_links.discard(conn)
        after = bool(self.congested_links)
        if before != after and not self.frozen:
            for client in self.clients.values():
                if client.transport is not None and not client.closing:
                    if after:
                        client.transport.pause_reading()
                    else:
                        client.transport.resume_reading()

    def freeze(self, hood: set[str]) -> None:
        """Stop reading from local clients and from links outside ``hood`` (TCP holds the
        rest), so that the neighbourhood's own links can be drained."""
        self.frozen = True
        self.frozen_hood = hood
        for conn in list(self.connections):
            if conn.transport is None or conn.closing or conn.control or conn.peer_id is None:
                continue
            self.hold_back(conn)

    def hold_back(self, conn: Connection) -> None:
        """While frozen, pause a client or a link that leaves the neighbourhood."""
        if conn.is_broker and self.linked_vn(conn.peer_id or "") in self.frozen_hood:
            return
        if conn.transport is not None:
            conn.transport.pause_reading()
            self.paused.append(conn)

    def unfreeze(self) -> None:
        """Read again from everything :meth:`freeze` paused (clients stay paused while a
        broker link is congested)."""
        self.frozen = False
        paused, self.paused = self.paused, []
        now = time.monotonic()
        for conn in paused:
            if conn.transport is None or conn.closing:
                continue
            conn.last_seen = now
            if not conn.is_broker and self.congested_links:
                continue
            conn.transport.resume_reading()

    def retire(self, vn: str) -> None:
        """Drop neighbour VN ``vn`` after a reconfiguration removed its link: stop dialling
        it, refuse its reconnections and close its links without withdrawing anything
        (the router no longer routes through it)."""
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

    def execute(self, actions: list[tuple[Any, Message]]) -> None:
        """Send the control messages a routing change produced."""
        for hop, msg in actions:
            if not hop.closing:
                hop.send(msg)

    def connection_closed(self, conn: Connection) -> None:
        if conn not in self.connections:
            return
        self.connections.discard(conn)
        self.congested_links.discard(conn)
        if conn.peer_id is not None:
            if conn.is_broker and self.links.get(conn.peer_id) is conn:
                del self.links[conn.peer_id]
                link_log.info("link %s-%s down", self.config.id, conn.peer_id)
                self.announce_links()
            elif not conn.is_broker and self.clients.get(conn.peer_id) is conn:
                del self.clients[conn.peer_id]
        hop = conn.vnhop
        if hop is None:
            self.execute(self.router.remove_hop(conn))
        elif hop.members.get(conn.peer_id or "") is conn:
            del hop.members[conn.peer_id or ""]
            if not hop.members:
                # The whole neighbouring VN is gone: withdraw what was learned through it.
                hop.forget()
                self.execute(self.router.remove_hop(hop))
        self.flush()

    def publish(self, source: Connection, msg: Publish) -> None:
        self.stats.publications_in += 1
        if not self.router.is_advertised(source, msg.attrs):
            source.reject(
                msg.rid,
                InvalidRequest(
                    f"PUBLISH seq {msg.seq}: the publication matches none of this client's "
                    "advertisements; advertise first"
                ),
            )
            return
        assert source.peer_id is not None
        sec = msg.sec
        if sec is None:
            self.dispatch(source, source.peer_id, msg.seq, msg.attrs, msg.payload)
        else:
            problem = self.secure.check_publish(source.peer_id, msg)
            if problem:
                source.reject(msg.rid, InvalidRequest(f"PUBLISH seq {msg.seq}: {problem}"))
                return
            share = sec.get("share")
            public = {k: v for k, v in sec.items() if k != "share"}
            self.dispatch(source, source.peer_id, msg.seq, msg.attrs, msg.payload, public)
            if share is not None:
                self.secure.share_arrived(source.peer_id, msg.seq, share)
        if msg.rid:
            source.send(Ack(msg.rid))

    def forward(self, source: Connection, msg: Forward) -> None:
        self.stats.forwards_in += 1
        # Every replica of the upstream VN sends a copy: route the first one only, and for
        # a confidential one, the first whose publisher signature checks.
        if not self.seen.fresh(msg.publisher, msg.seq):
            return
        if msg.sec is not None and not signature_valid(
            msg.publisher, msg.seq, msg.attrs, msg.payload, msg.sec
        ):
            self.stats.bad_signatures += 1
            link_log.warning(
                "discarding %s/%d from %s: publisher signature does not verify",
                msg.publisher,
                msg.seq,
                source.peer_id,
            )
            return
        self.seen.mark(msg.publisher, msg.seq)
        self.dispatch(source.vnhop, msg.publisher, msg.seq, msg.attrs, msg.payload, msg.sec)

    def dispatch(
        self,
        source: Any,
        publisher: str,
        seq: int,
        attrs: dict[str, Any],
        payload: bytes,
        sec: dict[str, Any] | None = None,
    ) -> None:
        """Deliver to matching local subscribers and forward toward matching brokers."""
        stats = self.stats
        if self.byzantine == "drop":
            return
        if self.byzantine == "corrupt":
            payload = bytes(b ^ 0x5A for b in payload)
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
        for conn, keys in targets.items():
            if conn.is_broker:
                if forward_frame is None:
                    forward_frame = encode_forward(publisher, seq, attrs, payload, sec)
                conn.send_raw(forward_frame)
                stats.count_forward(conn.peer_id)
            elif conn.congested:
                for key in keys:
                    conn.dropped[key] = conn.dropped.get(key, 0) + 1
                stats.deliveries_dropped += 1
            else:
                # Subscribers with the same subscription ids share one encoded frame.
                key = tuple(keys)
                data = deliver_frames.get(key)
                if data is None:
                    data = deliver_frames[key] = encode_deliver(
                        keys, publisher, seq, attrs, payload, sec=sec
                    )
                conn.send_raw(data)
                stats.deliveries += 1
        if sec is not None:
            # After the content, so every hop sees a publication before its key shares.
            self.secure.routed(publisher, sec["epoch"], targets, sec)

    def flush(self) -> None:
        dirty = self.dirty
        if dirty:
            self.dirty = []
            for conn in dirty:
                conn.flush()

    # -- background work ------------------------------------------------------------------

    async def heartbeat(self) -> None:
        """Ping quiet peers and close the ones silent for three intervals."""
        interval = self.config.heartbeat_interval
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            paused = set(self.paused)
            for conn in list(self.connections):
                if conn in paused:
                    continue  # not read during a reconfiguration freeze: its silence is ours
                silent = now - conn.last_seen
                if conn.peer_id is None:
                    if now - conn.opened > self.config.hello_timeout:
                        conn.fail(ProtocolError(f"no HELLO within {self.config.hello_timeout:g} s"))
                elif silent > 3 * interval:
                    conn.fail(ProtocolError(f"peer silent for {silent:.1f} s (heartbeat timeout)"))
                elif silent > interval:
                    conn.send(Ping(int(now)))
            self.flush()

    async def maintain_link(self, neighbour: NeighbourConfig) -> None:
        """Keep the link to a neighbour this broker dials open, with jittered backoff."""
        host, _, port = neighbour.endpoint.rpartition(":")
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            try:
                async with asyncio.timeout(self.config.hello_timeout):
                    _, conn = await loop.create_connection(
                        lambda: Connection(self, dial_peer=neighbour.id), host, int(port)
                    )
                conn.send(Hello(PROTOCOL_VERSION, Role.BROKER, self.config.id, {}))
                self.flush()
                async with asyncio.timeout(self.config.hello_timeout):
                    await asyncio.shield(conn.handshake)
                attempt = 0
                await conn.closed
            except (OSError, TrellisError, TimeoutError) as exc:
                link_log.debug("link %s-%s: %s", self.config.id, neighbour.id, exc)
            attempt += 1
            cap = min(self.config.link_backoff_max, 0.05 * 2**attempt)
            await asyncio.sleep(random.uniform(cap / 2, cap))


class Server:
    """Runs a ``Broker``: startup, serve until a signal, staged graceful shutdown."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker = Broker(config)
        self._stop = asyncio.Event()
        self._signals = 0
        self.port: int | None = None
        self.admin_port: int | None = None

    def request_stop(self) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second stop signal: exiting now")
            os._exit(1)
        self._stop.set()

    async def serve(self) -> None:
        from broker.daemon.admin import start_admin

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        server = await loop.create_server(
            lambda: Connection(self.broker), self.config.host, self.config.port, reuse_address=True
        )
        self.port = server.sockets[0].getsockname()[1]
        admin = None
        if self.config.admin_port is not None:
            admin = await start_admin(self.broker, self.config.host, self.config.admin_port)
            self.admin_port = admin.sockets[0].getsockname()[1]
        log.info("broker %s listening on %s:%d", self.config.id, self.config.host, self.port)
        if self.config.vn_size < 3:
            log.warning(
                "VN %s has %d replica(s): it tolerates no Byzantine replica, and its brokers can "
                "read the keys of confidential publications routed through it",
                self.broker.vn,
                self.config.vn_size,
            )
        self._write_ready_file()
        async with asyncio.TaskGroup() as tg:
            background = [
                tg.create_task(self.broker.heartbeat()),
                tg.create_task(self.broker.reconfig.run()),
            ]
            for neighbour in list(self.broker.neighbours.values()):
                self.broker.start_dialer(neighbour)
            await self._stop.wait()
            log.info("broker %s shutting down", self.config.id)
            server.close()
            for task in background:
                task.cancel()
            for peer_id in list(self.broker.dialers):
                self.broker.stop_dialer(peer_id)
            await self._close_connections()
        if admin is not None:
            admin.close()
        await server.wait_closed()
        log.info("broker %s stopped", self.config.id)

    async def _close_connections(self) -> None:
        conns = list(self.broker.connections)
        for conn in conns:
            if not conn.is_broker:
                conn.send(Notice("shutdown", {"broker": self.config.id}))
        self.broker.flush()
        for conn in conns:
            conn.close()
        if conns:
            await asyncio.wait([c.closed for c in conns], timeout=self.config.shutdown_timeout)
        for conn in list(self.broker.connections):
            if conn.transport is not None:
                conn.transport.abort()

    def _write_ready_file(self) -> None:
        path = self.config.ready_file
        if path is None:
            return
        tmp = Path(f"{path}.tmp")
        info: dict[str, Any] = {
            "host": self.config.host,
            "port": self.port,
            "admin_port": self.admin_port or 0,
            "pid": os.getpid(),
        }
        tmp.write_text(" ".join(f"{k}={v}" for k, v in info.items()) + "\n", encoding="utf-8")
        tmp.replace(path)


def run(config: BrokerConfig) -> None:
    """Run a broker until SIGTERM/SIGINT, on uvloop when it is installed."""
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(Server(config).serve())
