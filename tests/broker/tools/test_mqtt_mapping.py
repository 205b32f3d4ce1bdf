"""The MQTT bridge's pure mapping: topics and JSON payloads into attributes, filters and
templates into topics, and which redeliveries are copies."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from broker.errors import InvalidRequest
from broker.language.filters import Filter
from broker.tools.mqtt_mapping import (
    Redeliveries,
    Unmappable,
    inbound_attrs,
    match_topic,
    outbound_topic,
    parse_map,
    parse_out,
    payload_attrs,
    render_value,
)
from broker.wire.protocol import MAX_ATTRS, validate_attrs

level = st.text(
    st.characters(blacklist_characters="/+#\0{}", blacklist_categories=("Cs",)), max_size=8
)
topics = st.lists(level, min_size=1, max_size=6).map("/".join)
pattern_level = level.filter(lambda text: "=" not in text)  # a map splits at the first '='

names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)


def mqtt_matches(flt: str, topic: str) -> bool:
    """MQTT topic-filter matching, written independently of the code under test."""
    if topic.startswith("$") and flt[:1] in ("+", "#"):
        return False
    pattern = ""
    for i, part in enumerate(flt.split("/")):
        sep = "/" if i else ""
        if part == "#":
            tail = pattern + f"({sep}.*)?" if i else ".*"
            return re.fullmatch(tail, topic, re.DOTALL) is not None
        pattern += sep + ("[^/]*" if part == "+" else re.escape(part))
    return re.fullmatch(pattern, topic, re.DOTALL) is not None


# -- topics --------------------------------------------------------------------------------


@given(
    st.lists(st.one_of(pattern_level, st.just("+"), st.just("#")), min_size=1, max_size=5),
    topics,
)
def test_a_pattern_matches_a_topic_exactly_when_mqtt_would(parts: list[str], topic: str) -> None:
    if "#" in parts:
        parts = parts[: parts.index("#") + 1]
    assume("/".join(parts))  # an empty pattern is refused
    rule = parse_map("/".join(parts) + "=class:x")
    assert (match_topic(rule, topic) is not None) == mqtt_matches(rule.subscription, topic)


@given(st.lists(level, min_size=1, max_size=6), st.sampled_from(["", "/#"]))
def test_named_levels_become_attributes_and_are_subscribed_as_plus(
    parts: list[str], tail: str
) -> None:
    pattern = "/".join(["sensors", "{site}", "{kind}"]) + tail
    rule = parse_map(f"{pattern}=class:sensors")
    assert rule.subscription == "sensors/+/+" + tail
    topic = "/".join(["sensors", *parts])
    named = match_topic(rule, topic)
    if len(parts) == 2 or (tail and len(parts) >= 2):
        assert named == {"site": parts[0], "kind": parts[1]}
    else:
        assert named is None


@given(topics, st.binary(max_size=64))
def test_topic_levels_and_the_rule_become_attributes_every_time(topic: str, payload: bytes) -> None:
    assume(not topic.startswith("$"))  # '#' does not match $SYS-like topics (MQTT 4.7.2)
    attrs = inbound_attrs([parse_map("#=class:sensors,site:lab")], topic, payload)
    levels = topic.split("/")
    assert attrs["class"] == "sensors"
    assert attrs["site"] == "lab"
    assert attrs["topic"] == topic
    assert [attrs[f"topic_{i}"] for i in range(len(levels))] == levels
    assert f"topic_{len(levels)}" not in attrs
    assert attrs["format"] in ("json", "text", "binary")
    assert validate_attrs("PUBLISH", attrs) is attrs
    assert rule_advertises(attrs)


def rule_advertises(attrs: dict[str, object]) -> bool:
    """The rule's advertisement covers what it publishes (or the broker would refuse it)."""
    adv = parse_map("#=class:sensors,site:lab").advertisement()
    return adv.matches(attrs)  # type: ignore[arg-type]


def test_the_first_matching_rule_decides_and_no_match_is_unmappable() -> None:
    rules = [parse_map("a/+=class:first"), parse_map("a/#=class:second")]
    assert inbound_attrs(rules, "a/b", b"")["class"] == "first"
    assert inbound_attrs(rules, "a/b/c", b"")["class"] == "second"
    with pytest.raises(Unmappable, match="matches no --map pattern"):
        inbound_attrs(rules, "b/c", b"")


def test_a_topic_too_deep_for_the_attribute_limit_is_unmappable() -> None:
    rule = parse_map("#=class:x")
    inbound_attrs([rule], "/".join(["l"] * (MAX_ATTRS - 3)), b"")
    with pytest.raises(Unmappable, match="over the limit"):
        inbound_attrs([rule], "/".join(["l"] * (MAX_ATTRS - 2)), b"")


@pytest.mark.parametrize(
    "text",
    ["sensors/#", "=class:x", "a/#/b=class:x", "a/b+=class:x", "a/{x}/{x}=c:d", "a=class"],
)
def test_a_malformed_map_is_refused_naming_it(text: str) -> None:
    with pytest.raises(InvalidRequest, match="--map"):
        parse_map(text)


# -- payloads ------------------------------------------------------------------------------


@given(st.dictionaries(names, scalars, max_size=10))
def test_json_object_fields_become_typed_attributes(fields: dict[str, object]) -> None:
    fmt, found = payload_attrs(json.dumps(fields).encode())
    assert fmt == "json"
    assert dict(found) == fields
    assert all(type(dict(found)[k]) is type(v) for k, v in fields.items())


@given(st.dictionaries(names, st.dictionaries(names, scalars, max_size=3), max_size=3))
def test_nested_objects_are_flattened_with_dots(doc: dict[str, dict[str, object]]) -> None:
    _, found = payload_attrs(json.dumps(doc).encode())
    assert dict(found) == {f"{k}.{n}": v for k, inner in doc.items() for n, v in inner.items()}


@given(scalars)
def test_a_json_scalar_becomes_the_value_attribute(value: object) -> None:
    assert payload_attrs(json.dumps(value).encode()) == ("json", [("value", value)])


def test_fields_that_cannot_be_attributes_are_left_out_and_the_rest_kept() -> None:
    doc = {"n": None, "list": [1, 2], "huge": 2**64, "long": "x" * 70_000, "ok": 1, "x" * 300: 1}
    assert payload_attrs(json.dumps(doc).encode()) == ("json", [("ok", 1)])


@given(st.text(max_size=40))
def test_text_that_is_not_json_is_text_with_no_fields(text: str) -> None:
    try:
        json.loads(text)
    except ValueError:
        assert payload_attrs(text.encode()) == ("text", [])


@pytest.mark.parametrize("payload", [b"NaN", b"Infinity", b"-Infinity", b"", b"{"])
def test_non_standard_json_and_empty_payloads_are_text(payload: bytes) -> None:
    assert payload_attrs(payload) == ("text", [])


@given(st.binary(min_size=1, max_size=40))
def test_bytes_that_are_not_utf8_are_binary(payload: bytes) -> None:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        assert payload_attrs(payload) == ("binary", [])


@given(st.dictionaries(names, scalars, max_size=10))
def test_rule_topic_and_format_attributes_win_over_json_fields(fields: dict[str, object]) -> None:
    fields = {**fields, "class": "spoofed", "topic": "spoofed", "format": "spoofed"}
    attrs = inbound_attrs(
        [parse_map("s/{site}=class:sensors")], "s/lab", json.dumps(fields).encode()
    )
    assert (attrs["class"], attrs["site"], attrs["topic"], attrs["format"]) == (
        "sensors",
        "lab",
        "s/lab",
        "json",
    )


def test_json_fields_stop_at_the_attribute_limit() -> None:
    doc = {f"f{i:03}": i for i in range(200)}
    attrs = inbound_attrs([parse_map("a=class:x")], "a", json.dumps(doc).encode())
    assert len(attrs) == MAX_ATTRS
    assert attrs["f000"] == 0
    assert "f199" not in attrs


# -- filters -> topics ---------------------------------------------------------------------


@given(st.dictionaries(names, scalars.filter(lambda v: not isinstance(v, str)), min_size=1))
def test_a_template_renders_every_value_type_deterministically(attrs: dict[str, object]) -> None:
    names_ = sorted(attrs)
    rule = parse_out("x exists=" + "/".join(f"{{{n}}}" for n in names_))
    topic = outbound_topic(rule, attrs)  # type: ignore[arg-type]
    assert topic.split("/") == [render_value(attrs[n]) for n in names_]  # type: ignore[arg-type]
    for part, n in zip(topic.split("/"), names_, strict=True):
        value = attrs[n]
        if isinstance(value, bool):
            assert part in ("true", "false")
        elif isinstance(value, float):
            assert float(part) == value or (math.isnan(value) and part == "nan")


@given(
    st.text(st.characters(blacklist_characters="+#\0", blacklist_categories=("Cs",)), min_size=1)
)
def test_a_string_value_is_placed_as_it_is(symbol: str) -> None:
    rule = parse_out("class = 'alerts'=alerts/{symbol}/now")
    assert outbound_topic(rule, {"symbol": symbol}) == f"alerts/{symbol}/now"


@pytest.mark.parametrize("value", ["a+b", "#", "a\0b"])
def test_a_value_with_mqtt_wildcards_is_unmappable(value: str) -> None:
    with pytest.raises(Unmappable, match="cannot be part of a topic"):
        outbound_topic(parse_out("x exists=t/{x}"), {"x": value})


def test_a_missing_attribute_is_unmappable_naming_it() -> None:
    with pytest.raises(Unmappable, match="no attribute 'symbol'"):
        outbound_topic(parse_out("class = 'alerts'=alerts/{symbol}"), {"class": "alerts"})


def test_the_filter_is_split_at_the_last_equals_sign() -> None:
    rule = parse_out("class = 'alerts' and sev >= 3=alerts/{sev}")
    assert rule.filter == Filter.from_wire([["class", "eq", "alerts"], ["sev", "ge", 3]])
    assert rule.template == "alerts/{sev}"
    assert rule.names == ("sev",)


@pytest.mark.parametrize("text", ["alerts/{x}", "class = 'a'=", "class = 'a'=a/#", "=a/b"])
def test_a_malformed_out_rule_is_refused(text: str) -> None:
    with pytest.raises(InvalidRequest, match="--out"):
        parse_out(text)


@pytest.mark.parametrize(
    ("text", "why"),
    [("class = = 'a'=t", "expected a value"), ("x > 5 and x < 3=t", "x")],
)
def test_an_out_rule_with_a_bad_filter_is_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(InvalidRequest, match=f"--out .*filter .*{why}"):
        parse_out(text)


# -- redeliveries --------------------------------------------------------------------------


@given(
    st.lists(
        st.tuples(st.integers(1, 5), st.sampled_from(["a", "b"]), st.binary(max_size=2)),
        max_size=30,
    )
)
def test_only_a_dup_flagged_copy_of_a_bridged_packet_is_dropped(
    messages: list[tuple[int, str, bytes]],
) -> None:
    seen = Redeliveries(1000)
    bridged: set[tuple[int, str, bytes]] = set()
    for mid, topic, payload in messages:
        fresh = seen.is_copy(topic, payload, mid=mid, qos=1, retain=False, dup=False)
        redelivery = seen.is_copy(topic, payload, mid=mid, qos=1, retain=False, dup=True)
        assert not fresh  # never without DUP: the same reading may come twice
        assert redelivery == ((mid, topic, payload) in bridged)
        seen.bridged(topic, payload, mid=mid, qos=1)
        bridged.add((mid, topic, payload))


def test_a_replayed_retained_message_is_dropped_unless_it_changed() -> None:
    seen = Redeliveries(10)
    assert not seen.is_copy("s", b"on", mid=1, qos=1, retain=True, dup=False)
    seen.bridged("s", b"on", mid=1, qos=1)
    assert seen.is_copy("s", b"on", mid=7, qos=1, retain=True, dup=False)
    seen.bridged("s", b"off", mid=2, qos=1)  # a live update of the same topic
    assert not seen.is_copy("s", b"on", mid=8, qos=1, retain=True, dup=False)
    assert seen.is_copy("s", b"off", mid=9, qos=1, retain=True, dup=False)


def test_the_window_forgets_the_oldest_beyond_its_size() -> None:
    seen = Redeliveries(3)
    for mid in range(1, 5):
        seen.bridged("t", b"x", mid=mid, qos=1)
    assert not seen.is_copy("t", b"x", mid=1, qos=1, retain=False, dup=True)
    assert all(seen.is_copy("t", b"x", mid=m, qos=1, retain=False, dup=True) for m in (2, 3, 4))
