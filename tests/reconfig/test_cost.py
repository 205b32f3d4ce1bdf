"""The SPEC §5 routing cost, the master's local view, and the fast swap evaluator."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.tree import Tree, broker_names, link, random_tree
from reconfig.cost import (
    CostModel,
    SwapEvaluator,
    local_cost,
    local_view,
    routing_cost,
)


@pytest.fixture
def worked() -> Tree:
    """A master M with four neighbours B1..B4 and a local client c0 (the seed's shape).

    X1 hangs off B1 and X3 off B3, so some clients sit deeper than a neighbour.
    """
    return Tree(
        ["M", "B1", "B2", "B3", "B4", "X1", "X3"],
        [("M", "B1"), ("M", "B2"), ("M", "B3"), ("M", "B4"), ("B1", "X1"), ("B3", "X3")],
        {
            "c0": "M",
            "a1": "B1",
            "a2": "X1",
            "b2": "B2",
            "g2": "B2",
            "d3": "B3",
            "e3": "X3",
            "f4": "B4",
        },
    )


WORKED_DEMANDS = {
    frozenset({"c0", "a1", "b2"}): 5.0,  # -> {c0, B1, B2}
    frozenset({"c0", "a2", "g2"}): 3.0,  # -> {c0, B1, B2}: merged with the first, 8
    frozenset({"d3", "e3"}): 7.0,  # all behind B3: ignored
    frozenset({"b2", "f4"}): 2.0,  # -> {B2, B4}
}


def test_cost_of_a_small_tree_matches_the_hand_computation() -> None:
    # b1 –(5)– b2 –(1)– b3, clients x@b1, z@b2, y@b3; access links cost 1; α = 2, β = 3.
    tree = Tree(["b1", "b2", "b3"], [("b1", "b2"), ("b2", "b3")], {"x": "b1", "z": "b2", "y": "b3"})
    model = CostModel(alpha=2, beta=3, link_costs={("b2", "b1"): 5})
    demands = {
        frozenset({"x", "y"}): 2,  # links 1+5+1+1 = 8 -> 16; brokers 3 -> 9; 25 x 2 = 50
        frozenset({"x", "z"}): 1,  # links 1+5+1 = 7 -> 14; brokers 2 -> 6; 20 x 1 = 20
        frozenset({"z"}): 4,  # link 1 -> 2; broker 1 -> 3; 5 x 4 = 20
    }
    assert routing_cost(tree, demands, model) == 90
    assert SwapEvaluator.from_tree(tree, demands, model).cost == 90


def test_local_view_ignores_merges_and_replaces_clients_by_neighbours(worked: Tree) -> None:
    view = local_view(worked, "M", WORKED_DEMANDS)
    assert view.neighbours == ("B1", "B2", "B3", "B4")
    assert view.local_clients == ("c0",)
    assert dict(view.classes) == {
        frozenset({"c0", "B1", "B2"}): 8.0,
        frozenset({"B2", "B4"}): 2.0,
    }


def test_local_cost_of_star_and_of_a_better_local_tree_by_hand(worked: Tree) -> None:
    view = local_view(worked, "M", WORKED_DEMANDS)
    model = CostModel()
    # {c0,B1,B2}: c0–M, M–B1, M–B2 (3 links) + M, B1, B2 (3 brokers) = 6, x 8 = 48.
    # {B2,B4}: B2–M–B4 (2 links) + 3 brokers = 5, x 2 = 10.
    assert local_cost(view, view.star(), model) == 58
    better = (view.star() - {link("M", "B4")}) | {link("B2", "B4")}
    # {B2,B4} now: one link + two brokers = 3, x 2 = 6.
    assert local_cost(view, better, model) == 54
    change = view.change(better)
    assert change.remove == (("B4", "M"),)
    assert change.add == (("B2", "B4"),)
    before = routing_cost(worked, WORKED_DEMANDS, model)
    after = routing_cost(worked.apply(change), WORKED_DEMANDS, model)
    assert before - after == 4


def test_link_costs_are_keyed_by_unordered_pair_and_validated() -> None:
    model = CostModel(link_costs={("b", "a"): 3.5}, default_link_cost=2)
    assert model.link_cost("a", "b") == model.link_cost("b", "a") == 3.5
    assert model.link_cost("a", "c") == 2
    with pytest.raises(ValueError, match="link_costs"):
        CostModel(link_costs={("a", "b"): -1})
    with pytest.raises(ValueError, match="alpha"):
        CostModel(alpha=float("nan"))


@st.composite
def instances(
    draw: st.DrawFn, max_brokers: int = 12
) -> tuple[Tree, dict[frozenset[str], float], CostModel, random.Random]:
    """A random tree, clients, classes and an integer cost model (so equalities are exact)."""
    n = draw(st.integers(2, max_brokers))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    names = broker_names(n)
    n_clients = draw(st.integers(1, 12))
    clients = {f"c{i}": rng.choice(names) for i in range(n_clients)}
    tree = random_tree(names, rng, clients)
    pool = sorted(clients)
    demands: dict[frozenset[str], float] = {}
    for _ in range(draw(st.integers(1, 8))):
        members = frozenset(rng.sample(pool, rng.randint(1, min(5, len(pool)))))
        demands[members] = rng.randint(0, 20)
    link_costs = {
        link(a, b): rng.randint(1, 9)
        for a, b in itertools.combinations(names + pool, 2)
        if rng.random() < 0.6
    }
    model = CostModel(
        alpha=rng.randint(0, 4),
        beta=rng.randint(0, 4),
        link_costs=link_costs,
        broker_costs={b: rng.randint(0, 5) for b in names if rng.random() < 0.5},
        default_link_cost=rng.randint(1, 5),
    )
    return tree, demands, model, rng


@given(instances())
@settings(max_examples=120, deadline=None)
def test_local_improvement_equals_global_improvement(
    inst: tuple[Tree, dict[frozenset[str], float], CostModel, random.Random],
) -> None:
    tree, demands, model, rng = inst
    master = rng.choice(sorted(tree.brokers))
    view = local_view(tree, master, demands)
    new_local = random_tree(list(view.nodes), rng).links
    local_gain = local_cost(view, view.star(), model) - local_cost(view, new_local, model)
    after = tree.apply(view.change(new_local))
    global_gain = routing_cost(tree, demands, model) - routing_cost(after, demands, model)
    assert local_gain == global_gain


@given(instances())
@settings(max_examples=80, deadline=None)
def test_swap_evaluator_prices_every_removal_like_a_full_recomputation(
    inst: tuple[Tree, dict[frozenset[str], float], CostModel, random.Random],
) -> None:
    tree, demands, model, rng = inst
    ev = SwapEvaluator.from_tree(tree, demands, model)
    assert ev.cost == routing_cost(tree, demands, model)
    n = len(ev.names)
    for _ in range(4):
        i, j = rng.sample(range(n), 2)
        if ev.has_link(i, j):
            continue
        path, deltas = ev.removal_deltas(i, j)
        add = (ev.names[i], ev.names[j])
        for k, delta in enumerate(deltas):
            removed = (ev.names[path[k]], ev.names[path[k + 1]])
            swapped = tree.swap(removed, add)
            assert routing_cost(swapped, demands, model) - ev.cost == delta
        k = rng.randrange(len(deltas))
        ev.swap((i, j), (path[k], path[k + 1]), deltas[k])
        tree = tree.swap((ev.names[path[k]], ev.names[path[k + 1]]), add)
        assert ev.cost == ev.full_cost() == routing_cost(tree, demands, model)
        assert ev.links() == tree.links
