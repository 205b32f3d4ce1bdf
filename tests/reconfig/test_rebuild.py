"""The trust-aware rebuild planner: optimality on small trees, safety, moves, hysteresis."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from overlay.tree import Tree, broker_names, line_tree, random_tree, star_tree
from reconfig.cost import CostModel, routing_cost
from reconfig.rebuild import (
    DemandClasses,
    RebuildParams,
    Score,
    TrustState,
    apply_moves,
    classes_from_rows,
    exhaustive_best,
    moves_between,
    ocbr_demands,
    plan_rebuild,
    raised_transit,
    score_tree,
    transit_vns,
    update_trust_state,
)
from security.trust import TrustConfig, broker_trust, leximin_owa, path_trust, vn_trust

TRUST_LEVELS = (1.0, 0.95, 0.9, 0.8, 0.6, 0.3)
HEURISTIC = RebuildParams(exact_up_to=0)


def problem(
    n: int, seed: int, levels: tuple[float, ...] = TRUST_LEVELS
) -> tuple[Tree, DemandClasses, dict[str, float]]:
    rng = random.Random(seed)
    names = broker_names(n, "v")
    tree = random_tree(names, rng)
    classes: dict[tuple[str, frozenset[str]], float] = {}
    for _ in range(max(2, n // 2)):
        src = rng.choice(names)
        dsts = frozenset(rng.sample([x for x in names if x != src], min(3, n - 1)))
        classes[(src, dsts)] = float(rng.randint(1, 10))
    trust = {x: rng.choice(levels) for x in names}
    return tree, classes, trust


def reference_social(tree: Tree, classes: DemandClasses, trust: dict[str, float]) -> float:
    """SPEC §6 read literally: every client's leximin over its partner paths, then leximin."""
    partners: dict[str, set[str]] = {}
    for (src, dsts), _d in classes.items():
        for s in dsts:
            partners.setdefault(src, set()).add(s)
            partners.setdefault(s, set()).add(src)
    individual = [
        leximin_owa(path_trust(trust, tree.path(c, p)) for p in sorted(ps))
        for c, ps in sorted(partners.items())
    ]
    return leximin_owa(individual)


def all_trees(names: list[str]) -> list[Tree]:
    """Every spanning tree, found without Prüfer codes: every (n-1)-subset of links that is one."""
    out = []
    for links in itertools.combinations(itertools.combinations(names, 2), len(names) - 1):
        try:
            out.append(Tree(names, links))
        except ValueError:
            continue
    return out


# -- the objective ---------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.integers(3, 9), st.integers(0, 10_000))
def test_score_agrees_with_the_spec_read_literally(n: int, seed: int) -> None:
    tree, classes, trust = problem(n, seed)
    model = CostModel(alpha=1.0, beta=0.5)
    score = score_tree(tree, classes, trust, model)
    assert score.social == pytest.approx(reference_social(tree, classes, trust), abs=1e-12)
    assert score.cost == pytest.approx(routing_cost(tree, ocbr_demands(classes), model))


def test_a_distrusted_hub_pulls_social_trust_down_and_a_leaf_does_not() -> None:
    classes = {("a", frozenset({"b", "c"})): 5.0, ("b", frozenset({"c"})): 1.0}
    trust = {"a": 1.0, "b": 1.0, "c": 1.0, "x": 0.2}
    via_x = star_tree(["x", "a", "b", "c"])
    x_leaf = Tree(["x", "a", "b", "c"], [("a", "b"), ("a", "c"), ("a", "x")])
    assert score_tree(via_x, classes, trust, CostModel()).social == pytest.approx(0.2, abs=1e-3)
    assert score_tree(x_leaf, classes, trust, CostModel()).social == pytest.approx(1.0)
    assert transit_vns(via_x, classes) == {"x"}
    assert "x" not in transit_vns(x_leaf, classes)


# -- optimality against exhaustive search ----------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 5), st.integers(0, 10_000), st.sampled_from([0.0, 0.1, 0.5]))
def test_exhaustive_search_is_optimal_against_every_spanning_tree(
    n: int, seed: int, epsilon: float
) -> None:
    tree, classes, trust = problem(n, seed)
    model = CostModel()
    distrusted = {v for v, t in trust.items() if t < 0.5}
    links, score, min_cost = exhaustive_best(
        tree, classes, trust, model, distrusted=distrusted, epsilon=epsilon
    )
    trees = all_trees(sorted(tree.brokers))
    costs = {t: routing_cost(t, ocbr_demands(classes), model) for t in trees}
    assert min_cost == pytest.approx(min(costs.values()))
    budget = (1 + epsilon) * min_cost * (1 + 1e-9)
    feasible = [t for t in trees if costs[t] <= budget]
    best = max(
        (
            -sum(1 for v in distrusted if len(t.neighbours(v)) > 1),
            reference_social(t, classes, trust),
        )
        for t in feasible
    )
    assert score.violations == -best[0]
    assert score.social == pytest.approx(best[1], abs=1e-12)
    assert score_tree(Tree(tree.brokers, links), classes, trust, model).social == pytest.approx(
        score.social, abs=1e-12
    )


def heuristic_and_exact(n: int, seed: int) -> tuple[Score, Score, float]:
    """The heuristic search's plan, given the exhaustive optimum's budget, beside that
    optimum (scores) and the budget."""
    tree, classes, trust = problem(n, seed)
    model = CostModel()
    exact = plan_rebuild(tree, classes, trust, model)
    assert exact.exact
    heuristic = plan_rebuild(tree, classes, trust, model, params=HEURISTIC, budget=exact.budget)
    assert not heuristic.exact
    return heuristic.score_after, exact.score_after, exact.budget


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(4, 6), st.integers(0, 10_000))
@example(n=4, seed=7008)  # missed when a long tabu tenure and 40 iterations starved 4 VNs
@example(n=6, seed=7136)
@example(n=6, seed=1063)  # 12 iterations of the cost search missed every tree in the budget
def test_heuristic_search_finds_a_valid_tree_in_the_budget_when_one_exists(
    n: int, seed: int
) -> None:
    """As few distrusted VNs in transit as the optimum (none when a tree in the budget has
    none), within the budget; never a better score than the optimum (scoring agrees)."""
    heuristic, exact, budget = heuristic_and_exact(n, seed)
    assert heuristic.violations == exact.violations
    assert heuristic.cost <= budget * (1 + 1e-9)
    assert heuristic.social <= exact.social + 1e-9


def test_heuristic_search_reaches_the_exhaustive_optimum_on_nearly_all_small_trees() -> None:
    """A tabu search may miss the optimum; on small trees it almost never does. 100
    problems of each of 4, 5 and 6 VNs (fixed seeds: the search is seeded too), at most
    1 % missed (a wider sweep is in bench/RESULTS-rebuild.md)."""
    problems = [(n, seed) for n in (4, 5, 6) for seed in range(100)]
    missed = []
    for n, seed in problems:
        heuristic, exact, _ = heuristic_and_exact(n, seed)
        if heuristic.violations != exact.violations or heuristic.social < exact.social - 1e-9:
            missed.append((n, seed, heuristic.social, exact.social))
    assert len(missed) <= len(problems) // 100, missed


@settings(max_examples=20, deadline=None)
@given(st.integers(7, 30), st.integers(0, 10_000))
def test_the_planned_score_is_the_planned_trees_score(n: int, seed: int) -> None:
    tree, classes, trust = problem(n, seed)
    model = CostModel(alpha=1.0, beta=2.0)
    plan = plan_rebuild(tree, classes, trust, model, rng=random.Random(seed))
    pinned = [v for v in plan.distrusted if len(tree.neighbours(v)) <= 1]
    again = score_tree(plan.after, classes, trust, model, plan.distrusted, pinned=pinned)
    assert again.social == pytest.approx(plan.score_after.social, abs=1e-12)
    assert again.cost == pytest.approx(plan.score_after.cost)
    assert again.violations == plan.score_after.violations
    assert plan.score_after.cost <= plan.budget * (1 + 1e-9)
    assert plan.budget == pytest.approx(1.1 * plan.best_cost)


# -- safety ----------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.integers(4, 24), st.integers(0, 10_000), st.booleans())
def test_a_distrusted_vn_never_ends_in_a_transit_position(n: int, seed: int, tight: bool) -> None:
    tree, classes, trust = problem(n, seed)
    params = RebuildParams(epsilon=0.1 if tight else 10.0, exact_up_to=5)
    plan = plan_rebuild(tree, classes, trust, CostModel(), params=params)
    transit = transit_vns(plan.after, classes)
    for vn in plan.distrusted:
        # Either a leaf (never transit) or, when no tree within the budget allows it, flagged.
        assert len(plan.after.neighbours(vn)) <= 1 or vn in plan.flagged
        assert vn not in transit or vn in plan.flagged
    trusted = set(tree.brokers) - plan.distrusted
    if not tight and trusted:
        # With room in the budget and someone to route through, nobody needs detaching.
        assert not plan.flagged
        assert not transit & plan.distrusted


@settings(max_examples=25, deadline=None)
@given(st.integers(5, 16), st.integers(0, 10_000))
@example(16, 1091)  # a start above the budget the trust-aware search sets: not this case
@example(11, 21)  # the final tree hangs demoted v00 on flagged v07: a pair v07 ends carrying
def test_from_a_tree_within_budget_no_move_raises_a_distrusted_vn(n: int, seed: int) -> None:
    tree, classes, trust = problem(n, seed)
    # A tree as a previous cycle leaves it: planned for cost with everybody trusted.
    tree = plan_rebuild(tree, classes, {}, CostModel()).after
    plan = plan_rebuild(tree, classes, trust, CostModel(), params=RebuildParams(epsilon=0.2))
    # The premise: the search is a heuristic, so from the tree the cost-only plan left it may
    # find a cheaper optimum that puts that tree above the new budget (n=16, seed=1091: 354
    # against 1.2 x 294); such a start is a different case (a move to a cheaper tree).
    assume(plan.score_before.cost <= plan.budget * (1 + 1e-9))
    for vn in plan.distrusted:
        if len(tree.neighbours(vn)) <= 1:
            assert len(plan.after.neighbours(vn)) <= 1, vn  # a leaf stays a leaf
    # ... and no tree on the way makes a distrusted VN carry a pair it carries at neither end.
    assert raised_transit(tree, plan.moves, classes, plan.distrusted) == []
    if plan.moves:
        assert apply_moves(tree, plan.moves)[-1] == plan.after


def test_a_distrusted_transit_vn_is_demoted_to_a_leaf_and_trust_rises() -> None:
    names = ["v0", "v1", "v2", "v3", "v4", "v5"]
    tree = line_tree(names)  # v2 and v3 carry everything from v0, v1 to v4, v5
    classes = {("v0", frozenset({"v4", "v5"})): 10.0, ("v1", frozenset({"v5"})): 5.0}
    trust = {**dict.fromkeys(names, 1.0), "v2": 0.2}
    plan = plan_rebuild(tree, classes, trust, CostModel(), params=RebuildParams(epsilon=0.5))
    assert plan.reason == "constraint"
    assert plan.demoted == ("v2",)
    assert not plan.flagged
    assert "v2" not in transit_vns(plan.after, classes)
    assert plan.score_after.social > plan.score_before.social + 0.5
    assert plan.score_after.cost <= plan.budget * (1 + 1e-9)


def test_a_vn_below_the_detach_threshold_is_flagged_even_as_a_leaf() -> None:
    names = ["v0", "v1", "v2", "v3"]
    tree = Tree(names, [("v0", "v1"), ("v1", "v2"), ("v1", "v3")])
    classes = {("v0", frozenset({"v1", "v2", "v3"})): 1.0}  # every tree costs the same
    plan = plan_rebuild(tree, classes, {"v3": 0.05}, CostModel())
    assert plan.flagged == ("v3",)
    assert plan.reason == "kept"


def test_when_no_tree_within_the_budget_makes_it_a_leaf_the_vn_is_flagged() -> None:
    # All three VNs distrusted; a and c talk, so the line through b costs 5 against 3 for a
    # tree where they are neighbours: over the budget, the tree must change, and whichever
    # VN ends in the middle is raised into a transit position it did not have: flagged.
    names = ["a", "b", "c"]
    tree = line_tree(names)
    classes = {("a", frozenset({"c"})): 1.0}
    plan = plan_rebuild(tree, classes, dict.fromkeys(names, 0.3), CostModel())
    assert plan.score_before.cost > plan.budget
    (middle,) = (v for v in names if len(plan.after.neighbours(v)) == 2)
    assert middle != "b"
    assert plan.flagged == (middle,)
    assert plan.score_after.violations == len(names) + 1  # a raise weighs n + 1


# -- moves -----------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 16), st.integers(0, 10_000))
def test_moves_are_neighbourhood_moves_that_reach_the_target(n: int, seed: int) -> None:
    rng = random.Random(seed)
    names = broker_names(n)
    before, after = random_tree(names, rng), random_tree(names, rng)
    moves = moves_between(before, after)
    trees = apply_moves(before, moves)  # raises unless each is a neighbourhood move
    assert (trees[-1] if trees else before) == after
    for m in moves:
        assert m.remove != m.add
    assert not moves_between(after, after)


def test_a_plans_moves_lead_from_the_current_tree_to_the_planned_one() -> None:
    tree, classes, trust = problem(12, 3)
    plan = plan_rebuild(tree, classes, trust, CostModel())
    assert plan.moves
    assert apply_moves(tree, plan.moves)[-1] == plan.after


def test_apply_moves_refuses_a_move_that_is_not_local() -> None:
    from overlay.tree import TopologyError
    from reconfig.rebuild import Move

    tree = line_tree(["a", "b", "c", "d"])
    with pytest.raises(TopologyError):
        apply_moves(tree, [Move(master="a", vn="b", via="d")])


# -- hysteresis ------------------------------------------------------------------------------


def test_trust_state_distrusts_at_once_and_forgives_only_after_probation() -> None:
    params = RebuildParams(distrust_below=0.5, trust_again_at=0.7, probation=3)
    state = update_trust_state({"x": 0.4}, TrustState(), params)
    assert state.distrusted == {"x"}
    for value in (0.9, 0.9):
        state = update_trust_state({"x": value}, state, params)
        assert state.distrusted == {"x"}
    # In the band between the thresholds probation does not advance; it restarts.
    state = update_trust_state({"x": 0.6}, state, params)
    assert state.clean["x"] == 0
    for _ in range(2):
        state = update_trust_state({"x": 0.9}, state, params)
        assert "x" in state.distrusted
    state = update_trust_state({"x": 0.9}, state, params)
    assert "x" not in state.distrusted
    # A trusted VN in the band stays trusted.
    assert not update_trust_state({"x": 0.6}, state, params).distrusted
    assert TrustState.from_dict(state.to_dict()) == state


def flapping_overlay() -> tuple[Tree, DemandClasses, list[str]]:
    names = ["v0", "v1", "v2", "v3", "v4", "v5"]
    # v0, v1 and v3 all talk to each other: in any tree one of the three pairs has a VN in
    # between, and v2 (fully trusted when it behaves) is the best VN to put there.
    classes = {
        ("v0", frozenset({"v1", "v3"})): 10.0,
        ("v1", frozenset({"v3", "v5"})): 5.0,
        ("v4", frozenset({"v0"})): 3.0,
    }
    return line_tree(names), classes, names


def flapping_trust(names: list[str], cycle: int) -> dict[str, float]:
    return {**dict.fromkeys(names, 0.9), "v2": 0.2 if cycle % 2 == 0 else 1.0}


@pytest.mark.parametrize(
    "params", [RebuildParams(epsilon=10.0), RebuildParams(epsilon=10.0, exact_up_to=0)]
)
def test_a_vn_whose_fault_flaps_every_cycle_does_not_make_the_tree_oscillate(
    params: RebuildParams,
) -> None:
    tree, classes, names = flapping_overlay()
    state = TrustState()
    changes = []
    for cycle in range(12):
        trust = flapping_trust(names, cycle)
        plan = plan_rebuild(tree, classes, trust, CostModel(), params=params, state=state)
        changes.append(bool(plan.moves))
        tree, state = plan.after, plan.state
        assert "v2" in state.distrusted
        assert "v2" not in transit_vns(tree, classes)
    assert changes[0]
    assert not any(changes[1:])


def test_without_hysteresis_the_same_flapping_moves_the_tree_every_cycle() -> None:
    # The control: forgive at once and take any gain, and the tree follows the flapping.
    tree, classes, names = flapping_overlay()
    params = RebuildParams(epsilon=10.0, probation=0, min_gain=0.0)
    state = TrustState()
    changes = []
    for cycle in range(6):
        plan = plan_rebuild(
            tree, classes, flapping_trust(names, cycle), CostModel(), params=params, state=state
        )
        changes.append(bool(plan.moves))
        tree, state = plan.after, plan.state
    assert all(changes)


def test_a_recovered_vn_is_trusted_again_after_probation_and_may_carry_transit() -> None:
    tree, classes, names = flapping_overlay()
    params = RebuildParams(epsilon=10.0, probation=3)
    state = TrustState()
    plan = plan_rebuild(tree, classes, flapping_trust(names, 0), CostModel(), state=state)
    tree, state = plan.after, plan.state
    history = []
    for _ in range(4):
        plan = plan_rebuild(
            tree, classes, flapping_trust(names, 1), CostModel(), params=params, state=state
        )
        history.append(("v2" in plan.distrusted, bool(plan.moves)))
        tree, state = plan.after, plan.state
    # Distrusted through probation (nothing moves), then trusted and worth a hub position.
    assert history == [(True, False), (True, False), (False, True), (False, False)]
    assert "v2" in transit_vns(tree, classes)


def test_a_valid_tree_is_kept_when_the_gain_is_below_min_gain() -> None:
    tree, classes, names = flapping_overlay()
    trust = {**dict.fromkeys(names, 1.0), "v2": 0.995}
    plan = plan_rebuild(
        tree, classes, trust, CostModel(), params=RebuildParams(epsilon=10.0, min_gain=0.01)
    )
    assert plan.reason == "kept"
    assert not plan.moves
    assert plan.after == tree


def test_an_over_budget_tree_is_rebuilt_within_the_budget() -> None:
    tree, classes, _names = flapping_overlay()
    tree = Tree(
        tree.brokers, [("v0", "v5"), ("v5", "v1"), ("v1", "v4"), ("v4", "v2"), ("v2", "v3")]
    )
    plan = plan_rebuild(tree, classes, {}, CostModel(), params=RebuildParams(epsilon=0.0))
    assert plan.score_before.cost > plan.budget
    assert plan.reason == "constraint"
    assert plan.score_after.cost == pytest.approx(plan.best_cost)


# -- inputs ----------------------------------------------------------------------------------


def test_classes_from_rows_sums_windows_and_drops_local_traffic() -> None:
    rows = [
        {"w": 0.0, "src": "v1", "dsts": ["v2", "v3"], "demand": 4},
        {"w": 10.0, "src": "v1", "dsts": ["v3", "v2"], "demand": 6},
        {"w": 0.0, "src": "v2", "dsts": ["v2"], "demand": 9},
        {"w": 0.0, "src": "v2", "dsts": ["v2", "v1"], "demand": 1},
    ]
    assert classes_from_rows(rows) == {
        ("v1", frozenset({"v2", "v3"})): 10.0,
        ("v2", frozenset({"v1"})): 1.0,
    }


def test_trust_outside_the_unit_interval_is_refused() -> None:
    tree, classes, _names = flapping_overlay()
    with pytest.raises(ValueError, match="outside"):
        plan_rebuild(tree, classes, {"v1": 1.5}, CostModel())


# -- the loop on observed trust --------------------------------------------------------------


def feedback_window(w: int, names: list[str], bad_vn: str | None) -> list[dict[str, object]]:
    """One window of trust-feedback rows: every VN's replica judged on 100 copies and 100
    shares; ``bad_vn``'s replica had 80 of its shares rejected."""
    rows: list[dict[str, object]] = []
    for vn in names:
        bad = 80 if vn == bad_vn else 0
        rows.append(
            {
                "w": float(w),
                "evaluator": "v1.0" if vn == "v0" else "v0.0",
                "broker": f"{vn}.0",
                "broker_vn": vn,
                "expected": 100,
                "received": 100,
                "conflicting": 0,
                "bad_signatures": 0,
                "timely": 100,
                "shares_ok": 100 - bad,
                "bad_shares": bad,
                "failures": bad,
                "events": 200,
            }
        )
    return rows


def run_cycles(faulty: Callable[[int], bool], cycles: int) -> list[tuple[float, bool, int]]:
    """Cycles of: one more window of feedback, trust from all so far, one plan applied.

    The operator's prior is 0.9 for every VN but v2, so a well-behaved v2 is the best hub.
    """
    tree, classes, names = flapping_overlay()
    config = TrustConfig(priors={v: 0.9 for v in names if v != "v2"})
    params = RebuildParams(epsilon=10.0)
    state, rows = TrustState(), []
    seen = []
    for cycle in range(cycles):
        rows += feedback_window(cycle, names, "v2" if faulty(cycle) else None)
        trust = vn_trust(broker_trust(rows, config))
        plan = plan_rebuild(tree, classes, trust, CostModel(), params=params, state=state)
        seen.append((trust["v2"], "v2" in plan.distrusted, len(plan.moves)))
        tree, state = plan.after, plan.state
        assert plan.distrusted.isdisjoint(transit_vns(tree, classes))
    return seen


def test_a_vn_whose_faults_stop_regains_trust_and_its_hub_position_over_later_cycles() -> None:
    seen = run_cycles(lambda cycle: cycle < 3, 12)
    trust = [t for t, _d, _m in seen]
    distrusted = [d for _t, d, _m in seen]
    moved = [cycle for cycle, (_t, _d, m) in enumerate(seen) if m]
    assert all(b > a for a, b in itertools.pairwise(trust[2:]))  # recovers every clean cycle
    assert distrusted[:7] == [True] * 7  # faults, then probation
    assert not any(distrusted[7:])
    # Demoted at once; moved back into the best (hub) position once trusted and clearly
    # better than the 0.9-trusted alternatives; otherwise still.
    assert moved[0] == 0
    assert len(moved) == 2
    assert moved[1] > 7


def test_a_fault_that_flaps_every_cycle_keeps_the_vn_distrusted_and_the_tree_still() -> None:
    seen = run_cycles(lambda cycle: cycle % 2 == 0, 12)
    assert all(d for _t, d, _m in seen)
    assert max(t for t, _d, _m in seen) < 0.7  # never long enough above the bar
    assert [m > 0 for _t, _d, m in seen] == [True] + [False] * 11
