"""Key shares by the pass: one split, one signed statement and one blob per (splitter, next
VN, pass) — the bulk form of :mod:`security.propagation`'s tree of shares (SPEC §3).

Why a second form. The tree is the same (lineage, (k, r) per level, salted openings,
SHA-256 commitments, blame on proof only), but :mod:`security.propagation` carries it as
one record per share with its certificate chain: 66 records per publication over three VNs
of three replicas, each built, packed, parsed and checked in Python, which is what keeps
confidential delivery at a twentieth of plain throughput (issue 11, ``bench/RESULTS.md``).
Here the unit of work is a splitter's *pass* (every node it splits toward one next VN in
one event-loop flush), so the per-publication work is a few slices and hashes:

* **Split.** All openings a splitter holds for one next VN are split by one
  :func:`security.shamir.split` of their concatenation (byte-wise Shamir splits a
  concatenation exactly as it splits each part, every byte with its own polynomial). Replica
  ``j`` of the next VN gets one *blob*: child ``j`` of every node, ``salt || sub-share`` each
  (the opening of the child), in statement order.
* **Statement.** The splitter states the pass once (:class:`PassStatement`): splitter,
  next VN, serial, (k, r), and per node the publication, the lineage, the *reference* of the
  statement that committed to the node's own opening, the child opening size and the r
  child commitments; it signs the canonical bytes once. A statement's reference is the
  SHA-256 of its bytes *and* signature, so a child entry that names it vouches for that
  exact signature (a relay cannot pair a genuine statement with a forged signature: the
  pair has another reference, which nothing names).
* **Receive.** A replica checks every opening of its blob against its commitment
  (:func:`open_pass`, hashing only) and each entry's shape against the publication's path
  (:func:`entry_problem`); before it splits a share it verifies the signature of the
  statement it came under (:class:`SealChecks`, once per statement), as
  :mod:`security.propagation` does per batch root: its own statement names that one, so an
  honest broker never vouches for a bad signature.
* **Relay.** Statements travel whole along the path, each once per link, so a subscriber
  gets the statement of every splitter above its leaves. They name other publications the
  same splitter split toward the same VN in the same pass (ids and hiding commitments, no
  share): a subscriber learns which publications crossed its path, not their keys or
  content. The last VN splits nothing; its replicas hand the subscriber their leaves as
  :class:`LeafBatch` es (a statement reference, entry positions, the openings).
* **Reconstruct.** :class:`Assembly` rebuilds each key bottom-up as
  :func:`security.propagation.reconstruct` does (candidates per node keyed by commitment,
  one combine per version of a split, extra children checked against the polynomial; the
  honest nodes of a whole level, of every publication of a pass, in one combine), with the
  same blame rules (:class:`~security.propagation.Fault`). A bad signature on a statement
  of the last splitting VN proves nothing (its holder may have forged it: set aside, as
  :data:`~security.propagation.UNPROVEN`); on a statement above, it is blamed on every
  splitter whose validly signed entry names it (it vouched without checking).

Pure functions over plain data: framing, links, timers and silence belong to the caller
(:mod:`broker.daemon.passes` in a broker, :mod:`security.pass_keys` in a subscriber). It
is the SDK's default (``Client(share_form="pass")``); :mod:`security.propagation`'s records
remain a publisher's option (``share_form="record"``) until their code goes
(``bench/bench_pass_shares.py`` measures the two side by side).
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from security import shamir
from security.envelope import Signer
from security.paths import vn_path
from security.propagation import (
    SALT_SIZE,
    Blame,
    Fault,
    PathView,
    PropagationError,
    Reconstruction,
    commitment,
    outcome,
    recover_node,
    threshold_for,
    wrong_secrets,
)
from security.publication import epoch_of
from security.waiting import WAITING_BUDGET, WaitingShares, Weight

__all__ = [
    "Assembly",
    "Entry",
    "Held",
    "LeafBatch",
    "PassStatement",
    "SealChecks",
    "StatementStore",
    "claimed_vns",
    "entry_problem",
    "leaf_batches",
    "leaf_bytes",
    "open_pass",
    "parse_statement",
    "root_holdings",
    "split_bytes",
    "split_pass",
    "statement_ref",
]

Lineage = tuple[int, ...]

_DOMAIN = "trellis/pass-statement/v1"
_REF_TAG = b"trellis/pass-ref\x00"
_DIGEST = 32
_sha256 = hashlib.sha256


class Entry(NamedTuple):
    """One node a pass split: its publication and lineage, the reference of the statement
    that committed to its opening (``b""`` for a root, which the publisher holds), the size
    of each child opening and the r child commitments."""

    pub_id: bytes
    node: Lineage
    parent: bytes
    size: int
    commitments: tuple[bytes, ...]


@dataclass(frozen=True, slots=True, eq=False)
class PassStatement:
    """What one splitter split toward one next VN in one pass, as signed.

    ``raw`` is the canonical (signed) bytes; ``ref`` names the statement with its
    signature. Two validly signed statements toward the same VN with different entries for
    the same node prove the splitter equivocated.
    """

    splitter: str
    toward: str
    serial: int
    k: int
    r: int
    entries: tuple[Entry, ...]
    raw: bytes = field(repr=False)
    signature: bytes = field(repr=False)
    ref: bytes = field(repr=False)
    _positions: dict[tuple[bytes, Lineage], int] = field(repr=False)

    def position(self, pub_id: bytes, node: Lineage) -> int | None:
        """Where the entry for ``node`` of ``pub_id`` sits, or None."""
        return self._positions.get((pub_id, node))

    def blob_size(self) -> int:
        """The length of every blob of this pass (one child opening per entry)."""
        return sum(entry.size for entry in self.entries)


def statement_ref(raw: bytes, signature: bytes) -> bytes:
    """The reference naming a statement with its signature (what child entries name): a
    receiver that knows it skips parsing the statement again."""
    return _sha256(_REF_TAG + raw + signature).digest()


def _statement(
    splitter: str,
    toward: str,
    serial: int,
    k: int,
    r: int,
    entries: tuple[Entry, ...],
    raw: bytes,
    signature: bytes,
    ref: bytes | None = None,
) -> PassStatement:
    positions = {(e.pub_id, e.node): i for i, e in enumerate(entries)}
    if len(positions) != len(entries):
        raise PropagationError("a statement names one node twice")
    return PassStatement(
        splitter,
        toward,
        serial,
        k,
        r,
        entries,
        raw,
        signature,
        statement_ref(raw, signature) if ref is None else ref,
        positions,
    )


class Held(NamedTuple):
    """A share a broker (or the publisher, for a root) holds and may split: publication,
    lineage, opening (``salt || data``; a root's is the key) and the reference of the
    statement that committed to it (``b""`` for a root)."""

    pub_id: bytes
    lineage: Lineage
    opening: bytes
    parent: bytes


FRAMING = 24
"""Bytes of framing one share's row costs in a PASS or LEAVES frame, at most (msgpack
headers of its statement row and blob part, its size or position)."""


def split_bytes(share: Held, r: int) -> int:
    """What splitting ``share`` toward ``r`` replicas adds to each of their PASS frames, at
    most: its statement row (publication, lineage, parent reference, r commitments) and its
    child opening in the blob. Callers keep a pass's frames under the receiver's frame
    limit with it (one over closes the link with every share in it)."""
    return (
        len(share.pub_id)
        + len(share.lineage)
        + len(share.parent)
        + _DIGEST * r
        + SALT_SIZE
        + len(share.opening)
        + FRAMING
    )


def leaf_bytes(share: Held) -> int:
    """What handing ``share`` to a subscriber adds to a LEAVES frame, at most (its batch's
    statement reference counted in full)."""
    return _DIGEST + len(share.opening) + FRAMING


def root_holdings(roots: Iterable[tuple[bytes, bytes]]) -> list[Held]:
    """A publisher's ``(pub_id, key)`` pairs as the roots it splits."""
    return [Held(pub_id, (), key, b"") for pub_id, key in roots]


def split_pass(
    signer: Signer, toward: str, serial: int, r: int, held: Sequence[Held]
) -> tuple[PassStatement, list[bytes]]:
    """Split every held share toward the ``r`` replicas of VN ``toward`` in one pass.

    Returns the signed statement and one blob per next replica (blob ``j`` for replica
    ``j``: child ``j`` of every share, in statement order). The threshold is
    :func:`~security.propagation.threshold_for` ``(r)``.
    """
    if not held:
        raise PropagationError("a pass splits at least one share")
    k = threshold_for(r)
    if r > shamir.MAX_SHARES:
        raise PropagationError(f"a VN may have at most {shamir.MAX_SHARES} replicas")
    sizes = [len(h.opening) for h in held]
    shares = shamir.split(b"".join(h.opening for h in held), k, r)
    count = len(held)
    salts = os.urandom(SALT_SIZE * r * count)
    columns: list[list[bytes]] = [[] for _ in range(count)]
    blobs: list[bytes] = []
    for j, share in enumerate(shares):
        data = share.data
        parts: list[bytes] = []
        at = 0
        salt_at = j * count * SALT_SIZE
        for n, size in enumerate(sizes):
            opening = salts[salt_at : salt_at + SALT_SIZE] + data[at : at + size]
            salt_at += SALT_SIZE
            at += size
            parts.append(opening)
            columns[n].append(commitment(opening))
        blobs.append(b"".join(parts))
    entries = tuple(
        Entry(h.pub_id, h.lineage, h.parent, size + SALT_SIZE, tuple(column))
        for h, size, column in zip(held, sizes, columns, strict=True)
    )
    raw = msgpack.packb(
        [
            _DOMAIN,
            signer.id,
            toward,
            serial,
            k,
            r,
            [[e.pub_id, bytes(e.node), e.parent, e.size, b"".join(e.commitments)] for e in entries],
        ],
        use_bin_type=True,
    )
    signature = signer.sign(raw)
    return _statement(signer.id, toward, serial, k, r, entries, raw, signature), blobs


def parse_statement(raw: bytes, signature: bytes, ref: bytes | None = None) -> PassStatement:
    """A statement from its canonical bytes and signature (the signature is not checked
    here: :class:`SealChecks`). Raises :class:`PropagationError` on anything malformed.
    ``ref``: its :func:`statement_ref`, when the caller computed it already (to look it up)."""
    try:
        fields = msgpack.unpackb(raw, raw=False, use_list=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise PropagationError(f"malformed pass statement: {exc}") from None
    if type(fields) is not tuple or len(fields) != 7 or fields[0] != _DOMAIN:
        raise PropagationError("not a pass statement")
    _, splitter, toward, serial, k, r, rows = fields
    if not (type(splitter) is str and type(toward) is str and type(serial) is int):
        raise PropagationError("malformed pass statement header")
    if type(r) is not int or not 1 <= r <= shamir.MAX_SHARES or k != threshold_for(r):
        raise PropagationError(f"scheme (k, r) = ({k!r}, {r!r}) is not a threshold scheme")
    if type(rows) is not tuple or not rows or not isinstance(signature, bytes):
        raise PropagationError("a pass statement needs entries and a signature")
    width = r * _DIGEST
    try:
        # Checked column-wise, each column in one C-level pass, then built in one more.
        pub_ids, nodes, parents, sizes, joined = zip(*rows, strict=True)
    except (TypeError, ValueError):
        raise PropagationError("malformed pass entry") from None
    if not (
        _all_of(bytes, pub_ids, nodes, parents, joined)
        and set(map(type, sizes)) == {int}
        and min(sizes) > SALT_SIZE
        and set(map(len, joined)) == {width}
        and all(len(p) == (_DIGEST if len(n) else 0) for p, n in zip(parents, nodes, strict=True))
    ):
        raise PropagationError("malformed pass entry")
    commits = [tuple([j[i : i + _DIGEST] for i in range(0, width, _DIGEST)]) for j in joined]
    entries = list(map(Entry, pub_ids, map(tuple, nodes), parents, sizes, commits))
    return _statement(splitter, toward, serial, k, r, tuple(entries), raw, signature, ref)


def _all_of(kind: type, *columns: tuple[object, ...]) -> bool:
    return all(set(map(type, column)) == {kind} for column in columns)


class SealChecks:
    """Statement signatures already checked, by reference: each statement costs one
    Ed25519 verification per process however many shares it covers. Bounded."""

    def __init__(self, size: int = 1 << 15) -> None:
        self.size = size
        self._seen: dict[bytes, bool] = {}
        self.verified = 0  # verifications actually run (for benchmarks)

    def sealed(self, statement: PassStatement, key: Ed25519PublicKey) -> bool:
        """Whether ``statement`` carries its splitter's signature under ``key``."""
        ok = self._seen.get(statement.ref)
        if ok is None:
            self.verified += 1
            try:
                key.verify(statement.signature, statement.raw)
                ok = True
            except InvalidSignature:
                ok = False
            seen = self._seen
            if len(seen) >= self.size:
                for stale in list(seen)[: self.size // 4]:
                    del seen[stale]
            seen[statement.ref] = ok
        return ok


_FITS: dict[tuple[int, Lineage, str, int, int], tuple[PathView, str | None]] = {}
_FITS_LIMIT = 1 << 14


def entry_problem(statement: PassStatement, entry: Entry, path: PathView) -> str | None:
    """Why ``entry`` of ``statement`` does not fit the publication's ``path``, or None:
    the split's level must be on the path under an allowed (k, r), and the statement's
    signer must be the one entitled to split the node.

    Every publication of a publisher has the same nodes on the same path, so verdicts are
    remembered per (path object, node, splitter, scheme): a pass of n publications costs
    one check per node, not n."""
    memo = (id(path), entry.node, statement.splitter, statement.k, statement.r)
    seen = _FITS.get(memo)
    if seen is not None and seen[0] is path:
        return seen[1]
    problem = _entry_problem(statement, entry, path)
    if len(_FITS) >= _FITS_LIMIT:
        for stale in list(_FITS)[: _FITS_LIMIT // 4]:
            del _FITS[stale]
    _FITS[memo] = (path, problem)  # the path is kept, so its id is not reused meanwhile
    return problem


def _entry_problem(statement: PassStatement, entry: Entry, path: PathView) -> str | None:
    node = entry.node
    level = len(node) + 1
    if level > path.depth:
        return f"a split of {node} below the last VN"
    if any(not 0 <= i < len(path.vns[d]) for d, i in enumerate(node)):
        return f"lineage {node} out of the path's replicas"
    if not path.allows(level, statement.k, statement.r):
        return f"scheme (k, r) = ({statement.k}, {statement.r}) is not one the path allows"
    entitled = path.splitter(node).id
    if statement.splitter != entitled:
        return f"signed by {statement.splitter!r}, but {entitled!r} splits {node}"
    return None


def claimed_vns(
    statement: PassStatement,
    entry: Entry,
    statements: Mapping[bytes, PassStatement],
    owner: Callable[[str], str | None],
    first_vn: str,
    holder_vn: str,
) -> tuple[str, ...] | None:
    """The VN path the children of ``entry`` say they travelled, read up the chain of
    statements (each entry names the statement above by reference), or None when the chain
    is incomplete or cannot be a path.

    As :func:`security.paths.claimed_path` reads it from a record's certificates: VN_1 is
    the publisher's edge VN (``first_vn``, bound by the publisher's signature), VN_j for
    1 < j <= m the VN of the replica that split level j's node (``owner`` maps a broker to
    its VN), and VN_{m+1} the children's holder (``holder_vn``). Only a majority of a VN
    makes a verifier adopt a path (:class:`security.paths.PathVote`).
    """
    splitters: list[str] = []
    current, node = statement, entry.node
    while node:
        splitters.append(current.splitter)
        position = current.position(entry.pub_id, node)
        if position is None:
            return None
        above = statements.get(current.entries[position].parent)
        if above is None:
            return None
        current, node = above, node[:-1]
    if current.position(entry.pub_id, ()) is None:
        return None
    return vn_path(first_vn, splitters[::-1], holder_vn, owner)


def open_pass(
    statement: PassStatement, blob: bytes, index: int
) -> tuple[list[Held], list[tuple[Entry, str]]]:
    """What replica ``index`` of the next VN received in ``blob`` under ``statement``: the
    shares whose openings match their commitments, and each entry whose opening does not
    (with why). Hashing only; the caller checks entries against paths
    (:func:`entry_problem`), the sender against ``statement.splitter`` and, before it
    splits any of them, the signature (:class:`SealChecks`)."""
    if not 0 <= index < statement.r:
        return [], [(e, f"no child {index} in a split of {statement.r}") for e in statement.entries]
    if len(blob) != statement.blob_size():
        return [], [(e, "blob of the wrong length") for e in statement.entries]
    held: list[Held] = []
    bad: list[tuple[Entry, str]] = []
    ref = statement.ref
    at = 0
    child = (index,)
    for entry in statement.entries:
        size = entry.size
        opening = blob[at : at + size]
        at += size
        if commitment(opening) == entry.commitments[index]:
            held.append(Held(entry.pub_id, entry.node + child, opening, ref))
        else:
            bad.append((entry, "opening does not match its commitment"))
    return held, bad


class LeafBatch(NamedTuple):
    """Leaves a replica of the last VN hands a subscriber: the statement they came under
    (by reference), the positions of their entries in it and their openings, concatenated
    (child ``x`` of each entry, ``x`` being the sender's replica index)."""

    ref: bytes
    positions: tuple[int, ...]
    blob: bytes


def leaf_batches(held: Iterable[Held], under: Mapping[bytes, PassStatement]) -> list[LeafBatch]:
    """What a replica of the last VN hands a subscriber for the leaves it ``held``: one
    batch per statement they came under (``under``: those statements by reference)."""
    by_ref: dict[bytes, list[Held]] = defaultdict(list)
    for share in held:
        by_ref[share.parent].append(share)
    batches = []
    for ref, shares in by_ref.items():
        statement = under[ref]
        positions = []
        for share in shares:
            position = statement.position(share.pub_id, share.lineage[:-1])
            if position is None:
                raise PropagationError(f"{share.lineage} did not come under {ref.hex()[:16]}")
            positions.append(position)
        batches.append(LeafBatch(ref, tuple(positions), b"".join(s.opening for s in shares)))
    return batches


class StatementStore(Mapping[bytes, PassStatement]):
    """Statements by reference, the oldest let go once they hold more than ``budget``
    bytes (a statement of a pass of a stream is kilobytes: a count would bound nothing).
    What still holds a statement (a share, an entry) keeps it alive by itself; the store is
    for reading paths up chains and for knowing what was parsed already."""

    def __init__(self, budget: int = 16 << 20) -> None:
        self.budget = budget
        self._by_ref: OrderedDict[bytes, PassStatement] = OrderedDict()
        self._bytes = 0

    def __getitem__(self, ref: bytes) -> PassStatement:
        return self._by_ref[ref]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._by_ref)

    def __len__(self) -> int:
        return len(self._by_ref)

    def add(self, statement: PassStatement) -> PassStatement:
        """Keep ``statement``; the one already kept under its reference if any."""
        known = self._by_ref.get(statement.ref)
        if known is not None:
            return known
        self._by_ref[statement.ref] = statement
        self._bytes += len(statement.raw)
        while self._bytes > self.budget and len(self._by_ref) > 1:
            _, old = self._by_ref.popitem(last=False)
            self._bytes -= len(old.raw)
        return statement


HELD_BUDGET = 64 << 20
"""Bytes of statement entries and leaves one relay may have a subscriber hold for
publications whose key is not known yet (as a subscription's undecided copies are bounded
per replica); counted as :data:`ENTRY_OVERHEAD` plus 32 per commitment for an entry,
:data:`LEAF_OVERHEAD` plus its opening for a leaf."""

ENTRY_OVERHEAD = 160
LEAF_OVERHEAD = 256


def _entry_cost(entry: Entry) -> int:
    """What a statement's entry held for a publication counts (:data:`ENTRY_OVERHEAD`)."""
    return ENTRY_OVERHEAD + _DIGEST * len(entry.commitments)


CHARGED_MEMORY = 8192
"""Publications with leaves an :class:`Assembly` holds at most, the least recently added
to going first: a subscriber keeps the key assemblies of 4,096 epochs and each publisher's
current one, so the oldest past this are ones whose epoch was let go without
:meth:`Assembly.forget` (their charges would otherwise hold the relays' allowances)."""


class Assembly:
    """A subscriber's statements and leaves, indexed by publication.

    Statements and leaves cover many publications each (a pass of every splitter above);
    :meth:`reconstruct` looks at one publication's entries and leaves only, so a pass of
    n publications costs n reconstructions, not n passes over everything. Leaves whose
    statement has not arrived yet wait for it (a relay sends a statement before the leaves
    under it, but nothing here depends on that).

    What a publication some leaf came for holds until its key is known or given up (its
    leaves, and its statements' entries from then on) is charged to the relay that brought
    it, at most ``held_budget`` bytes per relay over all publications
    (:data:`HELD_BUDGET`); past it that relay's further entries and leaves are dropped and
    counted in :attr:`refused`. Entries of publications no leaf came for are bounded
    together (:data:`UNCLAIMED_MEMORY`, :data:`UNCLAIMED_BYTES`), the oldest let go. A
    Byzantine relay naming one publication in new forged statements, with or without leaves
    for it, again and again, grew the subscriber without bound until 2026-11-29 (a
    publication is let go only once its key is known or given up); honest relays hold what
    is in flight.
    """

    def __init__(self, held_budget: int = HELD_BUDGET) -> None:
        self.held_budget = held_budget
        self._charged: dict[str, int] = {}
        # publication -> relay -> bytes of its entries and leaves charged to that relay,
        # least recently charged first (CHARGED_MEMORY)
        self._charges: OrderedDict[bytes, dict[str, int]] = OrderedDict()
        self.refused: dict[str, int] = {}
        self.statements = StatementStore()
        self._entries: dict[bytes, list[tuple[PassStatement, Entry]]] = defaultdict(list)
        self._leaves: dict[bytes, list[tuple[str, PassStatement, Entry, bytes]]] = defaultdict(list)
        self.waiting: WaitingShares[bytes, tuple[str, LeafBatch]] = WaitingShares(
            _weigh_leaves, LEAVES_WAITING_BUDGET, _WAITING_LIMIT
        )
        # (sender, statement, position) of every leaf taken, per publication: a leaf
        # delivered twice (a resumed session is handed its last leaves again) counts once
        self._taken: dict[bytes, set[tuple[str, bytes, int]]] = defaultdict(set)
        # publications with entries and no leaf yet, oldest first (UNCLAIMED_MEMORY)
        # (and the bytes of their entries: UNCLAIMED_BYTES over all of them)
        self._unclaimed: OrderedDict[bytes, int] = OrderedDict()
        self._unclaimed_bytes = 0

    def add_statement(self, statement: PassStatement, sender: str = "") -> None:
        """Take a statement ``sender`` relayed (again: ignored).

        An entry of a publication some leaf came for is charged to ``sender`` (refused past
        its allowance); one of a publication without leaves yet counts toward
        :data:`UNCLAIMED_BYTES`, past which the oldest such publications go."""
        if statement.ref in self.statements:
            return
        entries, leaves, unclaimed = self._entries, self._leaves, self._unclaimed
        claimed = [
            (entry, _entry_cost(entry)) for entry in statement.entries if entry.pub_id in leaves
        ]
        if claimed and self._charged.get(sender, 0) + sum(c for _, c in claimed) > (
            self.held_budget
        ):
            # Refused whole and not kept: another relay's copy of it is then taken.
            self.refused[sender] = self.refused.get(sender, 0) + 1
            return
        self.statements.add(statement)
        for entry, cost in claimed:
            self._charge(sender, entry.pub_id, cost)
        for entry in statement.entries:
            pub_id = entry.pub_id
            if epoch_of(pub_id) is None:
                continue  # no publication's: nothing could ever let it go
            entries[pub_id].append((statement, entry))
            if pub_id in leaves:
                continue  # (charged above)
            cost = _entry_cost(entry)
            unclaimed[pub_id] = unclaimed.get(pub_id, 0) + cost
            self._unclaimed_bytes += cost
            while len(unclaimed) > UNCLAIMED_MEMORY or self._unclaimed_bytes > UNCLAIMED_BYTES:
                gone, held = unclaimed.popitem(last=False)
                self._unclaimed_bytes -= held
                entries.pop(gone, None)
        for waiting_sender, batch in self.waiting.pop(statement.ref):
            self.add_leaves(waiting_sender, batch)

    def charged(self, sender: str) -> int:
        """Bytes of entries and leaves held charged to ``sender``."""
        return self._charged.get(sender, 0)

    def _charge(self, sender: str, pub_id: bytes, cost: int) -> bool:
        charged = self._charged.get(sender, 0) + cost
        if charged > self.held_budget:
            self.refused[sender] = self.refused.get(sender, 0) + 1
            return False
        self._charged[sender] = charged
        charges = self._charges
        by_sender = charges.get(pub_id)
        if by_sender is None:
            by_sender = charges[pub_id] = {}
        else:
            charges.move_to_end(pub_id)
        by_sender[sender] = by_sender.get(sender, 0) + cost
        while len(charges) > CHARGED_MEMORY:
            self.forget(next(iter(charges)))
        return True

    def _release(self, pub_id: bytes) -> None:
        for sender, cost in self._charges.pop(pub_id, {}).items():
            left = self._charged[sender] - cost
            if left > 0:
                self._charged[sender] = left
            else:
                del self._charged[sender]

    def add_leaves(self, sender: str, batch: LeafBatch) -> None:
        """Take the leaves one replica of the last VN delivered (``sender``: its id)."""
        statement = self.statements.get(batch.ref)
        if statement is None:
            # (dropped past the sender's budget: a relay's leaves under nothing ever sent)
            self.waiting.add(batch.ref, (sender, batch))
            return
        entries = statement.entries
        blob = batch.blob
        at = 0
        for position in batch.positions:
            if type(position) is not int or not 0 <= position < len(entries):
                break
            entry = entries[position]
            if entry.pub_id not in self._entries:
                # (no publication's, or one let go: its key is known or was given up)
                at += entry.size
                continue
            taken = self._taken[entry.pub_id]
            mark = (sender, statement.ref, position)
            if mark not in taken and self._charge(sender, entry.pub_id, LEAF_OVERHEAD + entry.size):
                taken.add(mark)
                self._unclaimed_bytes -= self._unclaimed.pop(entry.pub_id, 0)
                self._leaves[entry.pub_id].append(
                    (sender, statement, entry, blob[at : at + entry.size])
                )
            at += entry.size

    def leaves(self, pub_id: bytes) -> list[tuple[str, PassStatement, Entry, bytes]]:
        """The leaves delivered for ``pub_id`` so far: (sender, statement, entry, opening)."""
        return self._leaves.get(pub_id, [])

    def publications(self) -> list[bytes]:
        """Every publication some leaf was delivered for."""
        return list(self._leaves)

    def forget(self, pub_id: bytes) -> None:
        """Drop what is held for ``pub_id`` (its key is known, or it was given up). The
        statements stay: they cover other publications too (the caller bounds them)."""
        self._entries.pop(pub_id, None)
        self._leaves.pop(pub_id, None)
        self._taken.pop(pub_id, None)
        self._unclaimed_bytes -= self._unclaimed.pop(pub_id, 0)
        self._release(pub_id)

    def reconstruct(
        self,
        pub_id: bytes,
        path: PathView,
        *,
        seals: SealChecks | None = None,
        audit: bool = True,
        check: Callable[[bytes], bool] | None = None,
        complete: bool = False,
    ) -> Reconstruction:
        """Recover ``pub_id``'s key from the leaves delivered so far, and blame every provable
        fault (the rules of :func:`security.propagation.reconstruct`).

        Args:
            pub_id: the publication.
            path: its path.
            seals: signature cache shared across calls.
            audit: verify every statement's signature (each once per cache). False: a quick
                pass that trusts every statement; its key must pass ``check`` (the AES-GCM
                tag) and its blame is only a reason to run the audit, never to name anyone:
                a relay can forge a statement, and only signatures tell whose it is.
            check: optional final test of a candidate key.
            complete: every delivery is in; only then is a short split blamed.
        """
        checks = None if check is None else {pub_id: check}
        return self.reconstruct_many(
            [pub_id], path, seals=seals, audit=audit, checks=checks, complete=complete
        )[pub_id]

    def reconstruct_many(
        self,
        pub_ids: Iterable[bytes],
        path: PathView,
        *,
        seals: SealChecks | None = None,
        audit: bool = True,
        checks: Mapping[bytes, Callable[[bytes], bool]] | None = None,
        complete: bool = False,
    ) -> dict[bytes, Reconstruction]:
        """:meth:`reconstruct` for several publications of one path at once (a pass of a
        stream): each level of every publication's honest nodes is rebuilt by one combine.
        ``checks``: a final test of the key per publication (optional)."""
        seals = seals or SealChecks()
        work = {pub_id: self._gather(pub_id, path, seals, audit) for pub_id in pub_ids}
        for level in range(path.depth - 1, -1, -1):
            layer = [
                (pub_id, splits, candidates, node)
                for pub_id, (_, splits, candidates) in work.items()
                for node in sorted(node for node in splits if len(node) == level)
            ]
            for pub_id, splits, candidates, node in _recover_level(layer, complete):
                recover_node(
                    node, splits[node], candidates, path, work[pub_id][0], complete=complete
                )
            if level == 0:
                break
            for pub_id, splits, candidates, node in layer:
                above = splits.get(node[:-1])
                if not above:
                    # The statement above has not arrived (or was set aside): nothing to
                    # check this node's values against, and nothing to use them for.
                    continue
                allowed = {c.commitments[node[-1]] for c in above if node[-1] < c.r}
                work[pub_id][0].extend(wrong_secrets(node, candidates, allowed, path))
        return {
            pub_id: outcome(candidates, blames, None if checks is None else checks.get(pub_id))
            for pub_id, (blames, _, candidates) in work.items()
        }

    def _gather(
        self, pub_id: bytes, path: PathView, seals: SealChecks, audit: bool
    ) -> tuple[list[Blame], dict[Lineage, list[_Version]], dict[Lineage, dict[bytes, bytes]]]:
        """One publication's blame so far, versions of each split and leaf candidates."""
        depth = path.depth
        blames: list[Blame] = []

        # The entries for this publication made along this path, under each statement,
        # shapes checked.
        along, on_path = _along(self._entries.get(pub_id, ()), path)
        mine: dict[bytes, list[Entry]] = {}
        unfit: set[bytes] = set()
        # (the statements themselves from the entries: the store may have let one go)
        statements: dict[bytes, PassStatement] = {}
        for statement, entry in along:
            ref = statement.ref
            statements[ref] = statement
            if ref in unfit:
                continue
            problem = entry_problem(statement, entry, path)
            if problem is None:
                mine.setdefault(ref, []).append(entry)
                continue
            unfit.add(ref)
            mine.pop(ref, None)
            # A relay can send anything: only the splitter's own signature makes it its fault.
            signer = _signer(path, statement.splitter)
            if audit and signer is not None and seals.sealed(statement, signer):
                blames.append(Blame(statement.splitter, Fault.BAD_SHARE, entry.node, problem))

        # The audit: a bad signature on the last splitting VN's statement proves nothing (its
        # holders relay it unchecked); above, it is the fault of whoever vouched for it.
        sealed = dict.fromkeys(mine, True)
        if audit:
            for ref, entries in mine.items():
                signer = path.splitter(entries[0].node).public_key
                sealed[ref] = seals.sealed(statements[ref], signer)
            for ref, ok in sealed.items():
                if ok:
                    continue
                for child_ref, entries in mine.items():
                    if sealed[child_ref] and any(e.parent == ref for e in entries):
                        blames.append(
                            Blame(
                                statements[child_ref].splitter,
                                Fault.BAD_SHARE,
                                (),
                                f"split under a statement of {statements[ref].splitter!r} "
                                "whose signature fails",
                            )
                        )

        # node -> entry -> its statement: the versions of each split.
        versions: dict[Lineage, dict[Entry, PassStatement]] = defaultdict(dict)
        for ref, entries in mine.items():
            if sealed[ref]:
                for entry in entries:
                    versions[entry.node].setdefault(entry, statements[ref])
        for node, stated in versions.items():
            if len(stated) > 1:
                refs = ", ".join(sorted(s.ref.hex()[:16] for s in stated.values()))
                blames.append(
                    Blame(
                        path.splitter(node).id,
                        Fault.EQUIVOCATION,
                        node,
                        f"{len(stated)} signed statements of one split ({refs})",
                    )
                )

        candidates: dict[Lineage, dict[bytes, bytes]] = defaultdict(dict)
        holders = {m.id: x for x, m in enumerate(path.vns[depth - 1])}
        for sender, statement, entry, opening in self._leaves.get(pub_id, ()):
            if not sealed.get(statement.ref, False) or id(entry) not in on_path:
                continue  # another path's, a statement unfit for this one, or set aside
            holder = holders.get(sender)
            if holder is None or len(entry.node) != depth - 1 or holder >= statement.r:
                blames.append(
                    Blame(sender, Fault.WRONG_SENDER, entry.node, "it does not hold this share")
                )
                continue
            leaf = (*entry.node, holder)
            digest = entry.commitments[holder]
            if len(opening) != entry.size or commitment(opening) != digest:
                blames.append(
                    Blame(sender, Fault.BAD_SHARE, leaf, "opening does not match its commitment")
                )
                continue
            known = candidates[leaf]
            if known and digest not in known:  # an honest holder keeps the first it got
                blames.append(Blame(sender, Fault.DUPLICATE, leaf, "two different shares"))
                continue
            known[digest] = opening

        splits = {
            node: [_Version(e.commitments, st.k, st.r) for e, st in stated.items()]
            for node, stated in versions.items()
        }
        return blames, splits, candidates


def _along(
    pairs: Sequence[tuple[PassStatement, Entry]], path: PathView
) -> tuple[list[tuple[PassStatement, Entry]], set[int]]:
    """The entries of one publication made along ``path``, and their ids: each split
    toward the path's VN of its level by a replica of the VN above
    (:meth:`PathView.carries`) under a statement that is itself on the path.

    A move can send a publication's shares along an old and a new path at once (an edge
    replica splits its node toward both next VNs, a replica further down splits what came
    both ways in one statement): each path is rebuilt from its own splits. Two splits of a
    node toward two VNs are no equivocation, and the other path's entries are no fault.

    Statements arrive top down, so one sweep usually settles it; an entry read before the
    statement above it is looked at again in another sweep."""
    carries = path.carries
    kept: list[tuple[PassStatement, Entry]] = []
    ids: set[int] = set()
    refs: set[bytes] = set()  # statements with an entry on the path
    rest = pairs
    while rest:
        later: list[tuple[PassStatement, Entry]] = []
        for pair in rest:
            statement, entry = pair
            level = len(entry.node)
            if not carries(statement.splitter, statement.toward, level):
                continue
            if level and entry.parent not in refs:
                later.append(pair)
                continue
            kept.append(pair)
            ids.add(id(entry))
            refs.add(statement.ref)
        if len(later) == len(rest):
            break
        rest = later
    return kept, ids


class _Version(NamedTuple):
    """One version of a split as reconstruction sees it
    (:class:`security.propagation.Split`)."""

    commitments: tuple[bytes, ...]
    k: int
    r: int


_Item = tuple[bytes, dict[Lineage, list[_Version]], dict[Lineage, dict[bytes, bytes]], Lineage]
"""A node of one level: (publication, its splits, its candidates, node)."""
_Layer = list[_Item]


def _recover_level(layer: _Layer, complete: bool) -> _Layer:
    """The honest case of a level at once: every node (of any publication) with one version
    of its split and the same children recovered (all r of them, or, while deliveries are
    still coming, at least k) is rebuilt by one combine over the concatenated children of
    all such nodes (byte-wise Shamir combines a concatenation as it combines each part),
    every extra child checked against the polynomial as
    :func:`~security.propagation.recover_node` does. Returns the nodes left for it: several
    versions, too few children (or fewer than r once everything is in: a short split is
    blamed there), or a group whose children are inconsistent somewhere."""
    rest: _Layer = []
    groups: dict[tuple[int, int, tuple[int, ...]], list[tuple[_Item, list[bytes]]]]
    groups = defaultdict(list)
    for item in layer:
        _, splits, candidates, node = item
        versions = splits[node]
        if len(versions) != 1:
            rest.append(item)
            continue
        split = versions[0]
        present: list[int] = []
        children = []
        for j, digest in enumerate(split.commitments):
            opening = candidates.get((*node, j), _NONE).get(digest)
            if opening is not None:
                present.append(j)
                children.append(opening)
        if len(children) < (split.r if complete else split.k):
            rest.append(item)
            continue
        groups[split.k, split.r, tuple(present)].append((item, children))
    for (k, _, indices), members in groups.items():
        points = [
            shamir.trusted_share(j + 1, b"".join([c[n][SALT_SIZE:] for _, c in members]))
            for n, j in enumerate(indices)
        ]
        try:
            joined = shamir.combine(points, k)
        except shamir.ShareError:
            rest.extend(item for item, _ in members)
            continue
        at = 0
        for (_, _, candidates, node), children in members:
            size = len(children[0]) - SALT_SIZE
            value = joined[at : at + size]
            at += size
            candidates[node] = {commitment(value) if node else value: value}
    return rest


def _signer(path: PathView, broker: str) -> Ed25519PublicKey | None:
    if path.publisher.id == broker:
        return path.publisher.public_key
    for vn in path.vns:
        for member in vn:
            if member.id == broker:
                return member.public_key
    return None


_NONE: dict[bytes, bytes] = {}
_WAITING_LIMIT = 4096
"""Statements an :class:`Assembly` holds leaves for before they arrive (the oldest let go)."""


UNCLAIMED_BYTES = 64 << 20
"""Bytes of entries (counted as for :data:`HELD_BUDGET`) of publications no leaf came for,
over all of them: a forged statement naming one such publication again and again adds to
it until it is the oldest and goes (the count alone bounded publications, not entries)."""

UNCLAIMED_MEMORY = 1 << 15
"""Publications a subscriber keeps statement entries of while no leaf of theirs came. A
relay's statement covers every publication of its pass routed to the subscriber's edge VN,
many of them perhaps for other subscribers there, whose leaves never come: past this many
the oldest go (until 2026-11-29 they were kept for good, a subscriber leaking the entries,
and the statements they hold, of every publication it shared an edge VN with and did not
match). A publication's leaves come with its statement or a pass later, never tens of
thousands of publications later."""

LEAVES_WAITING_BUDGET = WAITING_BUDGET
"""Bytes of leaves one relay may have waiting at a subscriber for statements not seen yet:
a Byzantine relay sending leaves under statements it never sends, again and again, fills
its own allowance only (until 2026-11-29 the leaves under one reference grew without
bound)."""


def _weigh_leaves(item: tuple[str, LeafBatch]) -> Weight:
    sender, batch = item
    return sender, None, 0, len(batch.blob) + 8 * len(batch.positions)
