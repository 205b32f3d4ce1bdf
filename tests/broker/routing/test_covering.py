"""The forwarded-subscriptions index: it narrows covering checks without changing their outcome."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.language.filters import Filter, Op
from broker.language.grammar import parse_filter
from broker.routing.covering import ForwardedFilters
from broker.routing.router import Router
from tests.broker.language.test_filters import predicates

# Suffix and contains patterns can spell a single value the index does not see as a pin:
# it may then miss a covering pair (a redundant subscription on a link, never a lost one),
# so the exactness property is stated for the other operators.
exact_predicates = predicates().filter(lambda p: p.op not in (Op.SUFFIX, Op.CONTAINS))
filters = st.builds(lambda ps: Filter(tuple(ps)), st.lists(exact_predicates, max_size=4))


@given(st.lists(filters, max_size=12), filters, st.lists(st.integers(0, 11), max_size=6))
def test_the_index_finds_every_covering_pair_a_full_scan_finds(
    forwarded: list[Filter], query: Filter, removed: list[int]
) -> None:
    index = ForwardedFilters()
    for i, flt in enumerate(forwarded):
        index[f"k{i}"] = flt
    for i in removed:
        index.pop(f"k{i}", None)
    held = dict(index.items())
    assert Counter(f for f in held.values() if f.covers(query)) == Counter(
        f for f in index.coverers(query) if f.covers(query)
    )
    assert {k for k, f in held.items() if query.covers(f)} == {
        k for k, f in index.covered(query) if query.covers(f)
    }


def test_lookups_answer_in_insertion_order() -> None:
    index = ForwardedFilters()
    for i in (3, 1, 2):
        index[f"k{i}"] = parse_filter(f"class = 's' and n = {i} and x > 0")
    wide = parse_filter("class = 's'")
    assert [k for k, _ in index.covered(wide)] == ["k3", "k1", "k2"]


@dataclass(eq=False)
class Hop:
    peer_id: str
    is_broker: bool


def test_a_burst_of_subscriptions_costs_covering_tests_in_proportion_to_its_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2,000 subscriptions pinned to different values, forwarded to one neighbour: a scan of
    the link per subscription made this about 4 million covering tests (n²)."""
    router: Router[Hop] = Router("B")
    neighbour, client = Hop("N", True), Hop("c", False)
    router.add_neighbour(neighbour)
    router.advertise(neighbour, "a", parse_filter("class = 's'"))
    tests = 0
    covers = Filter.covers

    def counted(self: Filter, other: Filter) -> bool:
        nonlocal tests
        tests += 1
        return covers(self, other)

    monkeypatch.setattr(Filter, "covers", counted)
    n = 2000
    for i in range(n):
        router.subscribe(client, f"s{i}", parse_filter(f"class = 's' and n = {i}"))
    assert len(router.forwarded_to(neighbour)) == n
    # A wider subscription withdraws every one of them from the link...
    router.subscribe(client, "all", parse_filter("class = 's'"))
    assert list(router.forwarded_to(neighbour).values()) == [parse_filter("class = 's'")]
    # ...and when it goes, they travel again, once each.
    actions = router.unsubscribe(client, "all")
    assert sum(type(m).__name__ == "Subscribe" for _, m in actions) == n
    router.remove_hop(client)
    assert router.forwarded_to(neighbour) == {}
    assert tests < 10 * n
