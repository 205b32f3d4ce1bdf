"""How entities, TDNs and topic owners talk over the overlay: classes, attributes, replies.

Everything is an ordinary publication, so TDNs are overlay *clients* and need nothing from
brokers. The well-known topics of SPEC §8 are attribute filters on ``class``:

- ``Services/Discovery/TopicDiscoveryNode``: requests to any TDN (every TDN subscribes);
- ``Services/Discovery/TopicDiscoveryNode/<TDN-ID>``: requests to one TDN;
- ``Services/Discovery/Topics``: advertisements disseminated to every TDN;
- ``Services/Discovery/Reply`` with ``to = <client id>``: answers, sealed to the requester;
- ``Services/Discovery/Flood``: discovery queries answered by topic owners (no TDN needed);
- ``Services/Discovery/Changes`` with ``subject = <collection id or topic UUID>`` and
  ``to = <client id>``: change notifications of a collection or a topic hierarchy, sealed to
  each authorised watcher.

A request's payload is :func:`security.topics_channel.sign_request` of a map with ``op``,
``rid`` (a random id the answer repeats), ``time``, ``reply`` (an X25519 key) and the op's
arguments. An answer's payload is sealed to ``reply`` and holds ``[signer id, signer key,
signature, body]``: the answering TDN (or topic owner) signs ``body`` (a map with ``rid``,
``ok`` and ``result`` or ``error``).
"""

from __future__ import annotations

from typing import Any

import msgpack

from broker.errors import ERRORS_BY_CODE, InvalidRequest, TrellisError
from security.envelope import Signer, public_key_to_bytes
from security.errors import IntegrityError
from security.topics import AdvertisementError
from security.topics_channel import ReplyKey, open_reply, seal_reply
from security.topics_collections import CollectionError, CollectionLimitExceeded, NotAllowedToEdit
from security.topics_delegations import DelegationError
from security.topics_hierarchy import (
    ChildrenNotAllowed,
    HierarchyError,
    LifetimeExceedsParent,
    LimitLoosened,
    MaxDepthExceeded,
    MaxWidthExceeded,
    NotAllowedToRegister,
    ParentUnavailable,
)
from security.topics_identity import signature_valid

__all__ = [
    "CHANGES_CLASS",
    "DISCOVERY_PREFIX",
    "FLOOD_CLASS",
    "REPLY_CLASS",
    "TDN_CLASS",
    "TOPICS_CLASS",
    "error_from_wire",
    "error_to_wire",
    "open_answer",
    "seal_answer",
]

DISCOVERY_PREFIX = "Services/Discovery/"
TDN_CLASS = "Services/Discovery/TopicDiscoveryNode"
TOPICS_CLASS = "Services/Discovery/Topics"
REPLY_CLASS = "Services/Discovery/Reply"
FLOOD_CLASS = "Services/Discovery/Flood"
CHANGES_CLASS = "Services/Discovery/Changes"
_ANSWER_DOMAIN = "trellis/tdn-answer/v1"

_ERRORS: dict[str, type[TrellisError]] = {
    cls.__name__: cls
    for cls in (
        HierarchyError,
        ParentUnavailable,
        ChildrenNotAllowed,
        MaxDepthExceeded,
        MaxWidthExceeded,
        LimitLoosened,
        LifetimeExceedsParent,
        NotAllowedToRegister,
        CollectionError,
        CollectionLimitExceeded,
        NotAllowedToEdit,
        DelegationError,
        AdvertisementError,
    )
}


def error_to_wire(exc: TrellisError) -> dict[str, Any]:
    """An error as an answer carries it: its class, code, message and data attributes."""
    data = {
        k: v
        for k, v in vars(exc).items()
        if k != "message" and isinstance(v, str | int | float | bool)
    }
    return {"kind": type(exc).__name__, "code": exc.code, "message": exc.message, "data": data}


def error_from_wire(error: object) -> TrellisError:
    """The exception an answer's error stands for (the same class, message and data)."""
    if not isinstance(error, dict):
        return TrellisError(f"malformed error: {error!r}")
    message = str(error.get("message", ""))
    cls = _ERRORS.get(str(error.get("kind"))) or ERRORS_BY_CODE.get(
        str(error.get("code")), TrellisError
    )
    exc = cls.__new__(cls)
    TrellisError.__init__(exc, message)
    data = error.get("data")
    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(k, str) and k != "message":
                setattr(exc, k, v)
    return exc


def seal_answer(
    signer: Signer, reply_key: bytes, body: dict[str, Any], certificate: bytes = b""
) -> bytes:
    """An answer to a request that named ``reply_key``, signed by ``signer`` (with its
    certificate, DER, when it has one: requesters that trust the CA check it)."""
    raw = msgpack.packb(body, use_bin_type=True)
    signature = signer.sign(msgpack.packb([_ANSWER_DOMAIN, raw], use_bin_type=True))
    fields: list[Any] = [signer.id, public_key_to_bytes(signer.public_key), signature, raw]
    if certificate:
        fields.append(bytes(certificate))
    return seal_reply(reply_key, msgpack.packb(fields, use_bin_type=True))


def open_answer(reply_key: ReplyKey, sealed: bytes) -> tuple[str, bytes, dict[str, Any], bytes]:
    """(signer id, signer key, body, certificate or empty) of an answer; the caller checks
    who signed it.

    Raises:
        IntegrityError: not sealed to ``reply_key``, or the signature does not verify.
        InvalidRequest: malformed.
    """
    plain = open_reply(reply_key, sealed)
    try:
        fields = msgpack.unpackb(plain, raw=False)
        signer_id, key, signature, raw = fields[:4]
        certificate = fields[4] if len(fields) == 5 else b""
        body = msgpack.unpackb(raw, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise InvalidRequest(f"malformed answer: {exc}") from None
    if (
        not isinstance(body, dict)
        or not isinstance(key, bytes)
        or not isinstance(signer_id, str)
        or not isinstance(certificate, bytes)
    ):
        raise InvalidRequest("malformed answer")
    if not signature_valid(key, signature, msgpack.packb([_ANSWER_DOMAIN, raw], use_bin_type=True)):
        raise IntegrityError(f"the answer signed as {signer_id!r} does not verify")
    return signer_id, key, body, certificate
