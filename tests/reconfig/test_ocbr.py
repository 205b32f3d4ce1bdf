"""OCBR tabu search: plans are never worse than the star and equal the global gain."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.tree import Tree, broker_names, link, random_tree, star_tree
from reconfig.cost import CostModel, SwapEvaluator, local_cost, local_view, routing_cost
from reconfig.ocbr import (
    OcbrPlan,
    TabuParams,
    centralised_tabu,
    plan_local,
    plan_view,
    tabu_search,
)


def _instance(seed: int, n: int) -> tuple[Tree, dict[frozenset[str], float], CostModel]:
    rng = random.Random(seed)
    names = broker_names(n)
    clients = {f"c{i}": rng.choice(names) for i in range(2 * n)}
    tree = random_tree(names, rng, clients)
    pool = sorted(clients)
    demands = {
        frozenset(rng.sample(pool, rng.randint(2, 4))): float(rng.randint(1, 50))
        for _ in range(2 * n)
    }
    model = CostModel(
        alpha=rng.choice([0.5, 1.0, 2.0]),
        beta=rng.choice([0.0, 1.0, 3.0]),
        link_costs={link(a, b): rng.uniform(0.5, 3.0) for a, b in itertools.combinations(names, 2)},
    )
    return tree, demands, model


def _all_spanning_trees(nodes: list[str]) -> list[frozenset[tuple[str, str]]]:
    """Every labelled tree over ``nodes``, by decoding every Prüfer sequence."""
    out = []
    for seq in itertools.product(range(len(nodes)), repeat=len(nodes) - 2):
        rng = _Replay(list(seq))
        out.append(random_tree(nodes, rng).links)  # type: ignore[arg-type]
    return out


class _Replay:
    """A stand-in for random.Random that returns a fixed Prüfer sequence."""

    def __init__(self, values: list[int]) -> None:
        self._values = iter(values)

    def randrange(self, _n: int) -> int:
        return next(self._values)


def test_master_with_two_neighbours_links_them_when_they_talk_most() -> None:
    tree = star_tree(["M", "A", "B"], clients={"a": "A", "b": "B"})
    demands = {frozenset({"a", "b"}): 10.0}
    plan = plan_local(tree, "M", demands, CostModel(), rng=random.Random(1))
    assert isinstance(plan, OcbrPlan)
    assert plan.change.add == (("A", "B"),)
    assert len(plan.change.remove) == 1
    # Locally the class is {A, B}: star A–M–B is 2 links + 3 brokers, A–B is 1 + 2; x 10. The
    # global costs (70 and 50) add the two access links, the same in both trees.
    assert (plan.cost_before, plan.cost_after) == (50, 30)
    after = tree.apply(plan.change)
    assert (
        routing_cost(tree, demands, CostModel()) - routing_cost(after, demands, CostModel()) == 20
    )


def test_leaf_and_idle_masters_never_plan() -> None:
    tree = star_tree(["M", "A", "B"], clients={"a": "A", "b": "B"})
    demands = {frozenset({"a", "b"}): 10.0}
    assert plan_local(tree, "A", demands, CostModel(), rng=random.Random(1)) is None
    quiet = {frozenset({"a"}): 3.0}
    assert plan_local(tree, "M", quiet, CostModel(), rng=random.Random(1)) is None


@given(st.integers(0, 2**32 - 1), st.integers(3, 14))
@settings(max_examples=40, deadline=None)
def test_tabu_never_returns_a_plan_worse_than_the_star(seed: int, n: int) -> None:
    tree, demands, model = _instance(seed, n)
    rng = random.Random(seed)
    for master in sorted(tree.brokers):
        view = local_view(tree, master, demands)
        star_cost = local_cost(view, view.star(), model)
        plan = plan_view(view, model, rng=rng, params=TabuParams(4, 10, 2))
        if plan is None:
            continue
        planned = view.star() - set(plan.change.remove) | set(plan.change.add)
        assert plan.cost_before == pytest.approx(star_cost, rel=1e-12)
        assert plan.cost_after == pytest.approx(local_cost(view, planned, model), rel=1e-12)
        assert plan.cost_after < plan.cost_before
        after = tree.apply(plan.change)
        drop = routing_cost(tree, demands, model) - routing_cost(after, demands, model)
        assert drop == pytest.approx(plan.improvement, rel=1e-9, abs=1e-9)


def test_tabu_finds_the_optimal_local_tree_of_a_small_neighbourhood() -> None:
    tree, demands, model = _instance(3, 14)
    master = max(sorted(tree.brokers), key=lambda b: len(tree.neighbours(b)))
    view = local_view(tree, master, demands)
    assert len(view.neighbours) >= 3
    best = min(local_cost(view, t, model) for t in _all_spanning_trees(list(view.nodes)))
    plan = plan_view(view, model, rng=random.Random(0), params=TabuParams(10, 60, 3))
    found = plan.cost_after if plan else local_cost(view, view.star(), model)
    assert abs(found - best) <= 1e-9 * best


def test_search_is_deterministic_for_a_given_rng_seed() -> None:
    tree, demands, model = _instance(11, 30)
    params = TabuParams(8, 40, 4)
    runs = [
        centralised_tabu(tree, demands, model, rng=random.Random(5), params=params)
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_centralised_tabu_never_returns_a_costlier_tree() -> None:
    for seed in range(5):
        tree, demands, model = _instance(seed, 25)
        result = centralised_tabu(
            tree, demands, model, rng=random.Random(seed), params=TabuParams(10, 80, 5)
        )
        assert result.cost_after <= result.cost_before
        assert result.cost_after == pytest.approx(routing_cost(result.tree, demands, model))
        assert result.tree.clients == tree.clients


def test_search_leaves_the_evaluator_on_its_best_tree() -> None:
    tree, demands, model = _instance(2, 20)
    ev = SwapEvaluator.from_tree(tree, demands, model)
    result = tabu_search(ev, rng=random.Random(2), params=TabuParams(6, 30, 3))
    assert ev.links() == result.best_links
    assert ev.cost == result.best_cost
    best = Tree(tree.brokers, result.best_links, tree.clients)
    assert result.best_cost == pytest.approx(routing_cost(best, demands, model), rel=1e-12)
    assert result.moves > 0


def test_adaptive_params_grow_with_the_neighbourhood_only() -> None:
    params = TabuParams(8, 30, 3, adaptive=True)
    assert params.for_size(5) == TabuParams(8, 30, 3)
    assert params.for_size(40) == TabuParams(40, 80, 3)
    assert TabuParams(8, 30, 3).for_size(40) == TabuParams(8, 30, 3)
