"""Secured topics at a broker: which advertisements and subscriptions a client may make.

A publication on a secured topic has ``class = 'Secured/<topic UUID>'``. With
``topic_trust`` set (the trusted TDNs file), a broker accepts from a local client an
ADVERTISE or SUBSCRIBE whose filter could match such a publication only when the filter pins
``class`` to secured topics (``=`` or ``in``) for which the client's HELLO credentials grant
``publish`` (advertise) or ``subscribe``; otherwise it answers ``NotAuthorized`` with the
reason and keeps the connection. A filter that pins ``class`` to anything else is untouched;
one that leaves ``class`` open (``*``, ``price > 5``) could match secured publications, so it
is refused. The marker is ``class`` because filters cannot say "attribute absent": with a
separate attribute, every ordinary subscription would intersect the secured ones.

Publishing needs a covering advertisement, so publications on a secured topic need the
publish right too; a subscriber refused here never receives that topic's publications or key
shares. Subscriptions and advertisements from neighbour brokers are not checked again (each
broker checks its own clients). Rights are checked when the request is made: a delegation
that expires later does not withdraw a subscription already in force.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from broker.language.filters import Filter, Op, Predicate
from security.errors import NotAuthorized
from security.topics import TrustedTdns
from security.topics_credentials import Credentials, check_grant, read_credentials
from security.topics_identity import own_copy

__all__ = ["SECURED_PREFIX", "TopicGuard", "secured_class"]

SECURED_PREFIX = "Secured/"
_ANY_SECURED = Filter((Predicate("class", Op.PREFIX, SECURED_PREFIX),))


def secured_class(topic: str) -> str:
    """The ``class`` of publications on a secured topic."""
    return SECURED_PREFIX + topic


class TopicGuard:
    """The broker's check of secured-topic rights (pure but for the clock)."""

    def __init__(self, trusted: TrustedTdns) -> None:
        self.trusted = own_copy(trusted)

    def admit(
        self, client_id: str, options: Mapping[str, object], certified_key: bytes | None = None
    ) -> Credentials:
        """The credentials of a client's HELLO (raises NotAuthorized on a bad proof);
        ``certified_key``: its TLS client certificate's Ed25519 key, when it has one."""
        return read_credentials(
            client_id,
            options.get("credentials"),
            self.trusted,
            time.time(),
            certified_key=certified_key,
        )

    def check(self, creds: Credentials, right: str, flt: Filter) -> None:
        """Raise NotAuthorized unless ``flt`` stays off secured topics or pins topics the
        client holds ``right`` on."""
        if not flt.intersects(_ANY_SECURED):
            return
        topics: set[str] | None = None
        for predicate in flt.predicates:
            if predicate.attr != "class":
                continue
            if predicate.op is Op.EQ and isinstance(predicate.value, str):
                values = {predicate.value}
            elif predicate.op is Op.IN and isinstance(predicate.value, frozenset):
                values = {v for v in predicate.value if isinstance(v, str)}
            else:
                continue
            topics = values if topics is None else topics & values
        if topics is None:
            raise NotAuthorized(
                f"{right}: this filter could match publications of secured topics; name the "
                f"class (class = '{SECURED_PREFIX}<topic uuid>' for a secured topic, or "
                "another class) and hold a delegation for each secured topic"
            )
        now = time.time()
        for value in sorted(topics):
            if value.startswith(SECURED_PREFIX):
                check_grant(creds, value.removeprefix(SECURED_PREFIX), right, now)
