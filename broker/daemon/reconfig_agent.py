"""Live OCBR reconfiguration in a broker (SPEC §5): the I/O around :mod:`reconfig.live`.

Every ``interval`` (jittered) a broker whose VN has at least two neighbour VNs may act as
master. Its *coordinator* is the lowest-numbered live replica of the VN (a replica defers
while a lower sibling answers a control connection): crash-tolerant leadership. The
coordinator is not trusted with the outcome (see "A Byzantine coordinator" below); it
only drives the steps. It runs one round over the
neighbourhood: the master VN plus its neighbour VNs, every replica of each. It talks to
each member broker over a short-lived *control connection* (HELLO with ``control``), one
``RECONF`` request and reply per step:

1. ``lock``: each member grants a lease or refuses at once. Nobody waits for a lock, so
   two masters cannot deadlock: the refused one releases what it got and tries again at
   its next (jittered) turn. A lease expires on its own (a timer) if its master goes silent.
   A member whose links the round needs are not all up refuses (:meth:`_links_down_for`).
2. The coordinator plans from the traffic classes it counted since its last window
   (:mod:`reconfig.ocbr`); without a cheaper tree it unlocks and stops here.
3. ``prepare`` then ``connect``: members first check the plan against their own view and
   accept its new neighbours, then open the new links in *standby*: connected, not routed
   over. (Two steps, so no dialler reaches an acceptor that does not expect it yet.)
4. ``freeze``: members stop reading from local clients and from links that leave the
   neighbourhood (TCP holds that traffic back; nothing is dropped) and drain the old
   links in two waves of in-band markers. Neighbours mark their links to the master;
   once the master has every wave-1 marker, every publication sent to it has been
   routed, and it answers with wave-2 markers. A neighbour holding every wave-2 marker
   has routed everything the master sent it. Nothing moves in the neighbourhood then.
   Every marker carries the digest of the plan its sender prepared.
5. ``install``: every replica of the master VN, whose star carried every entry that crosses
   the neighbourhood, computes what each link of the new tree carries
   (:func:`broker.routing.router.hood_routing`), installs its own VN's tables and sends
   each other member its VN's tables in a wave-3 marker (a *vouch*). The other members
   install tables that ``f + 1`` replicas of the master VN vouched for. Links leaving the
   neighbourhood hear only of entries a member gained or lost outright (SPEC §5: nothing
   else changes outside).
6. ``resume``: members read again, close the removed links and release the lock.

Publications held back by the freeze are routed afterwards on the new tree, so none is
lost or duplicated. Per-publisher order holds too: every earlier publication has left the
neighbourhood's links before a later one is read.

A Byzantine coordinator (or any f replicas of a VN of 2f + 1) cannot make an honest broker
install a wrong plan, wrong links or wrong routing tables. The rule, in three parts:

* **Each member checks the plan against its own view** before it acts
  (:func:`reconfig.live.plan_problem`): the plan names the master it granted its lock to;
  the neighbourhood is the master VN and VNs adjacent to it (at a replica of the master VN:
  exactly its neighbour VNs, none dropped and none added; elsewhere: the master is a
  neighbour and no other VN of the neighbourhood is); the links form one spanning tree over
  exactly those VNs (none leaves it, none repeats, no cycle, nobody cut off). A refusal is
  the step's error, naming the member and why; the round aborts and nothing changed.
  Replacing the star of a tree by any spanning tree over the same VNs leaves a tree over
  all VNs, every VN with its own replicas, so a plan the master VN's honest replicas accept
  is a valid rearrangement (it may not be the cheapest: the search is the coordinator's).
* **Plans are compared before anyone drains**: the drain markers carry the plan's digest,
  a replica of the master VN sends no wave-2 marker unless every wave-1 marker matched its
  plan, and a member whose markers disagree refuses the freeze. Every replica of the master
  VN is linked to every replica of each neighbour VN, so a member of another VN drains only
  when every honest member holds its plan, and a master replica only when every honest
  member of the other VNs holds its plan; a member installs only after it drained.
* **No member installs tables only the coordinator computed**: replicas of the master VN
  compute their own (the star's entries are the same at every honest replica once the
  neighbourhood is drained, and ``hood_routing`` is deterministic); every other member
  installs the tables ``f + 1`` distinct replicas of the master VN vouched for over their
  broker links (:func:`reconfig.live.vouch_quorum`), at least one of them honest. The
  coordinator's ``install`` tables only break a tie; a mismatch is logged. A drained
  member of another VN that holds such vouches but never hears ``install`` (or hears
  ``resume`` first) installs them when its lease ends: a replica of the master VN has
  switched, so going back would leave it alone on the old tree.

Traffic is held back at most one lease after the master's latest step, and never more than
``MAX_HOLD_LEASES`` leases per lock: each step of the round renews the lease when it
arrives (and the freeze once drained), asking again for a lock does not, and ``unlock``
after ``prepare`` undoes the round like ``abort``. A coordinator whose freeze took so long
(or whose round is so old) that an install might reach a member after that member's lease
ended aborts instead of installing: nobody has vouched for tables yet, so every member goes
back alike (an install after the lease once left members split between the two trees
until the next repair).

What a Byzantine coordinator can still do is deny service: refuse to run rounds, propose
trees that do not lower the cost, or, as a crashed one can, leave a round half-applied by
sending ``install`` to some replicas of the master VN and not others. Replicas that went
back on a round their siblings went forward on (or the reverse) are brought in line by
:meth:`ReconfigAgent.repair_from_siblings`: right after going back, and every
``repair_interval``, a replica takes the neighbour VNs and routing tables f + 1 of its
siblings keep, so a VN converges to what f + 1 of its replicas did.
A Byzantine replica of a neighbour VN can make rounds abort (wrong marker digests).
``broker.daemon.reconfig_faults`` holds Byzantine coordinators for tests.

The agent sees the broker only through :class:`Neighbourhood`; waits are on events (a link
came up or went down, a marker arrived) and timers (lease expiry), never on polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from broker.daemon.config import NeighbourConfig, ReconfigConfig
from broker.daemon.hops import Hop
from broker.daemon.links import sibling_agreement, sibling_tables
from broker.errors import PayloadTooLarge
from broker.language.filters import Filter
from broker.routing.router import LinkTables, Owned, hood_routing
from broker.wire.protocol import (
    DEFAULT_MAX_FRAME,
    HEADER_SIZE,
    MAX_ROUND_ID,
    PROTOCOL_VERSION,
    Hello,
    Message,
    Ping,
    Pong,
    Reconf,
    Role,
    Welcome,
    decode_body,
    encode,
)
from overlay.tree import Link, link
from reconfig.cost import CostModel, LocalView, SwapEvaluator
from reconfig.live import (
    MAX_HOLD_LEASES,
    OK,
    Install,
    Lock,
    MarkerBook,
    MemberRounds,
    Pending,
    Prepare,
    Reply,
    RequestedMove,
    RoundStats,
    Step,
    parse_move,
    parse_step,
    tables_digest,
    vouch_quorum,
)
from reconfig.ocbr import OcbrPlan, TabuParams, plan_view
from reconfig.table_parts import (
    MAX_PARTS,
    PartsInProgress,
    TablesError,
    merge_tables,
    split_tables,
)
from reconfig.table_parts import Tables as TablePart
from security.ca import Identity
from security.errors import InvalidRequest, ProtocolError, TrellisError
from security.tls import peer_identity

log = logging.getLogger("trellis.reconfig")

Tables = dict[str, tuple[dict[str, Filter], dict[str, Filter]]]
WireTables = dict[str, tuple[dict[str, Any], dict[str, Any]]]

# Marker waves: 1 and 2 drain the old links and carry the plan's digest; 3 is a master
# replica's vouch for one neighbour VN's new tables; 4 asks a broker outside the
# neighbourhood for a mark in what it sends this VN, and 5 is that mark (Broker.freeze).
DRAIN = 1
VOUCH = 3
MARK_ASK = 4
MARK = 5

DIGEST_LENGTH = 64
"""Characters of a plan's or tables' digest (SHA-256 in hex) in a marker."""

# Seconds between asking a sibling busy with a round for its neighbours again.
_ASK_AGAIN = 0.2
_RECHECK = 1.0  # seconds from a repair to the next check
# Seconds a freeze waits for its publishers' marks (a client answers within a round trip).
_MARK_PATIENCE = 1.0
# The share of a lease an install must have left, counted from the freeze step: what it
# needs to reach every member (whose lease its freeze renewed) before that lease ends.
_INSTALL_MARGIN = 0.25


class Neighbourhood(Protocol):
    """What live reconfiguration needs of its broker (implemented by the daemon's
    :class:`~broker.daemon.dispatch.Broker`)."""

    @property
    def broker_id(self) -> str: ...

    @property
    def vn(self) -> str: ...

    @property
    def replica(self) -> int: ...

    @property
    def covering(self) -> bool: ...

    @property
    def max_frame(self) -> int: ...

    @property
    def directory(self) -> Mapping[str, NeighbourConfig]:
        """Every broker this one may link to: configured neighbours and peers."""

    def neighbour_vns(self) -> list[str]:
        """The neighbour VNs routed to now."""

    def link_ids(self) -> Collection[str]:
        """Brokers this one has a live link to (standby links included)."""

    def linked_vn(self, peer_id: str) -> str | None:
        """The VN of a current neighbour broker."""

    def standby(self) -> Collection[str]:
        """VNs linked for a round in progress, not routed over yet."""

    def links_down(self) -> list[str]:
        """Current neighbour brokers whose link is not up (one restarting, a link being
        dialled again)."""

    def traffic_classes(self) -> Mapping[tuple[Hop, ...], int]: ...

    def start_traffic_window(self) -> None: ...

    def owned_entries(self) -> tuple[Owned, Owned]: ...

    def link_tables(self) -> LinkTables:
        """Per neighbour VN: what this broker holds from it and has forwarded to it."""

    def accept_standby(self, vns: set[str]) -> None:
        """Take the brokers of ``vns`` as neighbours, linked in standby."""

    def record_routes(self, on: bool) -> None:
        """Start (a round was prepared) or stop recording what this broker routes."""

    def replay_routes(self) -> int:
        """Send what was routed since the prepare to the neighbours the new tables add."""

    def adopt(self, vns: set[str]) -> None:
        """Take the brokers of ``vns`` as neighbours (f + 1 siblings are linked to them),
        accepting their links whatever this broker's link states say."""

    def dial(self, peers: Sequence[NeighbourConfig]) -> None:
        """Start keeping links to ``peers`` open (from the side that dials)."""

    def link_tls(self) -> dict[str, Any]:
        """``open_connection`` arguments for a connection to another broker (TLS if on)."""

    def freeze(self, hood: set[str]) -> int:
        """Stop reading outside ``hood``; ask publishers that answer marks and links from
        outside for one instead (returns how many were asked)."""

    def expect_marks(self, round_id: str | None, hood: Collection[str] = ()) -> None:
        """Hold publishers and links from outside ``hood`` at marks of ``round_id``
        (prepared here), or at none."""

    def marks_owed(self) -> int:
        """Streams (publishers, links from outside) asked for a mark and not yet read up
        to it."""

    def marks_progress(self) -> int:
        """Bytes read so far of the streams that owe a mark (it grows while they are read
        toward it)."""

    def hold_unmarked(self) -> None:
        """Stop reading the streams whose mark did not come, where they are."""

    def link_mark_asked(self, peer_id: str, round_id: str) -> None:
        """A replica of a neighbour VN in a round asks this broker for a mark."""

    def link_marked(self, peer_id: str, round_id: str) -> None:
        """The mark on a link from outside the neighbourhood of the prepared round."""

    def unfreeze(self) -> None: ...

    def send_on_link(self, peer_id: str, msg: Message) -> None: ...

    def install_hood(
        self, hood: set[str], neighbours: set[str], held: Tables, sent: dict[str, dict[str, Filter]]
    ) -> None:
        """Switch the neighbourhood's routing state to the new tree; end standby."""

    def end_standby(self, vns: set[str]) -> None: ...

    def retire(self, vn: str) -> None:
        """Drop neighbour VN ``vn`` (its link left the tree)."""

    def announce_links(self) -> None: ...

    def flush(self) -> None:
        """Write out what the calls above queued."""

    def save_links(self) -> None:
        """Persist the current neighbours (blocking file I/O)."""

    def counters(self) -> dict[str, int]:
        """Traffic counters for ``/reconfig``: routed, forwarded, published, delivered."""


ASKED_TABLES_BYTES = 64 << 20
"""Bytes of a sibling's tables in parts a replica that missed a round takes at most (parts
of half its frame each): bigger ones are refused, not held while they come."""

MIN_ASKED_FRAME = 4096
"""The smallest frame a sibling asking for tables in parts may say it reads (a smaller one
would only make more parts)."""

ANSWERS_IN_PARTS = 16
"""Askers whose tables in parts a broker keeps a snapshot for (the oldest goes first)."""


class _TablesSnapshot(NamedTuple):
    """Routing tables as one ``neighbours`` answer took them, in parts for one asker."""

    neighbours: tuple[str, ...]
    digest: str
    parts: list[TablePart]


CONTROL_INBOX = 16
"""Frames besides heartbeats a control connection keeps unread; past it the member is
flooding it (it answers each request once, and requests go one at a time)."""


class ControlChannel:
    """A coordinator's control connection to one member broker: request, then reply.

    The member pings it like any peer and closes it once it stayed silent for three
    heartbeat intervals. Between two steps the coordinator waits for its slowest member (a
    freeze that does not drain waits a whole step timeout), which may be longer: the
    member then closed the channel, the round's ``abort`` never reached it and it stayed
    locked until its lease ended. So one reader runs for the channel's whole life,
    answering PINGs at once and handing everything else to :meth:`request`.

    What the member sends is bounded like any peer's: a frame over ``max_frame`` ends the
    channel (:class:`~broker.errors.PayloadTooLarge`) before a byte of it is buffered, and
    so do more than :data:`CONTROL_INBOX` frames nobody asked for (a member answers each
    request once). The request fails with that error; callers take it as an unreachable
    member.
    """

    def __init__(
        self,
        me: str,
        peer: str,
        endpoint: str,
        tls: Mapping[str, Any] | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        self.me = me
        self.peer = peer
        self.endpoint = endpoint
        self.tls = dict(tls or {})
        self.max_frame = max_frame
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        # What the member sent besides heartbeats, or why reading it ended (kept there:
        # one slot beyond the bound is left for that).
        self._inbox: asyncio.Queue[Message | BaseException] = asyncio.Queue(CONTROL_INBOX + 1)
        self._pump: asyncio.Task[None] | None = None
        self._ended: BaseException | None = None

    async def open(self, timeout: float) -> None:
        host, _, port = self.endpoint.rpartition(":")
        async with asyncio.timeout(timeout):
            self.reader, self.writer = await asyncio.open_connection(host, int(port), **self.tls)
            if self.tls:
                identity = peer_identity(self.writer.get_extra_info("peercert"))
                if identity != Identity("broker", self.peer):
                    self.writer.close()
                    raise ProtocolError(
                        f"the broker at {self.endpoint} presented the certificate of "
                        f"{identity or 'nobody'}, not of broker '{self.peer}'"
                    )
            self.writer.write(
                encode(Hello(PROTOCOL_VERSION, Role.BROKER, self.me, {"control": True}))
            )
            reply = await self._read()
        if type(reply) is not Welcome:
            raise ProtocolError(f"broker {self.peer} refused a control connection: {reply}")
        self._pump = asyncio.get_running_loop().create_task(self._read_all())

    async def call(self, step: Step | RequestedMove, timeout: float) -> Reply:
        return await self.request(step.op, step.to_data(), timeout)

    async def request(self, op: str, data: dict[str, Any], timeout: float) -> Reply:
        """Send one ``RECONF`` request and wait for its reply."""
        assert self.writer is not None
        if self.writer.is_closing():
            if isinstance(self._ended, TrellisError):
                raise self._ended  # (what the member sent that ended the channel)
            # The member died or reset the connection (uvloop raises RuntimeError on a
            # write to it): an unreachable member, as the round's error handling expects.
            raise ConnectionResetError(f"control connection to {self.peer} is closed")
        self.writer.write(encode(Reconf(op, data)))
        async with asyncio.timeout(timeout):
            msg = await self._inbox.get()
        if isinstance(msg, BaseException):
            self._inbox.put_nowait(msg)  # every later request fails the same way
            raise msg
        if type(msg) is Reconf and msg.op == "reply":
            return Reply.from_data(msg.data)
        raise ProtocolError(f"broker {self.peer} answered {op} with {msg}")

    async def _read_all(self) -> None:
        """Answer the member's PINGs and queue the rest, until the channel ends."""
        assert self.writer is not None
        try:
            while True:
                msg = await self._read()
                if type(msg) is Ping:
                    # uvloop refuses a write to a reset transport: the next read says so.
                    with contextlib.suppress(RuntimeError):
                        self.writer.write(encode(Pong(msg.token)))
                elif type(msg) is not Pong:
                    if self._inbox.qsize() >= CONTROL_INBOX:
                        raise ProtocolError(
                            f"broker {self.peer} sent more than {CONTROL_INBOX} frames "
                            "nobody asked for on a control connection"
                        )
                    self._inbox.put_nowait(msg)
        except (OSError, TrellisError, asyncio.IncompleteReadError) as exc:
            self._ended = exc
            self._inbox.put_nowait(exc)  # (the slot kept for it)
            self.writer.close()

    async def _read(self) -> Message:
        assert self.reader is not None
        header = await self.reader.readexactly(HEADER_SIZE)
        length = int.from_bytes(header, "big")
        if length > self.max_frame:
            raise PayloadTooLarge(
                f"broker {self.peer} sent a control frame of {length} bytes, over the "
                f"limit of {self.max_frame} bytes",
                size=length,
                limit=self.max_frame,
            )
        return decode_body(await self.reader.readexactly(length))

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError):
                await self.writer.wait_closed()


class ReconfigAgent:
    """One broker's side of live reconfiguration: master turns and member requests."""

    def __init__(self, hood: Neighbourhood, settings: ReconfigConfig) -> None:
        self.hood = hood
        self.settings = s = settings
        self.model = CostModel(
            alpha=s.alpha,
            beta=s.beta,
            default_link_cost=s.link_cost,
            default_broker_cost=s.broker_cost,
        )
        self.params = TabuParams(
            candidates=s.candidates, iterations=s.iterations, tenure=s.tenure, adaptive=True
        )
        self.member = MemberRounds(hood.broker_id)
        self.markers = MarkerBook()
        # Tables vouched for by master replicas (marker wave 3): round -> digest -> tables.
        self._vouched: dict[str, dict[str, tuple[Mapping[str, Any], Mapping[str, Any]]]] = {}
        # Tables too large for one frame come in parts: vouches (per link peer) and
        # installs (per coordinator), each per round.
        self._vouch_parts = PartsInProgress()
        self._install_parts = PartsInProgress()
        # Tables a sibling asks for in parts: the snapshot each asker reads (ANSWERS_IN_PARTS).
        self._answers_in_parts: OrderedDict[str, _TablesSnapshot] = OrderedDict()
        self.coordinating: str | None = None
        self.stats = RoundStats()
        self.history: deque[dict[str, Any]] = deque(maxlen=200)
        self.rng = random.Random()
        self._changed = asyncio.Event()
        self._lease_timer: asyncio.TimerHandle | None = None
        self._seq = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.window_started = time.monotonic()

    def links_changed(self) -> None:
        """A link came up or went down, or a marker arrived: wake whoever waits on one."""
        self._changed.set()

    async def _until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``done()`` holds, re-checking whenever links or markers change."""
        try:
            async with asyncio.timeout(timeout):
                while not done():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            return done()
        return True

    # -- master turns ---------------------------------------------------------------------

    async def run(self) -> None:
        """Take a master turn every jittered interval.

        With reconfiguration off the broker still counts its traffic classes, one window
        per interval, for ``/reconfig`` (and so that counting holds no departed client).
        """
        s = self.settings
        while not s.enabled:
            await asyncio.sleep(s.interval)
            self.start_window()
        while True:
            await asyncio.sleep(s.interval * (1 + self.rng.uniform(-s.jitter, s.jitter)))
            try:
                await self.master_turn()
            except (OSError, TrellisError, TimeoutError) as exc:
                log.warning("reconfiguration round failed: %s", exc)

    async def master_turn(self, requested: RequestedMove | None = None) -> dict[str, Any] | None:
        """One round as master; returns the record of the round, or None if none ran.

        With ``requested`` (an operator's move, :meth:`request_move`) the round runs that
        move instead of searching for a cheaper tree, whatever the traffic seen."""
        h = self.hood
        neighbours = h.neighbour_vns()
        if len(neighbours) < 2 or self.member.lease is not None or self.member.pending:
            return None
        if requested is None and sum(h.traffic_classes().values()) < self.settings.min_traffic:
            return None
        if not await self.is_coordinator():
            return None
        self._seq += 1
        round_id = f"{h.broker_id}#{self._seq}"
        self.stats.turns += 1
        record: dict[str, Any] = {
            "round": round_id,
            "master": h.vn,
            "time": time.time(),
            "neighbourhood": sorted(link(h.vn, n) for n in neighbours),
        }
        if requested is not None:
            record["requested"] = requested.to_data()
        self.coordinating = round_id
        channels: list[ControlChannel] = []
        try:
            outcome = await self._coordinate(
                round_id, [h.vn, *neighbours], channels, record, requested
            )
        finally:
            self.coordinating = None
            await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
        record["outcome"] = outcome
        self.history.append(record)
        log.info("round %s: %s", round_id, outcome)
        return record

    async def _coordinate(
        self,
        round_id: str,
        hood: list[str],
        channels: list[ControlChannel],
        record: dict[str, Any],
        requested: RequestedMove | None = None,
    ) -> str:
        h = self.hood
        members = sorted(p for p, n in h.directory.items() if n.vn_id in hood)
        step_timeout = self.settings.step_timeout
        for peer in members:
            channels.append(self._channel(peer, h.directory[peer].endpoint))
        opened = await asyncio.gather(
            *(c.open(step_timeout) for c in channels), return_exceptions=True
        )
        failed = [c.peer for c, r in zip(channels, opened, strict=True) if r is not None]
        if failed:
            self.stats.refused += 1
            return f"refused: {', '.join(failed)} unreachable"
        lock = Lock("lock", round_id, h.vn, self.settings.lock_lease)
        locked_at = time.monotonic()
        unlock = Step("unlock", round_id)
        if not (await self.handle(lock)).ok:
            self.stats.refused += 1
            return "refused: this broker is locked"
        refusals = [r.error for r in await self._all(channels, lock) if not r.ok]
        if refusals:
            await self._all(channels, unlock)
            await self.handle(unlock)
            self.stats.refused += 1
            return f"refused: {refusals[0]}"
        view = self.local_view()
        plan: OcbrPlan | None
        if requested is not None:
            # Checked against the neighbours of now, under the lock: the request may be stale.
            problem = requested.problem(h.vn, view.neighbours)
            if problem is not None:
                await self._all(channels, unlock)
                await self.handle(unlock)
                self.stats.refused += 1
                return f"refused: {problem}"
            plan = self._requested_plan(requested, view)
        else:
            # The search is CPU work on immutable data: off the loop, so traffic keeps flowing.
            plan = await asyncio.to_thread(
                plan_view, view, self.model, rng=self.rng, params=self.params
            )
        self.start_window()
        if plan is None:
            await self._all(channels, unlock)
            await self.handle(unlock)
            self.stats.no_plan += 1
            return "no cheaper tree"
        honest = sorted((view.star() - set(plan.change.remove)) | set(plan.change.add))
        proposed, new_links = self.propose_plan(hood, honest)
        record.update(plan.to_dict())
        record["new_neighbourhood"] = new_links
        prepare = Prepare("prepare", round_id, h.vn, tuple(proposed), tuple(new_links))
        refused = await self._step(channels, prepare)
        if refused:
            record["refusals"] = refused
            await self._abort_all(channels, round_id)
            return f"aborted: plan refused: {refused[0]}"
        refused = await self._step(channels, Step("connect", round_id))
        if refused:
            record["refusals"] = refused
            await self._abort_all(channels, round_id)
            return "aborted: new links did not come up"
        froze_at = time.monotonic()
        refused = await self._step(channels, Step("freeze", round_id))
        if refused:
            record["refusals"] = refused
            await self._abort_all(channels, round_id)
            return "aborted: the neighbourhood did not drain"
        tables = self.propose_tables(await self.tables(new_links))
        lease = self.settings.lock_lease
        now = time.monotonic()
        drained_late = now - froze_at > lease * (1 - _INSTALL_MARGIN)
        if drained_late or now - locked_at > lease * (MAX_HOLD_LEASES - 1):
            # Every member renewed its lease when the freeze reached it (after froze_at),
            # up to its cap (after locked_at): an install that may reach one after that
            # lease ended, or whose wait for vouches may outlast it, would find it gone
            # back while the master VN's replicas switch. Nobody has vouched yet, so
            # going back now is the same decision everywhere.
            await self._abort_all(channels, round_id)
            return "aborted: the neighbourhood drained too slowly to install within the lease"
        empty: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        installs = [self.handle(Install("install", round_id, *tables.get(h.vn, empty)))]
        installs += [
            self._install_on(
                c, Install("install", round_id, *tables.get(h.directory[c.peer].vn_id, empty))
            )
            for c in channels
        ]
        results = await asyncio.gather(*installs)
        failed_at = [r.error for r in results if not r.ok]  # each names its member
        await self._step(channels, Step("resume", round_id))
        if failed_at:
            # Too late to go back: some members switched (they resumed above, so locks and
            # pauses end). Not counted as applied: the tree is the plan only where it took;
            # a replica that missed it repairs from its siblings, and the next rounds start
            # from the tree as it is.
            record["install_failed"] = failed_at
            self.stats.partial += 1
            log.error("round %s: install failed at %s", round_id, "; ".join(failed_at))
            return f"applied in part: install failed at {failed_at[0]}"
        self.stats.applied += 1
        self.stats.links_changed += len(plan.change.add)
        if requested is None:  # an operator's move may cost more: not a saving
            self.stats.saving += plan.improvement
        self.stats.last_cost_before = plan.cost_before
        self.stats.last_cost_after = plan.cost_after
        return "applied"

    def _requested_plan(self, requested: RequestedMove, view: LocalView) -> OcbrPlan:
        """An operator's move as a plan, priced on the window's demand like a searched one."""
        new_links = requested.local_links(view.master, view.neighbours)
        ev = SwapEvaluator.from_view(view, self.model)
        before = ev.cost
        ev.reset(new_links)
        return OcbrPlan(view.master, view.change(new_links), before, ev.cost)

    async def request_move(self, move: RequestedMove) -> Reply:
        """Run an operator's move as one round with this broker as coordinator (its VN is
        the master); the reply says whether it was applied and, if not, why (the round's
        outcome: refused or aborted rounds changed nothing)."""
        h = self.hood
        self.stats.requested += 1
        problem = move.problem(h.vn, h.neighbour_vns())
        if problem is not None:
            return Reply(False, f"{h.broker_id}: refused: {problem}")
        if self.member.lease is not None or self.member.pending or self.coordinating:
            return Reply(False, f"{h.broker_id}: refused: busy with another round")
        record = await self.master_turn(move)
        if record is None:
            return Reply(False, f"{h.broker_id}: refused: not the coordinator of VN {h.vn}")
        outcome = str(record["outcome"])
        return OK if outcome == "applied" else Reply(False, f"{h.broker_id}: {outcome}")

    def propose_plan(self, hood: list[str], planned: list[Link]) -> tuple[list[str], list[Link]]:
        """The neighbourhood and links this coordinator proposes (the plan's, when
        honest; :mod:`broker.daemon.reconfig_faults` overrides it)."""
        return hood, planned

    def propose_tables(self, tables: WireTables) -> WireTables:
        """The tables this coordinator sends each VN (those it computed, when honest).
        Members do not install them as sent: they check them against their own."""
        return tables

    async def _step(self, channels: list[ControlChannel], step: Step) -> list[str]:
        """Run one step at every member, this broker included, concurrently; the
        members' refusals (none when every member did it)."""
        mine, theirs = await asyncio.gather(self.handle(step), self._all(channels, step))
        problems = [r.error for r in [mine, *theirs] if not r.ok]
        if problems:
            log.warning("%s failed: %s", step.op, problems)
        return problems

    async def _abort_all(self, channels: list[ControlChannel], round_id: str) -> None:
        self.stats.aborted += 1
        await self._step(channels, Step("abort", round_id))

    async def _all(self, channels: list[ControlChannel], step: Step) -> list[Reply]:
        return list(await asyncio.gather(*(self._call(c, step) for c in channels)))

    async def _call(self, channel: ControlChannel, step: Step) -> Reply:
        return await self._request(channel, step.op, step.to_data())

    async def _request(self, channel: ControlChannel, op: str, data: dict[str, Any]) -> Reply:
        try:
            return await channel.request(op, data, self.settings.step_timeout * 2)
        except (OSError, TrellisError, TimeoutError, asyncio.IncompleteReadError) as exc:
            return Reply(False, f"{channel.peer}: {exc or type(exc).__name__}")

    def _forget_markers(self, round_id: str) -> None:
        """What arrived for ``round_id`` in markers: the markers and tables in parts."""
        self.markers.forget(round_id)
        self._vouch_parts.forget(round_id)
        self._install_parts.forget(round_id)

    def _table_parts(self, held: Mapping[str, Any], sent: Mapping[str, Any]) -> list[TablePart]:
        """A VN's tables in parts that fit half a frame (one part, mostly)."""
        return split_tables(held, sent, self.hood.max_frame // 2)

    async def _install_on(self, channel: ControlChannel, step: Install) -> Reply:
        """``step`` at one member, in parts when its tables outweigh a frame: the member
        answers each part and installs once the last is in."""
        parts = self._table_parts(step.held, step.sent)
        if len(parts) == 1:
            return await self._call(channel, step)
        digest = tables_digest(step.round, step.held, step.sent)
        reply = OK
        for i, (held, sent) in enumerate(parts):
            data: dict[str, Any] = {"round": step.round, "held": held, "sent": sent}
            data.update({"digest": digest, "part": i, "parts": len(parts)})
            reply = await self._request(channel, "install", data)
            if not reply.ok:
                break
        return reply

    async def is_coordinator(self) -> bool:
        """Whether no lower-numbered replica of this VN is alive to coordinate instead."""
        h = self.hood
        siblings = [n for n in h.directory.values() if n.vn_id == h.vn and n.replica < h.replica]
        for sibling in siblings:
            channel = self._channel(sibling.id, sibling.endpoint)
            try:
                await channel.open(0.5)
            except (OSError, TrellisError, TimeoutError, asyncio.IncompleteReadError):
                continue
            finally:
                await channel.close()
            return False
        return True

    def start_window(self) -> None:
        """Start a new traffic window (after a turn, or when the neighbourhood changed)."""
        self.hood.start_traffic_window()
        self.window_started = time.monotonic()

    def local_view(self) -> LocalView:
        """The master's local view (SPEC §5) from the traffic classes counted since the
        window started: each publication's source and targets, neighbours standing for
        their subtrees, local clients for themselves."""
        h = self.hood
        neighbours = set(h.neighbour_vns())
        classes: dict[frozenset[str], float] = {}
        local: set[str] = set()
        for hops, count in h.traffic_classes().items():
            names = set()
            for hop in hops:
                name = str(hop.peer_id)
                if hop.is_broker:
                    if name not in neighbours:
                        break  # counted before a change this window missed
                else:
                    if name in neighbours or name == h.vn:
                        break  # a client named like a VN cannot be placed
                    local.add(name)
                names.add(name)
            else:
                if len(names) > 1:
                    key = frozenset(names)
                    classes[key] = classes.get(key, 0.0) + count
        return LocalView(
            master=h.vn,
            neighbours=tuple(sorted(neighbours)),
            local_clients=tuple(sorted(local)),
            classes=MappingProxyType(classes),
        )

    async def tables(self, new_links: Sequence[Link]) -> WireTables:
        """Per VN of the neighbourhood: what it holds from, and sends to, each neighbour
        on the new tree, in wire form (computed off the loop from a snapshot of the
        router, which the freeze keeps still anyway)."""
        adverts, subs = self.hood.owned_entries()
        carried = await asyncio.to_thread(
            hood_routing, adverts, subs, new_links, covering=self.hood.covering
        )
        tables: WireTables = {}
        for (x, y), (advs, sbs) in carried.items():
            wire_advs, wire_subs = _wire(advs), _wire(sbs)
            tables.setdefault(y, ({}, {}))[0][x] = {"adv": wire_advs, "sub": wire_subs}
            tables.setdefault(x, ({}, {}))[1][y] = wire_subs
        return tables

    # -- member side ----------------------------------------------------------------------

    def control_request(
        self, op: str, data: dict[str, Any], answer: Callable[[Reply], None], sender: str = ""
    ) -> None:
        """A coordinator's request on a control connection: run it, then ``answer``.

        ``move`` is an operator's request (``trellis rebuild``) that this broker coordinate a
        round running one given move; it is accepted only on a control connection opened
        under this broker's own id (the operator holds its configuration), not from peers.
        A malformed step is answered like a refused one (the connection stays open)."""

        async def serve() -> None:
            me = self.hood.broker_id
            try:
                if op == "move":
                    if sender != me:
                        raise InvalidRequest(
                            f"a move is asked under the broker's own id, not {sender!r}"
                        )
                    reply = await self.request_move(parse_move(data))
                elif op == "neighbours":
                    reply = self.neighbours_answer(
                        with_tables=data.get("tables") is True,
                        asker=sender,
                        part=data.get("part", 0),
                        frame=data.get("frame"),
                    )
                elif op == "install" and "parts" in data:
                    reply = await self._install_part(sender, data)
                else:
                    reply = await self.handle(parse_step(op, data))
            except TrellisError as exc:
                reply = Reply(False, f"{me}: {exc.message}")
            except Exception as exc:  # a failed step must reach the coordinator as an answer
                log.exception("reconfiguration step %s failed", op)
                reply = Reply(False, f"{me}: {exc}")
            answer(reply)

        self._spawn(serve())

    async def _install_part(self, sender: str, data: Mapping[str, Any]) -> Reply:
        """One part of a coordinator's install: kept until the last, then installed as a
        whole (only during the round it is for)."""
        round_id, digest = str(data.get("round")), str(data.get("digest"))
        pending = self.member.pending
        if pending is None or pending.round != round_id:
            return Reply(False, f"{self.hood.broker_id}: no round {round_id} here to install")
        try:
            tables = self._install_parts.offer(
                sender,
                round_id,
                digest,
                data.get("part"),
                data.get("parts"),
                (data.get("held"), data.get("sent")),
            )
        except TablesError as exc:
            raise InvalidRequest(f"RECONF install: {exc}") from None
        if tables is None:
            return OK
        if tables_digest(round_id, *tables) != digest:
            raise InvalidRequest("RECONF install: its parts do not match their digest")
        return await self.handle(
            parse_step("install", {"round": round_id, "held": tables[0], "sent": tables[1]})
        )

    def kept_vns(self) -> frozenset[str]:
        """The neighbour VNs this broker keeps links to (what ``links_file`` holds), not
        counting VNs linked in standby for a round in progress."""
        h = self.hood
        kept = {h.linked_vn(p) for p in h.directory}
        return frozenset(vn for vn in kept if vn is not None) - frozenset(h.standby())

    def neighbours_answer(
        self, with_tables: bool = False, asker: str = "", part: object = 0, frame: object = None
    ) -> Reply:
        """A sibling replica's question: which neighbour VNs this broker keeps (and, with
        ``with_tables``, its routing tables for them). Not during a round (from its lock
        on), whose outcome is not known yet.

        Tables that do not fit half the asker's frame (``frame``, at most this broker's
        own) come in parts (:func:`reconfig.table_parts.split_tables`): part 0 takes a
        snapshot and says how many parts and their digest, and the asker asks for each
        other part of that snapshot in turn (one snapshot kept per asker)."""
        lease = self.member.lease
        if lease is not None or self.member.pending is not None:
            where = f"round {lease.round}" if lease is not None else "a round"
            return Reply(False, f"{self.hood.broker_id}: busy with {where}")
        if with_tables and part != 0:
            return self._tables_part(asker, part)
        kept = self.kept_vns()
        neighbours = tuple(sorted(kept))
        if not with_tables:
            return Reply(True, neighbours=neighbours)
        held: dict[str, Any] = {}
        sent: dict[str, Any] = {}
        for vn, ((adverts, subs), forwarded) in self.hood.link_tables().items():
            if vn in kept:
                held[vn] = {"adv": _wire(adverts), "sub": _wire(subs)}
                sent[vn] = _wire(forwarded)
        limit = self.hood.max_frame
        if type(frame) is int and MIN_ASKED_FRAME <= frame < limit:
            limit = frame
        parts = split_tables(held, sent, limit // 2)
        if len(parts) == 1:
            return Reply(True, neighbours=neighbours, tables={"held": held, "sent": sent})
        snapshot = _TablesSnapshot(neighbours, tables_digest("", held, sent), parts)
        self._answers_in_parts[asker] = snapshot
        self._answers_in_parts.move_to_end(asker)
        while len(self._answers_in_parts) > ANSWERS_IN_PARTS:
            self._answers_in_parts.popitem(last=False)
        return self._tables_part(asker, 0)

    def _tables_part(self, asker: str, part: object) -> Reply:
        snapshot = self._answers_in_parts.get(asker)
        if snapshot is None or type(part) is not int or not 0 <= part < len(snapshot.parts):
            return Reply(
                False,
                f"{self.hood.broker_id}: no part {part!r} of tables for {asker!r} "
                "(ask for part 0 first)",
            )
        held, sent = snapshot.parts[part]
        if part == len(snapshot.parts) - 1:
            del self._answers_in_parts[asker]
        tables = {"held": held, "sent": sent, "part": part, "parts": len(snapshot.parts)}
        tables["digest"] = snapshot.digest
        return Reply(True, neighbours=snapshot.neighbours, tables=tables)

    async def adopt_siblings_links(self, timeout: float, patience: float) -> frozenset[str] | None:
        """At start, take the neighbour VNs f + 1 siblings (the other replicas of this VN)
        agree on when they differ from the saved ones: a replica that was down while a
        round went on without it would otherwise come back on the tree before that round,
        its VN's replicas disagreeing on their neighbours for good. A sibling that does not
        answer within ``timeout`` does not count; one busy with a round is asked again
        until ``patience`` runs out (a round holds its lock one lease at most). Without
        f + 1 matching answers the saved links stay (with a warning when too few siblings
        answered). Returns the adopted set, or None. Call it before the links are dialled."""
        h = self.hood
        mine = self.kept_vns()
        asked = await self._siblings_neighbours(mine, timeout, patience)
        if asked is None:
            return None
        agreed, reported, quorum = asked
        log.info("%s: siblings' neighbour VNs %s; saved %s", h.broker_id, reported, sorted(mine))
        if agreed is None:
            if len(reported) < quorum:
                log.warning(
                    "%s: %d of %d sibling replicas told their neighbours (%d needed to "
                    "check the saved ones); keeping %s",
                    h.broker_id,
                    len(reported),
                    len(self._siblings()),
                    quorum,
                    sorted(mine) or "none",
                )
            return None
        if not self._known(agreed, mine):
            return None
        log.warning(
            "%s: saved neighbour VNs %s differ from those %d siblings agree on, %s: "
            "a round went on while this replica was down; taking theirs",
            h.broker_id,
            sorted(mine),
            quorum,
            sorted(agreed),
        )
        added = set(agreed - mine)
        h.accept_standby(added)
        h.end_standby(added)
        for vn in mine - agreed:
            h.retire(vn)
        await self.persist_links()
        return agreed

    def _siblings(self) -> list[NeighbourConfig]:
        """The other replicas of this broker's VN."""
        h = self.hood
        return [n for n in h.directory.values() if n.vn_id == h.vn and n.id != h.broker_id]

    async def _siblings_neighbours(
        self, mine: frozenset[str], timeout: float, patience: float
    ) -> tuple[frozenset[str] | None, dict[str, frozenset[str]], int] | None:
        """Ask the siblings which neighbour VNs they keep, again while one is busy with a
        round and no f + 1 of them agree on a set other than ``mine``, until ``patience``
        runs out. Returns (the set f + 1 agree on if it differs from ``mine``, the answers
        by sibling, f + 1), or None when this VN has no sibling."""
        siblings = self._siblings()
        size = max([n.vn_size for n in siblings], default=1)
        if not siblings or size < 2:
            return None
        quorum = vouch_quorum(size)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience
        reported: dict[str, frozenset[str]] = {}
        while True:
            asking = [n for n in siblings if n.id not in reported]
            replies = await asyncio.gather(*(self._ask_neighbours(n, timeout) for n in asking))
            busy = False
            for sibling, reply in zip(asking, replies, strict=True):
                if reply is not None and reply.neighbours is not None:
                    reported[sibling.id] = frozenset(reply.neighbours)
                busy = busy or (reply is not None and not reply.ok)
            agreed = sibling_agreement(mine, list(reported.values()), quorum)
            if agreed is not None or not busy or loop.time() + _ASK_AGAIN > deadline:
                return agreed, reported, quorum
            await asyncio.sleep(_ASK_AGAIN)

    def _known(self, agreed: frozenset[str], mine: frozenset[str]) -> bool:
        """Whether every VN the siblings agree on is another VN of this broker's directory
        (else the siblings' set cannot be linked: warn and keep ``mine``)."""
        h = self.hood
        unknown = sorted(
            vn
            for vn in agreed
            if vn == h.vn or not any(n.vn_id == vn for n in h.directory.values())
        )
        if unknown:
            log.warning(
                "%s: siblings agree on neighbour VNs %s, but %s are not in this broker's "
                "directory; keeping %s",
                h.broker_id,
                sorted(agreed),
                unknown,
                sorted(mine),
            )
        return not unknown

    # -- repair while running -------------------------------------------------------------

    async def repair_loop(self) -> None:
        """Every ``repair_interval``, check this replica's neighbour VNs against its
        siblings' (:meth:`repair_from_siblings`): the backstop for whatever made it miss a
        round (an abort after freeze also schedules a check at once)."""
        s = self.settings
        while True:
            await asyncio.sleep(s.repair_interval * (1 + self.rng.uniform(-s.jitter, s.jitter)))
            if s.enabled:
                await self._repair_guarded()

    async def _repair_guarded(self, delay: float = 0.0) -> None:
        await asyncio.sleep(delay)
        try:
            await self.repair_from_siblings()
        except (OSError, TrellisError, TimeoutError) as exc:
            log.warning("%s: asking the siblings' neighbours failed: %s", self.hood.broker_id, exc)

    def _repair_soon(self, delay: float = 0.0) -> None:
        """After this broker went back on a round its siblings may have gone forward on
        (or, with ``delay``, after a repair: the siblings may have moved on meanwhile)."""
        if self.settings.enabled and self._siblings():
            self._spawn(self._repair_guarded(delay))

    async def repair_from_siblings(self) -> frozenset[str] | None:
        """While running: if f + 1 siblings keep other neighbour VNs than this broker, and
        f + 1 of those hold identical routing tables for them, install those tables and
        links (as the round this broker missed would have: links outside the change hear
        only of entries gained or lost). A replica that went back on a round while its
        siblings switched (a lease that ran out before the vouches came, an install it
        failed) would otherwise disagree with them for good. f Byzantine siblings can
        neither move its links nor choose its tables. Returns the new set, or None."""
        h = self.hood
        s = self.settings
        if self._busy():
            return None
        mine = self.kept_vns()
        asked = await self._siblings_neighbours(mine, s.step_timeout, s.lock_lease)
        if asked is None:
            return None
        agreed, reported, quorum = asked
        if agreed is None or not self._known(agreed, mine):
            return None
        holding = [n for n in self._siblings() if reported.get(n.id) == agreed]
        replies = await asyncio.gather(
            *(self._ask_neighbours(n, s.step_timeout, tables=True) for n in holding)
        )
        chosen = sibling_tables(
            agreed,
            [
                r.tables
                for r in replies
                if r is not None and frozenset(r.neighbours or ()) == agreed
            ],
            quorum,
        )
        if chosen is None:
            log.info(
                "%s: %d siblings keep neighbour VNs %s (this broker %s), but fewer than %d "
                "sent the same tables; asking again later",
                h.broker_id,
                len(holding),
                sorted(agreed),
                sorted(mine),
                quorum,
            )
            return None
        if self._busy() or self.kept_vns() != mine:
            return None  # a round began meanwhile: its outcome decides
        log.warning(
            "%s: neighbour VNs %s differ from those %d siblings keep, %s: this replica "
            "missed a round; taking their links and tables",
            h.broker_id,
            sorted(mine),
            quorum,
            sorted(agreed),
        )
        added = set(agreed - mine)
        held, sent = _tables(chosen["held"], chosen["sent"])
        h.adopt(added)
        h.install_hood({h.vn, *mine, *agreed}, set(agreed), held, sent)
        for vn in mine - agreed:
            h.retire(vn)
        h.dial([n for n in h.directory.values() if n.vn_id in added])
        h.announce_links()
        h.flush()
        self.start_window()
        self.stats.repaired += 1
        await self.persist_links()
        # Rounds may have moved the siblings again while they answered: check once more.
        self._repair_soon(delay=_RECHECK)
        return agreed

    def _busy(self) -> bool:
        """In a round, as member or coordinator."""
        m = self.member
        return m.lease is not None or m.pending is not None or self.coordinating is not None

    async def _ask_neighbours(
        self, sibling: NeighbourConfig, timeout: float, tables: bool = False
    ) -> Reply | None:
        """A sibling's answer to ``neighbours`` (with its tables if ``tables``, put together
        when they come in parts; a refusal while it is busy with a round), or None if it
        does not answer within ``timeout`` (per request) or its parts do not fit together."""
        h = self.hood
        channel = self._channel(sibling.id, sibling.endpoint)
        try:
            await channel.open(timeout)
            asked = {"tables": tables, "frame": h.max_frame}
            reply = await channel.request("neighbours", asked, timeout)
            if not (tables and reply.ok and reply.tables and "parts" in reply.tables):
                return reply
            return await self._rest_of_tables(channel, reply, timeout)
        except (OSError, TrellisError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.info("sibling %s did not answer: %s", sibling.id, exc or type(exc).__name__)
            return None
        finally:
            await channel.close()

    async def _rest_of_tables(
        self, channel: ControlChannel, first: Reply, timeout: float
    ) -> Reply | None:
        """The tables whose part 0 is ``first``: every other part of the same snapshot,
        merged and checked against the digest part 0 gave."""
        assert first.tables is not None
        parts, digest = first.tables.get("parts"), first.tables.get("digest")
        received = [(first.tables["held"], first.tables["sent"])]
        problem = None
        most = min(MAX_PARTS, max(2, ASKED_TABLES_BYTES // (self.hood.max_frame // 2)))
        count = parts if type(parts) is int and 1 < parts <= most else 0
        if not count or type(digest) is not str:
            problem = f"{parts!r} parts is not a count of parts (at most {most})"
            count = 0
        # (one deadline for them all: a sibling sending each part just in time held the
        # repair for as many timeouts as it announced parts)
        deadline = asyncio.get_running_loop().time() + 2 * timeout
        for part in range(1, count):
            asked = {"tables": True, "frame": self.hood.max_frame, "part": part}
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                problem = f"part {part} of {count} not in within {2 * timeout:g} s"
                break
            reply = await channel.request("neighbours", asked, min(timeout, left))
            got = reply.tables or {}
            if not reply.ok or reply.neighbours != first.neighbours or got.get("part") != part:
                problem = f"part {part}: {reply.error or 'another answer'}"
                break
            if got.get("parts") != parts or got.get("digest") != digest:
                problem = f"part {part} is of other tables"
                break
            received.append((got["held"], got["sent"]))
        if problem is None:
            try:
                held, sent = merge_tables(received)
            except TablesError as exc:
                problem = str(exc)
            else:
                if tables_digest("", held, sent) == digest:
                    log.info("sibling %s sent its tables in %d parts", channel.peer, count)
                    return Reply(
                        True, neighbours=first.neighbours, tables={"held": held, "sent": sent}
                    )
                problem = "the parts do not match their digest"
        log.warning(
            "sibling %s sent its tables in parts that do not fit: %s", channel.peer, problem
        )
        return None

    def _channel(self, peer: str, endpoint: str) -> ControlChannel:
        """A control connection to ``peer`` that reads frames up to this broker's limit."""
        h = self.hood
        return ControlChannel(h.broker_id, peer, endpoint, h.link_tls(), h.max_frame)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def marker(self, sender: str, data: Mapping[str, Any]) -> None:
        """An in-band drain marker on a broker link."""
        wave, round_id, digest = data.get("wave"), data.get("round"), data.get("digest", "")
        if type(wave) is not int or not DRAIN <= wave <= MARK:
            raise ProtocolError(f"RECONF marker field 'wave' must be {DRAIN} to {MARK}")
        if type(round_id) is not str or not 0 < len(round_id) <= MAX_ROUND_ID:
            raise ProtocolError(
                f"RECONF marker field 'round' must be a round name of 1 to {MAX_ROUND_ID} "
                "characters"
            )
        if type(digest) is not str or len(digest) > DIGEST_LENGTH:
            raise ProtocolError(
                f"RECONF marker field 'digest' must be a digest of at most {DIGEST_LENGTH} "
                "characters"
            )
        if wave == MARK_ASK:
            self.hood.link_mark_asked(sender, round_id)
            return
        if wave == MARK:
            self.hood.link_marked(sender, round_id)
            return
        if wave == VOUCH:
            pending = self.member.pending
            if pending is None or pending.round != round_id:
                return  # late, or not for a round of ours: nothing will read it
            held, sent = data.get("held"), data.get("sent")
            if "parts" in data:
                try:
                    tables = self._vouch_parts.offer(
                        sender, round_id, digest, data.get("part"), data.get("parts"), (held, sent)
                    )
                except TablesError as exc:
                    raise ProtocolError(f"RECONF marker of wave 3: {exc}") from None
                if tables is None:
                    return  # more parts to come
                held, sent = tables
            if not isinstance(held, dict) or not isinstance(sent, dict):
                raise ProtocolError("RECONF marker of wave 3 must carry 'held' and 'sent' maps")
            if tables_digest(round_id, held, sent) != digest:
                raise ProtocolError("RECONF marker of wave 3: tables do not match their digest")
            self._vouched.setdefault(round_id, {})[digest] = (held, sent)
        self.markers.record(round_id, wave, sender, digest)
        if wave == VOUCH:
            # Only tables some replica's latest vouch names are kept: one vouching again
            # and again with other tables (each up to a frame) replaces its own.
            named = self.markers.vouched_digests(round_id, VOUCH)
            vouched = self._vouched[round_id]
            for stale in [d for d in vouched if d not in named]:
                del vouched[stale]
        self.links_changed()

    async def handle(self, step: Step) -> Reply:
        """Run one step of a round at this broker."""
        if isinstance(step, Lock):
            self._expire_lease()
            down = self._links_down_for(step.master)
            if down:
                return Reply(
                    False,
                    f"{self.hood.broker_id}: refused: links to {', '.join(down)} are not up "
                    "(a round drains and vouches over them)",
                )
            reply = self.member.lock(
                step,
                time.monotonic(),
                enabled=self.settings.enabled,
                coordinating=self.coordinating,
            )
            lease = self.member.lease
            if reply.ok and lease is not None:
                self._arm_lease_timer(lease.expires - time.monotonic())
            return reply
        if step.op == "abort":
            self.abort(step.round)
            return OK
        refusal = self.member.locked_for(step.round)
        if refusal is not None:
            return refusal
        self._renew(step.round)
        if step.op == "unlock":
            self.abort(step.round)  # after prepare, unlocking also undoes the round
            return OK
        if isinstance(step, Prepare):
            return self._prepare(step)
        pending = self.member.prepared(step.round)
        if isinstance(pending, Reply):
            return pending
        action = self._ACTIONS.get(step.op)
        if action is None:
            return Reply(False, f"{step.op} is not valid after prepare")
        return await action(self, pending, step)

    def _renew(self, round_id: str) -> None:
        """A step of the round this broker is locked for arrived or ended: its master is
        alive, so the lease runs from now (see :meth:`MemberRounds.renew`)."""
        expires = self.member.renew(round_id, time.monotonic())
        if expires is not None:
            self._arm_lease_timer(expires - time.monotonic())

    def _arm_lease_timer(self, seconds: float) -> None:
        if self._lease_timer is not None:
            self._lease_timer.cancel()
        loop = asyncio.get_running_loop()
        self._lease_timer = loop.call_later(seconds + 0.01, self._expire_lease)

    def _expire_lease(self) -> None:
        """Drop a lease whose master went silent, undoing a round it left half-done (or
        finishing one its master VN's replicas vouched they installed)."""
        lease = self.member.expired(time.monotonic())
        if lease is not None:
            log.warning("lock of master %s (round %s) expired", lease.master, lease.round)
            pending = self.member.pending
            if pending is not None and pending.round == lease.round and self._go_forward(pending):
                self._go_on(pending)
                return
            self.abort(lease.round)
            self._release()

    def _links_down_for(self, master: str) -> list[str]:
        """The links a round of ``master`` needs that are down: a replica of the master VN
        drains and vouches over its links to every neighbour VN, any other member over its
        links to the master VN's replicas. A member missing one (a replica just restarted,
        its links still coming up) would miss markers or a neighbour's routing state, and
        the master VN's replicas would vouch for different tables: some members would
        switch and others go back (seen: a restarted replica's VN split for a repair
        interval). So the lock is refused until they are up."""
        h = self.hood
        down = h.links_down()
        if h.vn == master:
            return down
        return [p for p in down if p in h.directory and h.directory[p].vn_id == master]

    def _release(self) -> None:
        self.member.finish()
        if self._lease_timer is not None:
            self._lease_timer.cancel()
            self._lease_timer = None

    def _prepare(self, step: Prepare) -> Reply:
        """Check the plan against this broker's own view; if sound, accept its new
        neighbours of this broker's VN (in standby)."""
        h = self.hood
        pending = self.member.prepare(step, h.vn, h.neighbour_vns())
        if isinstance(pending, Reply):
            log.warning("round %s: %s", step.round, pending.error)
            return pending
        self._forget_markers(step.round)
        h.accept_standby(pending.added)
        h.record_routes(True)
        h.expect_marks(step.round, pending.hood)
        return OK

    async def _connect(self, pending: Pending, step: Step) -> Reply:
        """Open the new links (this side dials those to larger ids) and wait for all."""
        h = self.hood
        peers = [n for n in h.directory.values() if n.vn_id in pending.added]
        h.dial(peers)

        def missing() -> list[str]:
            up = h.link_ids()
            return sorted(p.id for p in peers if p.id not in up)

        if not await self._until(lambda: not missing(), self.settings.step_timeout):
            return Reply(False, f"{h.broker_id}: no link to {', '.join(missing())}")
        return OK

    async def _freeze(self, pending: Pending, step: Step) -> Reply:
        """Pause input from outside the neighbourhood and drain its old links."""
        h = self.hood
        asked = h.freeze(pending.hood)
        pending.frozen = True
        # Marks first: what publishers and outside links sent before theirs is routed on
        # the old tables, so it must be on the old links before the drain markers.
        patience = min(_MARK_PATIENCE, self.settings.step_timeout / 3)
        marked = await self._until(lambda: not h.marks_owed(), patience)
        # A stream still being read toward its mark (a backlog ahead of it on a busy
        # machine) is waited for a while longer: frozen where it is, this replica would
        # switch at another point of it than its siblings. Not past what leaves the round
        # time to install within its lease (the coordinator goes back then anyway).
        settings = self.settings
        longest = min(settings.step_timeout * 2 / 3, settings.lock_lease * (1 - _INSTALL_MARGIN))
        waited, read = patience, h.marks_progress()
        while not marked and waited < longest:
            marked = await self._until(lambda: not h.marks_owed(), patience / 4)
            waited += patience / 4
            progress = h.marks_progress()
            if progress == read:
                break
            read = progress
        ended = self._ended(pending)
        if ended is not None:
            return ended  # undone meanwhile: holding streams now would hold them for good
        if not marked:
            owed = h.marks_owed()
            self.stats.unmarked += owed
            log.warning(
                "round %s: %d of %d stream(s) sent no mark within %.1f s; frozen where they are",
                pending.round,
                owed,
                asked,
                waited,
            )
            h.hold_unmarked()
            asked -= owed
        if asked:
            self.stats.marked += asked
            log.info("round %s: %d stream(s) read up to their mark", pending.round, asked)
        standby = set(h.standby())
        if h.vn == pending.master:
            old = {p for p in h.link_ids() if h.linked_vn(p) in pending.hood - standby}
            ok = await self._markers_from(pending.round, 1, old)
            ended = self._ended(pending)
            if ended is not None:
                return ended
            other = self.markers.disagreeing(pending.round, 1, pending.digest)
            if ok and not other:
                # No wave 2 for a plan some member does not share: nobody drains into it.
                self._send_markers(pending.round, 2, old, pending.digest)
        else:
            old = {p for p in h.link_ids() if h.linked_vn(p) == pending.master}
            self._send_markers(pending.round, 1, old, pending.digest)
            ok = await self._markers_from(pending.round, 2, old)
            ended = self._ended(pending)
            if ended is not None:
                return ended
            other = self.markers.disagreeing(pending.round, 2, pending.digest)
        if other:
            return Reply(False, f"{h.broker_id}: {', '.join(sorted(other))} prepared another plan")
        if not ok:
            return Reply(False, f"{h.broker_id}: drain markers missing")
        pending.drained = True
        self._renew(pending.round)
        return OK

    def _send_markers(self, round_id: str, wave: int, peers: set[str], digest: str) -> None:
        marker = Reconf("marker", {"round": round_id, "wave": wave, "digest": digest})
        for peer in peers:
            self.hood.send_on_link(peer, marker)
        self.hood.flush()

    async def _markers_from(self, round_id: str, wave: int, peers: set[str]) -> bool:
        """Wait for a marker of ``wave`` from every peer whose link stays up."""
        return await self._until(
            lambda: not self.markers.missing(round_id, wave, peers, self.hood.link_ids()),
            self.settings.step_timeout,
        )

    async def _install(self, pending: Pending, step: Step) -> Reply:
        """Switch the neighbourhood's routing state to the planned tree, with tables this
        broker computed (a replica of the master VN) or that f + 1 replicas of the master
        VN vouched for (any other member), never tables only the coordinator sent."""
        assert isinstance(step, Install)
        h = self.hood
        if not pending.drained:
            return Reply(False, f"{h.broker_id} has not drained round {pending.round}")
        offered = tables_digest(pending.round, step.held, step.sent)
        wire_held: Mapping[str, Any]
        wire_sent: Mapping[str, Any]
        if h.vn == pending.master:
            tables = await self.tables(pending.links)
            ended = self._ended(pending)
            if ended is not None:
                return ended
            self._vouch(pending, tables)
            wire_held, wire_sent = tables.get(h.vn, ({}, {}))
            if tables_digest(pending.round, wire_held, wire_sent) != offered:
                log.warning(
                    "round %s: the coordinator's tables for %s differ from this replica's;"
                    " installing its own",
                    pending.round,
                    h.vn,
                )
        else:
            if not await self._until(
                lambda: self._vouched_tables(pending, offered) is not None,
                self.settings.step_timeout,
            ):
                return Reply(
                    False,
                    f"{h.broker_id}: no tables for {h.vn} vouched for by f + 1 replicas of "
                    f"master {pending.master}",
                )
            ended = self._ended(pending)
            if ended is not None:
                return ended
            chosen = self._vouched_tables(pending, offered)
            assert chosen is not None
            wire_held, wire_sent = chosen
            if tables_digest(pending.round, wire_held, wire_sent) != offered:
                log.warning(
                    "round %s: the coordinator's tables differ from those vouched for;"
                    " installing the vouched ones",
                    pending.round,
                )
        self._switch(pending, wire_held, wire_sent)
        return OK

    def _ended(self, pending: Pending) -> Reply | None:
        """The refusal when ``pending`` ended here while a step waited (its lease ran out:
        undone, or gone forward on vouches), else None. Nothing may act on it then: a
        master replica that went back and vouched afterwards would lead other members to
        switch while it stays, and one that went forward would switch twice."""
        if self.member.pending is pending:
            return None
        return Reply(False, f"{self.hood.broker_id}: round {pending.round} ended here (lease)")

    def _switch(
        self, pending: Pending, wire_held: Mapping[str, Any], wire_sent: Mapping[str, Any]
    ) -> None:
        held, sent = _tables(wire_held, wire_sent)
        h = self.hood
        h.end_standby(pending.added)
        h.install_hood(pending.hood, pending.new_neighbours, held, sent)
        # Before anything new is read: what a sibling that froze earlier routes on the new
        # tables from now on, this broker may have routed on the old ones.
        replayed = h.replay_routes()
        if replayed:
            log.info("round %s: %d recorded copies sent on new links", pending.round, replayed)
        h.flush()
        pending.installed = True

    def _go_forward(self, pending: Pending) -> bool:
        """Install, without the coordinator's ``install``, a drained round that f + 1
        replicas of the master VN vouched tables for: at least one honest replica installed
        it, so going back would leave this broker on a tree its master VN left."""
        if pending.installed or not pending.drained or self.hood.vn == pending.master:
            return False
        chosen = self._vouched_tables(pending, "")
        if chosen is None:
            return False
        log.warning(
            "round %s: no install from master %s; installing what its replicas vouched for",
            pending.round,
            pending.master,
        )
        self._switch(pending, *chosen)
        # Siblings without those vouches went back: f + 1 of them then decide (the reverse
        # of a replica that went back while its siblings switched, see abort()).
        self._repair_soon(delay=_RECHECK)
        return True

    def _vouch(self, pending: Pending, tables: WireTables) -> None:
        """Send every member of the other VNs the tables this master replica computed for
        its VN (marker wave 3), over the old links, which are still up; in parts when
        they outweigh half a frame (:mod:`reconfig.table_parts`)."""
        h = self.hood
        made: dict[str, tuple[str, list[TablePart]]] = {}
        for peer in h.link_ids():
            vn = h.linked_vn(peer)
            if vn is None or vn == h.vn or vn not in pending.hood:
                continue
            split = made.get(vn)
            if split is None:
                held, sent = tables.get(vn, ({}, {}))
                split = made[vn] = (
                    tables_digest(pending.round, held, sent),
                    self._table_parts(held, sent),
                )
            digest, parts = split
            for i, (part_held, part_sent) in enumerate(parts):
                data = {"round": pending.round, "wave": VOUCH, "digest": digest}
                data.update({"held": part_held, "sent": part_sent})
                if len(parts) > 1:
                    data.update({"part": i, "parts": len(parts)})
                h.send_on_link(peer, Reconf("marker", data))
        h.flush()

    def _vouched_tables(
        self, pending: Pending, offered: str
    ) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
        """Tables for this VN that f + 1 distinct replicas of the master VN vouched for
        (``offered``, the coordinator's, first if it is one of them), or None yet."""
        replicas = [n for n in self.hood.directory.values() if n.vn_id == pending.master]
        need = vouch_quorum(max((n.vn_size for n in replicas), default=1))
        peers = {n.id for n in replicas}
        vouched = self._vouched.get(pending.round, {})
        for digest in sorted(sorted(vouched), key=lambda d: d != offered):  # offered first
            if len(self.markers.vouchers(pending.round, VOUCH, digest, peers)) >= need:
                return vouched[digest]
        return None

    async def _resume(self, pending: Pending, step: Step) -> Reply:
        if not pending.installed and not self._go_forward(pending):
            # Nothing new to route on: going back is the only consistent way out.
            self.abort(pending.round)
            return Reply(False, f"{self.hood.broker_id} had not installed; round undone")
        self.resume(pending)
        await self.persist_links()
        return OK

    _ACTIONS: Mapping[str, Callable[[ReconfigAgent, Pending, Step], Awaitable[Reply]]] = {
        "connect": _connect,
        "freeze": _freeze,
        "install": _install,
        "resume": _resume,
    }

    async def persist_links(self) -> None:
        """Save the neighbours (off the event loop)."""
        try:
            await asyncio.to_thread(self.hood.save_links)
        except OSError as exc:
            log.error("cannot save the current links: %s", exc)

    def resume(self, pending: Pending) -> None:
        """Read again, close the removed links, release the lock."""
        h = self.hood
        h.record_routes(False)
        h.expect_marks(None)
        for vn in pending.removed:
            h.retire(vn)
        h.unfreeze()
        h.announce_links()
        h.flush()
        if pending.added or pending.removed:
            self.start_window()
        self._forget_markers(pending.round)
        self._vouched.pop(pending.round, None)
        self._release()

    def _go_on(self, pending: Pending) -> None:
        """Resume on the new tree without the coordinator's ``resume`` (its lease ended, or
        it said abort after this broker installed) and save the links, as ``resume`` does:
        a broker restarted later must come back on the tree it switched to."""
        self.resume(pending)
        self._spawn(self.persist_links())

    def abort(self, round_id: str) -> None:
        """Undo a round that has not installed (an installed one can only go forward)."""
        pending = self.member.pending
        if pending is None or pending.round != round_id:
            self._release()
            return
        if pending.installed:
            self._go_on(pending)
            return
        h = self.hood
        h.record_routes(False)
        h.expect_marks(None)
        for vn in pending.added:
            h.retire(vn)
        h.end_standby(pending.added)
        h.unfreeze()  # frozen, or holding a publisher at an early mark
        h.announce_links()
        h.flush()
        self._forget_markers(round_id)
        self._vouched.pop(round_id, None)
        self._release()
        if pending.drained:
            # A round installs nowhere before every member drained: back on one that had,
            # so its other members may have switched all the same.
            self._repair_soon()

    def describe(self) -> dict[str, Any]:
        """State for ``/reconfig``: neighbourhood, lock, counters, recent rounds."""
        h = self.hood
        s = self.stats
        lease = self.member.lease
        return {
            "id": h.broker_id,
            "vn": h.vn,
            "replica": h.replica,
            "enabled": self.settings.enabled,
            "neighbours": h.neighbour_vns(),
            "locked_by": lease.master if lease else None,
            "turns": s.turns,
            "refused": s.refused,
            "no_plan": s.no_plan,
            "applied": s.applied,
            "partial": s.partial,
            "aborted": s.aborted,
            "requested": s.requested,
            "links_changed": s.links_changed,
            "repaired": s.repaired,
            "marked": s.marked,
            "unmarked": s.unmarked,
            "saving": s.saving,
            "window": {
                "seconds": time.monotonic() - self.window_started,
                "classes": self.local_view().to_dict()["classes"],
            },
            "traffic": h.counters(),
            "model": {
                "alpha": self.model.alpha,
                "beta": self.model.beta,
                "link_cost": self.model.default_link_cost,
                "broker_cost": self.model.default_broker_cost,
            },
            "rounds": list(self.history),
        }


def _filters(wire: Mapping[str, Any]) -> dict[str, Filter]:
    return {str(k): Filter.from_wire(v) for k, v in wire.items()}


def _tables(
    wire_held: Mapping[str, Any], wire_sent: Mapping[str, Any]
) -> tuple[Tables, dict[str, dict[str, Filter]]]:
    """One VN's tables from wire form (as an install or a sibling carries them)."""
    held: Tables = {
        vn: (_filters(entry["adv"]), _filters(entry["sub"])) for vn, entry in wire_held.items()
    }
    return held, {vn: _filters(subs) for vn, subs in wire_sent.items()}


def _wire(filters: Mapping[str, Filter]) -> dict[str, Any]:
    return {k: f.to_wire() for k, f in filters.items()}
