"""PST scoring on tiny problems whose trust and overhead are worked out by hand."""

from __future__ import annotations

import pytest

from overlay.pst import (
    PST,
    InvalidProblem,
    Problem,
    check_pst,
    compile_problem,
    evaluate,
    problem_from_dict,
    problem_to_dict,
)

# p = 0, subscribers 1 and 2, router 3. Events 0.1..0.5; sub 1 = [0.1, 0.3] matches
# {0.1, 0.2, 0.3}, sub 2 = [0.25, 0.45] matches {0.3, 0.4}. r = 1, f = 2, Δ = 0.5.
TRUST = {
    (0, 3): 0.5,
    (0, 1): 0.8,
    (1, 3): 0.6,
    (1, 2): 0.9,
    (2, 1): 0.7,
    (2, 3): 0.4,
}


def tiny(edges: tuple[tuple[int, int], ...], budget: float = 1000.0) -> Problem:
    return Problem(
        publisher=0,
        subscribers=(1, 2),
        routers=(3,),
        edges=edges,
        trust=TRUST,
        events=(0.1, 0.2, 0.3, 0.4, 0.5),
        subscriptions={1: (0.1, 0.3), 2: (0.25, 0.45)},
        budget=budget,
        r=1.0,
        f=2.0,
        delta=0.5,
    )


CHAIN = PST(0, {3: 0, 1: 3, 2: 1})  # 0 → 3 → 1 → 2


def test_chain_trust_matches_hand_computation() -> None:
    inst = compile_problem(tiny(((0, 3), (3, 1), (1, 2))))
    ev = evaluate(inst, CHAIN)
    # Publisher: paths to 1 (via 3) = 0.5, to 2 (via 3, 1) = 0.5·0.8 = 0.4;
    # OWA with Δ = 0.5, n = 2: w = (1/3, 2/3) → 0.5/3 + 0.4·2/3 = 1.3/3.
    assert ev.individual[0] == pytest.approx(1.3 / 3, rel=1e-12)
    # Internal subscriber 1: min(path to p via 3 = 0.6, path to child 2 = its trust 0.9).
    assert ev.individual[1] == pytest.approx(0.6, rel=1e-12)
    # Terminal subscriber 2: path to p via 1 and 3 = 0.7·0.4.
    assert ev.individual[2] == pytest.approx(0.28, rel=1e-12)
    # Social: sorted (0.6, 1.3/3, 0.28), weights (1/9, 2/9, 2/3).
    expected = 0.6 / 9 + (1.3 / 3) * 2 / 9 + 0.28 * 2 / 3
    assert ev.trust == pytest.approx(expected, rel=1e-12)


def test_chain_overhead_matches_hand_computation() -> None:
    inst = compile_problem(tiny(((0, 3), (3, 1), (1, 2))))
    ev = evaluate(inst, CHAIN)
    # p: (r+f)·|sub1 ∪ sub2| = 3·4; router 3: the same 3·4; subscriber 1 forwards sub 2's
    # events: 0.4 it did not want costs r+f = 3, 0.3 it wanted costs f = 2; leaf 2: 0.
    assert ev.overhead == 12 + 12 + 5
    assert ev.within_budget


def test_internal_subscriber_multiplies_in_its_trust_in_the_descendant() -> None:
    trust = dict(TRUST)
    trust[(1, 2)] = 0.1  # now the downward path is 1's weakest
    problem = tiny(((0, 3), (3, 1), (1, 2)))
    inst = compile_problem(Problem(**{**problem.__dict__, "trust": trust}))
    assert evaluate(inst, CHAIN).individual[1] == pytest.approx(0.1)


def test_direct_star_has_full_trust_and_only_the_publisher_term() -> None:
    inst = compile_problem(tiny(((0, 1), (0, 2))))
    ev = evaluate(inst, PST(0, {1: 0, 2: 0}))
    assert ev.trust == 1.0
    assert ev.overhead == 3 * 4


def test_over_budget_tree_is_flagged() -> None:
    inst = compile_problem(tiny(((0, 3), (3, 1), (1, 2)), budget=28.0))
    assert not evaluate(inst, CHAIN).within_budget


def test_check_pst_accepts_a_valid_tree() -> None:
    inst = compile_problem(tiny(((0, 3), (3, 1), (1, 2))))
    assert check_pst(inst, CHAIN) == []


@pytest.mark.parametrize(
    ("tree", "reason"),
    [
        (PST(0, {3: 0, 1: 0, 2: 1}), "router 3 is a leaf"),
        (PST(0, {3: 0, 1: 3}), "subscriber 2 is not spanned"),
        (PST(1, {3: 1, 0: 3, 2: 1}), "not at the publisher"),
        (PST(0, {3: 0, 1: 3, 2: 3}), "(3, 2) is not a connectivity-graph edge"),
        (PST(0, {3: 2, 1: 3, 2: 1}), "cycle"),
    ],
)
def test_check_pst_names_each_violation(tree: PST, reason: str) -> None:
    inst = compile_problem(tiny(((0, 3), (3, 1), (1, 2), (0, 1))))
    assert any(reason in r for r in check_pst(inst, tree))


def test_problem_round_trips_through_its_json_form() -> None:
    problem = tiny(((0, 3), (3, 1), (1, 2)))
    again = problem_from_dict(problem_to_dict(problem))
    assert again == Problem(**{**problem.__dict__, "trust": dict(sorted(TRUST.items()))})


def test_problem_file_with_a_misspelt_key_is_rejected_by_name() -> None:
    data = problem_to_dict(tiny(((0, 3),)))
    data["budjet"] = 5
    with pytest.raises(InvalidProblem, match="budjet"):
        problem_from_dict(data)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"subscribers": []}, "at least one subscriber"),
        ({"trust": [[0, 1, 1.5]]}, "outside"),
        ({"edges": [[0, 9]]}, "unknown node"),
        ({"subscriptions": {"1": [0.3, 0.1], "2": [0.1, 0.2]}}, "empty interval"),
    ],
)
def test_inconsistent_problems_are_rejected(change: dict, message: str) -> None:
    data = {**problem_to_dict(tiny(((0, 3), (3, 1), (1, 2)))), **change}
    with pytest.raises(InvalidProblem, match=message):
        problem_from_dict(data)
