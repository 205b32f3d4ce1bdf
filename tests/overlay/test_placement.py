"""The three placement phases of SPEC §4 on the seed's worked shape, worked out by hand.

The shape: three paths a→d, b→e, c→f, each of 3 hops, all through the two shared VNs x and y
(tree: a, b, c hang off x; d, e, f hang off y; x–y). Every path failed 10 times, so
γ = 1/3 each; with ω = 2, 3, 5 the priorities are ρ = 3 × 1/3 × ω = 2, 3, 5, and a budget of
ten replicas splits exactly 2, 3, 5. VN failures (out of 10 events each, so the failure ratio
is failures / 10): a 1, b 2, c 1, d 1, e 0, f 3, x 4, y 2.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.placement import (
    NodeFailures,
    PlacementError,
    Plan,
    apportion,
    diff,
    path_weights,
    place,
    vn_failures,
)
from overlay.tree import Tree, line_tree

TREE = Tree(
    ["a", "b", "c", "d", "e", "f", "x", "y"],
    [("a", "x"), ("b", "x"), ("c", "x"), ("x", "y"), ("y", "d"), ("y", "e"), ("y", "f")],
)
PATHS = [("a", "d"), ("b", "e"), ("c", "f")]
PATH_FAILURES = {("a", "d"): 10, ("b", "e"): 10, ("c", "f"): 10}
WEIGHTS = {("a", "d"): 2.0, ("b", "e"): 3.0, ("c", "f"): 5.0}
NODE = {
    vn: NodeFailures(n, 10)
    for vn, n in {"a": 1, "b": 2, "c": 1, "d": 1, "e": 0, "f": 3, "x": 4, "y": 2}.items()
}


def seed_plan(**kw: Any) -> Plan:
    args: dict[str, Any] = {
        "budget": 10,
        "path_failures": PATH_FAILURES,
        "node_failures": NODE,
        "weights": WEIGHTS,
        **kw,
    }
    return place(TREE, PATHS, **args)


def test_phase_one_gives_the_seed_paths_priorities_2_3_5_and_splits_ten_replicas_so() -> None:
    plan = seed_plan()
    by_path = {p.path: p for p in plan.paths}
    for key, rho in (("a", "d"), 2), (("b", "e"), 3), (("c", "f"), 5):
        assert by_path[key].hops == 3
        assert by_path[key].gamma == Fraction(1, 3)
        assert by_path[key].priority == rho
        assert by_path[key].replicas == rho  # 10 × ρ / (2 + 3 + 5)
    assert [p.path for p in plan.paths] == [("c", "f"), ("b", "e"), ("a", "d")]


def test_phase_two_splits_each_path_by_its_vns_share_of_the_path_failures() -> None:
    plan = seed_plan()
    by_path = {p.path: dict(p.by_node) for p in plan.paths}
    # a→d: failures a 1, x 4, y 2, d 1 (8); 2 replicas → quotas .25, 1, .5, .25:
    # floors give x 1, the one left goes to the largest remainder, y (.5).
    assert by_path[("a", "d")] == {"a": 0, "x": 1, "y": 1, "d": 0}
    # b→e: b 2, x 4, y 2, e 0 (8); 3 → .75, 1.5, .75, 0: floors x 1; two left go to the
    # remainders .75 of b and y (tie on remainder and on failures: b sorts first) - and
    # x's .5 comes after them.
    assert by_path[("b", "e")] == {"b": 1, "x": 1, "y": 1, "e": 0}
    # c→f: c 1, x 4, y 2, f 3 (10); 5 → .5, 2, 1, 1.5: floors x 2, y 1, f 1; the one left
    # ties c and f on .5 and goes to f (3 failures to c's 1).
    assert by_path[("c", "f")] == {"c": 0, "x": 2, "y": 1, "f": 2}
    # Batches add up on the shared VNs: x 1 + 1 + 2, y 1 + 1 + 1.
    assert dict(plan.placed) == {
        "a": 0, "b": 1, "c": 0, "d": 0, "e": 0, "f": 2, "x": 4, "y": 3,
    }  # fmt: skip
    assert sum(plan.placed.values()) == 10
    assert plan.unplaced == 0
    # A VN that received nothing still runs one broker.
    assert plan.replicas["a"] == 1
    assert plan.replicas["x"] == 4


def test_once_per_node_gives_each_vn_one_batch_and_the_surplus_to_the_most_failing_short_vns() -> (
    None
):
    plan = seed_plan(once_per_node=True)
    # In priority order: c→f serves x 2, y 1, f 2. b→e: b 1; x's 1 and y's 1 are surplus
    # (already served). a→d: x 1 and y 1 surplus again. Surplus 4, handed one at a time to
    # the VN with r < 3 and the highest failure ratio: x (.4) 2→3, f (.3) 2→3, then b and y
    # tie on .2 and on 1 replica: b (sorts first) 1→2, then y (now fewer) 1→2.
    assert plan.surplus == 4
    assert {vn: n for vn, n in plan.placed.items() if n} == {
        "x": 3, "f": 3, "b": 2, "y": 2,
    }  # fmt: skip
    assert plan.unplaced == 0


def test_once_per_node_surplus_stays_unplaced_when_no_vn_on_a_path_is_short() -> None:
    # One path a→x→y→d with replicas for everyone: 4 VNs × 3 = 12 fill them; a second
    # path a→e re-visits a, x and y and its batch can go nowhere.
    tree = Tree(["a", "x", "y", "d", "e"], [("a", "x"), ("x", "y"), ("y", "d"), ("y", "e")])
    plan = place(tree, [("a", "d"), ("a", "e")], budget=24, once_per_node=True)
    # No failures: γ = 1/2 each, ρ = 3 × 1/2 = 3/2 each → 12 and 12; each path splits
    # evenly, 3 per VN. a→d (sorts first) serves a, x, y, d; a→e serves e, and a, x, y's 9
    # are surplus with no VN under 3 to take them.
    assert dict(plan.placed) == {"a": 3, "d": 3, "e": 3, "x": 3, "y": 3}
    assert plan.surplus == 9
    assert plan.unplaced == 9


def test_max_per_path_cuts_the_lowest_failure_ratio_vn_first() -> None:
    plan = seed_plan(max_per_path=6)
    # c→f (first by priority) holds x 4 + y 3 + f 2 + c 0 = 9 > 6: y has the lowest ratio
    # (.2 < f .3 < x .4) and gives all 3. Then b→e holds b 1 + x 4 = 5 and a→d x 4: fine.
    assert plan.cut == {"y": 3}
    assert {vn: n for vn, n in plan.placed.items() if n} == {"b": 1, "f": 2, "x": 4}
    assert plan.unplaced == 3


def test_max_per_path_moves_to_the_next_vn_once_the_lowest_has_nothing_left() -> None:
    plan = seed_plan(max_per_path=4)
    # c→f: 9 → y gives 3 (6), then f (.3) gives 2 (4). b→e: b 1 + x 4 = 5 > 4: b (.2)
    # gives its 1. a→d: x 4, fine.
    assert plan.cut == {"b": 1, "f": 2, "y": 3}
    assert {vn: n for vn, n in plan.placed.items() if n} == {"x": 4}


def test_without_failures_paths_share_by_length_and_weight_and_vns_evenly() -> None:
    plan = seed_plan(path_failures={}, node_failures={})
    # γ = 1/3 for all, so ρ = 3 × 1/3 × ω = 2, 3, 5 again; within a path every VN has the
    # same share. a→d: 2 over a, x, y, d (.5 each) → a and d (ids first); b→e: 3 over
    # b, x, y, e (.75 each) → b, e, x; c→f: 5 over c, x, y, f (1.25) → 1 each, one more to c.
    by_path = {p.path: dict(p.by_node) for p in plan.paths}
    assert by_path[("a", "d")] == {"a": 1, "x": 0, "y": 0, "d": 1}
    assert by_path[("b", "e")] == {"b": 1, "x": 1, "y": 0, "e": 1}
    assert by_path[("c", "f")] == {"c": 2, "x": 1, "y": 1, "f": 1}
    assert sum(plan.placed.values()) == 10


def test_a_budget_smaller_than_the_number_of_paths_leaves_the_lowest_priorities_without() -> None:
    plan = seed_plan(budget=2)
    # Quotas 2 × (2, 3, 5) / 10 = .4, .6, 1: c→f gets 1 by its floor, the one left goes to
    # b→e (.6 > .4); a→d gets nothing.
    by_path = {p.path: p.replicas for p in plan.paths}
    assert by_path == {("c", "f"): 1, ("b", "e"): 1, ("a", "d"): 0}
    # c→f's one replica: quotas c .1, x .4, y .2, f .3 → x; b→e's: b .25, x .5, y .25,
    # e 0 → x too.
    assert {vn: n for vn, n in plan.placed.items() if n} == {"x": 2}
    # Every VN has r < 3, so every path warns as well as every VN.
    kinds = [(w.kind, w.subject) for w in plan.warnings]
    assert ("path", "a -> d") in kinds
    assert ("path", "c -> f") in kinds
    assert sum(1 for kind, _ in kinds if kind == "vn") == 8


def test_warnings_name_short_vns_and_only_paths_with_no_vn_at_three() -> None:
    plan = seed_plan()
    warned = {w.subject for w in plan.warnings if w.kind == "vn"}
    assert warned == {"a", "b", "c", "d", "e", "f"}  # x has 4, y has 3
    assert not [w for w in plan.warnings if w.kind == "path"]


def test_zero_hop_and_zero_weight_paths_get_no_priority() -> None:
    tree = line_tree(["b0", "b1", "b2"])
    plan = place(tree, [("b0", "b0"), ("b0", "b2")], budget=6, weights={("b0", "b2"): 0})
    assert all(p.priority == 0 for p in plan.paths)
    assert plan.unplaced == 6
    assert sum(plan.placed.values()) == 0


def test_apportion_is_largest_remainder() -> None:
    # 7 × (1, 1, 1) / 3 = 2.33 each: floors 2, 2, 2; one left to the first in order.
    shares = apportion(7, [("p", Fraction(1)), ("q", Fraction(1)), ("r", Fraction(1))], str)
    assert shares == {"p": 3, "q": 2, "r": 2}
    assert apportion(5, [("p", Fraction(0))], str) == {"p": 0}


def test_bad_input_is_refused_with_what_is_wrong() -> None:
    with pytest.raises(PlacementError, match="no VN 'zz'"):
        place(TREE, [("a", "zz")], budget=3)
    with pytest.raises(PlacementError, match="budget"):
        place(TREE, PATHS, budget=-1)
    with pytest.raises(PlacementError, match="negative weight"):
        place(TREE, PATHS, budget=3, weights={("a", "d"): -1.0})


def test_diff_names_attach_detach_and_keep_per_vn() -> None:
    changes = diff({"a": 3, "b": 1, "c": 2}, {"a": 1, "b": 3, "c": 2})
    assert [(c.vn, c.action, c.delta) for c in changes] == [
        ("a", "attach", 2),
        ("b", "detach", -2),
        ("c", "keep", 0),
    ]


def test_vn_failures_sum_the_replicas_of_each_vn() -> None:
    per_broker = {"b1.0": NodeFailures(2, 10), "b1.1": NodeFailures(1, 10), "b2": NodeFailures()}
    vn_of = {"b1.0": "b1", "b1.1": "b1", "b2": "b2"}
    assert vn_failures(per_broker, vn_of.get) == {
        "b1": NodeFailures(3, 20),
        "b2": NodeFailures(0, 0),
    }


def test_path_weights_most_specific_wins() -> None:
    paths = [("a", "d"), ("a", "e"), ("b", "e")]
    weights = path_weights(
        paths,
        by_path={("a", "d"): 2.0, ("a", "e"): 4.0},
        by_pair={("alice", "dora"): 7.0},
        by_publisher={"alice": 3.0},
        client_vn={"alice": "a", "dora": "d"},
    )
    # a→d: the pair alice→dora (7) beats the path's 2; a→e: the path's 4 beats alice's 3;
    # b→e: nothing applies.
    assert weights == {("a", "d"): 7.0, ("a", "e"): 4.0, ("b", "e"): 1.0}
    with pytest.raises(PlacementError, match="'bob'"):
        path_weights(paths, by_publisher={"bob": 1.0})


# -- properties --------------------------------------------------------------------------

VNS = [f"v{i}" for i in range(7)]


@st.composite
def inputs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(2, len(VNS)))
    names = VNS[:n]
    links = [(names[i], names[draw(st.integers(0, i - 1))]) for i in range(1, n)]
    tree = Tree(names, links)
    pairs = st.tuples(st.sampled_from(names), st.sampled_from(names))
    paths = draw(st.lists(pairs, min_size=1, max_size=6))
    return {
        "tree": tree,
        "paths": paths,
        "budget": draw(st.integers(0, 40)),
        "path_failures": draw(st.dictionaries(pairs, st.integers(0, 20), max_size=6)),
        "node_failures": draw(
            st.dictionaries(
                st.sampled_from(names),
                st.builds(NodeFailures, st.integers(0, 10), st.integers(0, 30)),
            )
        ),
        "weights": draw(
            st.dictionaries(pairs, st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]), max_size=6)
        ),
        "max_per_path": draw(st.none() | st.integers(0, 15)),
        "once_per_node": draw(st.booleans()),
    }


def run(case: dict[str, Any]) -> Plan:
    return place(**case)


@settings(max_examples=150, deadline=None)
@given(inputs())
def test_the_budget_is_never_exceeded_and_every_replica_is_accounted_for(
    case: dict[str, Any],
) -> None:
    plan = run(case)
    placed = sum(plan.placed.values())
    assert placed <= case["budget"]
    assert placed + plan.unplaced == case["budget"]
    assert all(r >= 1 for r in plan.replicas.values())
    assert set(plan.replicas) == set(case["tree"].brokers)


@settings(max_examples=150, deadline=None)
@given(inputs())
def test_no_path_holds_more_than_max_per_path(case: dict[str, Any]) -> None:
    plan = run(case)
    limit = case["max_per_path"]
    if limit is None:
        return
    tree = case["tree"]
    for src, dst in case["paths"]:
        held = sum(plan.placed[vn] for vn in tree.path(src, dst))
        assert held <= limit


@settings(max_examples=150, deadline=None)
@given(inputs(), st.randoms(use_true_random=False))
def test_the_plan_is_deterministic_whatever_the_order_of_the_input(
    case: dict[str, Any], rnd: random.Random
) -> None:
    first = run(case).to_dict()
    shuffled = dict(case)
    paths = list(case["paths"])
    rnd.shuffle(paths)
    shuffled["paths"] = paths
    for name in ("path_failures", "node_failures", "weights"):
        items = list(case[name].items())
        rnd.shuffle(items)
        shuffled[name] = dict(items)
    assert run(shuffled).to_dict() == first
    assert run(case).to_dict() == first
