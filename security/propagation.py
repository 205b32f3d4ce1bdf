"""Iterative share propagation across virtual nodes, and robust, blaming reconstruction (SPEC §3).

Vocabulary. A publication travels along a path of virtual nodes VN_1 .. VN_h; VN_d has r_d
replicas and threshold k_d = floor((r_d - 1) / 2) + 1. Its key K is the root of a tree of
shares: the publisher splits K with (k_1, r_1) and sends share j to replica j of VN_1; a replica
of VN_d that holds a share re-splits it with (k_{d+1}, r_{d+1}) and sends sub-share j to replica
j of VN_{d+1}; replicas of VN_h hand their shares to the subscriber, which thus gets up to
prod(r_d) *leaves*. A share is named by its *lineage*: the replica index (0-based; Shamir x =
index + 1) at every level, so replica j of VN_d holds exactly the shares whose lineage ends in j.
The share with lineage p is a *node*; the broker holding it is ``holder(p)``, and when it splits
p it is the *splitter* of p (the publisher splits the root ``()``).

Commitments. What is shared at every level is the parent's *opening* ``salt || data`` (the root
shares K itself), and every split is published as a :class:`SplitCert`: a statement (publication
id, node, k, r, splitter id, SHA-256 commitments of the r child openings, digest of the parent
certificate) under the splitter's Ed25519 signature. A record carries the certificates of all its
ancestors' splits, so any reconstructed value can be checked against the commitment its own
splitter's parent signed, at every level. The 16-byte random salt keeps a commitment hiding even
to colluders who hold other shares of the same split; sharing the salt onward (it is part of the
opening) lets the subscriber recompute it.

Amortised signatures. A splitter does not sign each certificate: it collects every split it
makes in one batch (a broker: one event-loop flush; :class:`CertBatch`), builds a Merkle tree
over the statements, and signs the root once; each certificate carries its position, the batch
size and its Merkle path (:class:`SplitCert` ``position``, ``count``, ``proof``). Verifiers cache
verified roots (:class:`SealCache`), so a batch costs one verification per receiver, whatever
the number of publications in it.

Incremental verification by vouching. A statement names its parent certificate by digest
(seal included), so a splitter's signature also vouches for the chain above it. An honest
broker checks every digest link, structure and commitment of what it receives (hashing only)
and, before it splits a share, the seal of the certificate its direct sender signed; it trusts
the seals above, which the sender vouched for. A share it only relays to a subscriber (the
last VN of a path splits nothing) has that seal checked by sample, after the write. A full
audit (:func:`reconstruct`) verifies every seal. It blames a bad seal above the newest
certificate on the signer of the certificate just below it: that broker split a share whose
certificate's seal fails without checking it, which no honest broker does. A bad seal on the
newest certificate proves nothing to the subscriber (the holder that relayed it, or the
splitter, may have forged it): the record is set aside and nobody is named
(:data:`UNPROVEN`); the relaying broker's sampled check names the splitter first-hand.

Robust reconstruction (:func:`reconstruct`) works bottom-up in time linear in the number of
leaves times the split width: a node's candidate value is the Shamir combination of those
children whose recovered values match the commitments of a certificate of that node, and extra
matching children must agree with it. Blame is only ever laid on proof, so no honest broker is
blamed: see :class:`Fault` for each rule and why it is sound. Soundness of the delivering-replica
and silence rules assumes every honest broker runs :class:`ShareInbox` on what it receives and
re-splits only records the inbox accepted.
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple, Protocol, TypeVar

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from security import shamir
from security.envelope import Signer
from security.errors import IntegrityError

__all__ = [
    "BATCH_RECORDS",
    "CERT_WINDOW",
    "SALT_SIZE",
    "UNPROVEN",
    "BatchEntry",
    "Blame",
    "CertBatch",
    "ChainVerifier",
    "Fault",
    "LinkCertsIn",
    "LinkCertsOut",
    "Member",
    "PathView",
    "PropagationError",
    "Reconstruction",
    "Seal",
    "SealCache",
    "ShareInbox",
    "ShareRecord",
    "Split",
    "SplitCert",
    "cert_digest",
    "commitment",
    "confidentiality_free",
    "merkle_fold",
    "merkle_tree",
    "outcome",
    "pack_batch",
    "pack_record",
    "publisher_split",
    "publisher_split_unsealed",
    "publisher_split_with",
    "reconstruct",
    "recover_node",
    "resplit",
    "seal_batch",
    "seal_certs",
    "silent_senders",
    "statement_sealed",
    "threshold_for",
    "unpack_batch",
    "unpack_record",
    "with_root_cert",
    "wrong_secrets",
]

SALT_SIZE = 16
UNPROVEN = ""
"""The culprit of a record that is invalid but whose fault no one can be proven to own: an
audit sets it aside and blames nobody (:meth:`ChainVerifier.record_fault`)."""
_DIGEST_SIZE = 32
_COMMIT_DOMAIN = b"trellis/share-commitment/v1\x00"
_CERT_DOMAIN = "trellis/split-cert/v2"
_ROOT_DOMAIN = "trellis/split-batch/v2"
_LEAF_TAG = b"trellis/merkle-leaf\x00"
_NODE_TAG = b"trellis/merkle-node\x00"
_DIGEST_TAG = b"trellis/cert-digest\x00"
_sha256 = hashlib.sha256

Lineage = tuple[int, ...]
_K = TypeVar("_K")
_V = TypeVar("_V")


class PropagationError(IntegrityError):
    """Input to the propagation functions is malformed (a bug or a garbled frame)."""


def threshold_for(r: int) -> int:
    """The threshold of a VN with ``r`` replicas: k = f + 1 with f = floor((r - 1) / 2)."""
    if type(r) is not int or r < 1:
        raise PropagationError(f"replica count must be a positive int, got {r!r}")
    return (r - 1) // 2 + 1


def confidentiality_free(r: int) -> bool:
    """True when a VN of ``r`` replicas cannot keep keys from its own brokers (k = 1: r < 3)."""
    return r < 3


def commitment(opening: bytes) -> bytes:
    """The SHA-256 commitment to one share opening (``salt || data``)."""
    return hashlib.sha256(_COMMIT_DOMAIN + opening).digest()


@dataclass(frozen=True, slots=True)
class Member:
    """A broker (or the publisher) as verifiers know it: id and Ed25519 public key."""

    id: str
    public_key: Ed25519PublicKey = field(repr=False, compare=False)


@dataclass(frozen=True)
class PathView:
    """What a verifier must know about one publication's path: who may sign which split.

    Attributes:
        publisher: the publisher (signer of the root split).
        vns: the replica slots of VN_1 .. VN_h in replica-index order; replica j of VN_d holds
            the shares whose lineage ends in j at level d.
        sizes: the replica counts r a split toward VN_d may use (default: all its slots).
            Replicas attach and detach live, so splits made before and after a switch
            coexist; a split toward r replicas is for the first r slots, and each node is
            reconstructed under its own certificate's (k, r), never from a mix.
        names: the VNs' names (optional): with them, :meth:`carries` tells the splits made
            along this path from those made toward other VNs (a publication's shares can
            travel an old and a new path during a move).
    """

    publisher: Member
    vns: tuple[tuple[Member, ...], ...]
    sizes: tuple[frozenset[int], ...] = ()
    names: tuple[str, ...] = ()
    _levels: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.vns or any(not vn for vn in self.vns):
            raise PropagationError("a path needs at least one VN, each with at least one replica")
        if any(len(vn) > shamir.MAX_SHARES for vn in self.vns):
            raise PropagationError(f"a VN may have at most {shamir.MAX_SHARES} replicas")
        if not self.sizes:
            object.__setattr__(self, "sizes", tuple(frozenset({len(vn)}) for vn in self.vns))
        if len(self.sizes) != len(self.vns) or any(
            not rs or not all(1 <= r <= len(vn) for r in rs)
            for rs, vn in zip(self.sizes, self.vns, strict=False)
        ):
            raise PropagationError("each VN needs replica counts between 1 and its slots")
        if self.names and len(self.names) != len(self.vns):
            raise PropagationError("a path names each of its VNs or none")
        levels = {member.id: d for d, vn in enumerate(self.vns) for member in vn}
        object.__setattr__(self, "_levels", levels)

    @property
    def depth(self) -> int:
        """h, the number of VNs on the path."""
        return len(self.vns)

    def scheme(self, level: int) -> tuple[int, int]:
        """(k, r) of a split toward every slot of VN_``level`` (1-based VN index)."""
        r = max(self.sizes[level - 1])
        return threshold_for(r), r

    def allows(self, level: int, k: int, r: int) -> bool:
        """Whether a split whose children live at ``level`` (1-based) may use (k, r)."""
        return r in self.sizes[level - 1] and k == threshold_for(r)

    def steady(self, level: int) -> tuple[Member, ...]:
        """The replicas of VN_``level`` under every allowed count (those that always hold
        a share of what reaches the VN)."""
        return self.vns[level - 1][: min(self.sizes[level - 1])]

    def carries(self, splitter: str, toward: str, level: int) -> bool:
        """Whether ``splitter``'s split of a node at ``level`` (its lineage's length) toward
        VN ``toward`` is one made along this path: the children live on the path's VN at
        that level and, below the root, the splitter is a replica of the VN above (a view
        without names cannot check ``toward``)."""
        if level >= len(self.vns) or (self.names and self.names[level] != toward):
            return False
        return level == 0 or self._levels.get(splitter) == level - 1

    def splitter(self, node: Lineage) -> Member:
        """The broker entitled to split ``node`` (the publisher for the root)."""
        return self.publisher if not node else self.vns[len(node) - 1][node[-1]]

    def holder(self, lineage: Lineage) -> Member:
        """The replica that holds the share with this (non-empty) lineage."""
        return self.vns[len(lineage) - 1][lineage[-1]]


@dataclass(frozen=True, slots=True)
class SplitCert:
    """A splitter's certified statement of one split: the commitments to all r child openings.

    The statement is (pub_id, node, k, r, splitter, commitments, parent); ``signature`` signs
    the Merkle root of the batch of statements the splitter certified together, and
    ``position``, ``count`` and ``proof`` place this statement in that batch. Two different
    statements validly sealed for the same (publication, node) prove that the splitter
    equivocated.
    """

    pub_id: bytes
    node: Lineage
    k: int
    r: int
    splitter: str
    commitments: tuple[bytes, ...]
    signature: bytes
    parent: bytes = b""
    position: int = 0
    count: int = 1
    proof: tuple[bytes, ...] = ()
    # Certificates are dictionary keys in every verifier cache and travel with every share
    # below them: the hash is computed once, not on each lookup.
    _hash: int = field(init=False, repr=False, compare=False)
    # The statement's canonical bytes, packed on first use: the splitter's seal, a
    # receiver's seal check and the digest its children name all need them.
    _signed: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        seal = (self.signature, self.position, self.count, self.proof)
        object.__setattr__(self, "_hash", hash((self.statement, seal)))

    def __hash__(self) -> int:
        return self._hash

    def signed_bytes(self) -> bytes:
        """The canonical msgpack bytes of the statement (a leaf of the batch's Merkle tree)."""
        signed = self._signed
        if signed is None:
            signed = _cert_bytes(
                self.pub_id,
                self.node,
                self.k,
                self.r,
                splitter=self.splitter,
                commitments=self.commitments,
                parent=self.parent,
            )
            object.__setattr__(self, "_signed", signed)
        return signed

    def sealed_as(self, seal: Seal) -> SplitCert:
        """This statement under ``seal`` (its packed statement carried over)."""
        cert = SplitCert(
            self.pub_id,
            self.node,
            self.k,
            self.r,
            self.splitter,
            self.commitments,
            seal.signature,
            self.parent,
            seal.position,
            seal.size,
            seal.proof,
        )
        object.__setattr__(cert, "_signed", self._signed)
        return cert

    @property
    def statement(self) -> tuple[object, ...]:
        """What the splitter states, without the seal: versions of a split compare on this."""
        return (
            self.pub_id,
            self.node,
            self.k,
            self.r,
            self.splitter,
            self.commitments,
            self.parent,
        )


def _cert_bytes(
    pub_id: bytes,
    node: Lineage,
    k: int,
    r: int,
    *,
    splitter: str,
    commitments: Sequence[bytes],
    parent: bytes,
) -> bytes:
    return msgpack.packb(
        [_CERT_DOMAIN, pub_id, list(node), k, r, splitter, list(commitments), parent],
        use_bin_type=True,
    )


def cert_digest(cert: SplitCert) -> bytes:
    """The digest a child statement names its parent certificate by (seal included)."""
    return _sha256(
        _DIGEST_TAG
        + cert.signed_bytes()
        + msgpack.packb([cert.signature, cert.position, cert.count, list(cert.proof)])
    ).digest()


def _leaf_hash(statement: bytes) -> bytes:
    return _sha256(_LEAF_TAG + statement).digest()


def merkle_tree(leaves: Sequence[bytes]) -> tuple[bytes, list[tuple[bytes, ...]]]:
    """The root over leaf hashes and each leaf's proof (sibling hashes, bottom up).

    A level with an odd count carries its last node up unchanged, so the shape (and which
    levels have a sibling) follows from the position and the count alone.
    """
    if not leaves:
        raise PropagationError("a Merkle tree needs at least one leaf")
    level = list(leaves)
    proofs: list[list[bytes]] = [[] for _ in leaves]
    # members[i]: the leaves under node i of the current level
    members: list[list[int]] = [[i] for i in range(len(leaves))]
    while len(level) > 1:
        up: list[bytes] = []
        up_members: list[list[int]] = []
        for i in range(0, len(level) - 1, 2):
            left, right = level[i], level[i + 1]
            for leaf in members[i]:
                proofs[leaf].append(right)
            for leaf in members[i + 1]:
                proofs[leaf].append(left)
            up.append(_sha256(_NODE_TAG + left + right).digest())
            up_members.append(members[i] + members[i + 1])
        if len(level) % 2:
            up.append(level[-1])
            up_members.append(members[-1])
        level, members = up, up_members
    return level[0], [tuple(p) for p in proofs]


def merkle_fold(leaf: bytes, position: int, count: int, proof: Sequence[bytes]) -> bytes | None:
    """The root ``proof`` leads to from ``leaf`` at ``position`` of ``count``; None when the
    proof has the wrong length for that position."""
    if not 0 <= position < count:
        return None
    node, p, n, used = leaf, position, count, 0
    while n > 1:
        if p ^ 1 < n:
            if used >= len(proof):
                return None
            sibling = proof[used]
            used += 1
            pair = sibling + node if p & 1 else node + sibling
            node = _sha256(_NODE_TAG + pair).digest()
        p >>= 1
        n = (n + 1) >> 1
    return node if used == len(proof) else None


def _root_message(splitter: str, count: int, root: bytes) -> bytes:
    return msgpack.packb([_ROOT_DOMAIN, splitter, count, root], use_bin_type=True)


class SealCache:
    """Batch roots already verified, by (public key, signer, count, root, signature):
    positives only.

    Shared by every verifier of a process, so a batch covering many publications is verified
    once, not once per publication or share. Bounded: the oldest entries are dropped.
    """

    def __init__(self, size: int = 1 << 16) -> None:
        self.size = size
        self._ok: dict[tuple[bytes, str, int, bytes, bytes], None] = {}
        self.verified = 0  # Ed25519 verifications actually run (for benchmarks)

    def check(
        self, key: Ed25519PublicKey, splitter: str, count: int, root: bytes, sig: bytes
    ) -> bool:
        """Whether ``sig`` is ``splitter``'s signature over the batch root."""
        # The signer's id is part of what was signed: a hit under another id is no proof.
        entry = (key.public_bytes_raw(), splitter, count, root, sig)
        if entry in self._ok:
            return True
        self.verified += 1
        try:
            key.verify(sig, _root_message(splitter, count, root))
        except InvalidSignature:
            return False
        ok = self._ok
        if len(ok) >= self.size:
            for stale in list(ok)[: self.size // 4]:
                del ok[stale]
        ok[entry] = None
        return True


DEFAULT_SEALS = SealCache()
_UNSEEN = "unseen"


class Seal(NamedTuple):
    """Where one statement sits in a sealed batch: the batch signature, the statement's
    position, the batch size (a certificate's ``count``) and its Merkle path."""

    signature: bytes
    position: int
    size: int
    proof: tuple[bytes, ...]


def seal_certs(
    certs: Sequence[SplitCert], signer: Signer, extra: Sequence[bytes] = ()
) -> list[SplitCert]:
    """Seal statements together: one signature over their Merkle root, a path for each.

    ``extra``: other statements (canonical bytes, domain-tagged by their own first field)
    sealed under the same signature after the certificates; :func:`seal_batch` returns
    their seals too.
    """
    return seal_batch(certs, signer, extra)[0]


def seal_batch(
    certs: Sequence[SplitCert], signer: Signer, extra: Sequence[bytes] = ()
) -> tuple[list[SplitCert], list[Seal]]:
    """:func:`seal_certs` that also returns the seal of each ``extra`` statement: a
    publisher seals its root split and the publication that carries it with one signature,
    and an edge replica verifies that signature once (:class:`SealCache`) for both."""
    leaves = [_leaf_hash(cert.signed_bytes()) for cert in certs]
    leaves.extend(_leaf_hash(statement) for statement in extra)
    root, proofs = merkle_tree(leaves)
    count = len(leaves)
    signature = signer.sign(_root_message(signer.id, count, root))
    sealed = [cert.sealed_as(Seal(signature, i, count, proofs[i])) for i, cert in enumerate(certs)]
    seals = [Seal(signature, i, count, proofs[i]) for i in range(len(certs), len(leaves))]
    return sealed, seals


def statement_sealed(
    key: Ed25519PublicKey,
    signer: str,
    statement: bytes,
    seal: Seal,
    cache: SealCache | None = None,
) -> bool:
    """Whether ``statement`` is in a batch ``signer`` sealed (its Merkle path leads to a
    root the signature covers); the root check goes through ``cache`` (default: the
    process-wide one), so a batch already verified for a certificate costs no signature."""
    root = merkle_fold(_leaf_hash(statement), seal.position, seal.size, seal.proof)
    if root is None:
        return False
    return (DEFAULT_SEALS if cache is None else cache).check(
        key, signer, seal.size, root, seal.signature
    )


@dataclass(frozen=True, slots=True)
class ShareRecord:
    """One share of a publication's key in flight, with everything needed to verify it.

    Attributes:
        pub_id: the publication id.
        lineage: replica index at every level so far (len = the VN level of the holder).
        certs: certs[d] is the split of ``lineage[:d]``; one per level.
        salt: this share's commitment salt.
        data: the Shamir share (of the parent's opening, or of K at level 1).
    """

    pub_id: bytes
    lineage: Lineage
    certs: tuple[SplitCert, ...]
    salt: bytes
    data: bytes

    @property
    def level(self) -> int:
        """The VN level of the replica that holds this share (1 = the publisher's edge VN)."""
        return len(self.lineage)

    @property
    def schemes(self) -> tuple[tuple[int, int], ...]:
        """(k, r) used at every level, from the publisher's split down."""
        return tuple((cert.k, cert.r) for cert in self.certs)

    @property
    def opening(self) -> bytes:
        """``salt || data``: what the commitment covers and what the next split shares."""
        return self.salt + self.data

    def with_cert(self, cert: SplitCert) -> ShareRecord:
        """This share with its newest certificate replaced (by its sealed form)."""
        return _record(self.pub_id, self.lineage, (*self.certs[:-1], cert), self.salt, self.data)


_new_object = object.__new__
_set_pub_id, _set_lineage, _set_certs, _set_salt, _set_data = (
    ShareRecord.__dict__[name].__set__ for name in ("pub_id", "lineage", "certs", "salt", "data")
)


def _record(
    pub_id: bytes, lineage: Lineage, certs: tuple[SplitCert, ...], salt: bytes, data: bytes
) -> ShareRecord:
    """A :class:`ShareRecord` without the frozen dataclass ``__init__`` (one
    ``object.__setattr__`` call per field): every hop builds several per share, and the
    class does no checks of its own (:class:`ChainVerifier` checks records)."""
    record = _new_object(ShareRecord)
    _set_pub_id(record, pub_id)
    _set_lineage(record, lineage)
    _set_certs(record, certs)
    _set_salt(record, salt)
    _set_data(record, data)
    return record


def _split_node(
    secret: bytes,
    pub_id: bytes,
    node: Lineage,
    parent_certs: tuple[SplitCert, ...],
    *,
    k: int,
    r: int,
    splitter: str,
) -> list[ShareRecord]:
    """Split ``secret`` with an unsealed certificate (empty signature)."""
    shares = shamir.split(secret, k, r)
    salts = os.urandom(SALT_SIZE * r)
    openings = [
        (salts[j * SALT_SIZE : (j + 1) * SALT_SIZE], share.data) for j, share in enumerate(shares)
    ]
    commitments = tuple(commitment(salt + data) for salt, data in openings)
    parent = cert_digest(parent_certs[-1]) if parent_certs else b""
    cert = SplitCert(pub_id, node, k, r, splitter, commitments, b"", parent)
    certs = (*parent_certs, cert)
    return [
        _record(pub_id, (*node, j), certs, salt, data) for j, (salt, data) in enumerate(openings)
    ]


def _with_last_cert(records: list[ShareRecord], cert: SplitCert) -> list[ShareRecord]:
    return [rec.with_cert(cert) for rec in records]


class CertBatch:
    """Splits one signer made since the last :meth:`seal`: one signature for all of them.

    :meth:`split` returns records whose newest certificate is unsealed; :meth:`seal` signs
    the batch's Merkle root and :meth:`sealed` swaps the sealed certificate into a record.
    """

    def __init__(self, signer: Signer) -> None:
        self.signer = signer
        self._pending: dict[SplitCert, SplitCert | None] = {}
        self.signatures = 0

    def __len__(self) -> int:
        return len(self._pending)

    def split(self, record: ShareRecord, k_next: int, r_next: int) -> list[ShareRecord]:
        """Re-split a held (and accepted) share, certificate to be sealed with the batch."""
        _check_scheme(k_next, r_next)
        subs = _split_node(
            record.opening,
            record.pub_id,
            record.lineage,
            record.certs,
            k=k_next,
            r=r_next,
            splitter=self.signer.id,
        )
        self._pending[subs[0].certs[-1]] = None
        return subs

    def seal(self) -> dict[SplitCert, SplitCert]:
        """Sign every pending certificate (one signature); unsealed -> sealed. Empties."""
        pending = list(self._pending)
        self._pending = {}
        if not pending:
            return {}
        self.signatures += 1
        return dict(zip(pending, seal_certs(pending, self.signer), strict=True))


def _check_scheme(k: int, r: int) -> None:
    if type(r) is not int or not 1 <= r <= shamir.MAX_SHARES:
        raise PropagationError(f"r must be an int in 1..{shamir.MAX_SHARES}, got {r!r}")
    if k != threshold_for(r):
        raise PropagationError(f"k must be threshold_for({r}) = {threshold_for(r)}, got {k!r}")


def publisher_split(key: bytes, k: int, n: int, signer: Signer, pub_id: bytes) -> list[ShareRecord]:
    """The publisher's split of ``key`` for its edge VN of ``n`` replicas.

    Record j goes to replica j. ``k`` must equal ``threshold_for(n)``: any other threshold
    would break either confidentiality or robustness, so it is rejected rather than honoured.
    """
    records, _ = publisher_split_with(key, k, n, signer, pub_id, ())
    return records


def publisher_split_unsealed(
    key: bytes, k: int, n: int, signer: str, pub_id: bytes
) -> list[ShareRecord]:
    """:func:`publisher_split` with the root certificate not sealed yet: the publisher
    seals it with the publications of its pass (:func:`seal_batch`) and swaps it in with
    :func:`with_root_cert`."""
    _check_scheme(k, n)
    return _split_node(bytes(key), bytes(pub_id), (), (), k=k, r=n, splitter=signer)


def with_root_cert(records: list[ShareRecord], cert: SplitCert) -> list[ShareRecord]:
    """The records of a split with their (newest) certificate replaced by its sealed form."""
    return _with_last_cert(records, cert)


def publisher_split_with(
    key: bytes, k: int, n: int, signer: Signer, pub_id: bytes, extra: Sequence[bytes]
) -> tuple[list[ShareRecord], list[Seal]]:
    """:func:`publisher_split` sealed under one signature with the ``extra`` statements
    (the publication that opens the key epoch): one signature instead of two, and one
    verification at each edge replica."""
    _check_scheme(k, n)
    records = _split_node(bytes(key), bytes(pub_id), (), (), k=k, r=n, splitter=signer.id)
    (cert,), seals = seal_batch([records[0].certs[-1]], signer, extra)
    return _with_last_cert(records, cert), seals


def resplit(record: ShareRecord, k_next: int, r_next: int, signer: Signer) -> list[ShareRecord]:
    """Re-split a held (and accepted) share for the next VN of ``r_next`` replicas, sealed
    at once (a batch of one; brokers batch with :class:`CertBatch`).

    Sub-share j goes to replica j of the next VN. The signer must be the record's holder; only
    records a :class:`ShareInbox` accepted should be re-split, or an honest broker could be
    blamed for forwarding garbage.
    """
    batch = CertBatch(signer)
    subs = batch.split(record, k_next, r_next)
    (cert,) = batch.seal().values()
    return _with_last_cert(subs, cert)


class Fault(StrEnum):
    """Why a broker is blamed; every rule holds only on proof, so honest brokers are never named.

    BAD_SHARE: it sent a record whose chain or opening does not verify (honest brokers verify
        before forwarding, and shares come over authenticated links), or it signed a statement
        naming a parent certificate whose seal fails (it split without checking).
    WRONG_SENDER: it sent a share it neither split nor holds (misrouted or relayed).
    DUPLICATE: it sent two different records for the same lineage.
    EQUIVOCATION: it sealed two different statements for the same split (evidence attached).
    INCONSISTENT_SPLIT: it committed to child openings that lie on no polynomial of degree k-1.
    WRONG_SECRET: the value its committed children reconstruct is not the share it was given.
    SHORT_SPLIT: it signed a split of which fewer than r - f children could be recovered, which
        an honest splitter's honest receivers always provide.
    SILENT: it sent nothing at all for the publication, though every honest broker on the
        path holds at least one valid share (when each VN has at most f Byzantine replicas).
    """

    BAD_SHARE = "bad_share"
    WRONG_SENDER = "wrong_sender"
    DUPLICATE = "duplicate"
    EQUIVOCATION = "equivocation"
    INCONSISTENT_SPLIT = "inconsistent_split"
    WRONG_SECRET = "wrong_secret"
    SHORT_SPLIT = "short_split"
    SILENT = "silent"


@dataclass(frozen=True, slots=True)
class Blame:
    """One attributed misbehaviour.

    Attributes:
        broker: id of the broker (or publisher) at fault.
        fault: what it did.
        node: the lineage concerned (() when not tied to one share).
        detail: human-readable explanation for logs.
        evidence: certificates that prove the fault, when there are any.
    """

    broker: str
    fault: Fault
    node: Lineage = ()
    detail: str = ""
    evidence: tuple[SplitCert, ...] = ()


class ChainVerifier:
    """Checks records against a path: structure, digest links, commitments and seals.

    ``seals`` says which seals are verified: ``"all"`` (an audit; a bad seal above the last
    is blamed on the signer who vouched for it), ``"last"`` (a broker: the seal of its direct
    sender's certificate; the sender vouched for the ones above) or ``"none"`` (a subscriber's
    quick pass for the key, which the AES-GCM tag then checks; never a basis for blame).
    Seal checks go through a :class:`SealCache`, so one batch root costs one verification.

    ``prefixes``: remember the verdict on the levels above each share, per chain and
    lineage. A subscriber gets r shares below every split of the last VN, so it checks
    each chain once instead of r times; a broker gets one share per chain (keep False).
    """

    def __init__(
        self,
        path: PathView,
        *,
        seals: str = "all",
        cache: SealCache | None = None,
        prefixes: bool = True,
    ) -> None:
        if seals not in ("all", "last", "none"):
            raise PropagationError(f"seals must be all, last or none, got {seals!r}")
        self.path = path
        self.seals = seals
        self.cache = DEFAULT_SEALS if cache is None else cache
        self._seal_ok: dict[SplitCert, bool] = {}
        # Checked once per distinct certificate and record: many records share certificates,
        # and a subscriber's assembly looks at the same records on every pass.
        self._shapes: dict[SplitCert, str | None] = {}
        self._digests: dict[SplitCert, bytes] = {}
        self._records: dict[
            tuple[int, bytes | None], tuple[ShareRecord, tuple[str, str | None] | None]
        ] = {}
        self._prefixes: dict[tuple[tuple[SplitCert, ...], Lineage, bytes], str | None] | None
        self._prefixes = {} if prefixes else None

    def cert_problem(
        self, cert: SplitCert, pub_id: bytes, node: Lineage, parent: bytes | None = None
    ) -> str | None:
        """Why ``cert`` is not a valid certificate for splitting ``node``, or None.

        ``parent``: the digest the statement must name (None: not checked). The seal is
        checked here whatever the verifier's mode.
        """
        problem = self._shape_problem(cert, pub_id, node, parent)
        if problem is None and not self.seal_ok(cert):
            problem = f"bad signature by {cert.splitter!r}"
        return problem

    def _shape_problem(
        self, cert: SplitCert, pub_id: bytes, node: Lineage, parent: bytes | None
    ) -> str | None:
        if not isinstance(cert, SplitCert):
            return "not a certificate"
        if cert.pub_id != pub_id or cert.node != node:
            return f"certificate is for {cert.node} of another publication or node"
        if parent is not None and cert.parent != parent:
            return "names another parent certificate"
        shape = self._shapes.get(cert, _UNSEEN)
        if shape is _UNSEEN:
            shape = self._shapes[cert] = self._intrinsic_problem(cert)
        return shape

    def _intrinsic_problem(self, cert: SplitCert) -> str | None:
        path = self.path
        node = cert.node
        level = len(node) + 1
        if level > path.depth:
            return "certificate below the last VN"
        if not path.allows(level, cert.k, cert.r):
            return f"scheme (k, r) = ({cert.k}, {cert.r}) is not one the manifest allows"
        signer = path.splitter(node)
        if cert.splitter != signer.id:
            return f"signed as {cert.splitter!r}, but {signer.id!r} splits {node}"
        if len(cert.commitments) != cert.r or any(
            not isinstance(c, bytes) or len(c) != _DIGEST_SIZE for c in cert.commitments
        ):
            return "malformed commitment vector"
        if not isinstance(cert.signature, bytes) or not isinstance(cert.parent, bytes):
            return "malformed signature"
        return None

    def _digest(self, cert: SplitCert) -> bytes:
        digest = self._digests.get(cert)
        if digest is None:
            digest = self._digests[cert] = cert_digest(cert)
        return digest

    def seal_ok(self, cert: SplitCert) -> bool:
        """Whether the certificate's Merkle path leads to a root its splitter signed."""
        ok = self._seal_ok.get(cert)
        if ok is None:
            root = merkle_fold(
                _leaf_hash(cert.signed_bytes()), cert.position, cert.count, cert.proof
            )
            signer = self.path.splitter(cert.node)
            ok = root is not None and self.cache.check(
                signer.public_key, signer.id, cert.count, root, cert.signature
            )
            self._seal_ok[cert] = ok
        return ok

    def record_fault(
        self, record: ShareRecord, pub_id: bytes | None = None
    ) -> tuple[str, str | None] | None:
        """Why ``record`` is invalid and who is to blame (None: whoever sent it;
        :data:`UNPROVEN`: nobody can be named on proof, the record is only set aside), or
        None.

        With ``pub_id``, a record of any other publication is invalid too: without that check a
        valid record replayed from another publication would pass for a second certificate of
        the same split, and an honest splitter would look like an equivocator.
        """
        memo = (id(record), pub_id)
        seen = self._records.get(memo)
        if seen is not None and seen[0] is record:
            return seen[1]
        fault = self._record_fault(record, pub_id)
        self._records[memo] = (record, fault)
        return fault

    def _record_fault(
        self, record: ShareRecord, pub_id: bytes | None
    ) -> tuple[str, str | None] | None:
        if not isinstance(record, ShareRecord):
            return "not a share record", None
        if pub_id is not None and record.pub_id != pub_id:
            return "share of another publication", None
        lineage = record.lineage
        certs = record.certs
        if not 1 <= len(lineage) <= self.path.depth or len(certs) != len(lineage):
            return f"lineage {lineage} does not fit a path of {self.path.depth} VNs", None
        if not isinstance(record.salt, bytes) or len(record.salt) != SALT_SIZE:
            return "malformed salt", None
        if not isinstance(record.data, bytes):
            return "malformed data", None
        last = len(certs) - 1
        prefixes = self._prefixes
        if last:
            if prefixes is None:
                problem = self._levels_problem(record, 0, last)
            else:
                # The levels above this share are the same for every share of a split
                # below them (a subscriber gets r of each): checked once per chain.
                prefix = (certs[:last], lineage[:last], record.pub_id)
                try:
                    problem = prefixes.get(prefix, _UNSEEN)
                except TypeError:  # a garbled record (an unhashable lineage or certificate)
                    problem = self._levels_problem(record, 0, last)
                if problem is _UNSEEN:
                    problem = prefixes[prefix] = self._levels_problem(record, 0, last)
            if problem is not None:
                return problem, None
        problem = self._levels_problem(record, last, last + 1)
        if problem is not None:
            return problem, None
        if commitment(record.opening) != certs[-1].commitments[lineage[-1]]:
            return "opening does not match its commitment", None
        if self.seals == "none":
            return None
        if not self.seal_ok(certs[-1]):
            # A broker ("last") got the record from the certificate's own splitter: its
            # fault. An audit ("all") got it from a holder that relays what it was sent and
            # checks that seal only by sample: it or the splitter forged it, no proof which.
            return (
                f"level {len(certs)}: bad signature by {certs[-1].splitter!r}",
                UNPROVEN if self.seals == "all" else None,
            )
        if self.seals == "all":
            for depth in range(len(certs) - 2, -1, -1):
                if not self.seal_ok(certs[depth]):
                    voucher = certs[depth + 1].splitter
                    return (
                        f"level {depth + 1}: bad signature by {certs[depth].splitter!r}, "
                        f"vouched for by {voucher!r}",
                        voucher,
                    )
        return None

    def _levels_problem(self, record: ShareRecord, start: int, stop: int) -> str | None:
        """Why the record's certificates at levels ``start + 1`` .. ``stop`` (and its
        lineage indices there) do not fit, or None."""
        lineage = record.lineage
        certs = record.certs
        parent = self._digest(certs[start - 1]) if start else b""
        for depth in range(start, stop):
            cert = certs[depth]
            index = lineage[depth]
            if type(index) is not int or not 0 <= index < len(self.path.vns[depth]):
                return f"lineage index {index!r} out of range at level {depth + 1}"
            problem = self._shape_problem(cert, record.pub_id, lineage[:depth], parent)
            if problem:
                return f"level {depth + 1}: {problem}"
            if index >= cert.r:
                return f"lineage index {index} out of the split's {cert.r}"
            if depth + 1 < stop:
                parent = self._digest(cert)
        return None

    def record_problem(self, record: ShareRecord, pub_id: bytes | None = None) -> str | None:
        """Why ``record`` (its certificate chain and its opening) is invalid, or None."""
        fault = self.record_fault(record, pub_id)
        return None if fault is None else fault[0]


class ShareInbox:
    """The shares one replica receives for one publication: verify, deduplicate, blame senders.

    Every broker runs one per publication and level it holds shares at; it re-splits only
    :attr:`records`. Blame here is the broker's own knowledge (links are authenticated).
    """

    def __init__(
        self,
        path: PathView,
        pub_id: bytes,
        level: int,
        index: int,
        verifier: ChainVerifier | None = None,
    ) -> None:
        """Args: path; pub_id: the publication; level: this replica's VN level (1..h); index:
        its replica index there; verifier: default one that checks the seal of the sender's
        own certificate and trusts those it vouched for."""
        if not 1 <= level <= path.depth or not 0 <= index < len(path.vns[level - 1]):
            raise PropagationError(f"no replica {index} at level {level} of this path")
        self.path = path
        self.pub_id = pub_id
        self.level = level
        self.index = index
        self.verifier = verifier or ChainVerifier(path, seals="last")
        self.blames: list[Blame] = []
        self._accepted: dict[Lineage, ShareRecord] = {}
        self._heard: set[str] = set()

    def rebase(self, path: PathView) -> None:
        """Verify further records against ``path``: a new manifest version of the same VNs
        (replicas attached or detached); what was accepted stays accepted."""
        self.path = path
        old = self.verifier
        self.verifier = ChainVerifier(
            path, seals=old.seals, cache=old.cache, prefixes=old._prefixes is not None
        )

    @property
    def records(self) -> list[ShareRecord]:
        """Accepted records in lineage order."""
        return [self._accepted[lineage] for lineage in sorted(self._accepted)]

    def offer(self, record: ShareRecord, sender: str) -> bool:
        """Take a record from the authenticated peer ``sender``; True when newly accepted."""
        self._heard.add(sender)
        fault = self.verifier.record_fault(record, self.pub_id)
        if fault:
            problem, culprit = fault
            lineage = getattr(record, "lineage", ())
            # First-hand: a broker is sent only its sender's own splits (checked below), so
            # a bad seal on the newest certificate is the sender's even in an audit mode.
            self._blame(culprit or sender, Fault.BAD_SHARE, lineage, problem)
            return False
        lineage = record.lineage
        if len(lineage) != self.level or lineage[-1] != self.index:
            self._blame(sender, Fault.WRONG_SENDER, lineage, "share is not for this replica")
            return False
        if sender != self.path.splitter(lineage[:-1]).id:
            self._blame(sender, Fault.WRONG_SENDER, lineage, "sender did not split this share")
            return False
        previous = self._accepted.get(lineage)
        if previous is not None:
            if not _same_share(previous, record):
                evidence = tuple({previous.certs[-1], record.certs[-1]})
                self._blame(sender, Fault.DUPLICATE, lineage, "two different shares", evidence)
            return False
        self._accepted[lineage] = record
        return True

    def silent(self) -> list[Blame]:
        """Blame for every expected sender heard nothing from; call once the wait is over."""
        blames = silent_senders(self.path, self.level, self._heard)
        self.blames.extend(blames)
        return blames

    def _blame(
        self,
        broker: str,
        fault: Fault,
        node: Lineage,
        detail: str,
        evidence: tuple[SplitCert, ...] = (),
    ) -> None:
        self.blames.append(Blame(broker, fault, tuple(node), detail, evidence))


def silent_senders(path: PathView, level: int, heard_from: Iterable[str]) -> list[Blame]:
    """Blame the expected senders of shares at ``level`` that sent nothing.

    Receivers at VN level d (1..h) expect every replica of VN_{d-1} (the publisher for d = 1);
    the subscriber (level h + 1) expects every replica of VN_h. Sound because an honest broker
    always holds at least one valid share when each VN has at most f Byzantine replicas; the
    caller decides how long to wait.
    """
    if not 1 <= level <= path.depth + 1:
        raise PropagationError(f"level must be in 1..{path.depth + 1}, got {level}")
    expected = (path.publisher,) if level == 1 else path.steady(level - 1)
    heard = set(heard_from)
    return [
        Blame(member.id, Fault.SILENT, (), f"sent nothing to level {level}")
        for member in expected
        if member.id not in heard
    ]


class Reconstruction(NamedTuple):
    """The outcome of :func:`reconstruct`: the key (None if unrecoverable) and all blame."""

    key: bytes | None
    blame: tuple[Blame, ...]

    @property
    def culprits(self) -> frozenset[str]:
        """Ids of every blamed broker."""
        return frozenset(b.broker for b in self.blame)


def reconstruct(
    deliveries: Iterable[tuple[str, ShareRecord]],
    path: PathView,
    pub_id: bytes,
    *,
    check: Callable[[bytes], bool] | None = None,
    complete: bool = False,
    verifier: ChainVerifier | None = None,
) -> Reconstruction:
    """Recover K from the leaves replicas of VN_h delivered, and blame every provable fault.

    Args:
        deliveries: (sender id, record) pairs as received over authenticated links.
        path: the publication's path.
        pub_id: the publication; group deliveries by the records' own ``pub_id``, because a
            record of another publication in the set is blamed on its sender.
        check: optional final test of a candidate key (e.g. AES-GCM opens the payload); only
            needed to choose between candidates when the publisher itself equivocated.
        complete: True once every delivery that will arrive is in (the wait is over): only
            then can a split with too few recovered children be blamed (SHORT_SPLIT).
        verifier: reuse a verifier (and its signature cache) across calls.

    Returns:
        The key, or None when fewer than k shares survive at some level (impossible while each
        VN has at most f Byzantine replicas), and the blame. Silence is not judged here: call
        :func:`silent_senders` with level h + 1 once the wait is over.
    """
    verifier = verifier or ChainVerifier(path)
    depth = path.depth
    blames: list[Blame] = []
    leaves: dict[Lineage, ShareRecord] = {}
    # node -> statement -> one certificate stating it (versions differ in what they state)
    versions: dict[Lineage, dict[tuple[object, ...], SplitCert]] = defaultdict(dict)
    seen: set[SplitCert] = set()

    for sender, record in deliveries:
        fault = verifier.record_fault(record, pub_id)
        lineage = getattr(record, "lineage", ())
        if fault is None and len(lineage) != depth:
            fault = f"share of level {len(lineage)}, subscribers get level {depth}", None
        if fault:
            problem, culprit = fault
            if culprit != UNPROVEN:
                blames.append(Blame(culprit or sender, Fault.BAD_SHARE, tuple(lineage), problem))
            continue
        if sender != path.holder(lineage).id:
            blames.append(Blame(sender, Fault.WRONG_SENDER, lineage, "it does not hold this share"))
            continue
        for cert in record.certs:
            # Every share below a split carries the same certificate (one object per
            # process, parsed once): its statement is built and hashed once per pass.
            if cert not in seen:
                seen.add(cert)
                versions[cert.node].setdefault(cert.statement, cert)
        previous = leaves.get(lineage)
        if previous is None:
            leaves[lineage] = record
        elif not _same_share(previous, record):
            blames.append(Blame(sender, Fault.DUPLICATE, lineage, "two different shares"))

    for node, stated in versions.items():
        if len(stated) > 1:
            who = path.splitter(node).id
            evidence = tuple(stated.values())
            blames.append(
                Blame(who, Fault.EQUIVOCATION, node, f"{len(evidence)} certificates", evidence)
            )

    # candidates[node] maps commitment -> opening of every value recovered for that node.
    candidates: dict[Lineage, dict[bytes, bytes]] = defaultdict(dict)
    for lineage, record in leaves.items():
        # record_fault checked the opening against this commitment: no need to hash it again.
        candidates[lineage][record.certs[-1].commitments[lineage[-1]]] = record.opening

    for level in range(depth - 1, -1, -1):
        nodes = sorted(node for node in versions if len(node) == level)
        for node in nodes:
            certs = list(versions[node].values())
            recover_node(node, certs, candidates, path, blames, complete=complete)
        if level == 0:
            break
        for node in nodes:
            allowed = {cert.commitments[node[-1]] for cert in versions[node[:-1]].values()}
            blames += wrong_secrets(node, candidates, allowed, path)
    return outcome(candidates, blames, check)


class Split(Protocol):
    """What reconstruction needs of one version of a split: the child commitments and the
    scheme (a :class:`SplitCert`, or a pass statement's entry with its scheme)."""

    @property
    def commitments(self) -> tuple[bytes, ...]: ...
    @property
    def k(self) -> int: ...
    @property
    def r(self) -> int: ...


def wrong_secrets(
    node: Lineage,
    candidates: Mapping[Lineage, Mapping[bytes, bytes]],
    allowed: set[bytes],
    path: PathView,
) -> list[Blame]:
    """Blame the splitter of ``node`` for every value its children rebuilt that no version
    of the split above committed to (``allowed``): it split something it was not given."""
    return [
        Blame(
            path.splitter(node).id,
            Fault.WRONG_SECRET,
            node,
            "its split does not reconstruct the share it was given",
        )
        for digest in candidates.get(node, {})
        if digest not in allowed
    ]


def outcome(
    candidates: Mapping[Lineage, Mapping[bytes, bytes]],
    blames: Iterable[Blame],
    check: Callable[[bytes], bool] | None,
) -> Reconstruction:
    """The key, if exactly one candidate root passes ``check``, and the blame, once each."""
    keys = list(candidates.get((), {}).values())
    if check is not None:
        keys = [key for key in keys if check(key)]
    key = keys[0] if len(keys) == 1 else None
    return Reconstruction(key, tuple(_dedupe(blames)))


def _same_share(a: ShareRecord, b: ShareRecord) -> bool:
    """The same share, whatever seals its certificates carry."""
    return (
        a.salt == b.salt
        and a.data == b.data
        and [c.statement for c in a.certs] == [c.statement for c in b.certs]
    )


_NO_CANDIDATES: dict[bytes, bytes] = {}  # read only: a child nothing was recovered for


def recover_node(
    node: Lineage,
    certs: Sequence[Split],
    candidates: dict[Lineage, dict[bytes, bytes]],
    path: PathView,
    blames: list[Blame],
    *,
    complete: bool,
) -> None:
    """Every value of ``node`` its children rebuild under some version of its split, keyed
    by the value's commitment (a root's by the key itself), into ``candidates``; blame for
    an inconsistent split and, once every delivery is in, for a short one."""
    found: dict[bytes, bytes] = {}
    best = 0
    splitter = path.splitter(node).id
    for cert in certs:
        points = []
        for j, digest in enumerate(cert.commitments):
            opening = candidates.get((*node, j), _NO_CANDIDATES).get(digest)
            if opening is not None:
                points.append(shamir.trusted_share(j + 1, opening[SALT_SIZE:]))
        best = max(best, len(points))
        if len(points) < cert.k:
            continue
        try:
            value = shamir.combine(points, cert.k)
        except shamir.ShareError as exc:
            evidence = (cert,) if isinstance(cert, SplitCert) else ()
            blames.append(Blame(splitter, Fault.INCONSISTENT_SPLIT, node, str(exc), evidence))
            continue
        found[commitment(value) if node else value] = value
    some = certs[0]
    if complete and best < some.r - (some.k - 1):
        blames.append(
            Blame(splitter, Fault.SHORT_SPLIT, node, f"only {best} of {some.r} children recovered")
        )
    candidates[node] = found


def _dedupe(blames: Iterable[Blame]) -> list[Blame]:
    seen: set[tuple[str, Fault, Lineage]] = set()
    out = []
    for blame in blames:
        key = (blame.broker, blame.fault, blame.node)
        if key not in seen:
            seen.add(key)
            out.append(blame)
    return out


_PACKED: dict[SplitCert, bytes] = {}
_PARSED: dict[bytes, SplitCert] = {}
_CERT_MEMORY = 1 << 14


def _bounded(table: dict[_K, _V], key: _K, value: _V) -> _V:
    """Remember ``value`` under ``key``, dropping the oldest quarter when full."""
    if len(table) >= _CERT_MEMORY:
        for stale in list(table)[: _CERT_MEMORY // 4]:
            del table[stale]
    table[key] = value
    return value


def _pack_cert(c: SplitCert) -> bytes:
    packed = _PACKED.get(c)
    if packed is None:
        packed = _bounded(
            _PACKED,
            c,
            msgpack.packb(
                [
                    c.pub_id,
                    list(c.node),
                    c.k,
                    c.r,
                    c.splitter,
                    list(c.commitments),
                    c.signature,
                    c.parent,
                    c.position,
                    c.count,
                    list(c.proof),
                ],
                use_bin_type=True,
            ),
        )
    return packed


_BYTES_ONLY = frozenset({bytes})
# A parsed certificate is built without the frozen dataclass __init__ (one
# object.__setattr__ per field, and __post_init__): a relaying broker parses every
# certificate of every share it holds. Its fields in order, then the packed statement.
_CERT_SETTERS = tuple(
    SplitCert.__dict__[name].__set__
    for name in (
        "pub_id",
        "node",
        "k",
        "r",
        "splitter",
        "commitments",
        "signature",
        "parent",
        "position",
        "count",
        "proof",
        "_signed",
    )
)
_set_cert_hash = SplitCert.__dict__["_hash"].__set__


MAX_CERT_BYTES = 8192
"""The most a packed certificate may weigh: an honest one names a publication and a
splitter, carries r <= 64 commitments and a Merkle path of at most 64 hashes (about 4.5 KB
at worst). The certificate caches are bounded by count; past this a certificate is
refused as malformed, so they are bounded in bytes too."""


def _unpack_cert(raw: bytes) -> SplitCert:
    cert = _PARSED.get(raw)
    if cert is not None:
        return cert
    if len(raw) > MAX_CERT_BYTES:
        raise ValueError(f"a certificate of {len(raw)} bytes (at most {MAX_CERT_BYTES})")
    c_pub, node, k, r, splitter, commits, sig, parent, position, count, proof = msgpack.unpackb(
        raw, use_list=False, raw=False
    )
    if not (
        type(c_pub) is bytes
        and type(k) is int
        and type(r) is int
        and type(splitter) is str
        and type(sig) is bytes
        and type(parent) is bytes
        and type(position) is int
        and type(count) is int
        and type(commits) is tuple
        and type(proof) is tuple
        and _BYTES_ONLY.issuperset(map(type, commits))
        and _BYTES_ONLY.issuperset(map(type, proof))
    ):
        raise TypeError("malformed certificate")
    cert = _new_object(SplitCert)
    for setter, value in zip(
        _CERT_SETTERS,
        (c_pub, _ints(node), k, r, splitter, commits, sig, parent, position, count, proof, None),
        strict=True,
    ):
        setter(cert, value)
    _set_cert_hash(cert, hash((cert.statement, (sig, position, count, proof))))
    # A relaying broker sends on what it parsed: the bytes it got are the certificate's
    # wire form (they parse to it), so it is never packed again.
    if cert not in _PACKED:
        _bounded(_PACKED, cert, raw)
    return _bounded(_PARSED, raw, cert)


def pack_record(record: ShareRecord) -> bytes:
    """msgpack wire form of a record; each certificate is packed on its own, once per
    process, and is parsed once per process on arrival (every share below a split carries
    the same certificates)."""
    return msgpack.packb(
        [
            record.pub_id,
            list(record.lineage),
            [_pack_cert(c) for c in record.certs],
            record.salt,
            record.data,
        ],
        use_bin_type=True,
    )


def unpack_record(raw: bytes) -> ShareRecord:
    """Parse :func:`pack_record` output; structure only (verify with :class:`ShareInbox`).

    Raises:
        PropagationError: the bytes are not a well-formed record.
    """
    try:
        pub_id, lineage, certs, salt, data = msgpack.unpackb(raw, use_list=False, raw=False)
        if type(pub_id) is not bytes or type(salt) is not bytes or type(data) is not bytes:
            raise TypeError("pub_id, salt and data must be bytes")
        if type(certs) is not tuple or not all(type(c) is bytes for c in certs):
            raise TypeError("certificates must be a list of packed certificates")
        chain = tuple(_unpack_cert(c) for c in certs)
        record = ShareRecord(pub_id, _ints(lineage), chain, salt, data)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise PropagationError(f"malformed share record: {exc}") from None
    return record


BATCH_RECORDS = 128
"""Most records in one batch frame: its certificate table stays well under a frame limit
(a record's chain is at most a few hundred bytes per level)."""

BatchEntry = tuple[str, int, bytes, Lineage, tuple[int, ...], bytes, bytes]
"""A record in a batch: publisher, seq, pub_id, lineage, certificate indices, salt, data."""


CERT_WINDOW = 4096
"""Certificates a link remembers: a sender names one it sent among its last
:data:`CERT_WINDOW` by id instead of sending it again; the receiver keeps at least the last
2 x :data:`CERT_WINDOW`, so every id a sender may reuse is still known at the other end."""

_FRAME_CERTS = 512  # new certificates per frame at most (keeps id growth per frame small)
_RECORD_FRAMING = 24  # msgpack headers of one batch entry, at most

FRAME_BUDGET = 512 * 1024
"""Bytes of one SHARES frame by default: half the default frame limit (a broker passes
half its own ``max_frame``)."""


class LinkCertsOut:
    """A sender's side of one link's certificate ids (one per connection: TCP keeps the
    frames in order, so both ends number the certificates alike, from 0)."""

    def __init__(self) -> None:
        self.next_id = 0
        self._ids: dict[SplitCert, int] = {}

    def frames(
        self, items: Iterable[tuple[str, int, ShareRecord]], budget: int = FRAME_BUDGET
    ) -> list[tuple[int, list[bytes], list[BatchEntry]]]:
        """The records of one pass for this link as (base id, new certificates, entries)
        per frame: a certificate the link carried recently is named by its id, a new one
        travels once and takes the next id. A frame holds at most :data:`BATCH_RECORDS`
        records and about ``budget`` bytes (a record larger has a frame to itself): with
        many replicas per VN a record's new certificates weigh kilobytes, and a frame over
        the receiver's ``max_frame`` closes the link with every share in it."""
        frames: list[tuple[int, list[bytes], list[BatchEntry]]] = []
        ids = self._ids
        base = self.next_id
        table: list[bytes] = []
        entries: list[BatchEntry] = []
        size = 0
        for publisher, seq, record in items:
            cost = _RECORD_FRAMING + len(publisher) + len(record.pub_id) + len(record.data)
            cost += len(record.salt) + 5 * (len(record.lineage) + len(record.certs))
            for cert in record.certs:
                i = ids.get(cert)
                if i is None or i < self.next_id - CERT_WINDOW:
                    cost += len(_pack_cert(cert))
            if entries and (
                len(entries) >= BATCH_RECORDS or len(table) >= _FRAME_CERTS or size + cost > budget
            ):
                frames.append((base, table, entries))
                base, table, entries, size = self.next_id, [], [], 0
            size += cost
            refs = []
            for cert in record.certs:
                i = ids.get(cert)
                if i is None or i < self.next_id - CERT_WINDOW:
                    i = ids[cert] = self.next_id
                    self.next_id += 1
                    table.append(_pack_cert(cert))
                refs.append(i)
            entries.append(
                (
                    publisher,
                    seq,
                    record.pub_id,
                    record.lineage,
                    tuple(refs),
                    record.salt,
                    record.data,
                )
            )
        if entries:
            frames.append((base, table, entries))
        if len(ids) > 2 * CERT_WINDOW:
            floor = self.next_id - CERT_WINDOW
            self._ids = {c: i for c, i in ids.items() if i >= floor}
        return frames


class LinkCertsIn:
    """A receiver's side of one link's certificate ids (:class:`LinkCertsOut`)."""

    def __init__(self) -> None:
        self.next_id = 0
        self._table: dict[int, SplitCert | PropagationError] = {}

    def unpack(
        self, base: int, certs: Sequence[bytes], entries: Iterable[BatchEntry]
    ) -> list[tuple[str, int, ShareRecord | PropagationError]]:
        """Parse a SHARES frame: (publisher, seq, record) per entry, or why the entry is
        malformed (a garbled certificate, or an id the link never carried, spoils only
        the entries that name it). Base 0 starts the numbering anew (a new connection)."""
        table = self._table
        if base == 0:
            table.clear()
        for n, raw in enumerate(certs):
            try:
                table[base + n] = _unpack_cert(raw)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                table[base + n] = PropagationError(f"malformed certificate: {exc}")
        # The newest id carried, not the last frame's: a sender numbering downwards (which
        # no honest one does) would otherwise keep every id it ever sent.
        self.next_id = base + len(certs) if base == 0 else max(self.next_id, base + len(certs))
        if len(table) > 3 * CERT_WINDOW:
            floor = self.next_id - 2 * CERT_WINDOW
            self._table = table = {i: c for i, c in table.items() if i >= floor}
        out: list[tuple[str, int, ShareRecord | PropagationError]] = []
        for publisher, seq, pub_id, lineage, refs, salt, data in entries:
            chain: list[SplitCert] = []
            problem: PropagationError | None = None
            for i in refs:
                cert = table.get(i) or PropagationError(f"no certificate {i} on this link")
                if isinstance(cert, PropagationError):
                    problem = cert
                    break
                chain.append(cert)
            if problem is not None:
                out.append((publisher, seq, problem))
            else:
                out.append((publisher, seq, _record(pub_id, lineage, tuple(chain), salt, data)))
        return out


def pack_batch(
    items: Iterable[tuple[str, int, ShareRecord]],
) -> list[tuple[list[bytes], list[BatchEntry]]]:
    """One pass's records on a fresh link (:class:`LinkCertsOut`): (certificate table,
    entries) per frame, each certificate once."""
    return [(table, entries) for _, table, entries in LinkCertsOut().frames(items)]


def unpack_batch(
    certs: Sequence[bytes], entries: Iterable[BatchEntry]
) -> list[tuple[str, int, ShareRecord | PropagationError]]:
    """Parse the first frame of a fresh link (:class:`LinkCertsIn`)."""
    return LinkCertsIn().unpack(0, certs, entries)


def _ints(value: object) -> Lineage:
    if type(value) is not tuple or not all(type(v) is int for v in value):
        raise TypeError(f"expected a list of ints, got {value!r}")
    return value


def coalition_key(records: Iterable[ShareRecord]) -> bytes | None:
    """Everything a coalition can compute from the share records it pooled: combine any k
    known children of any node, repeatedly, up to the root. Returns K if they get there.

    This is the attack the collusion tests run; sound sharing keeps it at None whenever
    every VN has at most f colluding replicas.
    """
    known: dict[Lineage, bytes] = {}
    schemes: dict[Lineage, tuple[int, int]] = {}
    for record in records:
        known[record.lineage] = record.opening
        for cert in record.certs:
            schemes[cert.node] = (cert.k, cert.r)
    return combine_upward(known, schemes)


def combine_upward(
    known: Mapping[Lineage, bytes], schemes: Mapping[Lineage, tuple[int, int]]
) -> bytes | None:
    """:func:`coalition_key` over pooled openings by lineage and the (k, r) of each split
    (also what a coalition pools from shares by the pass, :mod:`security.pass_shares`)."""
    known = dict(known)
    changed = True
    while changed and () not in known:
        changed = False
        for node, (k, r) in schemes.items():
            if node in known:
                continue
            children = [
                shamir.Share(j + 1, known[(*node, j)][SALT_SIZE:])
                for j in range(r)
                if (*node, j) in known
            ]
            if len(children) >= k:
                known[node] = shamir.combine(children[:k], k)
                changed = True
    return known.get(())
