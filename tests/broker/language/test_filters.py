"""The filter language: parsing, wire validation, matching semantics, covering and intersection."""

from __future__ import annotations

import math
import pickle
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import FilterError, FilterSyntaxError
from broker.language.filters import (
    MAX_PREDICATES,
    MAX_STRING_LENGTH,
    Filter,
    Op,
    Predicate,
    Value,
)
from broker.language.grammar import parse_attrs, parse_filter

# ---------------------------------------------------------------------------------------------
# Strategies: a small universe so that random filters and publications collide often.

ATTRS = ("a", "b", "c")
STRINGS = st.sampled_from(["", "a", "ab", "abc", "b", "ba", "bab", "c", "a\0", "zz"])
NUMBERS = st.sampled_from([-1, 0, 1, 2, 3, 0.5, 1.0, 2.5, -0.5, 10])
BOOLS = st.booleans()
SCALARS = st.one_of(STRINGS, NUMBERS, BOOLS)
PUB_VALUES = st.one_of(SCALARS, st.just(math.nan), st.just(math.inf))


@st.composite
def predicates(draw: st.DrawFn) -> Predicate:
    attr = draw(st.sampled_from(ATTRS))
    op = draw(st.sampled_from(list(Op)))
    if op is Op.EXISTS:
        return Predicate(attr, op, None)
    if op in (Op.PREFIX, Op.SUFFIX, Op.CONTAINS):
        return Predicate(attr, op, draw(STRINGS))
    if op in (Op.LT, Op.LE, Op.GT, Op.GE):
        return Predicate(attr, op, draw(st.one_of(STRINGS, NUMBERS)))
    if op is Op.IN:
        members = draw(st.lists(st.one_of(STRINGS, NUMBERS), min_size=1, max_size=3))
        if draw(st.booleans()):
            members.append(draw(BOOLS))
            members = [m for m in members if type(m) is bool or m not in (0, 1)]
        return Predicate(attr, op, frozenset(members))
    return Predicate(attr, op, draw(SCALARS))


filters = st.builds(lambda ps: Filter(tuple(ps)), st.lists(predicates(), max_size=4))
publications = st.dictionaries(st.sampled_from(ATTRS), PUB_VALUES, max_size=3)


def matches(text: str, **attrs: Value) -> bool:
    return parse_filter(text).matches(attrs)


# ---------------------------------------------------------------------------------------------
# Parsing and the text form.


def test_parse_reads_the_spec_example() -> None:
    flt = parse_filter("class = 'stock' and symbol = 'ACME' and price < 100")
    assert flt.to_wire() == [
        ["class", "eq", "stock"],
        ["price", "lt", 100],
        ["symbol", "eq", "ACME"],
    ]


@pytest.mark.parametrize(
    ("text", "wire"),
    [
        ("x = 1", ["x", "eq", 1]),
        ("x == 1", ["x", "eq", 1]),
        ("x != 'a'", ["x", "ne", "a"]),
        ("x < -2.5", ["x", "lt", -2.5]),
        ("x <= 1e3", ["x", "le", 1000.0]),
        ("x > 'm'", ["x", "gt", "m"]),
        ("x >= -7", ["x", "ge", -7]),
        ('x prefix "AC"', ["x", "prefix", "AC"]),
        ("x SUFFIX 'ME'", ["x", "suffix", "ME"]),
        ("x contains 'CM'", ["x", "contains", "CM"]),
        ("x in ('b', 3, 'a', true)", ["x", "in", [True, 3, "a", "b"]]),
        ("x exists", ["x", "exists", None]),
        ("x = TRUE", ["x", "eq", True]),
        ("x = false", ["x", "eq", False]),
        ("a.b-c/d_1 = .5", ["a.b-c/d_1", "eq", 0.5]),
        ("`odd name` = 'it\\'s'", ["odd name", "eq", "it's"]),
        ("x = '\\n\\t\\x41\\u00e9\\U0001F600\\\\'", ["x", "eq", "\n\tAé😀\\"]),
    ],
)
def test_parse_reads_every_operator_and_literal(text: str, wire: list[Any]) -> None:
    assert parse_filter(text).to_wire() == [wire]


def test_keywords_are_case_insensitive() -> None:
    assert parse_filter("x = 1 AND y Exists") == parse_filter("x = 1 and y exists")


def test_star_is_the_filter_that_matches_everything() -> None:
    flt = parse_filter(" * ")
    assert flt == Filter(())
    assert str(flt) == "*"
    assert flt.matches({})
    assert flt.to_wire() == []


def test_predicate_order_does_not_change_the_filter() -> None:
    a = parse_filter("price < 100 and class = 'stock' and price > 10")
    b = parse_filter("class = 'stock' and price > 10 and price < 100 and class = 'stock'")
    assert a == b
    assert hash(a) == hash(b)
    assert len(a.predicates) == 3


def test_true_and_one_are_different_predicates() -> None:
    assert parse_filter("x = true") != parse_filter("x = 1")
    assert parse_filter("x = 1") == parse_filter("x = 1.0")


@pytest.mark.parametrize(
    ("text", "message", "position", "token"),
    [
        (
            "class = 'stock' or x = 1",
            "unexpected token 'or' at position 16: expected 'and'",
            16,
            "or",
        ),
        ("", "empty filter at position 0: write '*' to match every publication", 0, ""),
        ("   ", "empty filter at position 0: write '*' to match every publication", 0, ""),
        (
            "symbol = ACME",
            "unexpected token 'ACME' at position 9: expected a value (strings need quotes)",
            9,
            "ACME",
        ),
        ("x = 1 and", "unexpected end of input at position 9: expected an attribute name", 9, ""),
        (
            "x ~ 1",
            "unexpected token '~' at position 2: expected an operator "
            "(= != < <= > >= prefix suffix contains in exists)",
            2,
            "~",
        ),
        ("x in ()", "unexpected token ')' at position 6: expected a value", 6, ")"),
        ("x in (1 2)", "unexpected token '2' at position 8: expected ',' or ')'", 8, "2"),
        ("x in 1", "unexpected token '1' at position 5: expected '('", 5, "1"),
        ("5x = 1", "unexpected token '5x' at position 0: expected an attribute name", 0, "5x"),
        ("x = 'abc", "unterminated string starting at position 4", 4, "'abc"),
        ("x = 'a\\qb'", "invalid escape '\\\\q' at position 6", 6, "\\q"),
        ("x = '\\x4'", "invalid escape '\\\\x4' at position 5", 5, "\\x4"),
        (
            "* and x = 1",
            "unexpected token 'and' at position 2: expected end of input after '*'",
            2,
            "and",
        ),
    ],
)
def test_syntax_errors_name_the_token_and_position(
    text: str, message: str, position: int, token: str
) -> None:
    with pytest.raises(FilterSyntaxError) as caught:
        parse_filter(text)
    assert caught.value.message == message
    assert caught.value.position == position
    assert caught.value.token == token
    assert caught.value.text == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x prefix 5", "invalid value at position 9: 'prefix' needs a string, got int 5"),
        ("x suffix true", "invalid value at position 9: 'suffix' needs a string, got bool True"),
        (
            "x contains 1.5",
            "invalid value at position 11: 'contains' needs a string, got float 1.5",
        ),
        ("x < true", "invalid value at position 4: '<' needs a number or a string, got bool True"),
        (
            "x >= false",
            "invalid value at position 5: '>=' needs a number or a string, got bool False",
        ),
        (
            "x in (1, true)",
            "invalid value at position 5: 'in' cannot mix true/false with the numbers 1/0",
        ),
        ("x = 1e999", "invalid value at position 4: inf is not a finite number"),
        (
            "x = 99999999999999999999",
            "invalid value at position 4: integer 99999999999999999999 does not fit in 64 bits",
        ),
    ],
)
def test_type_rules_are_enforced_at_parse(text: str, message: str) -> None:
    with pytest.raises(FilterSyntaxError) as caught:
        parse_filter(text)
    assert caught.value.message == message


def test_parse_limits_predicates_and_string_lengths() -> None:
    many = " and ".join(f"x{i} = 1" for i in range(MAX_PREDICATES))
    assert len(parse_filter(many).predicates) == MAX_PREDICATES
    with pytest.raises(FilterSyntaxError, match="too many predicates at position"):
        parse_filter(many + " and y = 1")
    with pytest.raises(FilterSyntaxError, match="string of 1025 characters is longer than 1024"):
        parse_filter(f"x = '{'a' * (MAX_STRING_LENGTH + 1)}'")


@given(filters)
@settings(max_examples=200)
def test_text_form_round_trips(flt: Filter) -> None:
    if flt.is_satisfiable():
        assert parse_filter(str(flt)) == flt
    else:
        with pytest.raises(FilterError, match="unsatisfiable filter, it can never match"):
            parse_filter(str(flt))


def unchecked(text: str) -> Filter:
    """The conjunction ``text`` even when it is unsatisfiable (which parse_filter refuses)."""
    return Filter(tuple(p for part in text.split(" and ") for p in parse_filter(part).predicates))


@given(st.text(max_size=20), st.text(min_size=1, max_size=10))
def test_any_string_and_name_survive_the_text_form(value: str, name: str) -> None:
    flt = Filter((Predicate(name, Op.EQ, value),))
    assert parse_filter(str(flt)) == flt


# ---------------------------------------------------------------------------------------------
# parse_attrs (the CLI's --attrs).


def test_parse_attrs_reads_typed_literals() -> None:
    assert parse_attrs("class='x', price=5,ok=true, f=-1.5e3, s=\"a,b\"") == {
        "class": "x",
        "price": 5,
        "ok": True,
        "f": -1500.0,
        "s": "a,b",
    }
    assert parse_attrs("") == {}


@pytest.mark.parametrize(
    ("text", "message", "position"),
    [
        ("a=1,a=2", "duplicate attribute 'a' at position 4", 4),
        ("a=1;b=2", "unexpected token ';b' at position 3: expected ',' or end of input", 3),
        ("a 1", "unexpected token '1' at position 2: expected '='", 2),
        ("a=x", "unexpected token 'x' at position 2: expected a value (strings need quotes)", 2),
        ("a=1,", "unexpected end of input at position 4: expected an attribute name", 4),
    ],
)
def test_parse_attrs_errors_carry_positions(text: str, message: str, position: int) -> None:
    with pytest.raises(FilterSyntaxError) as caught:
        parse_attrs(text)
    assert caught.value.message == message
    assert caught.value.position == position


# ---------------------------------------------------------------------------------------------
# Wire form.


def test_wire_form_round_trips_with_sorted_in_lists() -> None:
    flt = parse_filter("x in (3, 'b', 1.5) and y exists and z prefix 'p'")
    wire = flt.to_wire()
    assert wire == [["x", "in", [1.5, 3, "b"]], ["y", "exists", None], ["z", "prefix", "p"]]
    assert Filter.from_wire(wire) == flt
    assert Filter.from_wire(tuple(tuple(p) for p in wire)) == flt


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("x = 1", "a filter must be a list of predicates, got str 'x = 1'"),
        ([["x", "eq", 1], ["y"]], "predicate 1: must be a list [attr, op, value], got list ['y']"),
        ([["", "eq", 1]], "predicate 0: attribute name is empty"),
        ([[3, "eq", 1]], "predicate 0: attribute name must be a string, got int 3"),
        (
            [["x", "like", 1]],
            "predicate 0: unknown operator str 'like'; expected one of "
            "eq, ne, lt, le, gt, ge, prefix, suffix, contains, exists, in",
        ),
        ([["x", "prefix", 1]], "predicate 0: 'prefix' needs a string, got int 1"),
        ([["x", "lt", True]], "predicate 0: 'lt' needs a number or a string, got bool True"),
        ([["x", "eq", None]], "predicate 0: NoneType None is not a str, int, float or bool"),
        ([["x", "eq", [1]]], "predicate 0: list [1] is not a str, int, float or bool"),
        ([["x", "exists", 1]], "predicate 0: 'exists' takes no value, got int 1"),
        ([["x", "in", []]], "predicate 0: 'in' needs at least one value"),
        ([["x", "in", 1]], "predicate 0: 'in' needs a list of values, got int 1"),
        (
            [["x", "in", [1, b"x"]]],
            "predicate 0: 'in' value bytes b'x' is not a str, int, float or bool",
        ),
        ([["x", "eq", math.nan]], "predicate 0: nan is not a finite number"),
        ([["x", "eq", 2**64]], f"predicate 0: integer {2**64} does not fit in 64 bits"),
        ([["x", "eq", "a" * 1025]], "predicate 0: string of 1025 characters is longer than 1024"),
        (
            [["x" * 1025, "exists", None]],
            "predicate 0: attribute name is longer than 1024 characters",
        ),
        ([["x", "eq", 1]] * 65, "a filter has at most 64 predicates, got 65"),
    ],
)
def test_from_wire_names_the_offending_predicate(data: object, message: str) -> None:
    with pytest.raises(FilterError) as caught:
        Filter.from_wire(data)
    assert caught.value.message == message


def test_from_wire_accepts_the_empty_list_as_match_everything() -> None:
    assert Filter.from_wire([]) == parse_filter("*")


def test_predicate_construction_validates_and_coerces() -> None:
    assert Predicate("x", "in", [1, 2]) == Predicate("x", Op.IN, frozenset({1, 2}))  # type: ignore[arg-type]
    with pytest.raises(FilterError, match="unknown operator"):
        Predicate("x", "like", 1)  # type: ignore[arg-type]
    with pytest.raises(FilterError, match="'prefix' needs a string"):
        Predicate("x", Op.PREFIX, 1)


def test_filters_survive_pickling_with_their_compiled_tests() -> None:
    flt = parse_filter("x in (1, 'a') and y < 3 and z exists")
    copy = pickle.loads(pickle.dumps(flt))
    assert copy == flt
    assert copy.matches({"x": "a", "y": 2.5, "z": False})


# ---------------------------------------------------------------------------------------------
# Matching semantics.


@pytest.mark.parametrize(
    ("text", "attrs", "expected"),
    [
        ("x = 1", {"x": 1}, True),
        ("x = 1", {"x": 1.0}, True),
        ("x = 1", {"x": True}, False),
        ("x = true", {"x": 1}, False),
        ("x = true", {"x": True}, True),
        ("x = 'a'", {"x": "a"}, True),
        ("x = 1", {}, False),
        ("x != 1", {"x": 2}, True),
        ("x != 1", {"x": 1}, False),
        ("x != 1", {"x": "1"}, False),
        ("x != 1", {}, False),
        ("x != 1", {"x": math.nan}, True),
        ("x != true", {"x": False}, True),
        ("x != true", {"x": 0}, False),
        ("x < 5", {"x": 4.9}, True),
        ("x < 5", {"x": 5}, False),
        ("x <= 5", {"x": 5.0}, True),
        ("x > 5", {"x": math.inf}, True),
        ("x > 5", {"x": math.nan}, False),
        ("x >= 5", {"x": 5}, True),
        ("x < 5", {"x": "4"}, False),
        ("x < 5", {"x": False}, False),
        ("x < 'b'", {"x": "abc"}, True),
        ("x < 'b'", {"x": 1}, False),
        ("x prefix 'AC'", {"x": "ACME"}, True),
        ("x prefix 'AC'", {"x": "MAC"}, False),
        ("x suffix 'ME'", {"x": "ACME"}, True),
        ("x contains 'CM'", {"x": "ACME"}, True),
        ("x contains '1'", {"x": 1}, False),
        ("x in (1, 'a')", {"x": 1.0}, True),
        ("x in (1, 'a')", {"x": True}, False),
        ("x in (true)", {"x": 1}, False),
        ("x in (true)", {"x": True}, True),
        ("x in (1, 'a')", {"x": "b"}, False),
        ("x exists", {"x": False}, True),
        ("x exists", {"y": 1}, False),
        ("price > 10 and price <= 20", {"price": 20}, True),
        ("price > 10 and price <= 20", {"price": 10}, False),
    ],
)
def test_matching_follows_the_typed_semantics(
    text: str, attrs: dict[str, Value], expected: bool
) -> None:
    assert parse_filter(text).matches(attrs) is expected


# ---------------------------------------------------------------------------------------------
# Satisfiability, intersection, covering: exact on the common cases.


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("x > 5 and x < 3", False),
        ("x > 5 and x < 5", False),
        ("x >= 5 and x <= 5", True),
        ("x >= 5 and x <= 5 and x != 5", False),
        ("x = 1 and x = 2", False),
        ("x = 1 and x = 1.0", True),
        ("x = 'a' and x < 3", False),
        ("x in (1, 2) and x != 1 and x != 2", False),
        ("x in (1, 'a') and x prefix 'a'", True),
        ("x prefix 'ab' and x prefix 'ac'", False),
        ("x prefix 'ab' and x < 'ab'", False),
        ("x prefix 'ab' and x <= 'ab'", True),
        ("x > 'a' and x < 'a\\0'", False),
        ("x suffix 'ab' and x suffix 'cb'", False),
        ("x suffix 'ab' and x contains 'zz' and x prefix 'q'", True),
        ("x != 1 and x != 'a'", False),
        ("x = true and x != true", False),
        ("x exists and x != 3", True),
        ("*", True),
    ],
)
def test_is_satisfiable(text: str, expected: bool) -> None:
    flt = unchecked(text)
    assert flt.is_satisfiable() is expected
    if expected:
        assert parse_filter(text) == flt
        assert Filter.from_wire(flt.to_wire()) == flt
    else:  # refused as text and on the wire alike
        with pytest.raises(FilterError, match="unsatisfiable"):
            parse_filter(text)
        with pytest.raises(FilterError, match="unsatisfiable"):
            Filter.from_wire(flt.to_wire())


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "price > 'abc' and price < 5",
            "price < 5 needs a number, price > 'abc' needs a string; no value of price is both",
        ),
        (
            "x = true and x in (1, 'a')",
            "x = true needs a boolean, x in (1, 'a') needs a string or a number",
        ),
        ("x > 5 and x < 3", "no value of x satisfies all of: x < 3, x > 5"),
        ("a = 1 and x >= 5 and x <= 5 and x != 5", "all of: x != 5, x <= 5, x >= 5"),
        ("x < ''", "no value of x satisfies all of: x < ''"),
    ],
)
def test_an_unsatisfiable_filter_is_refused_saying_why(text: str, reason: str) -> None:
    with pytest.raises(FilterError) as info:
        parse_filter(text)
    assert not isinstance(info.value, FilterSyntaxError)
    assert str(info.value).startswith("unsatisfiable filter, it can never match: ")
    assert reason in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "x != 5",
        "x != 'a'",
        "x exists",
        "x exists and x != 3",
        "x != 5 and x != 6",
        "x >= 5 and x <= 5",
        "x = 1 and x = 1.0",
        "x in (1, 'a') and x prefix 'a'",
        "x in (true, 2) and x exists",
        "price > 10 and price <= 20 and class = 'stock'",
        "*",
    ],
)
def test_legitimate_filters_are_not_refused(text: str) -> None:
    flt = parse_filter(text)
    assert Filter.from_wire(flt.to_wire()) == flt


@given(filters)
@settings(max_examples=200)
def test_the_wire_refuses_exactly_the_unsatisfiable_filters(flt: Filter) -> None:
    if flt.is_satisfiable():
        assert Filter.from_wire(flt.to_wire()) == flt
    else:
        with pytest.raises(FilterError, match="unsatisfiable"):
            Filter.from_wire(flt.to_wire())


@given(filters, publications)
@settings(max_examples=200)
def test_a_filter_some_publication_matches_is_never_refused(
    flt: Filter, pub: dict[str, Value]
) -> None:
    if flt.matches(pub):
        assert flt.unsatisfiable_reason() is None
        assert parse_filter(str(flt)) == flt


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("class = 'stock' and price > 100", "class = 'stock' and price < 50", False),
        ("class = 'stock' and price > 100", "class = 'stock' and price < 150", True),
        ("class = 'stock'", "class = 'bond'", False),
        ("class = 'stock'", "symbol = 'ACME'", True),
        ("x != 5", "x = 5", False),
        ("x != 5", "x = 6", True),
        ("x in (1, 2)", "x > 1.5", True),
        ("x in (1, 2)", "x > 2", False),
        ("x exists", "x = 1", True),
        ("x prefix 'AC'", "x prefix 'ACM'", True),
        ("x prefix 'AC'", "x prefix 'B'", False),
        ("x prefix 'AC'", "x = 'ACME'", True),
        ("x prefix 'AC'", "x = 'BCME'", False),
        ("x < 'b'", "x prefix 'c'", False),
        ("x = true", "x = 1", False),
        ("*", "x = 1", True),
        ("x > 3 and x < 2", "*", False),
    ],
)
def test_intersects_is_exact_on_common_cases(a: str, b: str, expected: bool) -> None:
    assert unchecked(a).intersects(unchecked(b)) is expected
    assert unchecked(b).intersects(unchecked(a)) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("price < 100", "price < 50", True),
        ("price < 50", "price < 100", False),
        ("price <= 100", "price < 100", True),
        ("price < 100", "price <= 100", False),
        ("price > 10 and price <= 20", "price = 15", True),
        ("price > 10 and price <= 20", "price = 10", False),
        ("price > 10 and price <= 20", "price >= 12 and price < 20", True),
        ("class = 'stock'", "class = 'stock' and price < 10", True),
        ("class = 'stock' and price < 10", "class = 'stock'", False),
        ("x in (1, 2, 3)", "x in (1, 2)", True),
        ("x in (1, 2)", "x in (1, 2, 3)", False),
        ("x in (1, 2)", "x = 2.0", True),
        ("x in (true, 2)", "x = 1", False),
        ("x prefix 'AC'", "x prefix 'ACM'", True),
        ("x prefix 'ACM'", "x prefix 'AC'", False),
        ("x prefix 'AC'", "x = 'ACME'", True),
        ("x exists", "x prefix 'A'", True),
        ("x exists", "x != 3", True),
        ("x prefix 'A'", "x exists", False),
        ("x != 5", "x > 5", True),
        ("x != 5", "x > 4", False),
        ("x != 5", "x in (1, 2)", True),
        ("x != 'a'", "x > 'a'", True),
        ("x != 5", "x = 'a'", False),
        ("x suffix 'ME'", "x suffix 'CME'", True),
        ("x suffix 'CME'", "x suffix 'ME'", False),
        ("x contains 'CM'", "x prefix 'ACME'", True),
        ("x contains 'CM'", "x suffix 'ACME'", True),
        ("x contains 'CM'", "x prefix 'AC'", False),
        ("x < 'b'", "x prefix 'a'", True),
        ("*", "x = 1", True),
        ("x = 1", "*", False),
        ("x = 1", "y > 3 and y < 2", True),
    ],
)
def test_covers_is_exact_on_common_cases(a: str, b: str, expected: bool) -> None:
    assert unchecked(a).covers(unchecked(b)) is expected


def _pool(size: int) -> list[dict[str, Value]]:
    rng = random.Random(0)
    universe: list[Value] = [
        *["", "a", "ab", "abc", "b", "ba", "bab", "c", "a\0", "zz", "abab"],
        *[-1, 0, 1, 2, 3, 0.5, 1.0, 2.5, -0.5, 10, 1.5, math.nan, math.inf],
        True,
        False,
    ]
    return [
        {attr: rng.choice(universe) for attr in ATTRS if rng.random() < 0.8} for _ in range(size)
    ]


POOL = _pool(400)


@st.composite
def related_pairs(draw: st.DrawFn) -> tuple[Filter, Filter]:
    """Pairs (a, b) where a often keeps some of b's predicates, so covering actually happens."""
    b = draw(filters)
    if b.predicates and draw(st.booleans()):
        kept = draw(st.lists(st.sampled_from(b.predicates), max_size=2))
        extra = draw(st.lists(predicates(), max_size=1))
        return Filter((*kept, *extra)), b
    return draw(filters), b


@given(related_pairs())
@settings(max_examples=250)
def test_covers_is_sound(pair: tuple[Filter, Filter]) -> None:
    a, b = pair
    if a.covers(b):
        for pub in POOL:
            if b.matches(pub):
                assert a.matches(pub), (str(a), str(b), pub)


@given(related_pairs())
@settings(max_examples=250)
def test_intersects_is_sound(pair: tuple[Filter, Filter]) -> None:
    a, b = pair
    if any(a.matches(pub) and b.matches(pub) for pub in POOL):
        assert a.intersects(b)
        assert b.intersects(a)


@given(filters, publications)
@settings(max_examples=200)
def test_a_matching_publication_proves_satisfiability(flt: Filter, pub: dict[str, Value]) -> None:
    if flt.matches(pub):
        assert flt.is_satisfiable()


@given(filters)
@settings(max_examples=100)
def test_a_filter_covers_and_intersects_itself_when_satisfiable(flt: Filter) -> None:
    assert flt.covers(flt)
    assert flt.intersects(flt) is flt.is_satisfiable()
