"""MQTT <-> overlay mapping for ``trellis bridge mqtt`` (sans-I/O).

Inbound (MQTT -> overlay), for a message on a topic matched by a ``--map PATTERN=ATTRS``
rule, the publication's payload is the MQTT payload bytes, unchanged, and its attributes
are, by precedence (a name set by an earlier source is never overridden by a later one):

1. the rule's fixed attributes (``class:sensors,site:lab``; values are strings);
2. named levels of the pattern (``sensors/{site}/#`` sets ``site``, as a string);
3. ``topic`` (the whole topic), ``topic_0`` ... ``topic_<n-1>`` (each level, a string) and
   ``format``: ``json`` (the payload is UTF-8 RFC 8259 JSON), ``text`` (UTF-8, not JSON,
   or empty) or ``binary``;
4. for a JSON object, its fields in document order; nested objects are flattened with
   ``.`` (``{"loc": {"room": "k"}}`` gives ``loc.room``, to depth 8); for a JSON scalar,
   the attribute ``value``. Strings stay ``str``, ``true``/``false`` ``bool``, integers
   ``int`` and other numbers ``float``. Left out (the payload keeps them): ``null``,
   arrays, integers outside the signed 64-bit range, strings over 64 KiB, names over 256
   characters, and fields past the limit of 128 attributes.

A message that cannot be mapped (no rule matches its topic, or its topic alone needs more
than 128 attributes) raises :class:`Unmappable`.

Outbound (overlay -> MQTT), each ``--out FILTER=TEMPLATE`` rule is one overlay
subscription; a delivery is published on ``TEMPLATE`` with every ``{name}`` replaced by the
publication's attribute ``name``: strings as they are, ``true``/``false``, integers in
decimal, floats as Python's shortest round-trip ``repr`` without an exponent's ``+``
(``1e16``). A value may contain ``/`` (it
then spans several levels) but not ``+``, ``#`` or NUL; a missing attribute, such a value
or a topic over 65,535 UTF-8 bytes raises :class:`Unmappable`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from broker.errors import InvalidRequest
from broker.language.filters import Filter, Value
from broker.language.grammar import parse_filter
from broker.wire.protocol import MAX_ATTR_NAME, MAX_ATTRS, MAX_STRING_VALUE

__all__ = [
    "InboundRule",
    "OutboundRule",
    "RecentWindow",
    "Redeliveries",
    "Unmappable",
    "inbound_attrs",
    "match_topic",
    "outbound_topic",
    "parse_map",
    "parse_out",
    "payload_attrs",
    "render_value",
]

MAX_JSON_DEPTH: Final = 8
MAX_TOPIC_BYTES: Final = 65_535
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**63 - 1
_NAMED_LEVEL: Final = re.compile(r"^\{([^{}/+#]+)\}$")
_PLACEHOLDER: Final = re.compile(r"\{([^{}]+)\}")


class Unmappable(InvalidRequest):
    """A message the bridge cannot map; it is counted, logged and skipped."""


@dataclass(frozen=True)
class InboundRule:
    """``PATTERN=ATTRS``: MQTT messages on topics matching PATTERN become publications."""

    pattern: str
    """The pattern as written (``{name}`` levels included)."""
    subscription: str
    """The MQTT topic filter subscribed to (``{name}`` levels become ``+``)."""
    levels: tuple[str, ...]
    """The pattern's levels: a literal, ``+``, ``#`` or a ``{name}`` level."""
    fixed: tuple[tuple[str, str], ...]

    def names(self) -> dict[int, str]:
        """Level index -> attribute name, for the pattern's ``{name}`` levels."""
        found = {}
        for index, level in enumerate(self.levels):
            named = _NAMED_LEVEL.match(level)
            if named:
                found[index] = named.group(1)
        return found

    def advertisement(self) -> Filter:
        """What the bridge advertises for this rule: the fixed attributes' values, or
        ``*`` when the rule has none."""
        if not self.fixed:
            return parse_filter("*")
        return Filter.from_wire([[name, "eq", value] for name, value in self.fixed])


@dataclass(frozen=True)
class OutboundRule:
    """``FILTER=TEMPLATE``: overlay publications matching FILTER go to MQTT topic TEMPLATE."""

    filter: Filter
    text: str
    template: str
    names: tuple[str, ...]


def parse_map(text: str) -> InboundRule:
    """Parse ``PATTERN=ATTRS`` (split at the first ``=``, so a pattern has none), e.g.
    ``sensors/{site}/#=class:sensors,kind:temp``.

    Raises:
        InvalidRequest: the pattern is not a valid MQTT topic filter, a ``{name}`` level
            is malformed or repeated, or an attribute is not ``name:value``.
    """
    pattern, eq, attrs = text.partition("=")
    if not eq:
        raise InvalidRequest(f"--map {text!r} needs PATTERN=ATTRS, e.g. 'sensors/#=class:sensors'")
    if not pattern:
        raise InvalidRequest(f"--map {text!r}: the topic pattern is empty")
    levels = tuple(pattern.split("/"))
    subscription = []
    seen: set[str] = set()
    for index, level in enumerate(levels):
        named = _NAMED_LEVEL.match(level)
        if named:
            name = named.group(1)
            if name in seen:
                raise InvalidRequest(f"--map {text!r}: level name {name!r} is used twice")
            seen.add(name)
            subscription.append("+")
        elif level == "#":
            if index != len(levels) - 1:
                raise InvalidRequest(f"--map {text!r}: '#' must be the last level")
            subscription.append("#")
        elif level == "+" or not any(c in level for c in "+#{}\0"):
            subscription.append(level)
        else:
            raise InvalidRequest(
                f"--map {text!r}: level {level!r} must be a literal, '+', '#' or '{{name}}'"
            )
    fixed: list[tuple[str, str]] = []
    for item in filter(None, (part.strip() for part in attrs.split(","))):
        name, colon, value = item.partition(":")
        name = name.strip()
        if not colon or not name or len(name) > MAX_ATTR_NAME:
            raise InvalidRequest(f"--map {text!r}: attribute {item!r} must be name:value")
        if name in dict(fixed):
            raise InvalidRequest(f"--map {text!r}: attribute {name!r} is given twice")
        fixed.append((name, value.strip()))
    return InboundRule(pattern, "/".join(subscription), levels, tuple(fixed))


def parse_out(text: str) -> OutboundRule:
    """Parse ``FILTER=TEMPLATE`` (split at the last ``=``, so a template has none), e.g.
    ``class = 'alerts'=alerts/{symbol}``.

    Raises:
        InvalidRequest: no ``=``, an empty or wildcard template, or a filter that does not
            parse or can match nothing (the message says why).
    """
    flt, eq, template = text.rpartition("=")
    flt = flt.strip()
    template = template.strip()
    if not eq or not flt:
        raise InvalidRequest(
            f"--out {text!r} needs FILTER=TEMPLATE, e.g. \"class = 'alerts'=alerts/{{symbol}}\""
        )
    if not template or any(c in _PLACEHOLDER.sub("", template) for c in "+#{}\0"):
        raise InvalidRequest(
            f"--out {text!r}: topic template {template!r} must be non-empty, with no "
            f"'+', '#' or stray braces"
        )
    names = tuple(dict.fromkeys(_PLACEHOLDER.findall(template)))
    try:
        parsed = parse_filter(flt)
    except InvalidRequest as exc:  # FilterError, FilterSyntaxError
        raise InvalidRequest(f"--out {text!r}: filter {flt!r}: {exc}") from None
    return OutboundRule(parsed, flt, template, names)


def match_topic(rule: InboundRule, topic: str) -> dict[str, str] | None:
    """The named levels of ``topic`` under ``rule``, or None when it does not match."""
    parts = topic.split("/")
    levels = rule.levels
    named: dict[str, str] = {}
    for index, level in enumerate(levels):
        if level == "#":
            # '#' matches the parent level too ('a/#' matches 'a'), but not a topic that
            # starts with '$' at the first level (MQTT 4.7.2).
            return named if not (index == 0 and topic.startswith("$")) else None
        if index >= len(parts):
            return None
        part = parts[index]
        if level == "+" or _NAMED_LEVEL.match(level):
            if index == 0 and part.startswith("$"):
                return None
            name = _NAMED_LEVEL.match(level)
            if name:
                named[name.group(1)] = part
        elif level != part:
            return None
    return named if len(parts) == len(levels) else None


def _json_value(value: Any) -> Value | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if _INT_MIN <= value <= _INT_MAX else None
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        return value if len(value) <= MAX_STRING_VALUE else None
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def payload_attrs(payload: bytes) -> tuple[str, list[tuple[str, Value]]]:
    """The payload's format (``json``, ``text`` or ``binary``) and the attributes its
    JSON gives, in document order (see the module docstring for the rules)."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return "binary", []
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except ValueError:  # JSONDecodeError included; NaN and Infinity are not JSON
        return "text", []
    found: list[tuple[str, Value]] = []
    if isinstance(doc, dict):
        _flatten(doc, "", 1, found)
    else:
        value = _json_value(doc)
        if value is not None:
            found.append(("value", value))
    return "json", found


def _flatten(doc: dict[str, Any], prefix: str, depth: int, out: list[tuple[str, Value]]) -> None:
    for key, item in doc.items():
        name = prefix + key
        if isinstance(item, dict):
            if depth < MAX_JSON_DEPTH:
                _flatten(item, name + ".", depth + 1, out)
            continue
        value = _json_value(item)
        if value is not None and name and len(name) <= MAX_ATTR_NAME:
            out.append((name, value))


def inbound_attrs(rules: Sequence[InboundRule], topic: str, payload: bytes) -> dict[str, Value]:
    """The attributes of the publication an MQTT message becomes: the first rule (in
    the order given) whose pattern matches the topic decides.

    Raises:
        Unmappable: no rule matches, or the topic alone exceeds the attribute limit.
    """
    for rule in rules:
        named = match_topic(rule, topic)
        if named is not None:
            break
    else:
        raise Unmappable(f"topic {topic!r} matches no --map pattern")
    parts = topic.split("/")
    if len(rule.fixed) + len(named) + len(parts) + 2 > MAX_ATTRS:
        raise Unmappable(
            f"topic {topic!r} has {len(parts)} levels; with the rule's attributes that is "
            f"over the limit of {MAX_ATTRS} attributes"
        )
    fmt, fields = payload_attrs(payload)
    attrs: dict[str, Value] = dict(rule.fixed)
    for name, level in named.items():
        attrs.setdefault(name, level)
    attrs.setdefault("topic", topic)
    for index, part in enumerate(parts):
        attrs.setdefault(f"topic_{index}", part)
    attrs.setdefault("format", fmt)
    for name, value in fields:
        if len(attrs) >= MAX_ATTRS:
            break
        attrs.setdefault(name, value)
    return attrs


def render_value(value: Value) -> str:
    """An attribute value as it appears in a topic."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value).replace("e+", "e")  # '+' is a wildcard in MQTT
    return str(value)


def outbound_topic(rule: OutboundRule, attrs: Mapping[str, Value]) -> str:
    """The MQTT topic a delivery matching ``rule`` is published on.

    Raises:
        Unmappable: an attribute the template names is missing, its value contains
            ``+``, ``#`` or NUL, or the topic is too long.
    """
    missing = [name for name in rule.names if name not in attrs]
    if missing:
        raise Unmappable(
            f"publication has no attribute {missing[0]!r} for topic template {rule.template!r}"
        )

    def fill(found: re.Match[str]) -> str:
        text = render_value(attrs[found.group(1)])
        if any(c in text for c in "+#\0"):
            raise Unmappable(
                f"attribute {found.group(1)!r} = {text!r} cannot be part of a topic "
                f"(it contains '+', '#' or NUL)"
            )
        return text

    topic = _PLACEHOLDER.sub(fill, rule.template)
    if len(topic.encode("utf-8")) > MAX_TOPIC_BYTES:
        raise Unmappable(f"topic from template {rule.template!r} is over {MAX_TOPIC_BYTES} bytes")
    return topic


class RecentWindow:
    """The last ``size`` keys seen, with a value each (bounded memory, oldest forgotten)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise InvalidRequest("a recent-message window needs room for at least 1 key")
        self.size = size
        self._keys: OrderedDict[object, object] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def get(self, key: object) -> object | None:
        return self._keys.get(key)

    def add(self, key: object, value: object = True) -> None:
        """Remember ``key`` (newest), forgetting the oldest beyond ``size``."""
        self._keys[key] = value
        self._keys.move_to_end(key)
        while len(self._keys) > self.size:
            self._keys.popitem(last=False)


class Redeliveries:
    """Which MQTT messages are copies of messages already bridged.

    Two bounded windows of ``size`` entries:

    - QoS 1 messages bridged, by (packet id, topic, payload digest). A message the MQTT
      broker flags as a redelivery (DUP) that is in this window is a copy: the broker
      resends an unacknowledged message with its packet id. A message without DUP is
      never a copy, however alike (a sensor may send the same reading twice).
    - the last payload bridged from each topic. A retained message (the subscription
      asks for retain-as-published off, so only what a (re)subscription replays has the
      flag) equal to it is a copy: a broker that lost the session replays it.
    """

    def __init__(self, size: int) -> None:
        self._packets = RecentWindow(size)
        self._last_on_topic = RecentWindow(size)

    def is_copy(
        self, topic: str, payload: bytes, *, mid: int, qos: int, retain: bool, dup: bool
    ) -> bool:
        """Whether this message repeats one already bridged."""
        digest = hashlib.sha256(payload).digest()
        if retain:
            return self._last_on_topic.get(topic) == digest
        return dup and qos > 0 and (mid, topic, digest) in self._packets

    def bridged(self, topic: str, payload: bytes, *, mid: int, qos: int) -> None:
        """Record a message as bridged (or as skipped for good: unmappable)."""
        digest = hashlib.sha256(payload).digest()
        self._last_on_topic.add(topic, digest)
        if qos > 0:
            self._packets.add((mid, topic, digest))
