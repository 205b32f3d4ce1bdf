"""What the router's hops are inside the daemon: local connections and neighbouring VNs.

The router (:mod:`broker.routing.router`) is generic in its hop type; the daemon routes
over two kinds, a client or broker :class:`~broker.daemon.dispatch.Connection` and a
:class:`VNHop` standing for every replica of a neighbouring virtual node. :class:`Hop` is
what both offer, so routing code never needs to know which one it holds.
"""

from __future__ import annotations

from typing import Protocol

from broker.wire.protocol import Message


class Hop(Protocol):
    """One next hop of the router: a local client, a broker link, or a neighbouring VN."""

    @property
    def is_broker(self) -> bool:
        """True for overlay hops (links and VNs), False for local clients."""

    @property
    def peer_id(self) -> str | None:
        """The client id, broker id or VN id (None before the handshake)."""

    @property
    def closing(self) -> bool:
        """True once nothing more may be sent to this hop."""

    @property
    def congested(self) -> bool:
        """True while a local client's send buffer is over its limit (deliveries drop)."""

    def note_dropped(self, keys: list[str]) -> None:
        """Count a delivery dropped for the subscriptions ``keys`` (reported later)."""

    def send(self, msg: Message) -> None:
        """Queue ``msg`` for the hop (flushed once per read batch)."""

    def send_raw(self, data: bytes) -> None:
        """Queue an already encoded frame for the hop."""

    def deliver_raw(self, data: bytes) -> None:
        """Queue an encoded DELIVER frame for a local client."""

    def __hash__(self) -> int: ...


class Member(Hop, Protocol):
    """A replica's link as a member of a :class:`VNHop`."""

    @property
    def opened(self) -> float:
        """When the link was opened (``time.monotonic()``)."""

    def close(self) -> None:
        """Close the link."""


class VNHop:
    """A neighbouring virtual node as one hop of the router.

    Messages to it go to every replica whose link is up. Routing messages from it take
    effect only once a majority of its replicas sent the same entry, so a Byzantine
    minority can neither inject nor withdraw routing state.
    """

    is_broker = True
    closing = False
    # Links between brokers never drop: a congested link pauses the broker's clients.
    congested = False

    def __init__(self, vn: str, size: int) -> None:
        self.peer_id = vn
        self.size = size
        self.quorum = size // 2 + 1
        self.members: dict[str, Member] = {}
        self._votes: dict[tuple[object, ...], set[str]] = {}

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

    def deliver_raw(self, data: bytes) -> None:
        raise AssertionError(f"{self!r} is a neighbour VN, not a local client")

    def note_dropped(self, keys: list[str]) -> None:
        raise AssertionError(f"a delivery to {self!r} cannot be dropped: links never drop")

    def vote(self, member: str, entry: tuple[object, ...]) -> bool:
        """Count ``member``'s vote for ``entry``; True exactly when it reaches the quorum."""
        voters = self._votes.setdefault(entry, set())
        if member in voters:
            return False
        voters.add(member)
        return len(voters) == self.quorum

    def has_votes(self, *prefix: object) -> bool:
        n = len(prefix)
        return any(e[:n] == prefix for e in self._votes)

    def forget(self, *prefix: object) -> None:
        """Drop the votes on entries starting with ``prefix`` (their outcome is applied)."""
        n = len(prefix)
        for entry in [e for e in self._votes if e[:n] == prefix]:
            del self._votes[entry]


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
