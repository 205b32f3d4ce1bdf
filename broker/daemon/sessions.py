"""Client sessions that outlive a lost connection (broker setting ``session_linger``).

A subscriber connected to the replicas of its edge VN delivers a publication once ``f + 1``
of them sent identical copies. If its connections to more than ``f`` replicas drop at once
(a network path reset, a client too busy to answer PINGs), the publications routed while
they were down reach it from too few replicas to be agreed on, and were lost for good once
later ones were agreed: the replicas had withdrawn its subscriptions and kept nothing.

So a client session whose connection was *lost* (reset, or closed here for heartbeat
silence; not a clean close, which ends with an EOF) is parked for ``session_linger``
seconds: its subscriptions and advertisements stay in the routing tables, with the
connection that holds them (its *session hop*) as their hop; the deliveries and key shares it
was sent just before (the newest :data:`RECENT_DELIVERY_BYTES` of deliveries and
``broker.daemon.shares.RECENT_SHARES`` share records: they may have died in flight, in the
socket buffers) open its buffer, and what is sent to it meanwhile joins them, up to
``session_buffer`` bytes. When the same client (id and HELLO ``session`` token) connects again
in time, the new connection carries the session: the buffer, then everything routed to the
session hop. The client discards what it already had (it deduplicates by publisher and seq,
and a key share it holds twice counts once). A session not claimed in time, or whose buffer
overflows, ends as the connection would have: its routing state is withdrawn.

Key shares travel in SHARES frames whose certificate ids are numbered per connection
(:class:`~security.propagation.LinkCertsOut`): a parked session's recent share records are
encoded again from id 0, and the new connection's numbering continues from there. Shares by
the pass (``LEAVES``) are handed again with every statement above them
(:meth:`broker.daemon.passes.PassForwarding.resend_recent`); the client counts a leaf it
holds twice once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from broker.wire.resend import RecentFrames

log = logging.getLogger("trellis.broker")

RECENT_DELIVERY_BYTES = 1024 * 1024
"""Bytes of the newest deliveries a client connection keeps for a resume: about what the
socket buffers of a busy connection hold, so for small deliveries thousands (until
2026-11-28 it kept 128 frames, so a reset lost whatever else was in flight)."""

RECENT_FRAME_BYTES = 8192
"""Largest delivery frame kept among the recent ones (one large delivery would otherwise
push out hundreds of small ones)."""

MAX_PARKED = 1024
"""Sessions parked at once at most (a flood of reset connections parks no more; past it a
lost connection's session ends with it, as with ``session_linger = 0``)."""


class SessionHop(Protocol):
    """What a session needs of the connection that holds its routing state."""

    peer_id: str | None
    session: str | None


H = TypeVar("H", bound=SessionHop)


def recent_deliveries() -> RecentFrames:
    """The last DELIVER frames (of at most :data:`RECENT_FRAME_BYTES`) sent on a client
    connection: ``Connection.take_out`` keeps them once per write, the oldest fall out."""
    return RecentFrames(RECENT_DELIVERY_BYTES)


@dataclass
class _Parked(Generic[H]):
    hop: H
    frames: list[bytes]
    size: int
    timer: asyncio.Handle | None = None
    overflowed: bool = False


class Sessions(Generic[H]):
    """The parked sessions of one broker, by client id.

    ``end`` withdraws a session's routing state (the broker's ``router.remove_hop``); it is
    called from a timer or a new connection's HELLO, never while a publication is routed.
    """

    def __init__(self, linger: float, buffer_limit: int, end: Callable[[H], None]) -> None:
        self.linger = linger
        self.buffer_limit = buffer_limit
        self._end = end
        self._parked: dict[str, _Parked[H]] = {}

    def __len__(self) -> int:
        return len(self._parked)

    def can_park(self, hop: H) -> bool:
        """Whether ``hop``'s session may be parked: sessions are on, it has an identity
        (client id and session token), and fewer than :data:`MAX_PARKED` are."""
        return (
            self.linger > 0
            and bool(hop.peer_id)
            and bool(hop.session)
            and len(self._parked) < MAX_PARKED
        )

    def park(self, hop: H, inflight: list[bytes]) -> None:
        """Keep ``hop``'s session for ``linger`` seconds: ``inflight`` (recent deliveries that
        may not have arrived) opens its buffer."""
        assert hop.peer_id is not None
        parked = _Parked(hop, inflight, sum(map(len, inflight)))
        self._parked[hop.peer_id] = parked
        parked.timer = asyncio.get_running_loop().call_later(
            self.linger, self._expire, hop.peer_id, parked
        )
        log.info(
            "client %s: connection lost; its session is kept for %g s", hop.peer_id, self.linger
        )

    def buffer(self, hop: H, frame: bytes) -> None:
        """A frame sent to a parked session: kept for the resume, within ``buffer_limit``."""
        client_id = hop.peer_id or ""
        parked = self._parked.get(client_id)
        if parked is None or parked.hop is not hop or parked.overflowed:
            return
        parked.size += len(frame)
        if parked.size <= self.buffer_limit:
            parked.frames.append(frame)
            return
        # Ended from the loop, not here: a frame is buffered while a publication is routed.
        parked.overflowed = True
        parked.frames = []
        log.warning(
            "client %s: session buffer over %d bytes; the session ends",
            client_id,
            self.buffer_limit,
        )
        if parked.timer is not None:
            parked.timer.cancel()
        parked.timer = asyncio.get_running_loop().call_soon(self._expire, client_id, parked)

    def resume(self, client_id: str, session: str | None) -> tuple[H, list[bytes]] | None:
        """The parked session of ``client_id`` (hop, frames to send first), claimed by a new
        connection of the same session; a parked session of another session ends."""
        parked = self._parked.pop(client_id, None)
        if parked is None:
            return None
        if parked.timer is not None:
            parked.timer.cancel()
        if parked.overflowed or not session or parked.hop.session != session:
            self._end(parked.hop)
            return None
        log.info("client %s: session resumed (%d frames kept)", client_id, len(parked.frames))
        return parked.hop, parked.frames

    def _expire(self, client_id: str, parked: _Parked[H]) -> None:
        if self._parked.get(client_id) is not parked:
            return
        del self._parked[client_id]
        log.info("client %s: session not resumed within %g s; it ends", client_id, self.linger)
        self._end(parked.hop)

    def close(self) -> None:
        """Forget every parked session (the broker is stopping)."""
        for parked in self._parked.values():
            if parked.timer is not None:
                parked.timer.cancel()
        self._parked.clear()
