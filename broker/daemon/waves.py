"""Routing-state waves: a client's ADVERTISE or SUBSCRIBE is acknowledged once it is in force.

Routing state spreads hop by hop: an advertisement floods the tree and pulls matching
subscriptions back toward its publisher; a subscription travels toward matching
advertisements. Acknowledging a client's request at once would let its first publications
overtake the subscriptions still on their way back, and be lost.

So the edge broker acknowledges after a *wave*: it sends ``SYNC(token)`` to every replica of
every neighbouring VN, each of those passes a wave of its own on to its other neighbours,
and a broker answers ``SYNC(token, done)`` once every broker it asked has answered. Links are
FIFO and a broker handles one frame at a time, so:

* a broker handles a ``SYNC`` after every routing message its sender sent before it, and
  sends its own routing messages (the advertisement passed on, the subscriptions it pulls
  back) before it passes the wave on or answers;
* when a broker has every answer, it has already handled every routing message the brokers
  beyond it sent back, and what those made it send upstream precedes its own answer.

A replicated neighbour VN's routing entries take effect at a majority of its replicas
(:class:`~broker.daemon.hops.VNHop`), so a replica's entry may still lack the quorum when its
``SYNC`` arrives: the receiver then answers only once every entry that replica announced
reached the quorum (or it changed its word, or ``timeout`` passed). Otherwise the replica's
wave would complete before the receiver applied the entry and sent back what it pulls (a
subscription toward a new advertisement), and a publication published right after
``advertise()`` could reach the receiver from fewer than ``f + 1`` replicas and be lost (seen
when a publisher advertised just after another one left).

When the edge broker's wave completes, every routing change the request caused anywhere in
the overlay has therefore been applied on the way back to it: a publication published after
``advertise()`` returned reaches every subscriber whose ``subscribe()`` returned before it
(while the links are up and the replicas honest). A neighbour that does not answer within
``timeout`` seconds (a link that went down, a Byzantine replica) does not hold the wave: it
completes without it, and the delay is logged.

A link a live reconfiguration opened in *standby* carries no wave: nothing is routed over it
until the round installs it, and with it the VNs' links form a cycle, around which every
broker passing a wave on would pass it round for ever (each pass asking every replica of
the next VN: thousands of waves a second per broker during a round, which starved the
rounds' own steps on a loaded machine until leases ran out and VNs split). A wave that
arrives over a standby link (from a neighbour that installed the round first) is answered at
once: nothing beyond this broker is routed from that link yet.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from broker.daemon.hops import Member, VNHop
from broker.wire.protocol import Sync

log = logging.getLogger("trellis.routing")


@dataclass(slots=True)
class _Deferred:
    upstream: Member
    vn: str
    token: int
    settled: Callable[[], bool]
    timer: asyncio.TimerHandle


@dataclass(slots=True)
class _Wave:
    waiting: set[Member]
    done: Callable[[], None]
    timer: asyncio.TimerHandle


class RoutingWaves:
    """The waves this broker started and is waiting on (by token)."""

    def __init__(
        self,
        hops: Mapping[str, VNHop],
        flush: Callable[[], None],
        timeout: float,
        standby: Collection[str] = (),
    ) -> None:
        # The broker's neighbouring VNs by id, and those linked in standby for a round in
        # progress (its live tables: reconfiguration changes them).
        self.hops = hops
        self.standby = standby
        self.flush = flush
        self.timeout = timeout
        self._tokens = itertools.count(1)
        self._pending: dict[int, _Wave] = {}
        self._deferred: dict[tuple[int, int], _Deferred] = {}

    def start(self, done: Callable[[], None], *, exclude: str | None = None) -> None:
        """Ask every replica of every neighbouring VN but ``exclude`` to settle; call
        ``done`` once all answered (at once when there is nobody to ask)."""
        standby = self.standby
        waiting = {
            member
            for vn, hop in self.hops.items()
            if vn != exclude and vn not in standby
            for member in hop.members.values()
            if not member.closing
        }
        if not waiting:
            done()
            return
        token = next(self._tokens)
        timer = asyncio.get_running_loop().call_later(self.timeout, self._expire, token)
        self._pending[token] = _Wave(waiting, done, timer)
        ask = Sync(token, False)
        for member in waiting:
            member.send(ask)

    def asked(
        self, upstream: Member, vn: str, token: int, settled: Callable[[], bool] | None = None
    ) -> None:
        """A neighbour asks this broker to settle: pass the wave on, then answer it; first,
        when ``settled`` says the entries it announced are not all agreed on yet, wait
        until they are (:meth:`recheck`) or ``timeout`` passed. Over a standby link:
        answered at once."""
        if vn in self.standby:
            upstream.send(Sync(token, True))
            return
        if settled is not None and not settled():
            key = (id(upstream), token)
            timer = asyncio.get_running_loop().call_later(self.timeout, self._give_up, key)
            self._deferred[key] = _Deferred(upstream, vn, token, settled, timer)
            return
        self._pass_on(upstream, vn, token)

    def recheck(self) -> None:
        """Routing votes changed: answer the deferred waves whose entries are now agreed."""
        if not self._deferred:
            return
        for key, wave in list(self._deferred.items()):
            if wave.upstream.closing or wave.settled():
                del self._deferred[key]
                wave.timer.cancel()
                if not wave.upstream.closing:
                    self._pass_on(wave.upstream, wave.vn, wave.token)

    def _give_up(self, key: tuple[int, int]) -> None:
        wave = self._deferred.pop(key, None)
        if wave is None or wave.upstream.closing:
            return
        log.warning(
            "routing wave from %s: its entries lack a majority of %s after %.1f s; answering",
            wave.upstream.peer_id,
            wave.vn,
            self.timeout,
        )
        self._pass_on(wave.upstream, wave.vn, wave.token)
        self.flush()

    def _pass_on(self, upstream: Member, vn: str, token: int) -> None:
        def answer() -> None:
            if not upstream.closing:
                upstream.send(Sync(token, True))

        self.start(answer, exclude=vn)

    def answered(self, member: Member, token: int) -> None:
        """A neighbour answered one of this broker's waves."""
        wave = self._pending.get(token)
        if wave is not None:
            wave.waiting.discard(member)
            if not wave.waiting:
                self._finish(token)

    def lost(self, member: Member) -> None:
        """A link went down: no wave waits for it any more."""
        for token in [t for t, w in self._pending.items() if member in w.waiting]:
            self.answered(member, token)

    def _finish(self, token: int) -> None:
        wave = self._pending.pop(token)
        wave.timer.cancel()
        wave.done()

    def _expire(self, token: int) -> None:
        wave = self._pending.get(token)
        if wave is None:
            return
        log.warning(
            "routing wave %d: no answer from %s within %.1f s; going on without",
            token,
            ", ".join(sorted(str(m.peer_id) for m in wave.waiting)),
            self.timeout,
        )
        self._finish(token)
        self.flush()
