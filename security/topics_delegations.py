"""Delegations: a topic owner's signed grant that lets another key publish or subscribe.

The owner of a topic is the key that created it (``TopicAdvertisement.request.creator_key``).
It signs ``[domain, topic UUID, holder key, right, issued, expires]``; whoever checks a
delegation (a broker, a TDN, a subscriber) needs the topic's advertisement, verified against
the trusted TDNs, to know who the owner is. :func:`authorize` is the one decision: the owner
itself needs no delegation; anyone else needs a delegation that passes every check, and each
failed check has its own reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from security.envelope import Signer, public_key_to_bytes
from security.errors import InvalidRequest, NotAuthorized
from security.topics import TopicAdvertisement
from security.topics_identity import principal_of, signature_valid

__all__ = ["RIGHTS", "Delegation", "DelegationError", "authorize", "delegate", "verify_delegation"]

RIGHTS = ("publish", "subscribe")
_DOMAIN = "trellis/delegation/v1"


class DelegationError(NotAuthorized):
    """A delegation does not grant what is asked.

    Attributes:
        reason: ``no-delegation``, ``wrong-topic``, ``not-owner``, ``forged``,
            ``wrong-holder``, ``wrong-right``, ``not-yet-valid``, ``expired``,
            ``topic-expired``.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Delegation:
    """``issuer_key`` lets ``holder_key`` use ``right`` on ``topic`` from ``issued`` until
    ``expires`` (None: as long as the topic lives)."""

    topic: str
    holder_key: bytes
    right: str
    issued: float
    expires: float | None
    issuer_key: bytes
    signature: bytes = b""

    def signed_bytes(self) -> bytes:
        return msgpack.packb(
            [
                _DOMAIN,
                self.topic,
                bytes(self.holder_key),
                self.right,
                float(self.issued),
                None if self.expires is None else float(self.expires),
                bytes(self.issuer_key),
            ],
            use_bin_type=True,
        )

    def to_wire(self) -> list[Any]:
        return [
            self.topic,
            bytes(self.holder_key),
            self.right,
            float(self.issued),
            self.expires,
            bytes(self.issuer_key),
            bytes(self.signature),
        ]

    @classmethod
    def from_wire(cls, data: object) -> Delegation:
        """Raises InvalidRequest on a malformed delegation (the signature is checked by
        :func:`verify_delegation`)."""
        if not isinstance(data, list | tuple) or len(data) != 7:
            raise InvalidRequest("a delegation is a list of 7 fields")
        topic, holder, right, issued, expires, issuer, sig = data
        if not isinstance(topic, str) or len(topic) > 64:
            raise InvalidRequest("delegation topic must be a UUID string")
        for name, raw, size in (
            ("holder_key", holder, 32),
            ("issuer_key", issuer, 32),
            ("signature", sig, 64),
        ):
            if not isinstance(raw, bytes) or len(raw) != size:
                raise InvalidRequest(f"delegation {name} must be {size} bytes")
        if right not in RIGHTS:
            raise InvalidRequest(f"delegation right must be one of {', '.join(RIGHTS)}")
        if not isinstance(issued, float | int) or isinstance(issued, bool):
            raise InvalidRequest("delegation issued must be a number")
        if expires is not None and (
            not isinstance(expires, float | int)
            or isinstance(expires, bool)
            or not math.isfinite(expires)
        ):
            raise InvalidRequest("delegation expires must be a number or nil")
        return cls(
            topic,
            holder,
            right,
            float(issued),
            None if expires is None else float(expires),
            issuer,
            sig,
        )


def delegate(
    owner: Signer,
    ad: TopicAdvertisement,
    holder_key: bytes,
    right: str,
    *,
    now: float,
    expires: float | None = None,
) -> Delegation:
    """The owner's grant of ``right`` on ``ad``'s topic to ``holder_key``.

    Raises:
        InvalidRequest: an unknown right, or an expiry not after ``now``.
        NotAuthorized: ``owner`` is not the topic's owner.
    """
    if right not in RIGHTS:
        raise InvalidRequest(f"right must be one of {', '.join(RIGHTS)}, got {right!r}")
    if expires is not None and expires <= now:
        raise InvalidRequest("a delegation must expire after it is issued")
    key = public_key_to_bytes(owner.public_key)
    if key != bytes(ad.request.creator_key):
        raise NotAuthorized(f"{owner.id} does not own topic {ad.uuid}: only its owner delegates")
    grant = Delegation(ad.uuid, bytes(holder_key), right, float(now), expires, key)
    return replace(grant, signature=owner.sign(grant.signed_bytes()))


def verify_delegation(
    grant: Delegation, ad: TopicAdvertisement, *, holder_key: bytes, right: str, now: float
) -> None:
    """Check that ``grant`` lets ``holder_key`` use ``right`` on ``ad``'s topic at ``now``.

    ``ad`` must already be verified against the trusted TDNs.

    Raises:
        DelegationError: with the first failed check's ``reason``.
    """
    if grant.topic != ad.uuid:
        raise DelegationError(
            f"the delegation is for topic {grant.topic}, not {ad.uuid}", "wrong-topic"
        )
    if bytes(grant.issuer_key) != bytes(ad.request.creator_key):
        raise DelegationError(
            f"the delegation is signed by {principal_of(grant.issuer_key)[:16]}…, not by the "
            f"owner of topic {ad.uuid}",
            "not-owner",
        )
    if not signature_valid(grant.issuer_key, grant.signature, grant.signed_bytes()):
        raise DelegationError("the delegation's signature does not verify", "forged")
    if bytes(grant.holder_key) != bytes(holder_key):
        raise DelegationError("the delegation was granted to another key", "wrong-holder")
    if grant.right != right:
        raise DelegationError(f"the delegation grants {grant.right}, not {right}", "wrong-right")
    if now < grant.issued - 60.0:
        raise DelegationError("the delegation is not valid yet", "not-yet-valid")
    if grant.expires is not None and now >= grant.expires:
        raise DelegationError(f"the delegation expired at {grant.expires:.3f}", "expired")
    if not ad.live(now):
        raise DelegationError(f"topic {ad.uuid} has expired", "topic-expired")


def authorize(
    ad: TopicAdvertisement,
    holder_key: bytes,
    right: str,
    grant: Delegation | None,
    now: float,
) -> None:
    """May ``holder_key`` use ``right`` on ``ad``'s topic? The owner always may.

    Raises:
        DelegationError: not authorised, with the reason.
    """
    if bytes(holder_key) == bytes(ad.request.creator_key):
        if not ad.live(now):
            raise DelegationError(f"topic {ad.uuid} has expired", "topic-expired")
        return
    if grant is None:
        raise DelegationError(
            f"{right} on topic {ad.uuid} needs a delegation from its owner", "no-delegation"
        )
    verify_delegation(grant, ad, holder_key=holder_key, right=right, now=now)
