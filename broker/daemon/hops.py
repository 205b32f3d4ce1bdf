"""What the router's hops are inside the daemon: local connections and neighbouring VNs.

The router (:mod:`broker.routing.router`) is generic in its hop type; the daemon routes
over two kinds, a client or broker :class:`~broker.daemon.dispatch.Connection` and a
:class:`VNHop` standing for every replica of a neighbouring virtual node. :class:`Hop` is
what both offer, so routing code never needs to know which one it holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from typing import Protocol, cast

from broker.errors import LimitExceeded
from broker.language.filters import Filter
from broker.wire.protocol import Message, encode_filter

Entry = tuple[object, ...]
"""A routing entry a neighbouring VN's replica announces: ``(kind, key, filter)`` adds it,
``("un" + kind, key)`` removes it (kind ``adv`` or ``sub``)."""

VOTE_BUDGET = 64 << 20
"""Bytes of routing entries one replica of a neighbour VN may have announced here without a
majority of its VN agreeing yet (a broker's ``max_vote_bytes_per_source``)."""

WITHDRAWN_MEMORY = 1 << 16
"""Entries a majority of a neighbour VN withdrew whose replicas' words a broker keeps until
the rest of the VN withdraws them too (to recognise their late removals); past it the
oldest are let go. A replica that is down never withdraws: every entry its VN's clients
made and withdrew meanwhile was kept for good."""

VOTE_OVERHEAD = 256
"""Bytes an entry waiting for its majority is charged beyond its key and filter."""


def entry_cost(entry: Entry) -> int:
    """What one entry waiting for its VN's majority is charged: its key and its filter as
    encoded (as ``max_filter_bytes_per_client`` counts a client's)."""
    cost = VOTE_OVERHEAD + len(str(entry[1]))
    if len(entry) > 2:
        cost += len(encode_filter(cast(Filter, entry[2])))
    return cost


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

    An entry no majority sends is never applied, and used to be kept for good: a Byzantine
    replica announcing new entries without end (or an honest one whose clients connect to
    it alone) grew its neighbours' memory without bound. Each replica's entries that lack
    the majority are charged to it (:func:`entry_cost`); past ``vote_budget`` bytes its
    new ones are refused (:class:`~broker.errors.LimitExceeded`), and what the majority
    takes up, or the replica withdraws, frees its allowance.
    """

    is_broker = True
    closing = False
    # Links between brokers never drop: a congested link pauses the broker's clients.
    congested = False

    def __init__(
        self,
        vn: str,
        size: int,
        vote_budget: int = VOTE_BUDGET,
        withdrawn_memory: int = WITHDRAWN_MEMORY,
    ) -> None:
        self.peer_id = vn
        self.size = size
        self.quorum = size // 2 + 1
        self.vote_budget = vote_budget
        # member -> bytes of its latest words that lack the quorum (see entry_cost)
        self._pending_bytes: dict[str, int] = {}
        # (kind, key) a majority withdrew while some replica has not (WITHDRAWN_MEMORY)
        self.withdrawn_memory = withdrawn_memory
        self._withdrawn: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.members: dict[str, Member] = {}
        # entry -> the members whose latest word it is; (kind, key) -> those entries;
        # (kind without "un", key) -> member -> its latest word (see vote()).
        self._votes: dict[Entry, set[str]] = {}
        self._entries: dict[tuple[str, str], set[Entry]] = {}
        self._said: dict[tuple[str, str], dict[str, Entry]] = {}
        # member -> its latest words that have not reached the quorum yet, each with what
        # it is charged; and those of them it announced since its last routing wave (what
        # its next wave waits for)
        self._unsettled: dict[str, dict[Entry, int]] = {}
        self._fresh: dict[str, set[Entry]] = {}
        # The VN's replicas once a membership change named them (None: as configured):
        # only their words count.
        self._allowed: frozenset[str] | None = None

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

    def vote(self, member: str, entry: Entry) -> bool:
        """Record ``entry`` as ``member``'s latest word on its routing entry: an addition
        ``(kind, key, filter)`` or a removal ``("un" + kind, key)``. True exactly when
        this makes ``entry`` reach the quorum.

        Only a member's latest word counts (it replaces what the member said before about
        the same kind and key): a replica whose client advertised and left at once may
        send both before another replica's advertisement arrives, and its removal must
        still count once that advertisement is in force.

        Raises:
            LimitExceeded: ``entry`` would wait for the quorum, and the member's words
                that wait already take ``vote_budget`` (nothing is recorded).
        """
        if self._allowed is not None and member not in self._allowed:
            return False  # a replica that left the VN: its link stays open a while
        kind, key = entry[0], entry[1]
        assert isinstance(kind, str)
        assert isinstance(key, str)
        base = kind[2:] if kind.startswith("un") else kind
        said = self._said.get((base, key))
        before = said.get(member) if said is not None else None
        if before == entry:
            return False
        cost: int | None = None
        if kind == base and len(self._votes.get(entry, ())) + 1 < self.quorum:
            # (a withdrawal is never refused: it replaces a word of the member's own, one
            # per entry it announced, and refusing it would leave that entry in force)
            cost = entry_cost(entry)
            charged = self._pending_bytes.get(member, 0)
            if before is not None:
                # (replaced: a withdrawal frees its addition)
                charged -= self._unsettled.get(member, {}).get(before, 0)
            if charged + cost > self.vote_budget:
                raise LimitExceeded(
                    f"routing entries of {member} that no majority of VN {self.peer_id} "
                    f"sent yet take more than max_vote_bytes_per_source = "
                    f"{self.vote_budget} bytes here; {kind} {key!r} refused"
                )
        if said is None:
            said = self._said[(base, key)] = {}
        if before is not None:
            self._drop_voter(before, member)
            self._settle(member, before)
        said[member] = entry
        voters = self._votes.get(entry)
        if voters is None:
            voters = self._votes[entry] = set()
            self._entries.setdefault((kind, key), set()).add(entry)
        voters.add(member)
        if len(voters) < self.quorum:
            if cost is None:
                cost = entry_cost(entry)
            self._unsettled.setdefault(member, {})[entry] = cost
            self._fresh.setdefault(member, set()).add(entry)
            self._pending_bytes[member] = self._pending_bytes.get(member, 0) + cost
        elif len(voters) == self.quorum:
            for voter in voters:
                self._settle(voter, entry)
        group = (base, key)
        if kind == base:
            if len(voters) >= self.quorum:
                self._withdrawn.pop(group, None)  # in force again: not a withdrawn entry
        elif len(voters) >= self.size:
            # Every replica removed it: no late word is left to recognise.
            self._withdrawn.pop(group, None)
            self._drop_entry(entry)
            for voter in voters:
                said.pop(voter, None)
            if not said:
                del self._said[group]
        elif len(voters) >= self.quorum:
            self._note_withdrawn(group)
        return len(voters) == self.quorum

    def _note_withdrawn(self, group: tuple[str, str]) -> None:
        """A majority withdrew ``group``: its words are kept for the rest of the VN's late
        removals, for the latest ``withdrawn_memory`` withdrawals."""
        withdrawn = self._withdrawn
        withdrawn[group] = None
        withdrawn.move_to_end(group)
        while len(withdrawn) > self.withdrawn_memory:
            base, key = withdrawn.popitem(last=False)[0]
            self._said.pop((base, key), None)
            for kind in (base, "un" + base):
                for entry in self._entries.get((kind, key), set()).copy():
                    for voter in self._votes.get(entry, ()):
                        self._settle(voter, entry)
                    self._drop_entry(entry)

    def resize(self, members: Collection[str]) -> None:
        """The VN's replicas are now ``members`` (a live attach or detach): the majority is
        counted among them, and the words of those that left are dropped and no longer
        taken. Two replicas that left, each withdrawing the entries of the clients that
        left them, made up a majority of the smaller VN and withdrew an advertisement its
        remaining replicas still held."""
        allowed = frozenset(members)
        self.size = len(allowed)
        self.quorum = self.size // 2 + 1
        self._allowed = allowed
        for group, said in list(self._said.items()):
            for member in [m for m in said if m not in allowed]:
                self._drop_voter(said.pop(member), member)
            if not said:
                del self._said[group]
        for table in (self._unsettled, self._fresh, self._pending_bytes):
            for member in [m for m in table if m not in allowed]:
                del table[member]

    def wave_entries(self, member: str) -> frozenset[Entry]:
        """``member`` starts a routing wave: the entries it announced since its previous
        one that still lack the quorum, which the wave waits for
        (:mod:`broker.daemon.waves`). Older ones do not hold it: an entry only one replica
        ever announces (a client connected to that replica alone) delays one wave, the
        one that carried it, not every later one."""
        return frozenset(self._fresh.pop(member, ()))

    def unsettled(self, member: str, entries: frozenset[Entry]) -> bool:
        """Whether any of ``entries`` is still ``member``'s word and lacks the quorum."""
        pending = self._unsettled.get(member)
        return pending is not None and not pending.keys().isdisjoint(entries)

    def pending_bytes(self, member: str) -> int:
        """Bytes ``member``'s words that lack the quorum are charged."""
        return self._pending_bytes.get(member, 0)

    def _settle(self, member: str, entry: Entry) -> None:
        unsettled = self._unsettled.get(member)
        if unsettled is not None and entry in unsettled:
            left = self._pending_bytes[member] - unsettled.pop(entry)
            if left > 0:
                self._pending_bytes[member] = left
            else:
                del self._pending_bytes[member]
            if not unsettled:
                del self._unsettled[member]
        fresh = self._fresh.get(member)
        if fresh is not None:
            fresh.discard(entry)
            if not fresh:
                del self._fresh[member]

    def has_quorum(self, entry: Entry) -> bool:
        """Whether ``entry`` is the latest word of a majority of the VN's replicas."""
        return len(self._votes.get(entry, ())) >= self.quorum

    def has_votes(self, kind: str, key: str) -> bool:
        """Whether some member's latest word on ``key`` is of ``kind``."""
        return (kind, key) in self._entries

    def forget(self) -> None:
        """Drop every vote: the routing state learned from this VN was replaced wholesale
        (a live round installed tables, or the VN went away)."""
        self._votes.clear()
        self._entries.clear()
        self._said.clear()
        self._unsettled.clear()
        self._fresh.clear()
        self._pending_bytes.clear()
        self._withdrawn.clear()

    def _drop_voter(self, entry: Entry, member: str) -> None:
        voters = self._votes.get(entry)
        if voters is not None:
            voters.discard(member)
            if not voters:
                self._drop_entry(entry)

    def _drop_entry(self, entry: Entry) -> None:
        del self._votes[entry]
        group = (str(entry[0]), str(entry[1]))
        entries = self._entries.get(group)
        if entries is not None:
            entries.discard(entry)
            if not entries:
                del self._entries[group]


class _SeqWindow:
    """One publisher's routed seqs: a bitmap from ``base`` (a seq below it counts as routed)."""

    __slots__ = ("base", "bits")

    def __init__(self) -> None:
        self.base = 0
        self.bits = bytearray()


class SeenPublications:
    """Which (publisher, seq) this broker has already routed, within a sliding window.

    Copies of one publication arrive from every replica of the upstream VN, in any order
    across replicas (and a client whose session resumed sends its last publications
    again). Per publisher, a bitmap covers the seqs from ``horizon`` below the newest one
    routed (older ones count as routed): at most ``horizon / 4`` bytes, however sparse the
    seqs this broker sees; the ``max_publishers`` that most recently published new seqs are
    remembered.
    """

    def __init__(self, horizon: int = 65536, max_publishers: int = 65536) -> None:
        self.horizon = horizon
        self.max_publishers = max_publishers
        self._windows: OrderedDict[str, _SeqWindow] = OrderedDict()

    def __len__(self) -> int:
        return len(self._windows)

    def fresh(self, publisher: str, seq: int) -> bool:
        """Whether (publisher, seq) has not been routed yet."""
        window = self._windows.get(publisher)
        if window is None:
            return True
        offset = seq - window.base
        if offset < 0:
            return False
        index = offset >> 3
        bits = window.bits
        return index >= len(bits) or not (bits[index] >> (offset & 7)) & 1

    def add(self, publisher: str, seq: int) -> bool:
        """Record (publisher, seq) as routed; whether it was fresh (one lookup for both)."""
        window = self._windows.get(publisher)
        if window is None:
            window = self._open(publisher)
        offset = seq - window.base
        bits = window.bits
        index = offset >> 3
        if 0 <= index < len(bits):
            bit = 1 << (offset & 7)
            byte = bits[index]
            if byte & bit:
                return False
            bits[index] = byte | bit
            return True
        if offset < 0:
            return False
        if offset >= 2 * self.horizon:
            # Slide by whole bytes so that ``seq`` sits ``horizon`` (to 8 more) above the base.
            drop = (offset - self.horizon) >> 3
            del bits[:drop]
            window.base += drop << 3
            offset -= drop << 3
            index = offset >> 3
        if index >= len(bits):
            bits.extend(bytes(index + 1 - len(bits)))
        bits[index] |= 1 << (offset & 7)
        # Recently active: kept when publishers must be forgotten (checked once per byte of
        # new seqs, not per publication).
        self._windows.move_to_end(publisher)
        return True

    def _open(self, publisher: str) -> _SeqWindow:
        windows = self._windows
        window = windows[publisher] = _SeqWindow()
        if len(windows) > self.max_publishers:
            windows.popitem(last=False)
        return window
