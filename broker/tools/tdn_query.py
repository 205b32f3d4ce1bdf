"""Discovery queries over topic advertisements (sans-I/O): what TDNs and topic owners answer.

Three kinds, as SPEC §8 names them:

- ``exact``: the topic's synopsis equals the text;
- ``regex``: the synopsis matches the regular expression in full (``re.fullmatch``; at most
  ``MAX_PATTERN`` characters, compiled once per query);
- ``properties``: the topic's descriptors match a filter of the broker's filter language
  (``kind = 'sensor' and floor >= 2``), the same language and semantics as subscriptions.

Results depend on who asks: a topic is returned only when it is live and the requester may
discover it and every ancestor (:meth:`security.topics_hierarchy.TopicRegistry.visible`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.errors import InvalidRequest
from broker.language.grammar import parse_filter
from security.topics import TopicAdvertisement

__all__ = ["KINDS", "MAX_PATTERN", "Query", "compile_query", "run_query"]

KINDS = ("exact", "regex", "properties")
MAX_PATTERN = 512


@dataclass(frozen=True)
class Query:
    """A discovery query: ``kind`` (exact, regex, properties) and its ``text``."""

    kind: str
    text: str

    def to_wire(self) -> list[str]:
        return [self.kind, self.text]

    @classmethod
    def from_wire(cls, data: object) -> Query:
        if (
            not isinstance(data, list | tuple)
            or len(data) != 2
            or not all(isinstance(x, str) for x in data)
        ):
            raise InvalidRequest("a query is [kind, text]")
        return cls(data[0], data[1])


def compile_query(query: Query) -> Callable[[TopicAdvertisement], bool]:
    """A predicate over advertisements.

    Raises:
        InvalidRequest: an unknown kind, a bad regular expression (or one longer than
            ``MAX_PATTERN``), or a filter that does not parse (``FilterError``).
    """
    if query.kind == "exact":
        text = query.text
        return lambda ad: ad.request.synopsis == text
    if query.kind == "regex":
        if len(query.text) > MAX_PATTERN:
            raise InvalidRequest(f"regular expression longer than {MAX_PATTERN} characters")
        try:
            pattern = re.compile(query.text)
        except re.error as exc:
            raise InvalidRequest(f"bad regular expression {query.text!r}: {exc}") from None
        return lambda ad: pattern.fullmatch(ad.request.synopsis) is not None
    if query.kind == "properties":
        flt = parse_filter(query.text)
        return lambda ad: flt.matches(ad.request.descriptors)
    raise InvalidRequest(f"query kind must be one of {', '.join(KINDS)}, got {query.kind!r}")


def run_query(
    query: Query,
    candidates: Iterable[TopicAdvertisement],
    visible: Callable[[TopicAdvertisement], bool],
    *,
    limit: int = 1000,
) -> list[TopicAdvertisement]:
    """The ``candidates`` matching ``query`` that pass ``visible`` (the requester's
    credentials against the topic's and its ancestors' discovery restrictions), at most
    ``limit``, by UUID order. A TDN passes its registry and
    ``lambda ad: registry.visible(ad.uuid, principal, now)``."""
    match = compile_query(query)
    found = [ad for ad in candidates if match(ad) and visible(ad)]
    found.sort(key=lambda ad: ad.uuid)
    return found[:limit]
