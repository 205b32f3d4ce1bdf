"""MatchIndex: the same answers as a linear scan, without doing one."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.language.filters import Filter, Value
from broker.language.grammar import parse_filter
from broker.routing.matching import MatchIndex
from tests.broker.language.test_filters import filters, publications


def brute_force(subs: dict[int, Filter], attrs: dict[str, Value]) -> set[int]:
    return {key for key, flt in subs.items() if flt.matches(attrs)}


def index_of(*texts: str) -> MatchIndex[int]:
    index: MatchIndex[int] = MatchIndex()
    for key, text in enumerate(texts):
        index.add(key, parse_filter(text))
    return index


class CountingAttrs(dict[str, Any]):
    """Publication attributes that count how often the matcher looks at them."""

    lookups = 0

    def get(self, key: str, default: Any = None) -> Any:
        self.lookups += 1
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.lookups += 1
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.lookups += 1
        return super().__contains__(key)


def test_match_finds_exactly_the_matching_filters() -> None:
    index = index_of(
        "class = 'stock' and symbol = 'ACME' and price < 100",
        "class = 'stock' and price > 50",
        "class = 'bond'",
        "symbol prefix 'AC'",
        "*",
    )
    assert index.match({"class": "stock", "symbol": "ACME", "price": 75}) == {0, 1, 3, 4}
    assert index.match({"class": "stock", "symbol": "ACME", "price": 100}) == {1, 3, 4}
    assert index.match({"class": "bond", "symbol": "XY"}) == {2, 4}
    assert index.match({}) == {4}


def test_range_bounds_are_exact_at_the_boundary() -> None:
    index = index_of("x < 5", "x <= 5", "x > 5", "x >= 5", "x < 'm'", "x >= 'm'")
    assert index.match({"x": 5}) == {1, 3}
    assert index.match({"x": 5.0}) == {1, 3}
    assert index.match({"x": 4.999}) == {0, 1}
    assert index.match({"x": math.inf}) == {2, 3}
    assert index.match({"x": math.nan}) == set()
    assert index.match({"x": True}) == set()
    assert index.match({"x": "m"}) == {5}
    assert index.match({"x": "l"}) == {4}


def test_types_do_not_mix_in_hash_lookups() -> None:
    index = index_of("x = 1", "x = true", "x in (1, 'a')", "x in (false, 'b')", "x = 'a'")
    assert index.match({"x": 1.0}) == {0, 2}
    assert index.match({"x": True}) == {1}
    assert index.match({"x": 0}) == set()
    assert index.match({"x": False}) == {3}
    assert index.match({"x": "a"}) == {2, 4}


def test_prefix_suffix_and_presence_filters_are_found() -> None:
    index = index_of(
        "s prefix ''",
        "s prefix 'AC'",
        "s prefix 'ACME'",
        "s suffix 'ME'",
        "s exists",
        "s contains 'CM'",
        "s != 'ACME'",
    )
    assert index.match({"s": "ACME"}) == {0, 1, 2, 3, 4, 5}
    assert index.match({"s": "AC"}) == {0, 1, 4, 6}
    assert index.match({"s": 3}) == {4}


def test_re_adding_a_key_replaces_its_filter() -> None:
    index = index_of("x = 1")
    index.add(0, parse_filter("x = 2"))
    assert len(index) == 1
    assert index.match({"x": 1}) == set()
    assert index.match({"x": 2}) == {0}


def test_remove_forgets_the_filter_and_ignores_unknown_keys() -> None:
    index = index_of("x = 1 and y < 3", "x in (1, 2)", "x prefix 'a'", "x > 1 and y > 1", "*")
    for key in range(5):
        index.remove(key)
    index.remove(99)
    assert len(index) == 0
    assert index.match({"x": 1, "y": 2}) == set()
    assert index.match({"x": "abc"}) == set()


def test_len_contains_keys_and_get() -> None:
    index: MatchIndex[tuple[str, str]] = MatchIndex()
    flt = parse_filter("x = 1")
    index.add(("hop", "s1"), flt)
    assert len(index) == 1
    assert ("hop", "s1") in index
    assert ("hop", "s2") not in index
    assert list(index.keys()) == [("hop", "s1")]
    assert index.get(("hop", "s1")) is flt
    assert index.get(("hop", "s2")) is None


def test_match_does_not_look_at_every_subscription() -> None:
    index: MatchIndex[int] = MatchIndex()
    parsed: dict[int, Filter] = {}
    for key in range(20_000):
        text = f"class = 'c{key % 200}' and price < {key % 1000}"
        index.add(key, parsed.get(key % 1000) or parsed.setdefault(key % 1000, parse_filter(text)))
    attrs = CountingAttrs({"class": "c7", "price": 500.5})
    found = index.match(attrs)
    assert found == {k for k in range(20_000) if k % 200 == 7 and k % 1000 > 500.5}
    assert attrs.lookups < 20


@given(st.lists(filters, max_size=30), st.lists(publications, min_size=1, max_size=10))
@settings(max_examples=150)
def test_match_equals_brute_force(flts: list[Filter], pubs: list[dict[str, Value]]) -> None:
    subs = dict(enumerate(flts))
    index: MatchIndex[int] = MatchIndex()
    for key, flt in subs.items():
        index.add(key, flt)
    for pub in pubs:
        assert index.match(pub) == brute_force(subs, pub)


@given(
    st.lists(filters, max_size=30),
    st.lists(st.integers(0, 29), max_size=20),
    st.lists(filters, max_size=5),
    st.lists(publications, min_size=1, max_size=8),
)
@settings(max_examples=150)
def test_match_equals_brute_force_after_removes_and_replacements(
    flts: list[Filter],
    removed: list[int],
    replacements: list[Filter],
    pubs: list[dict[str, Value]],
) -> None:
    subs = dict(enumerate(flts))
    index: MatchIndex[int] = MatchIndex()
    for key, flt in subs.items():
        index.add(key, flt)
    for key in removed:
        index.remove(key)
        subs.pop(key, None)
    for key, flt in enumerate(replacements):
        index.add(key, flt)
        subs[key] = flt
    assert len(index) == len(subs)
    for pub in pubs:
        assert index.match(pub) == brute_force(subs, pub)
    for key in list(subs):
        index.remove(key)
    assert all(not index.match(pub) for pub in pubs)
