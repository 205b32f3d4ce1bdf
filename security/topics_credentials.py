"""What a client shows a broker to use secured topics, and the broker's check of it.

A client proves it holds its key (a signature over its client id and the time) and presents,
per secured topic, the topic's advertisement and, unless it owns the topic, the owner's
delegation. It travels in the ``credentials`` option of HELLO::

    {"key": raw public key, "time": float, "proof": signature,
     "grants": [[advertisement wire form, delegation wire form or nil], ...]}

The broker (:func:`read_credentials`) checks the proof and each advertisement against the
trusted TDNs once, at HELLO, and keeps per topic either the pair or the reason it was refused;
:func:`check_grant` then decides each advertise or subscribe, at that moment (a delegation may
expire while the client is connected). The proof is replayable within ``max_skew`` by someone
who captured the HELLO; over TLS with a client certificate from the project CA for the same
key, the certificate is the proof (checked in the handshake) and nothing can be replayed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from security.envelope import Signer, public_key_to_bytes
from security.errors import InvalidRequest, NotAuthorized, TrellisError
from security.topics import TopicAdvertisement, TrustedTdns, verify_advertisement
from security.topics_delegations import Delegation, DelegationError, authorize
from security.topics_identity import signature_valid

__all__ = ["Credentials", "check_grant", "present_credentials", "read_credentials"]

_DOMAIN = "trellis/client-credentials/v1"
_MAX_GRANTS = 256


def _proof_bytes(client_id: str, at: float) -> bytes:
    return msgpack.packb([_DOMAIN, client_id, float(at)], use_bin_type=True)


def present_credentials(
    signer: Signer,
    client_id: str,
    now: float,
    grants: Sequence[tuple[TopicAdvertisement, Delegation | None]],
) -> dict[str, Any]:
    """The ``credentials`` HELLO option for ``client_id`` holding ``signer``'s key."""
    return {
        "key": public_key_to_bytes(signer.public_key),
        "time": float(now),
        "proof": signer.sign(_proof_bytes(client_id, now)),
        "grants": [[ad.to_wire(), None if d is None else d.to_wire()] for ad, d in grants],
    }


@dataclass
class Credentials:
    """What a broker learned from one client's HELLO."""

    key: bytes | None = None
    grants: dict[str, tuple[TopicAdvertisement, Delegation | None]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # topic -> why


def read_credentials(
    client_id: str,
    option: object,
    trusted: TrustedTdns,
    now: float,
    max_skew: float = 300.0,
    certified_key: bytes | None = None,
) -> Credentials:
    """Check a client's ``credentials`` option (None: a client without any).

    ``certified_key``: the Ed25519 key of the client certificate the TLS handshake verified
    against the project CA (the certificate chain is checked there). The client has then
    proved it holds that key over this very connection, so the credentials must name that
    key, and their signed time is not needed (nothing to replay); a client with a
    certificate and no credentials holds that key and no grants.

    Raises:
        NotAuthorized: the proof of key possession fails or is stale, or the credentials
            name another key than the client's certificate.
        InvalidRequest: the option is malformed.
    """
    if option is None:
        return Credentials(certified_key)
    if not isinstance(option, dict):
        raise InvalidRequest("HELLO option 'credentials' must be a map")
    key, at, proof, grants = (option.get(k) for k in ("key", "time", "proof", "grants"))
    if (
        not isinstance(key, bytes)
        or not isinstance(proof, bytes)
        or not isinstance(at, float | int)
    ):
        raise InvalidRequest("HELLO credentials need 'key', 'time' and 'proof'")
    if certified_key is not None:
        if key != certified_key:
            raise NotAuthorized(
                f"credentials of {client_id!r} name another key than its TLS client certificate"
            )
    elif abs(now - float(at)) > max_skew:
        raise NotAuthorized(f"credentials of {client_id!r} are dated {now - float(at):+.0f} s off")
    elif not signature_valid(key, proof, _proof_bytes(client_id, float(at))):
        raise NotAuthorized(f"credentials of {client_id!r}: the proof of key does not verify")
    if not isinstance(grants, list) or len(grants) > _MAX_GRANTS:
        raise InvalidRequest(f"HELLO credentials 'grants' must be a list of at most {_MAX_GRANTS}")
    found = Credentials(key)
    for item in grants:
        if not isinstance(item, list) or len(item) != 2:
            raise InvalidRequest("each grant is [advertisement, delegation or nil]")
        ad = TopicAdvertisement.from_wire(item[0])
        try:
            verify_advertisement(ad, trusted)
            grant = None if item[1] is None else Delegation.from_wire(item[1])
        except TrellisError as exc:
            found.refused[ad.uuid] = str(exc)
            continue
        found.grants[ad.uuid] = (ad, grant)
    return found


def check_grant(creds: Credentials, topic: str, right: str, now: float) -> None:
    """May this client use ``right`` on ``topic`` now?

    Raises:
        DelegationError: no, with the reason (a refused credential's reason included).
    """
    if topic in creds.refused:
        raise DelegationError(
            f"{right} on topic {topic}: its credential was refused: {creds.refused[topic]}",
            "refused-credential",
        )
    held = creds.grants.get(topic)
    if held is None or creds.key is None:
        raise DelegationError(
            f"{right} on secured topic {topic} needs the topic's advertisement and a "
            "delegation from its owner (none presented)",
            "no-delegation",
        )
    ad, grant = held
    authorize(ad, creds.key, right, grant, now)
