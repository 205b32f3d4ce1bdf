"""A bounded ring of a broker's recent routing decisions, for ``/api/trace``.

The forwarder already hands its traffic log one tuple per decision (``copy``: a replica's
copy arrived; ``pub``: a publication was routed, its hops named by a route id; ``pubx``: the
same with a dropped delivery). :func:`install` puts a :class:`TraceRing` where the forwarder
keeps its traffic log, so forwarding code is unchanged: the ring appends each tuple to a
``deque(maxlen=...)`` (one C call) and passes it on to the real traffic log, if there is
one. Without a traffic log the ring stands in for it alone, which costs the forwarder what
logging costs it: a clock read, a route-id lookup and a small tuple per publication.

Only the last :data:`RING_RECORDS` records are kept (routes included), so a trace answers for
recent publications only; a route id whose definition was dropped (more than two
generations of :data:`ROUTE_LIMIT` routes ago) is reported as unknown. Queries scan the ring
(milliseconds; admin requests only).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from broker.daemon.traffic_log import TrafficLog

RING_RECORDS = 8192
"""Records kept per broker: routing decisions, copies received and route definitions."""

ROUTE_LIMIT = 4096
"""Distinct routes (source hop, target hops) remembered before the table starts afresh."""

Record = tuple[Any, ...]


class _HopLike(Protocol):
    @property
    def is_broker(self) -> bool: ...

    @property
    def peer_id(self) -> str | None: ...


class Logged(Protocol):
    """The forwarder as the ring sees it: where it keeps its traffic log."""

    tlog: TrafficLog | None


class TraceRing:
    """Recent routing decisions of one broker; a stand-in for (or a tee in front of) its
    traffic log, with the attributes the forwarder uses: ``append``, ``routes``,
    :meth:`define_route` and :meth:`dropped_pub`."""

    def __init__(self, log: TrafficLog | None = None, size: int = RING_RECORDS) -> None:
        self.size = size
        self.ring: deque[Record] = deque(maxlen=size)
        self.log = log
        self.route_defs: dict[int, Record] = {}
        self._old_defs: dict[int, Record] = {}
        self._next_route = 0
        self.routes: dict[tuple[Any, ...], int]
        if log is None:
            self.routes = {}
            self.append = self.ring.append
        else:
            # The log's route table and ids, so its files name the same routes.
            self.routes = log.routes
            self.append = self._tee

    def _tee(self, record: Record) -> None:
        self.ring.append(record)
        log = self.log
        if log is not None:
            log.append(record)

    def define_route(self, key: tuple[Any, ...], source: Any, targets: Iterable[Any]) -> int:
        """A new route's id (the traffic log's, when there is one) and its definition."""
        log = self.log
        if log is not None:
            route = log.define_route(key, source, targets)
            self.routes = log.routes  # the log may have started a fresh table
            record = log.route_defs[route]
            if len(self.route_defs) > ROUTE_LIMIT:
                self._old_defs, self.route_defs = self.route_defs, {}
        else:
            hops = list(targets)
            if len(self.routes) > ROUTE_LIMIT:
                self.routes, self._old_defs, self.route_defs = {}, self.route_defs, {}
            route = self._next_route
            self._next_route += 1
            record = (
                "route",
                route,
                _name(source),
                not source.is_broker,
                [_name(h) for h in hops if h.is_broker],
                [_name(h) for h in hops if not h.is_broker],
                [],
            )
            self.routes[key] = route
        self.route_defs[route] = record
        return route

    def dropped_pub(
        self,
        t: float,
        publisher: str,
        seq: int,
        source: _HopLike,
        sender: object,
        targets: Mapping[Any, Any],
        dropped: list[Any],
        nbytes: int,
        conf: bool,
        digest: int | None,
    ) -> Record:
        """A ``pubx`` record: a ``pub`` with its hops inline (a delivery was dropped)."""
        return (
            "pubx",
            t,
            publisher,
            seq,
            _name(source),
            not source.is_broker,
            None if sender is None else str(sender),
            [_name(h) for h in targets if h.is_broker],
            [_name(h) for h in targets if not h.is_broker and h not in dropped],
            [_name(h) for h in dropped],
            nbytes,
            conf,
            digest,
        )

    # -- queries (admin requests) -----------------------------------------------------------

    def _route(self, route: int) -> Record | None:
        return self.route_defs.get(route) or self._old_defs.get(route)

    def publication(self, publisher: str, seq: int) -> dict[str, Any]:
        """What this broker did with publication (publisher, seq), as far as the ring
        remembers: copies received, routing decisions, and a verdict with its reason."""
        copies: list[dict[str, Any]] = []
        decisions: list[dict[str, Any]] = []
        for record in list(self.ring):
            kind = record[0]
            if kind == "route" or record[2] != publisher or record[3] != seq:
                continue
            if kind == "copy":
                copies.append({"t": record[1], "vn": record[4], "replica": record[5]})
            elif kind == "pub":
                route = self._route(record[4])
                decision: dict[str, Any] = {"t": record[1], "sender": record[5]}
                if route is None:
                    decision.update(prev=None, from_client=False, next=[], local=[], dropped=[])
                    decision["unknown_route"] = True
                else:
                    decision.update(
                        prev=route[2],
                        from_client=route[3],
                        next=list(route[4]),
                        local=list(route[5]),
                        dropped=list(route[6]),
                    )
                decisions.append(decision)
            elif kind == "pubx":
                decisions.append(
                    {
                        "t": record[1],
                        "sender": record[6],
                        "prev": record[4],
                        "from_client": record[5],
                        "next": list(record[7]),
                        "local": list(record[8]),
                        "dropped": list(record[9]),
                    }
                )
        return {
            "publisher": publisher,
            "seq": seq,
            "copies": copies,
            "decisions": decisions,
            "verdict": _verdict(copies, decisions),
            "ring": {"size": self.size, "held": len(self.ring)},
        }

    def recent(self, limit: int = 50) -> list[dict[str, Any]]:
        """The last ``limit`` publications this broker routed: (publisher, seq) and hops."""
        out: list[dict[str, Any]] = []
        for record in reversed(self.ring):
            if len(out) >= limit:
                break
            if record[0] == "pub":
                route = self._route(record[4])
                out.append(
                    {
                        "publisher": record[2],
                        "seq": record[3],
                        "prev": route[2] if route else None,
                        "next": list(route[4]) if route else [],
                        "local": list(route[5]) if route else [],
                    }
                )
            elif record[0] == "pubx":
                out.append(
                    {
                        "publisher": record[2],
                        "seq": record[3],
                        "prev": record[4],
                        "next": list(record[7]),
                        "local": list(record[8]),
                    }
                )
        return out


def _verdict(copies: list[dict[str, Any]], decisions: list[dict[str, Any]]) -> dict[str, str]:
    if not decisions:
        if copies:
            return {
                "what": "held",
                "why": "copies arrived but none was routed here: already routed from another "
                "VN, or fewer than f + 1 replicas agreed yet",
            }
        return {"what": "unseen", "why": "not in this broker's ring (never here, or too old)"}
    d = decisions[-1]
    if d["dropped"]:
        return {
            "what": "dropped",
            "why": "a subscriber's send buffer was full: " + ", ".join(d["dropped"]),
        }
    if not d["next"] and not d["local"]:
        return {
            "what": "stopped",
            "why": "matched no subscription behind any other hop (nothing to forward)",
        }
    parts = []
    if d["local"]:
        parts.append("delivered to " + ", ".join(d["local"]))
    if d["next"]:
        parts.append("forwarded to " + ", ".join(d["next"]))
    return {"what": "delivered" if d["local"] else "forwarded", "why": "; ".join(parts)}


def _name(hop: Any) -> str:
    return str(hop.peer_id)


def install(forwarder: Logged, size: int = RING_RECORDS) -> TraceRing:
    """Put a ring where ``forwarder`` keeps its traffic log (in front of the log, if any)."""
    existing = forwarder.tlog
    if isinstance(existing, TraceRing):
        return existing
    ring = TraceRing(existing, size)
    # Duck-typed: the forwarder uses only what TraceRing offers (append, routes,
    # define_route, dropped_pub); the key shares keep the real log.
    forwarder.tlog = cast("TrafficLog", ring)
    return ring
