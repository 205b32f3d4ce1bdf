"""Topic-creation requests and topic advertisements: what a TDN signs and what everyone checks.

An entity asks a topic discovery node (TDN) to create a topic with a :class:`TopicRequest`
(creator, lifetime, synopsis, descriptors, hierarchy settings, who may discover it), signed
with the creator's key and carrying a fresh nonce. The TDN assigns a UUID, hashes the
request's canonical bytes with SHA-256 and signs (UUID, digest, TDN, issue and expiry times,
depth): that record is the :class:`TopicAdvertisement`. Anyone holding the trusted TDNs' keys
verifies it with :func:`verify_advertisement`; the creator also checks that the response
answers *its* request (:func:`check_response`: same nonce, same creator key, same digest), so
an old advertisement replayed at it is refused.

Canonical encoding: msgpack of a list that starts with a domain string (so the two signed
formats never collide with each other or with publication signatures), descriptors sorted by
name, floats always float64, ``use_bin_type=True``; see :mod:`security.envelope` for why msgpack
is deterministic for decoded values.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from security.envelope import Signer, public_key_to_bytes
from security.errors import IntegrityError, InvalidRequest, NotAuthorized
from security.topics_identity import (
    TdnAuthority,
    TrustedTdns,
    principal_of,
    signature_valid,
)

__all__ = [
    "ANYONE",
    "AdvertisementError",
    "HierarchySpec",
    "ReplayGuard",
    "TdnAuthority",
    "TopicAdvertisement",
    "TopicRequest",
    "TrustedTdns",
    "Value",
    "check_response",
    "issue_advertisement",
    "make_request",
    "tdn_trusted",
    "verify_advertisement",
]

Value = str | int | float | bool
ANYONE = "*"
"""In a permission list: every principal."""

_REQUEST_DOMAIN = "trellis/topic-request/v1"
_AD_DOMAIN = "trellis/topic-advertisement/v1"
_MAX_TEXT = 4096
_MAX_DESCRIPTORS = 64
_MAX_PRINCIPALS = 256


class AdvertisementError(IntegrityError):
    """A topic advertisement (or a TDN's response) cannot be accepted.

    Attributes:
        reason: a stable word: ``untrusted-tdn``, ``forged``, ``digest``, ``request-forged``,
            ``expired``, ``replayed``, ``conflict``.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _text(name: str, value: object, limit: int = _MAX_TEXT) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidRequest(f"{name} must be a string of at most {limit} characters")
    return value


def _principals(name: str, value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) > _MAX_PRINCIPALS:
        raise InvalidRequest(f"{name} must be a list of at most {_MAX_PRINCIPALS} principals")
    return tuple(sorted({_text(name, v, 128) for v in value}))


def _limit(name: str, value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
        raise InvalidRequest(f"{name} must be a non-negative integer or absent")
    return value


@dataclass(frozen=True)
class HierarchySpec:
    """Where a topic stands in a hierarchy, and the limits it sets below itself.

    Attributes:
        root: RootTopic, the topic starts a hierarchy (it names no parent).
        allow_children: AllowChildTopics.
        max_depth: MaxDepth, levels allowed below this topic (None: no limit of its own).
        max_width: MaxWidth, children allowed per topic anywhere below (None: no limit).
        parent: ParentTopic, the parent's UUID (None for a root or a stand-alone topic).
        registrars: principals that may register children (None: the owner only;
            ``("*",)``: anyone). Every ancestor's list applies as well.
    """

    root: bool = False
    allow_children: bool = False
    max_depth: int | None = None
    max_width: int | None = None
    parent: str | None = None
    registrars: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _limit("max_depth", self.max_depth)
        _limit("max_width", self.max_width)
        if self.root and self.parent is not None:
            raise InvalidRequest("a root topic names no parent topic")
        if self.allow_children and not self.root and self.parent is None:
            raise InvalidRequest(
                "only a root topic or a child topic may allow children (set root, or a parent)"
            )

    def to_wire(self) -> list[Any]:
        regs = None if self.registrars is None else list(self.registrars)
        return [
            self.root,
            self.allow_children,
            self.max_depth,
            self.max_width,
            self.parent,
            regs,
        ]

    @classmethod
    def from_wire(cls, data: object) -> HierarchySpec:
        if not isinstance(data, list | tuple) or len(data) != 6:
            raise InvalidRequest("hierarchy must be a list of 6 fields")
        root, allow, depth, width, parent, regs = data
        if not isinstance(root, bool) or not isinstance(allow, bool):
            raise InvalidRequest("hierarchy root and allow_children must be booleans")
        if parent is not None:
            parent = _text("parent", parent, 64)
        return cls(
            root,
            allow,
            _limit("max_depth", depth),
            _limit("max_width", width),
            parent,
            _principals("registrars", regs),
        )


def _descriptors(value: object) -> dict[str, Value]:
    if not isinstance(value, Mapping) or len(value) > _MAX_DESCRIPTORS:
        raise InvalidRequest(f"descriptors must be a map of at most {_MAX_DESCRIPTORS} entries")
    out: dict[str, Value] = {}
    for name, item in value.items():
        _text("descriptor name", name, 256)
        if not isinstance(item, str | int | float | bool):
            raise InvalidRequest(f"descriptor {name!r} must be str, int, float or bool")
        if isinstance(item, float) and not math.isfinite(item):
            raise InvalidRequest(f"descriptor {name!r} must be finite")
        if isinstance(item, str):
            _text(f"descriptor {name!r}", item)
        out[name] = item
    return out


@dataclass(frozen=True)
class TopicRequest:
    """A topic-creation request, signed by its creator.

    Attributes:
        creator: the creator's id (a label).
        creator_key: the creator's raw Ed25519 public key: the topic's owner.
        nonce: 16 fresh random bytes; the response must repeat them.
        requested_at: the creator's clock when asking (TDNs refuse stale requests).
        lifetime: seconds the topic lives from its creation.
        synopsis: the topic's text (exact-string and regular-expression queries match it).
        synopsis_type: what the synopsis is (free text for queries; ``"string"`` default).
        descriptors: the topic's properties (property queries match them).
        hierarchy: RootTopic, AllowChildTopics, MaxDepth, MaxWidth, ParentTopic, registrars.
        discoverers: principals that may discover the topic (None: anyone; the owner
            always may). Every ancestor's list applies as well.
        signature: the creator's signature over :meth:`canonical`.
    """

    creator: str
    creator_key: bytes
    nonce: bytes
    requested_at: float
    lifetime: float
    synopsis: str
    descriptors: Mapping[str, Value] = field(default_factory=dict)
    synopsis_type: str = "string"
    hierarchy: HierarchySpec = field(default_factory=HierarchySpec)
    discoverers: tuple[str, ...] | None = None
    signature: bytes = b""

    @property
    def owner(self) -> str:
        """The owner's principal."""
        return principal_of(self.creator_key)

    def canonical(self) -> bytes:
        """The bytes the creator signs and the TDN hashes (the signature excluded)."""
        return msgpack.packb(
            [
                _REQUEST_DOMAIN,
                self.creator,
                bytes(self.creator_key),
                bytes(self.nonce),
                float(self.requested_at),
                float(self.lifetime),
                self.synopsis_type,
                self.synopsis,
                [[k, self.descriptors[k]] for k in sorted(self.descriptors)],
                self.hierarchy.to_wire(),
                None if self.discoverers is None else list(self.discoverers),
            ],
            use_bin_type=True,
        )

    def digest(self) -> bytes:
        """SHA-256 of :meth:`canonical`."""
        return hashlib.sha256(self.canonical()).digest()

    def signed_correctly(self) -> bool:
        return signature_valid(self.creator_key, self.signature, self.canonical())

    def to_wire(self) -> list[Any]:
        return [
            self.creator,
            bytes(self.creator_key),
            bytes(self.nonce),
            float(self.requested_at),
            float(self.lifetime),
            self.synopsis_type,
            self.synopsis,
            dict(self.descriptors),
            self.hierarchy.to_wire(),
            None if self.discoverers is None else list(self.discoverers),
            bytes(self.signature),
        ]

    @classmethod
    def from_wire(cls, data: object) -> TopicRequest:
        """Read and validate the wire form.

        Raises:
            InvalidRequest: a field is missing, of the wrong type or out of range.
        """
        if not isinstance(data, list | tuple) or len(data) != 11:
            raise InvalidRequest("a topic request is a list of 11 fields")
        (creator, key, nonce, at, lifetime, stype, synopsis, desc, hier, disc, sig) = data
        for name, raw, size in (
            ("creator_key", key, 32),
            ("nonce", nonce, 16),
            ("signature", sig, 64),
        ):
            if not isinstance(raw, bytes) or len(raw) != size:
                raise InvalidRequest(f"{name} must be {size} bytes")
        for name, number in (("requested_at", at), ("lifetime", lifetime)):
            if (
                not isinstance(number, float | int)
                or isinstance(number, bool)
                or not math.isfinite(number)
            ):
                raise InvalidRequest(f"{name} must be a finite number")
        if lifetime <= 0:
            raise InvalidRequest("lifetime must be positive")
        return cls(
            _text("creator", creator, 256),
            key,
            nonce,
            float(at),
            float(lifetime),
            _text("synopsis", synopsis),
            _descriptors(desc),
            _text("synopsis_type", stype, 64),
            HierarchySpec.from_wire(hier),
            _principals("discoverers", disc),
            sig,
        )


def make_request(
    signer: Signer,
    synopsis: str,
    *,
    nonce: bytes,
    now: float,
    lifetime: float,
    descriptors: Mapping[str, Value] | None = None,
    synopsis_type: str = "string",
    hierarchy: HierarchySpec | None = None,
    discoverers: tuple[str, ...] | list[str] | None = None,
) -> TopicRequest:
    """A signed topic-creation request from ``signer`` (nonce and clock passed in).

    Raises:
        InvalidRequest: a field is out of range.
    """
    if len(nonce) != 16:
        raise InvalidRequest("nonce must be 16 bytes")
    if not lifetime > 0 or not math.isfinite(lifetime):
        raise InvalidRequest("lifetime must be a positive number of seconds")
    request = TopicRequest(
        signer.id,
        public_key_to_bytes(signer.public_key),
        bytes(nonce),
        float(now),
        float(lifetime),
        _text("synopsis", synopsis),
        _descriptors(descriptors or {}),
        _text("synopsis_type", synopsis_type, 64),
        hierarchy or HierarchySpec(),
        _principals("discoverers", discoverers),
    )
    return replace(request, signature=signer.sign(request.canonical()))


@dataclass(frozen=True)
class TopicAdvertisement:
    """A topic as a TDN created it: the signed record everyone verifies.

    Attributes:
        uuid: the topic's name, assigned by the TDN (carries no hierarchy).
        request: the creator's request, verbatim.
        digest: SHA-256 of the request's canonical bytes.
        tdn: the issuing TDN's id; ``tdn_key`` its raw Ed25519 public key.
        issued, expires: wall-clock seconds; a child never expires after its parent.
        depth: 0 for a root or stand-alone topic, the parent's depth + 1 otherwise.
        signature: the TDN's signature over :meth:`signed_bytes`.
        certificate: the TDN's X.509 certificate (DER, role ``tdn``) from the project CA, or
            empty; it binds ``tdn`` to ``tdn_key`` for verifiers that trust the CA rather than
            a list of TDN keys, so it is not under the signature.
    """

    uuid: str
    request: TopicRequest
    digest: bytes
    tdn: str
    tdn_key: bytes
    issued: float
    expires: float
    depth: int
    signature: bytes = b""
    certificate: bytes = b""

    @property
    def owner(self) -> str:
        return self.request.owner

    @property
    def parent(self) -> str | None:
        return self.request.hierarchy.parent

    def signed_bytes(self) -> bytes:
        return msgpack.packb(
            [
                _AD_DOMAIN,
                self.uuid,
                bytes(self.digest),
                self.tdn,
                bytes(self.tdn_key),
                float(self.issued),
                float(self.expires),
                self.depth,
            ],
            use_bin_type=True,
        )

    def to_wire(self) -> list[Any]:
        return [
            self.uuid,
            self.request.to_wire(),
            bytes(self.digest),
            self.tdn,
            bytes(self.tdn_key),
            float(self.issued),
            float(self.expires),
            self.depth,
            bytes(self.signature),
            *([bytes(self.certificate)] if self.certificate else []),
        ]

    @classmethod
    def from_wire(cls, data: object) -> TopicAdvertisement:
        """Read and validate the wire form (the signature is checked by
        :func:`verify_advertisement`, not here).

        Raises:
            InvalidRequest: a field is missing, of the wrong type or out of range.
        """
        if not isinstance(data, list | tuple) or len(data) not in (9, 10):
            raise InvalidRequest("a topic advertisement is a list of 9 fields (+ certificate)")
        uuid, req, digest, tdn, tdn_key, issued, expires, depth, sig = data[:9]
        certificate = data[9] if len(data) == 10 else b""
        if not isinstance(certificate, bytes) or len(certificate) > 16384:
            raise InvalidRequest("certificate must be DER bytes (at most 16 KiB)")
        if not isinstance(digest, bytes) or len(digest) != 32:
            raise InvalidRequest("digest must be 32 bytes")
        if not isinstance(tdn_key, bytes) or len(tdn_key) != 32:
            raise InvalidRequest("tdn_key must be 32 bytes")
        if not isinstance(sig, bytes) or len(sig) != 64:
            raise InvalidRequest("signature must be 64 bytes")
        for name, number in (("issued", issued), ("expires", expires)):
            if (
                not isinstance(number, float | int)
                or isinstance(number, bool)
                or not math.isfinite(number)
            ):
                raise InvalidRequest(f"{name} must be a finite number")
        if not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth < 2**31:
            raise InvalidRequest("depth must be a non-negative integer")
        return cls(
            _text("uuid", uuid, 64),
            TopicRequest.from_wire(req),
            digest,
            _text("tdn", tdn, 256),
            tdn_key,
            float(issued),
            float(expires),
            depth,
            sig,
            certificate,
        )

    def live(self, now: float) -> bool:
        return now < self.expires


def issue_advertisement(
    tdn: Signer,
    request: TopicRequest,
    *,
    uuid: str,
    now: float,
    depth: int,
    expires: float,
    certificate: bytes = b"",
) -> TopicAdvertisement:
    """The TDN's side: sign the advertisement of ``request`` (UUID and clock passed in),
    with the TDN's certificate (DER) when it has one.

    The caller has checked the request (signature, hierarchy rules, replay).
    """
    ad = TopicAdvertisement(
        uuid,
        request,
        request.digest(),
        tdn.id,
        public_key_to_bytes(tdn.public_key),
        float(now),
        float(expires),
        depth,
        certificate=bytes(certificate),
    )
    return replace(ad, signature=tdn.sign(ad.signed_bytes()))


def tdn_trusted(
    trusted: TrustedTdns,
    tdn: str,
    key: bytes,
    certificate: bytes = b"",
    now: float | None = None,
) -> bool:
    """Whether ``key`` is TDN ``tdn``'s key for ``trusted`` (with a CA, ``certificate``
    must be the CA's certificate of ``tdn`` for ``key``)."""
    if isinstance(trusted, TdnAuthority):
        return trusted.certified_key(tdn, certificate, now) == bytes(key)
    return trusted.get(tdn) == bytes(key)


def verify_advertisement(
    ad: TopicAdvertisement, trusted: TrustedTdns, now: float | None = None
) -> None:
    """Check that a trusted TDN issued ``ad`` for exactly this request, and (given ``now``)
    that it has not expired.

    Args:
        trusted: TDN id -> raw Ed25519 public key (the trust anchor operators distribute),
            or a :class:`TdnAuthority` (the project CA certifies TDNs).

    Raises:
        AdvertisementError: with ``reason`` untrusted-tdn, forged, digest, request-forged or
            expired.
    """
    if not tdn_trusted(trusted, ad.tdn, ad.tdn_key, ad.certificate, now):
        raise AdvertisementError(
            f"topic {ad.uuid}: issued by {ad.tdn!r}, which is not a trusted TDN "
            "(or not with this key)",
            "untrusted-tdn",
        )
    if not signature_valid(ad.tdn_key, ad.signature, ad.signed_bytes()):
        raise AdvertisementError(
            f"topic {ad.uuid}: the TDN signature of {ad.tdn!r} does not verify", "forged"
        )
    if ad.request.digest() != bytes(ad.digest):
        raise AdvertisementError(
            f"topic {ad.uuid}: the request does not hash to the signed digest", "digest"
        )
    if not ad.request.signed_correctly():
        raise AdvertisementError(
            f"topic {ad.uuid}: the creator's signature over the request does not verify",
            "request-forged",
        )
    if now is not None and not ad.live(now):
        raise AdvertisementError(f"topic {ad.uuid} expired at {ad.expires:.3f}", "expired")


def check_response(
    ad: TopicAdvertisement, sent: TopicRequest, trusted: TrustedTdns, now: float
) -> None:
    """The creator's check of a TDN's response: a valid advertisement of *this* request.

    Raises:
        AdvertisementError: ``replayed`` when the advertisement answers another request
            (another nonce, creator or digest), or any reason of
            :func:`verify_advertisement`.
    """
    verify_advertisement(ad, trusted, now)
    if bytes(ad.request.nonce) != bytes(sent.nonce) or ad.digest != sent.digest():
        raise AdvertisementError(
            f"topic {ad.uuid}: the response answers another request (nonce or digest "
            "differs): a replayed response",
            "replayed",
        )


class ReplayGuard:
    """A TDN's memory of (creator key, nonce) pairs: a request seen before gets the same
    topic back instead of a second one, and a request older than ``max_age`` seconds (or
    that far in the future) is refused, so the memory only spans ``2 * max_age``."""

    def __init__(self, max_age: float = 300.0) -> None:
        self.max_age = max_age
        self._seen: dict[tuple[bytes, bytes], tuple[float, str]] = {}

    def check(self, request: TopicRequest, now: float) -> str | None:
        """The UUID already issued for this request, or None for a fresh one.

        Raises:
            NotAuthorized: the request is stale (or dated in the future) beyond ``max_age``.
        """
        if abs(now - request.requested_at) > self.max_age:
            raise NotAuthorized(
                f"request dated {request.requested_at:.3f} is more than {self.max_age:g} s "
                f"from the TDN's clock ({now:.3f}): stale or replayed"
            )
        entry = self._seen.get((bytes(request.creator_key), bytes(request.nonce)))
        return None if entry is None else entry[1]

    def remember(self, request: TopicRequest, uuid: str, now: float) -> None:
        self._seen[(bytes(request.creator_key), bytes(request.nonce))] = (now, uuid)
        if len(self._seen) % 256 == 0:
            horizon = now - 2 * self.max_age
            self._seen = {k: v for k, v in self._seen.items() if v[0] >= horizon}
