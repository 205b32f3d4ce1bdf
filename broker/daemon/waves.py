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

When the edge broker's wave completes, every routing change the request caused anywhere in
the overlay has therefore been applied on the way back to it: a publication published after
``advertise()`` returned reaches every subscriber whose ``subscribe()`` returned before it
(while the links are up and the replicas honest). A neighbour that does not answer within
``timeout`` seconds (a link that went down, a Byzantine replica) does not hold the wave: it
completes without it, and the delay is logged.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker.daemon.hops import Member, VNHop
from broker.wire.protocol import Sync

log = logging.getLogger("trellis.routing")


@dataclass(slots=True)
class _Wave:
    waiting: set[Member]
    done: Callable[[], None]
    timer: asyncio.TimerHandle


class RoutingWaves:
    """The waves this broker started and is waiting on (by token)."""

    def __init__(
        self, hops: Mapping[str, VNHop], flush: Callable[[], None], timeout: float
    ) -> None:
        # The broker's neighbouring VNs by id (its live table: reconfiguration changes it).
        self.hops = hops
        self.flush = flush
        self.timeout = timeout
        self._tokens = itertools.count(1)
        self._pending: dict[int, _Wave] = {}

    def start(self, done: Callable[[], None], *, exclude: str | None = None) -> None:
        """Ask every replica of every neighbouring VN but ``exclude`` to settle; call
        ``done`` once all answered (at once when there is nobody to ask)."""
        waiting = {
            member
            for vn, hop in self.hops.items()
            if vn != exclude
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

    def asked(self, upstream: Member, vn: str, token: int) -> None:
        """A neighbour asks this broker to settle: pass the wave on, then answer it."""

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
