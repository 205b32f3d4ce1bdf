"""Key shares by the pass inside one broker (SPEC §3, :mod:`security.pass_shares`).

The bulk form of :class:`~broker.daemon.shares.SecureForwarding`'s per-record forwarding:
a publisher that splits its keys by the pass (``Client(share_form="pass")``) sends each edge
replica a ``PASS`` frame (its root statement and blob) beside the PUBLISH, and from there
every replica keeps, per key epoch, the first share it accepted of each lineage and splits
every share routed toward a next VN in one :func:`~security.pass_shares.split_pass` per
(next VN, event-loop pass): one signature, one Shamir split, one frame per next replica. A
local subscriber is handed the shares themselves (``LEAVES``). Statements travel whole,
each once per link: the receiver reads the path a share travelled from them
(:func:`~security.pass_shares.claimed_vns`, adopted once a majority of the sending VN
vouches for it, :class:`~security.paths.PathVote`).

Checks, as the record form makes them: at once, hashing only (the statement is the
sender's own and toward this VN, every opening matches its commitment, every entry fits
the path); the signature of the statement a share came under is verified (once per
statement) only when this replica splits that share and so vouches for it; a share only
relayed to local subscribers has it verified by sample (one in
:data:`~broker.daemon.shares.RELAY_CHECK_ONE_IN`) after the pass's write. Every fault is
blamed on the sender over the authenticated link: an honest broker sends only its own
statements, validly signed.

Shared with the record form (``SecureForwarding``): the content's security blocks (which
epochs were routed here, and along which hops), the blame and traffic-log verdicts, and
the silence deadline (who sent anything at all for an epoch).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NamedTuple, Protocol, TypeVar

from broker.daemon.config import NeighbourConfig
from broker.daemon.hops import Hop, Member, VNHop
from broker.daemon.stats import BrokerStats
from broker.wire.protocol import Leaves, Pass, Signed
from overlay.manifest import Manifest
from security.envelope import Signer
from security.pass_keys import claimed_pass_path
from security.pass_shares import (
    Entry,
    Held,
    PassStatement,
    SealChecks,
    StatementStore,
    entry_problem,
    leaf_batches,
    leaf_bytes,
    open_pass,
    parse_statement,
    split_bytes,
    split_pass,
    statement_ref,
)
from security.paths import PathVote, path_view
from security.propagation import PathView, PropagationError, silent_senders
from security.publication import SecBlock, epoch_of
from security.waiting import WaitingShares, Weight


class ShareHost(Protocol):
    """What key shares by the pass share with the record form in a broker
    (:class:`broker.daemon.shares.SecureForwarding`, which holds a :class:`PassForwarding`):
    identity and keys, the epochs routed here and the hops they went to, blame, silence."""

    @property
    def broker_id(self) -> str: ...

    @property
    def replica(self) -> int: ...

    @property
    def vn(self) -> str: ...

    @property
    def stats(self) -> BrokerStats: ...

    @property
    def manifest(self) -> Manifest | None: ...

    @property
    def signer(self) -> Signer | None: ...

    @property
    def neighbours(self) -> Mapping[str, NeighbourConfig]: ...

    @property
    def secs(self) -> Mapping[tuple[str, int], SecBlock]: ...

    @property
    def served(self) -> Mapping[tuple[str, int], list[Hop]]: ...

    @property
    def heard(self) -> OrderedDict[tuple[str, int], list[str]]: ...

    @property
    def distrusted(self) -> set[str]: ...

    @property
    def splits_by_scheme(self) -> dict[tuple[str, int], int]: ...

    @property
    def recent_shares(self) -> int: ...

    @property
    def enabled(self) -> bool: ...

    @property
    def waiting_budget(self) -> int: ...

    @property
    def frame_budget(self) -> int: ...

    @property
    def keep_recent(self) -> bool: ...

    def sample_relay(self) -> bool: ...

    def blame(self, key: tuple[str, int], broker: str, detail: str, sender: str | None) -> None: ...

    def log_share(
        self, publisher: str, epoch: int, sender: str | None, culprit: str | None, why: str | None
    ) -> None: ...

    def schedule_flush(self) -> None: ...

    def over_budget(self, key: tuple[str, int], sender: str) -> None: ...


log = logging.getLogger("trellis.security")

Key = tuple[str, int]
Path = tuple[str, ...]

CLAIM_MEMORY = 1 << 14
"""Paths read from statements a broker remembers (per statement and publication)."""

LINK_MEMORY = 1 << 13
"""Statement references a link remembers having carried (each travels once per link)."""

EPOCH_MEMORY = 4096
"""Key epochs a broker's per-epoch tables hold (both forms'): past it the oldest goes."""

V = TypeVar("V")


def epoch_entry(table: OrderedDict[Key, V], key: Key, make: Callable[[], V]) -> V:
    """``table[key]``, made if missing; past :data:`EPOCH_MEMORY` epochs the oldest goes."""
    value = table.get(key)
    if value is None:
        value = table[key] = make()
        if len(table) > EPOCH_MEMORY:
            table.popitem(last=False)
    return value


class Accepted(NamedTuple):
    """A share this replica holds: the share, the statement it came under, the path it
    was checked against, and its sender."""

    share: Held
    statement: PassStatement
    view: PathView
    sender: str


class _Waiting(NamedTuple):
    """A share whose epoch's content has not been routed here, or whose path no majority
    vouched for yet (``claim`` None: not read yet)."""

    share: Held
    statement: PassStatement
    entry: Entry
    sender: str
    claim: Path | None


def _weigh(item: _Waiting) -> Weight:
    statement = item.statement
    return item.sender, statement.ref, len(statement.raw), len(item.share.opening)


class PassForwarding:
    """Per-broker state of key shares by the pass."""

    def __init__(self, owner: ShareHost) -> None:
        self.owner = owner
        self.statements = StatementStore()
        self.seals = SealChecks()
        # key -> lineage -> the first share of that lineage accepted
        self.held: OrderedDict[Key, dict[tuple[int, ...], Accepted]] = OrderedDict()
        self.waiting: WaitingShares[Key, _Waiting] = WaitingShares(
            _weigh, owner.waiting_budget, EPOCH_MEMORY
        )
        # key -> the paths a majority of the sending VN vouched for, and the vote
        self.paths: OrderedDict[Key, dict[Path, PathView]] = OrderedDict()
        self.votes: OrderedDict[Key, PathVote] = OrderedDict()
        # this pass's shares per hop (split toward a next VN, or handed to a subscriber)
        self._toward: dict[Hop, dict[tuple[bytes, tuple[int, ...]], Accepted]] = {}
        self._sent: dict[Member | Hop, OrderedDict[bytes, None]] = {}
        self._relay_checks: list[Accepted] = []
        # The leaves each local client was handed last, for its parked session (as the
        # record form keeps its records: RECENT_SHARES, when sessions linger).
        self._recent: dict[Hop, deque[Accepted]] = {}
        self._bad_seals: OrderedDict[bytes, None] = OrderedDict()
        self._serial = 0
        self._claims: dict[tuple[bytes, bytes], Path | None] = {}

    @property
    def pending(self) -> bool:
        return bool(self._toward)

    # -- receiving ----------------------------------------------------------------------------

    def pass_arrived(self, msg: Pass, sender: str) -> None:
        """A PASS frame from ``sender`` (a broker of the VN before, or the publisher)."""
        owner = self.owner
        if not owner.enabled:
            return
        for raw, signature in msg.above:
            if self._learn(raw, signature, sender) is None:
                return
        statement = self._learn(msg.statement, msg.signature, sender)
        if statement is None:
            return
        owner.stats.shares_in += len(statement.entries)
        if statement.splitter != sender or statement.toward != owner.vn:
            self._blame_sender(
                statement,
                sender,
                f"a statement of {statement.splitter!r} toward {statement.toward!r}",
            )
            return
        # The sender is heard about every epoch its pass names, good shares or not (as a
        # record is heard before it is checked): silence is blamed only on silence.
        for pub_id in {entry.pub_id for entry in statement.entries}:
            named = epoch_of(pub_id)
            if named is not None:
                heard = epoch_entry(owner.heard, named, list)
                if sender not in heard:
                    heard.append(sender)
        shares, bad = open_pass(statement, msg.blob, owner.replica)
        for entry, why in bad:
            culprit_key = epoch_of(entry.pub_id) or (sender, 0)
            owner.blame(culprit_key, sender, f"bad_share: {entry.node}: {why}", sender)
        for share in shares:
            key = epoch_of(share.pub_id)
            position = statement.position(share.pub_id, share.lineage[:-1])
            if key is None or position is None:
                continue
            self._offer(key, _Waiting(share, statement, statement.entries[position], sender, None))

    def _learn(self, raw: bytes, signature: bytes, sender: str) -> PassStatement | None:
        """Parse a statement (kept by reference); a malformed one is the sender's fault."""
        ref = statement_ref(raw, signature)
        known = self.statements.get(ref)
        if known is not None:
            return known  # (an ancestor reaches a replica once per upstream replica)
        try:
            statement = parse_statement(raw, signature, ref)
        except PropagationError as exc:
            self.owner.blame((sender, 0), sender, f"malformed statement: {exc}", sender)
            return None
        return self.statements.add(statement)

    def _blame_sender(self, statement: PassStatement, sender: str, detail: str) -> None:
        key = epoch_of(statement.entries[0].pub_id) or (sender, 0)
        self.owner.blame(key, sender, f"bad_share: {detail}", sender)

    def _offer(self, key: Key, item: _Waiting) -> None:
        owner = self.owner
        sec = owner.secs.get(key)
        if sec is None:
            self._wait(key, item)
            return
        claim = item.claim or self._claim(key, item)
        if claim is None:
            owner.blame(key, item.sender, "claims no possible path", item.sender)
            return
        paths = self.paths.get(key)
        view = paths.get(claim) if paths is not None else None
        if view is not None:
            self._accept(key, item, view)
            return
        if not self._wait(key, item._replace(claim=claim)):
            return
        vote = epoch_entry(self.votes, key, PathVote)
        assert owner.manifest is not None
        if vote.vouch(owner.manifest, claim, item.sender) is not None:
            self._open_path(key, claim)

    def _claim(self, key: Key, item: _Waiting) -> Path | None:
        """The VN path ``item`` says it travelled (None: none it can have). Read once per
        statement and publication: the path is what the vote is about, and each entry is
        then checked against the path voted for (:func:`entry_problem`)."""
        memo = (item.statement.ref, item.share.pub_id)
        claims = self._claims
        if memo in claims:
            return claims[memo]
        if len(claims) >= CLAIM_MEMORY:
            claims.clear()
        claims[memo] = claim = self._read_claim(key, item)
        return claim

    def _read_claim(self, key: Key, item: _Waiting) -> Path | None:
        manifest = self.owner.manifest
        sec = self.owner.secs.get(key)
        assert manifest is not None
        assert sec is not None
        return claimed_pass_path(
            manifest, sec, item.statement, item.entry, self.statements, self.owner.vn
        )

    def _open_path(self, key: Key, claim: Path) -> None:
        owner = self.owner
        sec = owner.secs[key]
        assert owner.manifest is not None
        try:
            view = path_view(owner.manifest, key[0], sec, claim)
        except (PropagationError, KeyError) as exc:
            log.warning("cannot verify shares of %s/%d: %s", key[0], key[1], exc)
            return
        epoch_entry(self.paths, key, dict)[claim] = view
        waiting = self.waiting.pop(key)
        for item in waiting:
            if item.claim != claim:
                self.waiting.add(key, item)  # (fits: it was charged until the pop)
        for item in waiting:
            if item.claim == claim:
                self._accept(key, item, view)

    def _wait(self, key: Key, item: _Waiting) -> bool:
        """Keep ``item`` until its content or path comes; False when its sender is over
        budget (the share is dropped and counted)."""
        if self.waiting.add(key, item):
            return True
        self.owner.over_budget(key, item.sender)
        return False

    def _accept(self, key: Key, item: _Waiting, view: PathView) -> None:
        owner = self.owner
        problem = entry_problem(item.statement, item.entry, view)
        if problem is None and len(item.share.lineage) != view.depth:
            problem = f"a share of level {len(item.share.lineage)} at level {view.depth}"
        if problem is not None:
            owner.blame(key, item.sender, f"bad_share: {problem}", item.sender)
            return
        held = epoch_entry(self.held, key, dict)
        lineage = item.share.lineage
        if lineage in held:
            return  # an honest sender sends each share once; the first one is kept
        accepted = held[lineage] = Accepted(item.share, item.statement, view, item.sender)
        owner.log_share(key[0], key[1], item.sender, None, None)
        for hop in owner.served.get(key, ()):
            self._queue(hop, accepted)

    # -- routing ------------------------------------------------------------------------------

    def routed(self, key: Key, hops: Iterable[Hop]) -> None:
        """``key``'s content was routed here (its waiting shares can be read) and on to
        ``hops`` new to the epoch (they get every share held)."""
        held = self.held.get(key)
        if held:
            for hop in hops:
                for accepted in held.values():
                    self._queue(hop, accepted)
        # (after: a share accepted now goes to every hop served, these included)
        for item in self.waiting.pop(key):
            self._offer(key, item)

    def _queue(self, hop: Hop, accepted: Accepted) -> None:
        if hop.closing:
            return
        work = self._toward.get(hop)
        if work is None:
            work = self._toward[hop] = {}
        work[accepted.share.pub_id, accepted.share.lineage] = accepted
        self.owner.schedule_flush()

    # -- sending ------------------------------------------------------------------------------

    def flush(self) -> dict[Member | Hop, None]:
        """Split this pass's shares toward each next VN (one statement per VN) and hand
        local subscribers theirs; returns the connections written to."""
        toward, self._toward = self._toward, {}
        written: dict[Member | Hop, None] = {}
        owner = self.owner
        for hop, work in toward.items():
            if hop.closing:
                continue
            if isinstance(hop, VNHop):
                self._split_toward(hop, [a for a in work.values() if self._vouch(a)], written)
            elif hop.congested:
                owner.stats.deliveries_dropped += 1
            else:
                # A sender caught with a bad signature has every share checked first.
                distrusted = owner.distrusted
                leaves = [a for a in work.values() if a.sender not in distrusted or self._vouch(a)]
                if leaves:
                    self._hand(hop, leaves)
                    written[hop] = None
        if self._relay_checks:
            asyncio.get_running_loop().call_soon(self._check_relays)
        return written

    def _split_toward(
        self, hop: VNHop, work: list[Accepted], written: dict[Member | Hop, None]
    ) -> None:
        if not work:
            return
        owner = self.owner
        stats = owner.stats
        scheme = (hop.peer_id, hop.size)
        owner.splits_by_scheme[scheme] = owner.splits_by_scheme.get(scheme, 0) + len(work)
        replicas = {
            n.replica: conn
            for broker_id, conn in hop.members.items()
            if not conn.closing and (n := owner.neighbours.get(broker_id)) is not None
        }
        r = hop.size
        for piece, above in self._pieces(work, lambda a: split_bytes(a.share, r)):
            sends = self.split(hop, [a.share for a in piece])
            stats.shares_split += len(piece)
            for replica, statement, blob in sends:
                conn = replicas.get(replica)
                if conn is None:
                    continue
                conn.send(Pass(self._new_to(conn, above), statement.raw, statement.signature, blob))
                stats.shares_forwarded += len(piece)
                written[conn] = None

    def _hand(self, hop: Hop, work: list[Accepted]) -> None:
        """A local subscriber's leaves, relayed as received, with the statements above."""
        owner = self.owner
        for piece, above in self._pieces(work, lambda a: leaf_bytes(a.share)):
            under = {a.statement.ref: a.statement for a in piece}
            batches = leaf_batches([a.share for a in piece], under)
            hop.send(
                Leaves(self._new_to(hop, above), [(b.ref, b.positions, b.blob) for b in batches])
            )
        owner.stats.shares_delivered += len(work)
        if owner.keep_recent:
            recent = self._recent.get(hop)
            if recent is None:
                recent = self._recent[hop] = deque(maxlen=owner.recent_shares)
            recent.extend(work)
        for accepted in work:
            if owner.sample_relay():
                self._relay_checks.append(accepted)

    def _pieces(
        self, work: list[Accepted], share_bytes: Callable[[Accepted], int]
    ) -> Iterator[tuple[list[Accepted], list[PassStatement]]]:
        """``work`` with the statements above it, in pieces whose frames stay within the
        owner's ``frame_budget``: a busy event-loop pass can gather thousands of shares for
        one hop, and a frame over the receiver's ``max_frame`` closes the link with every
        share in it (lost for good: 2026-11-29, a subscriber missed 2,000 keys in a row).

        A piece is charged every statement above it, sent on this link before or not, so
        that a statement's whole chain stays within the budget hop after hop (a piece of
        one share is sent whatever it weighs: its chain is its parent's plus one entry)."""
        budget = self.owner.frame_budget
        todo = [work]
        while todo:
            part = todo.pop()
            above = self._chains(part)
            size = sum(len(s.raw) + len(s.signature) for s in above)
            size += sum(map(share_bytes, part))
            if size <= budget or len(part) == 1:
                yield part, above
                continue
            count = min(len(part), -(-size // budget))
            step = -(-len(part) // count)
            todo.extend(part[at : at + step] for at in reversed(range(0, len(part), step)))

    def _chains(self, work: list[Accepted]) -> list[PassStatement]:
        """Every statement above the shares of ``work`` (theirs included), each once.

        One statement covers nodes of several parents (a pass splits many), so the walk
        goes on past a statement already listed; it stops at a (statement, node) already
        walked, from where the rest of the chain is the same."""
        found: dict[bytes, PassStatement] = {}
        walked: set[tuple[bytes, bytes, tuple[int, ...]]] = set()
        statements = self.statements
        for accepted in work:
            statement: PassStatement | None = accepted.statement
            pub_id = accepted.share.pub_id
            node = accepted.share.lineage[:-1]
            while statement is not None:
                step = (statement.ref, pub_id, node)
                if step in walked:
                    break
                walked.add(step)
                found[statement.ref] = statement
                if not node:
                    break
                position = statement.position(pub_id, node)
                if position is None:
                    break
                statement = statements.get(statement.entries[position].parent)
                node = node[:-1]
        return list(found.values())

    def _new_to(self, conn: Member | Hop, statements: list[PassStatement]) -> list[Signed]:
        sent = self._sent.get(conn)
        if sent is None:
            sent = self._sent[conn] = OrderedDict()
            for gone in [c for c in self._sent if c.closing]:
                del self._sent[gone]
        out: list[Signed] = []
        for statement in statements:
            if statement.ref not in sent:
                sent[statement.ref] = None
                out.append((statement.raw, statement.signature))
        while len(sent) > LINK_MEMORY:
            sent.popitem(last=False)
        return out

    def _vouch(self, accepted: Accepted) -> bool:
        """Whether the statement ``accepted`` came under carries its splitter's signature
        (this replica's own statement will name it). A sender whose signature fails is
        blamed first-hand and distrusted."""
        statement = accepted.statement
        splitter = accepted.view.splitter(accepted.share.lineage[:-1])
        if self.seals.sealed(statement, splitter.public_key):
            return True
        owner = self.owner
        owner.distrusted.add(accepted.sender)
        bad = self._bad_seals
        if statement.ref not in bad:
            bad[statement.ref] = None
            if len(bad) > EPOCH_MEMORY:
                bad.popitem(last=False)
            key = epoch_of(accepted.share.pub_id) or (accepted.sender, 0)
            owner.blame(
                key,
                accepted.sender,
                "bad_share: bad signature on its own pass statement",
                accepted.sender,
            )
        return False

    def _check_relays(self) -> None:
        checks, self._relay_checks = self._relay_checks, []
        for accepted in checks:
            self._vouch(accepted)

    # -- hook (wrapped by broker.daemon.faults on a Byzantine test broker) ---------------

    def split(self, hop: VNHop, shares: list[Held]) -> list[tuple[int, PassStatement, bytes]]:
        """What the replicas of ``hop`` are sent for ``shares``: (replica, statement, blob)
        items; honestly, one split of them all, replica ``j`` its blob ``j``."""
        signer = self.owner.signer
        assert signer is not None
        self._serial += 1
        statement, blobs = split_pass(signer, hop.peer_id, self._serial, hop.size, shares)
        return [(j, statement, blob) for j, blob in enumerate(blobs)]

    # -- links, manifests, silence --------------------------------------------------------

    def link_gone(self, conn: Member | Hop) -> None:
        self._sent.pop(conn, None)
        self._recent.pop(conn, None)

    def resend_recent(self, hop: Hop) -> None:
        """A local client's connection was lost and its session parked on ``hop``: hand it
        again the leaves it was handed last, with every statement above them (what the
        lost connection carried may have died in flight)."""
        self._sent.pop(hop, None)
        items = list(self._recent.pop(hop, ()))
        if items:
            self._hand(hop, items)

    def rebase(self, key: Key) -> None:
        """Views of ``key``'s paths against a new manifest version."""
        owner = self.owner
        sec = owner.secs.get(key)
        paths = self.paths.get(key)
        if sec is None or not paths or owner.manifest is None:
            return
        for claim in list(paths):
            try:
                paths[claim] = path_view(owner.manifest, key[0], sec, claim)
            except (PropagationError, KeyError):
                continue

    def silent(self, key: Key, heard: Iterable[str]) -> list[tuple[str, str]]:
        """(broker, why) for every upstream replica of an agreed path that sent nothing."""
        heard = list(heard)
        return [
            (blame.broker, f"{blame.fault}: {blame.detail}")
            for view in self.paths.get(key, {}).values()
            for blame in silent_senders(view, view.depth, heard)
        ]
