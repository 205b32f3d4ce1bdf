"""Agreement on a replicated stream: what ``f + 1`` replicas sent, exactly once, in order.

Every replica of a virtual node (VN) forwards each publication it routes to every replica
of the next VN, and the replicas of a subscriber's edge VN each deliver it to the
subscriber. Up to ``f`` of those senders may be Byzantine: they may drop, alter, invent,
replay, reorder or delay copies, or send different versions to different receivers. A
receiver (a broker for a neighbouring VN's copies, the SDK for its edge VN's deliveries)
runs one :class:`ReplicatedStream` per publisher and upstream VN and acts on what it
*releases*:

* **Integrity.** A version is released only once ``f + 1`` distinct sources sent identical
  content; one of them is honest, and an honest sender only ever passes on what was
  published (by induction from the publisher's edge VN, which hears the publisher itself).
  Content that differs in a single byte is another version, so a bad copy never advances a
  sequence and never evicts a good one: versions wait side by side.
* **Order and exactly once.** Sequences are released in increasing order, each at most once;
  copies at or below the last decided sequence are late and ignored. The smallest pending
  sequence blocks the later ones until it is decided. It is released when a version reaches
  ``f + 1``; it is *abandoned* (decided without release) when more than ``f`` sources have
  already sent a later sequence without supporting any of its versions. An honest source sends
  its copies in sequence order over one connection, so once it sent a later sequence it will
  never send this one; a version every honest source skipped was never genuine (only the
  ``f`` Byzantine sources can skip a genuine version, and ``f`` is not more than ``f``).
* **No loss.** A genuine publication that some honest source sends is sent by every honest
  source that routes it, and there are at least ``f + 1`` honest sources, so it reaches the
  threshold; released later sequences never overtake it because one of their ``f + 1``
  supporters is honest and sent it first. Liveness therefore needs ``f + 1`` honest sources
  whose links are up and whose routing tables agree. While a subscription is still spreading,
  honest replicas can briefly disagree on whether a publication matches; a sequence stuck
  below a released one for ``patience`` seconds is then abandoned (:meth:`expire`), so the
  stream never stalls and order still holds.
* **Blame, only on proof.** Once a version is released it is the genuine one, so a source
  that sent a different version of that sequence (before or after) is Byzantine; so is a
  source that sent two versions of one sequence, or more undecided copies than ``limit``.

The class is pure: no clocks and no I/O. Callers pass ``now`` (any monotonic clock).
"""

from __future__ import annotations

import heapq
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "ALTERED",
    "COPY_BUDGET",
    "COPY_OVERHEAD",
    "FLOODING",
    "TWO_VERSIONS",
    "Blame",
    "CopyBudget",
    "MarkRequests",
    "ReplicatedStream",
    "forget_idle_streams",
]

S = TypeVar("S", bound=Hashable)
K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

COPY_BUDGET = 64 << 20
"""Bytes of undecided versions one source may have by default (:class:`CopyBudget`; a
broker's ``max_copy_bytes_per_source``, a subscription's at least twice the frame limit)."""

COPY_OVERHEAD = 256
"""Bytes an undecided version is charged beyond its payload (its message and version)."""

_RECENT = 4096
_FIRST_RING = 8
_ABANDONED = -1  # hash() never returns -1


LOGGED_BLAMES = 100
"""Blames of one culprit that are logged one by one; past them every :data:`LOGGED_EVERY`-th
(all are counted): one Byzantine replica's bad copies or shares must not flood a log."""

LOGGED_EVERY = 10_000


def worth_logging(blamed: int) -> bool:
    """Whether a culprit's ``blamed``-th blame goes to the log (:data:`LOGGED_BLAMES`)."""
    return blamed <= LOGGED_BLAMES or blamed % LOGGED_EVERY == 0


class LogRate:
    """Warnings counted per source (a broker, a relay, an endpoint), for the log's rate only
    (:func:`worth_logging`); past ``sources`` sources the counts start afresh."""

    def __init__(self, sources: int = 4096) -> None:
        self.sources = sources
        self.counts: dict[str, int] = {}

    def note(self, source: str) -> int:
        """Count one warning about ``source``; its count if the log should have it, else 0."""
        counts = self.counts
        if source not in counts and len(counts) >= self.sources:
            counts.clear()
        count = counts[source] = counts.get(source, 0) + 1
        return count if worth_logging(count) else 0


ALTERED = "altered"
TWO_VERSIONS = "two_versions"
FLOODING = "flooding"

_WHY = {
    ALTERED: "sent a copy that differs from the agreed one",
    TWO_VERSIONS: "sent two versions of one publication",
    FLOODING: "sent more undecided copies than its limit",
}


@dataclass(frozen=True, slots=True)
class Blame(Generic[S]):
    """A source proven to have misbehaved on one sequence (``fault``: ``ALTERED``,
    ``TWO_VERSIONS`` or ``FLOODING``)."""

    source: S
    seq: int
    fault: str

    @property
    def why(self) -> str:
        return _WHY[self.fault]


class CopyBudget(Generic[S, T]):
    """Bytes of undecided versions each source brought, over every stream sharing this
    budget (a broker's, a subscription's).

    ``limit`` copies per source bound one stream, not many: a source that sends lone copies
    for publishers nobody else sends (never decided, so never let go) held memory without
    bound, one new stream at a time. Past ``limit`` bytes its new versions are refused and
    it is blamed as flooding; a copy that joins a version another source brought costs
    nothing (it is not kept). An honest source has only what is in flight undecided.
    """

    def __init__(self, limit: int, weigh: Callable[[T], int]) -> None:
        self.limit = limit
        self.weigh = weigh
        self.charged: dict[S, int] = {}
        self.refused: set[S] = set()  # sources blamed for going over (once each)

    def take(self, source: S, cost: int) -> bool:
        charged = self.charged.get(source, 0) + cost
        if charged > self.limit:
            return False
        if cost:
            self.charged[source] = charged
        return True

    def give_back(self, source: S, cost: int) -> None:
        left = self.charged[source] - cost
        if left > 0:
            self.charged[source] = left
        else:
            del self.charged[source]


class _Version(Generic[S, T]):
    __slots__ = ("cost", "item", "owner", "sources")

    def __init__(self, item: T, source: S, cost: int = 0) -> None:
        self.item = item
        self.sources = {source}
        self.owner = source  # who brought it, charged ``cost`` for it (a CopyBudget)
        self.cost = cost


class _Pending(Generic[S, T]):
    __slots__ = ("since", "versions")

    def __init__(self, since: float) -> None:
        self.since = since
        self.versions: dict[Hashable, _Version[S, T]] = {}


class ReplicatedStream(Generic[S, T]):
    """One publisher's stream as copies from up to ``f`` Byzantine sources deliver it.

    Args:
        faults: ``f``, the most sources that may be Byzantine (0: trust the one source).
        limit: the most undecided copies one source may have outstanding; more are ignored
            and blamed (an honest source has only what is in flight).
    """

    def __init__(
        self, faults: int, *, limit: int = 16384, budget: CopyBudget[S, T] | None = None
    ) -> None:
        if faults < 0:
            raise ValueError(f"faults must be >= 0, got {faults}")
        self.faults = faults
        self.threshold = faults + 1
        self.limit = limit
        self.budget = budget
        self.floor = -1
        """Every sequence at or below it is decided (released or abandoned)."""
        self.first_copy_at = 0.0
        """When the first copy of the last released sequence came (``now`` of its offer):
        every honest source's copy of it came no earlier."""
        self.blames: list[Blame[S]] = []
        """Proven misbehaviour, oldest first; the caller drains it."""
        self._pending: dict[int, _Pending[S, T]] = {}
        self._heap: list[int] = []
        self._high: dict[S, int] = {}
        self._load: dict[S, int] = {}
        self._flooding: set[S] = set()
        # The last decided sequences, by seq % ring, with the hash of the released content
        # (_ABANDONED: none), to blame late copies: a copy whose hash differs differs in
        # content, so blaming on it is sound. The ring grows with the decisions, 8 slots
        # to _RECENT (64 KiB): a stream of a few publications (a short-lived publisher;
        # a broker keeps one stream per publisher it hears) stays small.
        self._ring = _FIRST_RING
        self._decisions = 0
        self._decided_seq = array("q", [-1]) * _FIRST_RING
        self._decided_hash = array("q", [_ABANDONED]) * _FIRST_RING

    @property
    def waiting(self) -> int:
        """Sequences with copies that are not decided yet."""
        return len(self._pending)

    @property
    def last_undecided(self) -> int:
        """The highest sequence with copies that is not decided yet (-1: none)."""
        return max(self._pending, default=-1)

    def blocked_since(self) -> float | None:
        """When the first copy of the smallest undecided sequence came, if any is waiting."""
        return self._pending[self._heap[0]].since if self._heap else None

    def offer(
        self, source: S, seq: int, content: Hashable, item: T, now: float = 0.0
    ) -> list[tuple[int, T]]:
        """One copy of ``seq`` from ``source``; returns what it releases, in order.

        ``content`` is what must be identical across copies (payload, attributes, security
        block); ``item`` is what is released (the first copy of the winning version)."""
        if seq <= self.floor:
            self._late(source, seq, content)
            return []
        if seq > self._high.get(source, -1):
            self._high[source] = seq
        entry = self._pending.get(seq)
        if entry is not None:
            version = entry.versions.get(content)
            if version is not None and source in version.sources:
                return []  # the same copy again (a replay): nothing new
            for other in entry.versions.values():
                if source in other.sources:
                    self.blames.append(Blame(source, seq, TWO_VERSIONS))
                    return []
        else:
            version = None
        load = self._load.get(source, 0)
        if load >= self.limit:
            self._flood(source, seq)
            return []
        cost = 0
        budget = self.budget
        if version is None and budget is not None:
            cost = budget.weigh(item)
            if not budget.take(source, cost):
                if source not in budget.refused:  # (once per budget: streams come and go)
                    budget.refused.add(source)
                    self.blames.append(Blame(source, seq, FLOODING))
                return []
        self._load[source] = load + 1
        if entry is None:
            entry = self._pending[seq] = _Pending(now)
            heapq.heappush(self._heap, seq)
        if version is None:
            entry.versions[content] = _Version(item, source, cost)
        else:
            version.sources.add(source)
        return self._settle()

    def resize(self, faults: int) -> list[tuple[int, T]]:
        """The sending VN now has a different number of replicas (one attached or detached
        live): count ``faults + 1`` from now on; returns what that releases, in order."""
        if faults < 0:
            raise ValueError(f"faults must be >= 0, got {faults}")
        self.faults = faults
        self.threshold = faults + 1
        return self._settle()

    def expire(self, now: float, patience: float) -> list[tuple[int, T]]:
        """Abandon the smallest undecided sequence if it has waited ``patience`` seconds
        while a later one is ready (a subscription still spreading); returns what that
        releases, in order."""
        released: list[tuple[int, T]] = []
        while self._heap:
            first = self._pending[self._heap[0]]
            if now - first.since < patience or not self._later_ready():
                break
            self._decide(self._heap[0], None)
            released.extend(self._settle())
        return released

    def _later_ready(self) -> bool:
        threshold = self.threshold
        head = self._heap[0]
        return any(
            len(v.sources) >= threshold
            for s, p in self._pending.items()
            if s != head
            for v in p.versions.values()
        )

    def _settle(self) -> list[tuple[int, T]]:
        released: list[tuple[int, T]] = []
        threshold = self.threshold
        heap = self._heap
        while heap:
            seq = heap[0]
            versions = self._pending[seq].versions
            winner = None
            for content, version in versions.items():
                if len(version.sources) >= threshold:
                    winner = content
                    break
            if winner is not None:
                released.append((seq, versions[winner].item))
                self._decide(seq, winner)
                continue
            if not self._abandoned(seq, versions):
                break
            self._decide(seq, None)
        return released

    def _abandoned(self, seq: int, versions: dict[Hashable, _Version[S, T]]) -> bool:
        passed = [s for s, high in self._high.items() if high > seq]
        faults = self.faults
        if len(passed) <= faults:
            return False
        for version in versions.values():
            sources = version.sources
            if sum(1 for s in passed if s not in sources) <= faults:
                return False
        return True

    def _decide(self, seq: int, winner: Hashable | None) -> None:
        heapq.heappop(self._heap)
        entry = self._pending.pop(seq)
        if winner is not None:
            self.first_copy_at = entry.since
        load = self._load
        budget = self.budget
        for content, version in entry.versions.items():
            if budget is not None and version.cost:
                budget.give_back(version.owner, version.cost)
            for source in version.sources:
                load[source] -= 1
                if winner is not None and content != winner:
                    self.blames.append(Blame(source, seq, ALTERED))
        self.floor = seq
        self._decisions += 1
        if self._decisions > self._ring < _RECENT:
            self._grow()
        slot = seq % self._ring
        self._decided_seq[slot] = seq
        self._decided_hash[slot] = _ABANDONED if winner is None else hash(winner)

    def _grow(self) -> None:
        """Eight times the ring (at most _RECENT), keeping what it remembers."""
        ring = min(self._ring * 8, _RECENT)
        seqs = array("q", [-1]) * ring
        hashes = array("q", [_ABANDONED]) * ring
        kept = sorted(
            (s, h) for s, h in zip(self._decided_seq, self._decided_hash, strict=True) if s >= 0
        )
        for s, h in kept:  # oldest first: a newer sequence takes a shared slot
            seqs[s % ring] = s
            hashes[s % ring] = h
        self._ring, self._decided_seq, self._decided_hash = ring, seqs, hashes

    def _late(self, source: S, seq: int, content: Hashable) -> None:
        slot = seq % self._ring
        if self._decided_seq[slot] != seq:
            return
        winner = self._decided_hash[slot]
        if winner != _ABANDONED and hash(content) != winner:
            self.blames.append(Blame(source, seq, ALTERED))

    def _flood(self, source: S, seq: int) -> None:
        if source not in self._flooding:
            self._flooding.add(source)
            self.blames.append(Blame(source, seq, FLOODING))


def forget_idle_streams(streams: dict[K, ReplicatedStream[S, T]], bound: int) -> int:
    """Forget idle streams, those that released least recently first, down to 7/8 of
    ``bound`` (so this runs once per many new publishers, not at every new one); returns how
    many were forgotten. Each short-lived publisher that was ever heard left a stream, so
    without a bound they add up. Forgetting one is safe when the caller still knows what was
    released (a subscriber sets the new stream's ``floor`` to it; a broker's
    ``SeenPublications`` drops what it already routed): the new stream releases only what
    ``f + 1`` sources send. A stream with copies waiting is kept."""
    excess = len(streams) - bound * 7 // 8
    if excess <= 0:
        return 0
    idle = sorted(
        (key for key, stream in streams.items() if not stream.waiting),
        key=lambda key: streams[key].first_copy_at,
    )
    for key in idle[:excess]:
        del streams[key]
    return min(excess, len(idle))


class MarkRequests(Generic[K, S]):
    """Requests from the replicas of a VN for one mark in a stream (a live reconfiguration
    round's switch point): the mark is placed once ``f + 1`` distinct replicas asked for the
    same key, and only once. One of them is honest, so ``f`` Byzantine replicas cannot place
    it where they like by asking early or often. At most ``keep`` keys are remembered either
    way (open requests, placed marks), oldest forgotten first."""

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep
        self._asks: OrderedDict[K, set[S]] = OrderedDict()
        self._placed: OrderedDict[K, None] = OrderedDict()

    def ask(self, key: K, asker: S, quorum: int) -> bool:
        """Count ``asker``'s request for ``key``; True once, when it completes ``quorum``
        (``f + 1``) distinct askers."""
        if key in self._placed:
            return False
        asks = self._asks.get(key)
        if asks is None:
            asks = self._asks[key] = set()
            if len(self._asks) > self.keep:
                self._asks.popitem(last=False)
        asks.add(asker)
        if len(asks) < quorum:
            return False
        del self._asks[key]
        self._placed[key] = None
        if len(self._placed) > self.keep:
            self._placed.popitem(last=False)
        return True
