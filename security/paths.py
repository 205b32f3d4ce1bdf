"""Which path a key share travelled, who vouches for it, and a subscriber's key assembly.

Live reconfiguration moves links, so a confidential publication's path is not the
manifest's starting tree: it is read from its shares' signed split certificates
(:func:`claimed_path`) and adopted once a majority of the sending VN vouches for it
(:class:`PathVote`). A subscriber gathers an epoch's shares per claimed path and
reconstructs the key from whichever path is complete (:class:`KeyAssembly`). Pure logic
over the overlay manifest and the share records: no I/O.
"""

from __future__ import annotations

import logging
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol
from weakref import WeakKeyDictionary

from security.agreement import CopyBudget
from security.envelope import (
    AttributeValue,
    EnvelopeError,
    open_sealed,
    public_key_from_bytes,
)
from security.propagation import (
    ChainVerifier,
    Member,
    PathView,
    PropagationError,
    Reconstruction,
    ShareRecord,
    reconstruct,
    threshold_for,
)
from security.publication import SecBlock, publication_id

log = logging.getLogger("trellis.security")

AUDIT_ONE_IN = 16
"""A subscriber verifies every seal of an epoch whose shares all check out by hashing with
probability 1 / this (and of every epoch where hashing finds a fault or the key fails)."""

# Which epochs are audited: seeded from os.urandom and never visible outside this process,
# so no broker can tell which of its shares will be (``secrets`` costs a system call).
_draw = random.Random()


class Membership(Protocol):
    """What path checks need of the overlay manifest (``overlay.manifest.Manifest``):
    the trust anchor for who belongs to which VN and their public keys. A protocol, so
    that ``security`` never imports ``overlay``."""

    @property
    def members(self) -> Mapping[str, tuple[str, ...]]: ...

    @property
    def keys(self) -> Mapping[str, bytes]: ...

    def owner(self, broker_id: str) -> str | None: ...

    def slots(self, vn: str) -> tuple[str, ...]: ...

    def schemes(self, vn: str) -> frozenset[int]: ...


_Slots = tuple[tuple[tuple[Member, ...], ...], tuple[frozenset[int], ...]]
_PATH_CACHE: WeakKeyDictionary[Membership, dict[tuple[str, ...], _Slots]]
_PATH_CACHE = WeakKeyDictionary()
# (publisher, its public key, path) -> view, newest last; bounded.
_VIEWS: OrderedDict[tuple[str, bytes, tuple[str, ...], _Slots], PathView] = OrderedDict()
_VIEW_MEMORY = 1024


def path_view(
    manifest: Membership, publisher: str, sec: SecBlock, path: tuple[str, ...]
) -> PathView:
    """Who may sign each split of this publication along the VN ``path`` it travelled.

    Keys are decoded once per path and publisher key, not once per publication: a
    publisher's epochs all travel the same few paths.
    """
    paths = _PATH_CACHE.setdefault(manifest, {})
    slots = paths.get(path)
    if slots is None:
        keys = manifest.keys
        slots = paths[path] = (
            tuple(
                tuple(Member(b, public_key_from_bytes(keys[b])) for b in manifest.slots(vn))
                for vn in path
            ),
            tuple(manifest.schemes(vn) for vn in path),
        )
    key = (publisher, sec.pk, path, slots)
    view = _VIEWS.get(key)
    if view is None:
        publisher_member = Member(publisher, public_key_from_bytes(sec.pk))
        view = _VIEWS[key] = PathView(publisher_member, *slots, names=path)
        if len(_VIEWS) > _VIEW_MEMORY:
            _VIEWS.popitem(last=False)
    return view


def claimed_path(
    manifest: Membership, sec: SecBlock, record: ShareRecord, holder_vn: str
) -> tuple[str, ...] | None:
    """The VN path a key share says it travelled, or None when that cannot be a path.

    Live reconfiguration moves links, so a publication's path is not the manifest's tree:
    it is read from the share's signed split certificates. VN_1 is the publisher's edge VN
    (bound by the publisher's signature); VN_d, 1 < d < h, is the VN of the replica that
    signed the split at level d; VN_h is the holder's own. Only a majority of a VN can make
    a verifier adopt a path (see :class:`PathVote`), so a Byzantine minority cannot.
    """
    h = record.level
    if h < 1 or len(record.certs) != h:
        return None
    splitters = [cert.splitter for cert in record.certs[1:]]
    path = vn_path(sec.vn, splitters, holder_vn, manifest.owner)
    if path is None or any(vn not in manifest.members for vn in path):
        return None
    return path


def vn_path(
    first_vn: str,
    splitters: Sequence[str],
    holder_vn: str,
    owner: Callable[[str], str | None],
) -> tuple[str, ...] | None:
    """The VN path a share says it travelled, from who split it at each level below the
    publisher (``splitters``, level 1 first), or None when that cannot be a path: VN_1 is
    the publisher's edge VN (``first_vn``) and must be the first splitter's, VN_j for
    1 < j <= m the j-th splitter's VN (``owner``), VN_{m+1} the share's holder
    (``holder_vn``); no VN twice."""
    path = [first_vn]
    for depth, splitter in enumerate(splitters, 1):
        vn = owner(splitter)
        if vn is None or (depth == 1 and vn != first_vn):
            return None
        if depth > 1:
            path.append(vn)
    if splitters:
        path.append(holder_vn)
    elif holder_vn != first_vn:
        return None
    if len(set(path)) != len(path):
        return None
    return tuple(path)


@dataclass
class PathVote:
    """Which path the shares of one key epoch travelled, by the senders that vouch for it.

    A verifier adopts a path once a majority of the sending VN's replicas (or the publisher
    itself, at the edge) delivered shares that claim it. Honest replicas are a majority and
    all claim the true path; the shares that claim any other fail verification against it.
    """

    votes: dict[tuple[str, ...], set[str]] = field(default_factory=dict)

    def offer(
        self,
        manifest: Membership,
        sec: SecBlock,
        record: ShareRecord,
        sender: str,
        holder_vn: str,
    ) -> tuple[str, ...] | None:
        """Count ``sender``'s claim; the path once it has a majority, else None."""
        path = claimed_path(manifest, sec, record, holder_vn)
        return None if path is None else self.vouch(manifest, path, sender)

    def vouch(
        self, manifest: Membership, path: tuple[str, ...], sender: str
    ) -> tuple[str, ...] | None:
        """Count ``sender``'s claim of an already read ``path``; the path once it has a
        majority, else None."""
        voters = self.votes.setdefault(path, set())
        voters.add(sender)
        vn = manifest.owner(sender)
        needed = 1 if vn is None else len(manifest.members[vn]) // 2 + 1
        return path if len(voters) >= needed else None


@dataclass
class PathShares:
    """The shares of one key epoch that claim one path, and their reconstruction state."""

    view: PathView
    shares: list[tuple[str, ShareRecord]] = field(default_factory=list)
    verifier: ChainVerifier | None = None
    audited: bool = False
    quick: ChainVerifier | None = None
    tried: int = 0  # shares seen by the last quick pass
    checked: bool = False  # the complete set was looked at by a quick pass
    # node -> the r of its split, from the shares so far (the first ``widths_of`` of them)
    widths: dict[tuple[int, ...], int] = field(default_factory=dict)
    widths_of: int = 0
    total: int | None = None  # the leaves those splits make (None: one not known yet)
    # the quick pass over the complete set (no seal checked), kept for the clean check
    clean: Reconstruction | None = None


class PassRecovery(Protocol):
    """Recovers an epoch key from shares by the pass (:class:`security.pass_keys.PassKeys`,
    which imports this module)."""

    def recover(
        self, keys: KeyAssembly, manifest: Membership, holder_vn: str, *, audit: bool
    ) -> None: ...


@dataclass
class KeyAssembly:
    """A subscriber's shares of one key epoch, until the key is recovered.

    An epoch's shares normally travel one path; when reconfiguration moves a link while an
    epoch is under way, some replicas of the publisher's edge VN may split along the old
    path and some along the new one, and neither set alone need be complete. The key is
    the same, so every path the edge VN's majority vouches for is tried.
    """

    publisher: str
    seq: int  # the epoch's first publication
    shares: list[tuple[str, ShareRecord]] = field(default_factory=list)
    key: bytes | None = None
    culprits: frozenset[str] = frozenset()
    sec: SecBlock | None = None
    paths: dict[tuple[str, ...], PathShares] = field(default_factory=dict)
    # key came from the quick pass (no signature checked) and no payload has opened under it
    tentative: bool = False
    # a quick-pass key failed the AES-GCM tag: verify every seal from now on
    distrust: bool = False
    # the manifest the path views were built from (a new version rebuilds them)
    _manifest: Membership | None = None
    _vote: PathVote = field(default_factory=PathVote)
    _claims: dict[tuple[str, ...], list[tuple[str, ShareRecord]]] = field(default_factory=dict)
    _classified: int = 0
    # the epoch's shares travel by the pass: who recovers its key from them, and where
    passes: PassRecovery | None = None
    _holder_vn: str | None = None
    # record-form shares held, and the bytes charged to each relay (RecordAllowance)
    _held: set[tuple[str, ShareRecord]] = field(default_factory=set)
    charges: dict[str, int] = field(default_factory=dict)
    # told of new culprits as they are proven (a client keeps its log to a culprit's first
    # blames); None: each is logged here
    on_culprits: Callable[[KeyAssembly, frozenset[str], str], None] | None = None

    def report(self, culprits: frozenset[str], when: str = "") -> None:
        """Add ``culprits``, brokers a bad share proves at fault; the new ones are told
        (``when``: a note for the log, e.g. that the key was known first)."""
        new = culprits - self.culprits
        if not new:
            return
        self.culprits = self.culprits | new
        if self.on_culprits is not None:
            self.on_culprits(self, new, when)
        else:
            log.warning(
                "publication %s/%d: bad shares from %s%s",
                self.publisher,
                self.seq,
                ", ".join(sorted(new)),
                when,
            )

    def add(self, sender: str, record: ShareRecord) -> bool:
        """Hold ``record`` as ``sender`` relayed it; False if it already was (a resumed
        session is handed its last shares again)."""
        held = (sender, record)
        if held in self._held:
            return False
        self._held.add(held)
        self.shares.append(held)
        return True

    def recover(self, manifest: Membership, holder_vn: str, *, audit: bool = True) -> bytes | None:
        """Sort new shares by the path they claim, then try every path a majority of the
        edge VN vouches for; the key once one of them reconstructs it.

        ``audit=False``: skip the audit of a complete path once the key is known (the
        caller runs it later, e.g. after handing out the deliveries the key opens, so
        the audit's signature checks are not on the delivery's critical path)."""
        if self.sec is None:
            return self.key
        if self.passes is not None:
            self._manifest, self._holder_vn = manifest, holder_vn
            self.passes.recover(self, manifest, holder_vn, audit=audit)
            return self.key
        if manifest is not self._manifest:
            if self._manifest is not None:
                for held, shares in self.paths.items():
                    view = path_view(manifest, self.publisher, self.sec, held)
                    self.paths[held] = PathShares(view, shares.shares)
            self._manifest = manifest
        for sender, record in self.shares[self._classified :]:
            claim = claimed_path(manifest, self.sec, record, holder_vn)
            if claim is None:
                continue
            self._claims.setdefault(claim, []).append((sender, record))
            if claim not in self.paths and self._vote.vouch(manifest, claim, sender):
                view = path_view(manifest, self.publisher, self.sec, claim)
                self.paths[claim] = PathShares(view, self._claims[claim])
        self._classified = len(self.shares)
        for path in self.paths.values():
            self._try(path, audit=audit)
        return self.key

    def _try(self, path: PathShares, *, audit: bool = True) -> None:
        """Reconstruct along one path once enough of its shares are in.

        First a quick pass that checks structure, digest links and commitments but no
        signature: the AES-GCM tag of the payload is the final check of the key it gives
        (:meth:`open` falls back to a verified pass when it fails). Once every expected
        share has arrived, the quick pass runs once more over all of them: when it finds
        nothing wrong (no blame, one key, the same), the audit is done without a signature
        check, except for one epoch in :data:`AUDIT_ONE_IN` picked at random. Otherwise
        an audit verifies every seal (each batch root once per process) and attributes
        every bad share, even if the key came earlier.

        Why skipping the seals of a clean epoch loses no blame: blame needs a fault the
        hashes show. A forged certificate states something its splitter did not sign, so
        the others' copies of the same split show a second version (or the opening under
        it fails a commitment above), and the audit runs; the only forgery hashes cannot
        see yields the same key from openings that match every commitment (a genuine
        statement under a broken seal, say), and changes nothing a subscriber uses. The
        random audits name a broker that does that persistently.
        """
        if path.audited:
            return  # (checked first: the subscriber tries each epoch on every pass)
        shares = path.shares
        view = path.view
        # Each read adds a few shares to an epoch: count the splits they show, not all again.
        widths = path.widths
        if path.widths_of < len(shares):
            known = len(widths)
            for _, record in shares[path.widths_of :]:
                for cert in record.certs:
                    if widths.setdefault(cert.node, cert.r) != cert.r:
                        widths[cert.node] = cert.r
                        known = -1
            path.widths_of = len(shares)
            if known != len(widths):
                path.total = _leaves_below((), widths, view.depth)
        total = path.total
        if self.key is not None and (total is None or len(shares) < total):
            return
        needed = math.prod(threshold_for(min(rs)) for rs in view.sizes)
        if len(shares) < needed:
            return
        complete = total is not None and len(shares) >= total
        if not complete and not _enough(shares, view):
            return
        pub_id = publication_id(self.publisher, self.seq)
        if self.key is None and not self.distrust and path.tried < len(shares):
            path.tried = len(shares)
            path.quick = path.quick or ChainVerifier(view, seals="none")
            try:
                quick = reconstruct(shares, view, pub_id, verifier=path.quick, complete=complete)
            except PropagationError:
                quick = None
            if complete:
                # The same pass over the same shares as the clean check below: run it once.
                path.clean = quick
            if quick is not None and quick.key is not None:
                self.key = quick.key
                self.tentative = True
        if self.key is not None and (not complete or not audit):
            return
        if self.key is not None and not self.distrust and not path.checked:
            path.checked = True
            path.quick = path.quick or ChainVerifier(view, seals="none")
            clean = path.clean
            if clean is None or path.tried != len(shares):
                try:
                    clean = reconstruct(shares, view, pub_id, verifier=path.quick, complete=True)
                except PropagationError:
                    clean = None
            if (
                clean is not None
                and not clean.blame
                and clean.key == self.key
                and _draw.randrange(AUDIT_ONE_IN) != 0
            ):
                path.audited = True
                # Caches of a finished epoch: a subscriber keeps thousands of epochs, and
                # every object they hold is scanned again by each full garbage collection.
                path.quick = None
                path.clean = None
                return
        # No key from the quick pass (forged certificates can make it ambiguous), or the
        # wait is over: the verified pass.
        path.verifier = path.verifier or ChainVerifier(view)
        try:
            result = reconstruct(shares, view, pub_id, verifier=path.verifier, complete=complete)
        except PropagationError as exc:
            if complete:
                log.warning("reconstruction of %s/%d failed: %s", self.publisher, self.seq, exc)
            return
        path.audited = complete
        path.clean = None
        self.report(result.culprits)
        if result.key is not None and (self.key is None or self.tentative):
            self.key = result.key
            self.tentative = False

    def open(self, seq: int, attrs: Mapping[str, AttributeValue], sealed: bytes) -> bytes | None:
        """The plaintext of publication ``seq``, once the key is known and the tag checks."""
        if self.key is None:
            return None
        try:
            return open_sealed(self.key, publication_id(self.publisher, seq), attrs, sealed)
        except EnvelopeError:
            if not self.tentative:
                return None
        # The quick pass was fooled (forged certificates): verify every seal and try again.
        self.key = None
        self.tentative = False
        self.distrust = True
        if self.passes is not None:
            if self._manifest is not None and self._holder_vn is not None:
                self.passes.recover(self, self._manifest, self._holder_vn, audit=True)
            return self.open(seq, attrs, sealed) if self.key is not None else None
        for path in self.paths.values():
            path.audited = False
            self._try(path)
        return self.open(seq, attrs, sealed) if self.key is not None else None


RECORD_BUDGET = 64 << 20
"""Bytes of record-form key shares (:func:`record_cost`) one relay may have a subscriber hold,
over every epoch it keeps."""

RECORD_OVERHEAD = 160
"""Bytes a held record is charged beyond its fields (objects, tuple, list and set slots)."""

CERT_OVERHEAD = 200
"""Bytes a certificate is charged beyond its commitments, proof and signature."""


def record_cost(record: ShareRecord) -> int:
    """What holding ``record`` is charged: its fields and every certificate above it. A
    certificate several records name is charged to each (a bound, not a measurement: 3
    VNs of 3 replicas charge about 1.1 kB per leaf, 40 MB for the 4,096 epochs a client
    keeps, within :data:`RECORD_BUDGET`)."""
    cost = RECORD_OVERHEAD + len(record.pub_id) + len(record.salt) + len(record.data)
    for cert in record.certs:
        cost += CERT_OVERHEAD + len(cert.pub_id) + len(cert.signature) + len(cert.parent)
        cost += 32 * (len(cert.commitments) + len(cert.proof))
    return cost


class RecordAllowance:
    """The record-form shares each relay has a subscriber hold, in bytes, over all epochs.

    A subscriber keeps an epoch's shares until the epoch is let go (the client keeps 4,096),
    and took every record a relay sent: one relay repeating records for an epoch, or
    forging new ones, grew that epoch's assembly without bound (until 2026-12-02; the pass
    form's leaves were bounded per relay since 2026-11-29). Past :data:`RECORD_BUDGET` a
    relay's further records are refused and counted (:attr:`refused`); the other relays'
    shares still give the key (``k`` of every split suffice), and :meth:`release` frees
    an epoch's charges once the client lets it go."""

    def __init__(self, budget: int = RECORD_BUDGET) -> None:
        self._budget: CopyBudget[str, ShareRecord] = CopyBudget(budget, record_cost)
        self.refused: dict[str, int] = {}

    @property
    def budget(self) -> int:
        return self._budget.limit

    @budget.setter
    def budget(self, limit: int) -> None:
        self._budget.limit = limit

    def take(self, assembly: KeyAssembly, relay: str, record: ShareRecord) -> bool:
        """Hold ``record`` in ``assembly`` if ``relay`` has room; True if it was taken
        (False: refused, or held already)."""
        cost = record_cost(record)
        if not self._budget.take(relay, cost):
            refused = self.refused[relay] = self.refused.get(relay, 0) + 1
            if refused == 1:
                log.warning(
                    "relay %s has key shares of %d bytes held here (at most %d): its "
                    "further record-form shares are refused",
                    relay,
                    self.charged(relay),
                    self.budget,
                )
            return False
        if not assembly.add(relay, record):
            self._budget.give_back(relay, cost)
            return False
        assembly.charges[relay] = assembly.charges.get(relay, 0) + cost
        return True

    def release(self, assembly: KeyAssembly) -> None:
        """``assembly``'s epoch is let go: what it held no longer counts."""
        for relay, cost in assembly.charges.items():
            self._budget.give_back(relay, cost)
        assembly.charges.clear()

    def charged(self, relay: str) -> int:
        """Bytes of ``relay``'s shares held now."""
        return self._budget.charged.get(relay, 0)


def _enough(shares: list[tuple[str, ShareRecord]], view: PathView) -> bool:
    """Whether the leaves' lineages alone leave k children at every level up to the root,
    k as each node's certificate states it (a cheap test before a reconstruction pass)."""
    ready: set[tuple[int, ...]] = {record.lineage for _, record in shares}
    ks = {cert.node: cert.k for _, record in shares for cert in record.certs}
    for level in range(view.depth, 0, -1):
        counts: dict[tuple[int, ...], int] = {}
        for lineage in ready:
            if len(lineage) == level:
                parent = lineage[:-1]
                counts[parent] = counts.get(parent, 0) + 1
        ready = {node for node, n in counts.items() if n >= ks.get(node, n + 1)}
    return () in ready


def _leaves_below(
    node: tuple[int, ...], widths: Mapping[tuple[int, ...], int], depth: int
) -> int | None:
    """The leaves under ``node`` given the r of each split (None: a split not known yet)."""
    if len(node) == depth:
        return 1
    r = widths.get(node)
    if r is None:
        return None
    total = 0
    for j in range(r):
        below = _leaves_below((*node, j), widths, depth)
        if below is None:
            return None
        total += below
    return total
