"""Live OCBR reconfiguration (SPEC §5): a broker's master turns and its part as a member.

Every ``interval`` (jittered) a broker whose VN has at least two neighbour VNs may act as
master. Its *coordinator* is the lowest-numbered live replica of the VN (a replica defers
while a lower sibling answers a control connection). That is crash-tolerant leadership; it
does not defend against a Byzantine coordinator. The coordinator runs one round over the
neighbourhood: the master VN plus its neighbour VNs, every replica of each. It talks to
each member broker over a short-lived *control connection* (HELLO with ``control``), one
``RECONF`` request and reply per step:

1. ``lock``: each member grants a lease or refuses at once. Nobody waits for a lock, so
   two masters cannot deadlock: the refused one releases what it got and tries again at
   its next (jittered) turn. A lease expires on its own if its master goes silent.
2. The coordinator plans from the traffic classes it counted since its last window
   (:mod:`reconfig.ocbr`); without a cheaper tree it unlocks and stops here.
3. ``prepare`` then ``connect``: members first accept the plan's new neighbours, then
   open the new links in *standby*: connected, not routed over. (Two steps, so no
   dialler reaches an acceptor that does not expect it yet.)
4. ``freeze``: members stop reading from local clients and from links that leave the
   neighbourhood (TCP holds that traffic back; nothing is dropped) and drain the old
   links in two waves of in-band markers. Neighbours mark their links to the master;
   once the master has every wave-1 marker, every publication sent to it has been
   routed, and it answers with wave-2 markers. A neighbour holding every wave-2 marker
   has routed everything the master sent it. Nothing moves in the neighbourhood then.
5. ``install``: the coordinator, whose star carried every entry that crosses the
   neighbourhood, computes what each link of the new tree carries
   (:func:`broker.routing.router.hood_routing`). Every member installs the same tables without
   messages; links leaving the neighbourhood hear only of entries a member gained or
   lost outright (SPEC §5: nothing else changes outside).
6. ``resume``: members read again, close the removed links and release the lock.

Publications held back by the freeze are routed afterwards on the new tree, so none is
lost or duplicated. Per-publisher order holds too: every earlier publication has left the
neighbourhood's links before a later one is read. Every replica of a VN receives the same
plan and tables from the coordinator, so the replicas of a VN switch together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from broker.errors import InvalidRequest, ProtocolError, TrellisError
from broker.routing.filters import Filter
from broker.routing.router import hood_routing
from broker.wire.protocol import (
    HEADER_SIZE,
    PROTOCOL_VERSION,
    Hello,
    Ping,
    Pong,
    Reconf,
    Role,
    Welcome,
    decode_body,
    encode,
)
from overlay.tree import link
from reconfig.cost import CostModel, LocalView
from reconfig.ocbr import TabuParams, plan_view

if TYPE_CHECKING:
    from broker.daemon.server import Broker, Connection

log = logging.getLogger("trellis.reconfig")


@dataclass
class Lease:
    """A neighbourhood lock this broker granted."""

    round: str
    master: str
    expires: float


@dataclass
class Pending:
    """A round this broker takes part in, between ``prepare`` and ``resume``."""

    round: str
    master: str
    hood: set[str]
    new_neighbours: set[str]
    added: set[str]
    removed: set[str]
    frozen: bool = False
    installed: bool = False


@dataclass
class RoundStats:
    """What this broker's master turns did (for ``/reconfig`` and ``/metrics``)."""

    turns: int = 0
    refused: int = 0
    no_plan: int = 0
    applied: int = 0
    aborted: int = 0
    links_changed: int = 0
    saving: float = 0.0
    last_cost_before: float = 0.0
    last_cost_after: float = 0.0
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=200))


class ControlChannel:
    """A coordinator's control connection to one member broker: request, then reply."""

    def __init__(self, me: str, peer: str, endpoint: str) -> None:
        self.me = me
        self.peer = peer
        self.endpoint = endpoint
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self, timeout: float) -> None:
        host, _, port = self.endpoint.rpartition(":")
        async with asyncio.timeout(timeout):
            self.reader, self.writer = await asyncio.open_connection(host, int(port))
            self.writer.write(
                encode(Hello(PROTOCOL_VERSION, Role.BROKER, self.me, {"control": True}))
            )
            reply = await self._read()
        if type(reply) is not Welcome:
            raise ProtocolError(f"broker {self.peer} refused a control connection: {reply}")

    async def call(self, op: str, data: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.writer is not None
        self.writer.write(encode(Reconf(op, data)))
        async with asyncio.timeout(timeout):
            while True:
                msg = await self._read()
                if type(msg) is Reconf and msg.op == "reply":
                    return msg.data
                if type(msg) is Ping:
                    self.writer.write(encode(Pong(msg.token)))
                elif type(msg) is not Pong:
                    raise ProtocolError(f"broker {self.peer} answered {op} with {msg}")

    async def _read(self) -> Any:
        assert self.reader is not None
        header = await self.reader.readexactly(HEADER_SIZE)
        body = await self.reader.readexactly(int.from_bytes(header, "big"))
        return decode_body(body)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError):
                await self.writer.wait_closed()


class ReconfigAgent:
    """One broker's side of live reconfiguration: master turns and member requests."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.settings = broker.config.reconfig
        s = self.settings
        self.model = CostModel(
            alpha=s.alpha,
            beta=s.beta,
            default_link_cost=s.link_cost,
            default_broker_cost=s.broker_cost,
        )
        self.params = TabuParams(
            candidates=s.candidates, iterations=s.iterations, tenure=s.tenure, adaptive=True
        )
        self.lease: Lease | None = None
        self.pending: Pending | None = None
        self.coordinating: str | None = None
        self.stats = RoundStats()
        self.rng = random.Random()
        self._markers: dict[str, set[tuple[int, str]]] = {}
        self._marker_event: asyncio.Event | None = None
        self._seq = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._links_changed = False
        self.window_started = time.monotonic()

    # -- master turns ---------------------------------------------------------------------

    async def run(self) -> None:
        """Take a master turn every jittered interval; expire stale leases meanwhile.

        With reconfiguration off the broker still counts its traffic classes, one window
        per interval, for ``/reconfig`` (and so that counting holds no departed client).
        """
        s = self.settings
        while not s.enabled:
            await asyncio.sleep(s.interval)
            self.start_window()
        while True:
            delay = s.interval * (1 + self.rng.uniform(-s.jitter, s.jitter))
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline:
                await asyncio.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
                self.expire_lease()
                await self.persist_links()
            try:
                await self.master_turn()
            except (OSError, TrellisError, TimeoutError) as exc:
                log.warning("reconfiguration round failed: %s", exc)

    async def persist_links(self) -> None:
        """Save the neighbours after a round changed them (off the event loop)."""
        if self._links_changed:
            self._links_changed = False
            try:
                await asyncio.to_thread(self.broker.save_links)
            except OSError as exc:
                log.error("cannot save the current links: %s", exc)

    def expire_lease(self) -> None:
        """Drop a lease whose master went silent, undoing a round it left half-done."""
        lease = self.lease
        if lease is not None and time.monotonic() > lease.expires:
            log.warning("lock of master %s (round %s) expired", lease.master, lease.round)
            self.abort(lease.round)
            self.lease = None

    async def master_turn(self) -> dict[str, Any] | None:
        """One round as master; returns the record of the round, or None if none ran."""
        b = self.broker
        neighbours = self.neighbour_vns()
        if len(neighbours) < 2 or self.lease is not None or self.pending is not None:
            return None
        if sum(b.traffic.values()) < self.settings.min_traffic:
            return None
        if not await self.is_coordinator():
            return None
        self._seq += 1
        round_id = f"{b.config.id}#{self._seq}"
        hood = [b.vn, *neighbours]
        self.stats.turns += 1
        record: dict[str, Any] = {
            "round": round_id,
            "master": b.vn,
            "time": time.time(),
            "neighbourhood": sorted(link(b.vn, n) for n in neighbours),
        }
        self.coordinating = round_id
        channels: list[ControlChannel] = []
        try:
            outcome = await self._coordinate(round_id, hood, channels, record)
        finally:
            self.coordinating = None
            await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
        record["outcome"] = outcome
        self.stats.history.append(record)
        log.info("round %s: %s", round_id, outcome)
        return record

    async def _coordinate(
        self,
        round_id: str,
        hood: list[str],
        channels: list[ControlChannel],
        record: dict[str, Any],
    ) -> str:
        b = self.broker
        step = self.settings.step_timeout
        members = sorted(p for p, n in b.directory.items() if n.vn_id in hood)
        for peer in members:
            channels.append(ControlChannel(b.config.id, peer, b.directory[peer].endpoint))
        opened = await asyncio.gather(*(c.open(step) for c in channels), return_exceptions=True)
        failed = [c.peer for c, r in zip(channels, opened, strict=True) if r is not None]
        if failed:
            self.stats.refused += 1
            return f"refused: {', '.join(failed)} unreachable"
        lock = {"round": round_id, "master": b.vn, "lease": self.settings.lock_lease}
        if not (await self.handle("lock", lock)).get("ok"):
            self.stats.refused += 1
            return "refused: this broker is locked"
        replies = await self._all(channels, "lock", lock)
        refusals = [r.get("error", "?") for r in replies if not r.get("ok")]
        if refusals:
            await self._all(channels, "unlock", {"round": round_id})
            await self.handle("unlock", {"round": round_id})
            self.stats.refused += 1
            return f"refused: {refusals[0]}"
        view = self.local_view()
        # The search is CPU work on immutable data: off the loop, so traffic keeps flowing.
        plan = await asyncio.to_thread(
            plan_view, view, self.model, rng=self.rng, params=self.params
        )
        self.start_window()
        if plan is None:
            await self._all(channels, "unlock", {"round": round_id})
            await self.handle("unlock", {"round": round_id})
            self.stats.no_plan += 1
            return "no cheaper tree"
        new_links = sorted((view.star() - set(plan.change.remove)) | set(plan.change.add))
        record.update(plan.to_dict())
        record["new_neighbourhood"] = new_links
        prepare = {"round": round_id, "master": b.vn, "hood": hood, "links": new_links}
        if not await self._step(channels, "prepare", prepare) or not await self._step(
            channels, "connect", {"round": round_id}
        ):
            await self._abort_all(channels, round_id)
            return "aborted: new links did not come up"
        if not await self._step(channels, "freeze", {"round": round_id}):
            await self._abort_all(channels, round_id)
            return "aborted: the neighbourhood did not drain"
        tables = await self.tables(new_links)
        installs = [self.handle("install", {"round": round_id, **tables[b.vn]})]
        installs += [
            self._call(c, "install", {"round": round_id, **tables[b.directory[c.peer].vn_id]})
            for c in channels
        ]
        results = await asyncio.gather(*installs)
        if not all(r.get("ok") for r in results):
            # Too late to go back: some members switched. Resume so locks and pauses end.
            log.error("round %s: install failed at some member: %s", round_id, results)
        await self._step(channels, "resume", {"round": round_id})
        self.stats.applied += 1
        self.stats.links_changed += len(plan.change.add)
        self.stats.saving += plan.improvement
        self.stats.last_cost_before = plan.cost_before
        self.stats.last_cost_after = plan.cost_after
        return "applied"

    async def _step(self, channels: list[ControlChannel], op: str, data: dict[str, Any]) -> bool:
        """Run one step at every member, this broker included, concurrently."""
        replies = await asyncio.gather(self.handle(op, data), self._all(channels, op, data))
        mine, theirs = replies
        problems = [r.get("error") for r in [mine, *theirs] if not r.get("ok")]
        if problems:
            log.warning("%s failed: %s", op, problems)
        return not problems

    async def _abort_all(self, channels: list[ControlChannel], round_id: str) -> None:
        self.stats.aborted += 1
        await self._step(channels, "abort", {"round": round_id})

    async def _all(
        self, channels: list[ControlChannel], op: str, data: dict[str, Any]
    ) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(self._call(c, op, data) for c in channels)))

    async def _call(self, channel: ControlChannel, op: str, data: dict[str, Any]) -> dict[str, Any]:
        try:
            return await channel.call(op, data, self.settings.step_timeout * 2)
        except (OSError, TrellisError, TimeoutError, asyncio.IncompleteReadError) as exc:
            return {"ok": False, "error": f"{channel.peer}: {exc or type(exc).__name__}"}

    async def is_coordinator(self) -> bool:
        """Whether no lower-numbered replica of this VN is alive to coordinate instead."""
        b = self.broker
        siblings = [
            n for n in b.directory.values() if n.vn_id == b.vn and n.replica < b.config.replica
        ]
        for sibling in siblings:
            channel = ControlChannel(b.config.id, sibling.id, sibling.endpoint)
            try:
                await channel.open(0.5)
            except (OSError, TrellisError, TimeoutError, asyncio.IncompleteReadError):
                continue
            finally:
                await channel.close()
            return False
        return True

    def neighbour_vns(self) -> list[str]:
        """The neighbour VNs this broker routes to now."""
        return sorted(
            str(h.peer_id) for h in self.broker.router.neighbours if h.is_broker and h.peer_id
        )

    def start_window(self) -> None:
        """Start a new traffic window (after a turn, or when the neighbourhood changed)."""
        self.broker.traffic = defaultdict(int)
        self.window_started = time.monotonic()

    def local_view(self) -> LocalView:
        """The master's local view (SPEC §5) from the traffic classes counted since the
        window started: each publication's source and targets, neighbours standing for
        their subtrees, local clients for themselves."""
        b = self.broker
        neighbours = set(self.neighbour_vns())
        classes: dict[frozenset[str], float] = {}
        local: set[str] = set()
        for hops, count in b.traffic.items():
            names = set()
            for hop in hops:
                name = str(hop.peer_id)
                if hop.is_broker:
                    if name not in neighbours:
                        break  # counted before a change this window missed
                else:
                    if name in neighbours or name == b.vn:
                        break  # a client named like a VN cannot be placed
                    local.add(name)
                names.add(name)
            else:
                if len(names) > 1:
                    key = frozenset(names)
                    classes[key] = classes.get(key, 0.0) + count
        return LocalView(
            master=b.vn,
            neighbours=tuple(sorted(neighbours)),
            local_clients=tuple(sorted(local)),
            classes=MappingProxyType(classes),
        )

    async def tables(self, new_links: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
        """Per VN of the neighbourhood: what it holds from, and sends to, each neighbour
        on the new tree, in wire form (computed off the loop from a snapshot of the
        router, which the freeze keeps still anyway)."""
        b = self.broker
        adverts, subs = b.router.owned_entries(b.vn)
        carried = await asyncio.to_thread(
            hood_routing, adverts, subs, new_links, covering=b.config.covering
        )
        tables: dict[str, dict[str, Any]] = {}
        for (x, y), (advs, sbs) in carried.items():
            wire_advs = {k: f.to_wire() for k, f in advs.items()}
            wire_subs = {k: f.to_wire() for k, f in sbs.items()}
            into = tables.setdefault(y, {"held": {}, "sent": {}})
            into["held"][x] = {"adv": wire_advs, "sub": wire_subs}
            tables.setdefault(x, {"held": {}, "sent": {}})["sent"][y] = wire_subs
        return tables

    # -- member side ----------------------------------------------------------------------

    def control_request(self, conn: Connection, msg: Reconf) -> None:
        """A coordinator's request on a control connection: run it, then reply."""

        async def serve() -> None:
            try:
                reply = await self.handle(msg.op, msg.data)
            except TrellisError as exc:
                reply = {"ok": False, "error": f"{self.broker.config.id}: {exc.message}"}
            except Exception as exc:  # a failed step must reach the coordinator as an answer
                log.exception("reconfiguration step %s failed", msg.op)
                reply = {"ok": False, "error": f"{self.broker.config.id}: {exc}"}
            if not conn.closing:
                conn.send(Reconf("reply", reply))
                self.broker.flush()

        task = asyncio.get_running_loop().create_task(serve())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def link_message(self, conn: Connection, msg: Reconf) -> None:
        """An in-band drain marker on a broker link."""
        if msg.op != "marker":
            raise ProtocolError(f"RECONF {msg.op} is not valid on a broker link")
        round_id = str(msg.data.get("round"))
        wave = msg.data.get("wave")
        if type(wave) is not int:
            raise ProtocolError("RECONF marker field 'wave' must be an integer")
        self._markers.setdefault(round_id, set()).add((wave, str(conn.peer_id)))
        if self._marker_event is not None:
            self._marker_event.set()

    async def handle(self, op: str, data: dict[str, Any]) -> dict[str, Any]:
        """Run one step of a round at this broker; the reply says ok or why not."""
        round_id = str(data.get("round", ""))
        me = self.broker.config.id
        if op == "lock":
            if not self.settings.enabled:
                return {"ok": False, "error": f"{me} has reconfiguration disabled"}
            self.expire_lease()
            if self.lease is not None and self.lease.round != round_id:
                return {"ok": False, "error": f"{me} is locked by master {self.lease.master}"}
            if self.coordinating is not None and self.coordinating != round_id:
                return {"ok": False, "error": f"{me} is master of its own round"}
            lease = float(data.get("lease", self.settings.lock_lease))
            self.lease = Lease(round_id, str(data.get("master")), time.monotonic() + lease)
            return {"ok": True}
        if op == "abort":
            self.abort(round_id)
            return {"ok": True}
        if self.lease is None or self.lease.round != round_id:
            return {"ok": False, "error": f"{me} holds no lock for round {round_id}"}
        if op == "unlock":
            self.lease = None
            return {"ok": True}
        if op == "prepare":
            return self.prepare(round_id, data)
        pending = self.pending
        if pending is None or pending.round != round_id:
            return {"ok": False, "error": f"{me} has no prepared round {round_id}"}
        if op == "connect":
            return await self.connect(pending)
        if op == "freeze":
            return await self.freeze(pending)
        if op == "install":
            return self.install(pending, data)
        if op == "resume":
            self.resume(pending)
            await self.persist_links()
            return {"ok": True}
        return {"ok": False, "error": f"unknown step {op!r}"}

    def prepare(self, round_id: str, data: dict[str, Any]) -> dict[str, Any]:
        """Accept the plan's new neighbours of this broker's VN (in standby)."""
        b = self.broker
        hood, links, master = data.get("hood"), data.get("links"), data.get("master")
        if not isinstance(hood, list) or not all(isinstance(v, str) for v in hood):
            raise InvalidRequest("RECONF prepare field 'hood' must be a list of VN ids")
        if not isinstance(links, list) or not all(
            isinstance(lk, list | tuple) and len(lk) == 2 and all(isinstance(v, str) for v in lk)
            for lk in links
        ):
            raise InvalidRequest("RECONF prepare field 'links' must be a list of VN id pairs")
        if master not in hood:
            raise InvalidRequest("RECONF prepare field 'master' must be one of 'hood'")
        new = {y for x, y in links if x == b.vn} | {x for x, y in links if y == b.vn}
        old = set(self.neighbour_vns()) & set(hood)
        added = new - old
        self.pending = Pending(round_id, master, set(hood), new, added, old - new)
        self._markers.pop(round_id, None)
        b.standby_vns |= added
        for peer in b.directory.values():
            if peer.vn_id in added:
                b.neighbours[peer.id] = peer
                b.vnhop_for(peer)
        return {"ok": True}

    async def connect(self, pending: Pending) -> dict[str, Any]:
        """Open the new links (this side dials those to larger ids) and wait for all."""
        b = self.broker
        peers = [n for n in b.directory.values() if n.vn_id in pending.added]
        for peer in peers:
            b.start_dialer(peer)
        deadline = time.monotonic() + self.settings.step_timeout
        while not all(p.id in b.links for p in peers):
            if time.monotonic() > deadline:
                missing = sorted(p.id for p in peers if p.id not in b.links)
                return {"ok": False, "error": f"{b.config.id}: no link to {', '.join(missing)}"}
            await asyncio.sleep(0.01)
        return {"ok": True}

    async def freeze(self, pending: Pending) -> dict[str, Any]:
        """Pause input from outside the neighbourhood and drain its old links."""
        b = self.broker
        b.freeze(pending.hood)
        pending.frozen = True
        if b.vn == pending.master:
            old = {p for p in b.links if b.linked_vn(p) in pending.hood - b.standby_vns}
            ok = await self._await_markers(pending.round, 1, old)
            self._send_markers(pending.round, 2, old)
        else:
            old = {p for p in b.links if b.linked_vn(p) == pending.master}
            self._send_markers(pending.round, 1, old)
            ok = await self._await_markers(pending.round, 2, old)
        if not ok:
            return {"ok": False, "error": f"{b.config.id}: drain markers missing"}
        return {"ok": True}

    def _send_markers(self, round_id: str, wave: int, peers: set[str]) -> None:
        b = self.broker
        for peer in peers:
            conn = b.links.get(peer)
            if conn is not None:
                conn.send(Reconf("marker", {"round": round_id, "wave": wave}))
        b.flush()

    async def _await_markers(self, round_id: str, wave: int, peers: set[str]) -> bool:
        """Wait for a marker of ``wave`` from every peer whose link stays up."""
        if self._marker_event is None:
            self._marker_event = asyncio.Event()
        deadline = time.monotonic() + self.settings.step_timeout
        while True:
            got = {p for w, p in self._markers.get(round_id, ()) if w == wave}
            if all(p in got or p not in self.broker.links for p in peers):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._marker_event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._marker_event.wait(), min(remaining, 0.1))

    def install(self, pending: Pending, data: dict[str, Any]) -> dict[str, Any]:
        """Switch the neighbourhood's routing state to the planned tree."""
        b = self.broker
        held: dict[str, tuple[dict[str, Filter], dict[str, Filter]]] = {}
        for vn, entry in data.get("held", {}).items():
            held[vn] = (_filters(entry["adv"]), _filters(entry["sub"]))
        sent = {vn: _filters(subs) for vn, subs in data.get("sent", {}).items()}
        hops = {vn: b.vnhops[vn] for vn in pending.new_neighbours}
        for hop in hops.values():
            hop.forget()
        actions = b.router.install_hood(pending.hood, hops, held, sent)
        b.standby_vns -= pending.added
        pending.installed = True
        b.execute(actions)
        b.flush()
        return {"ok": True}

    def resume(self, pending: Pending) -> None:
        """Read again, close the removed links, release the lock."""
        b = self.broker
        for vn in pending.removed:
            b.retire(vn)
        b.unfreeze()
        b.announce_links()
        b.flush()
        if pending.added or pending.removed:
            self.start_window()
            self._links_changed = True
        self.pending = None
        self.lease = None
        self._markers.pop(pending.round, None)

    def abort(self, round_id: str) -> None:
        """Undo a round that has not installed (an installed one can only go forward)."""
        pending = self.pending
        if pending is None or pending.round != round_id:
            self.lease = None
            return
        if pending.installed:
            self.resume(pending)
            return
        b = self.broker
        for vn in pending.added:
            b.retire(vn)
        b.standby_vns -= pending.added
        if pending.frozen:
            b.unfreeze()
        b.announce_links()
        b.flush()
        self.pending = None
        self.lease = None
        self._markers.pop(round_id, None)

    def describe(self) -> dict[str, Any]:
        """State for ``/reconfig``: neighbourhood, lock, counters, recent rounds."""
        b = self.broker
        s = self.stats
        return {
            "id": b.config.id,
            "vn": b.vn,
            "replica": b.config.replica,
            "enabled": self.settings.enabled,
            "neighbours": self.neighbour_vns(),
            "locked_by": self.lease.master if self.lease else None,
            "turns": s.turns,
            "refused": s.refused,
            "no_plan": s.no_plan,
            "applied": s.applied,
            "aborted": s.aborted,
            "links_changed": s.links_changed,
            "saving": s.saving,
            "window": {
                "seconds": time.monotonic() - self.window_started,
                "classes": self.local_view().to_dict()["classes"],
            },
            "traffic": {
                "routed": b.stats.routed,
                "forwarded": sum(b.stats.forwarded.values()),
                "published": b.stats.publications_in,
                "delivered": b.stats.deliveries,
            },
            "model": {
                "alpha": self.model.alpha,
                "beta": self.model.beta,
                "link_cost": self.model.default_link_cost,
                "broker_cost": self.model.default_broker_cost,
            },
            "rounds": list(s.history),
        }


def _filters(wire: dict[str, Any]) -> dict[str, Filter]:
    return {str(k): Filter.from_wire(v) for k, v in wire.items()}
