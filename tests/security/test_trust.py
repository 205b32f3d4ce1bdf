"""The trust model: individual trust functions, the path semiring and analytical leximin."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from security.trust import (
    inferred_trust,
    leximin_owa,
    leximin_weights,
    make_weighted_trust,
    most_trusted_paths,
    path_trust,
    semiring_plus,
    semiring_times,
    trust_edges_from_vectors,
    weighted_trust,
)


def test_leximin_weights_match_yagers_formula_by_hand() -> None:
    # n = 3, Δ = 0.5: w1 = Δ²/(1+Δ)² = 1/9, w2 = Δ/(1+Δ)² = 2/9, w3 = 1/(1+Δ) = 2/3.
    assert leximin_weights(3, 0.5) == pytest.approx((1 / 9, 2 / 9, 2 / 3), rel=1e-15)


def test_leximin_of_one_value_is_the_value() -> None:
    assert leximin_weights(1) == (1.0,)
    assert leximin_owa([0.37]) == 0.37


@given(st.integers(1, 12), st.sampled_from([1e-4, 1e-3, 0.1, 0.5, 2.0]))
def test_leximin_weights_sum_to_one(n: int, delta: float) -> None:
    assert math.fsum(leximin_weights(n, delta)) == pytest.approx(1.0, rel=1e-12)


def test_leximin_puts_almost_all_weight_on_the_least_trusting() -> None:
    assert leximin_owa([0.9, 0.2, 0.8], 0.001) == pytest.approx(0.2, abs=2e-3)
    # Weights are applied in descending order of value, whatever the input order.
    assert leximin_owa([0.2, 0.9, 0.8], 0.5) == leximin_owa([0.9, 0.8, 0.2], 0.5)
    assert leximin_owa([0.9, 0.8, 0.2], 0.5) == pytest.approx(0.9 / 9 + 0.8 * 2 / 9 + 0.2 * 2 / 3)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=7), st.integers(0, 6), st.floats(0, 1))
def test_leximin_is_monotone_in_every_value(values: list[float], i: int, lower: float) -> None:
    i %= len(values)
    worse = list(values)
    worse[i] = min(worse[i], lower)
    assert leximin_owa(worse) <= leximin_owa(values)


def test_leximin_rejects_empty_input_and_bad_delta() -> None:
    with pytest.raises(ValueError, match="at least one"):
        leximin_owa([])
    with pytest.raises(ValueError, match="positive"):
        leximin_weights(2, 0.0)


def test_path_of_one_edge_has_trust_one_and_longer_paths_multiply_intermediates() -> None:
    trust = {"a": 0.5, "b": 0.4, "z": 0.01}
    assert path_trust(trust, ["me", "z"]) == 1.0
    assert path_trust(trust, ["me", "a", "b", "z"]) == 0.5 * 0.4
    assert path_trust(trust.__getitem__, ["me", "a", "z"]) == 0.5


def test_semiring_keeps_the_better_path_and_multiplies_along_one() -> None:
    assert semiring_plus(0.3, 0.7) == 0.7
    assert semiring_times(0.5, 0.5) == 0.25


def test_most_trusted_paths_prefers_trusted_relays_over_fewer_hops() -> None:
    graph = {"s": ["x", "a"], "x": ["s", "t"], "a": ["s", "b"], "b": ["a", "t"], "t": ["x", "b"]}
    trust = {"x": 0.3, "a": 0.9, "b": 0.9, "s": 1.0, "t": 1.0}
    best, pred = most_trusted_paths(graph, "s", trust.__getitem__)
    assert best["t"] == pytest.approx(0.81)
    assert pred["t"] == "b"
    assert best["x"] == 1.0  # a direct neighbour


def test_inferred_trust_uses_the_direct_edge_then_the_best_chain_then_zero() -> None:
    edges = {(0, 1): 0.5, (1, 2): 0.8, (0, 3): 0.9, (3, 2): 0.6, (0, 2): 0.1}
    t = inferred_trust(edges, [0, 1, 2, 3, 4], 0)
    assert t[2] == 0.1  # direct opinion wins even though 0→3→2 gives 0.54
    t_no_direct = inferred_trust({k: v for k, v in edges.items() if k != (0, 2)}, range(5), 0)
    assert t_no_direct[2] == pytest.approx(0.9 * 0.6)
    assert t_no_direct[4] == 0.0
    assert t_no_direct[0] == 1.0


def test_inferred_trust_rejects_weights_outside_unit_interval() -> None:
    with pytest.raises(ValueError, match="outside"):
        inferred_trust({(0, 1): 1.5}, [0, 1], 0)


def test_weighted_trust_ignores_unweighted_properties_and_normalises() -> None:
    tau = make_weighted_trust({"delivery_ratio": 3.0, "uptime": 1.0})
    assert tau({"delivery_ratio": 1.0, "uptime": 0.0, "colour": 0.5}) == pytest.approx(0.75)
    assert tau({"colour": 0.5}) == 0.0  # no evidence, no trust
    assert weighted_trust({"delivery_ratio": 0.9}) == pytest.approx(0.9)


def test_weighted_trust_rejects_out_of_range_values_and_negative_weights() -> None:
    with pytest.raises(ValueError, match="outside"):
        weighted_trust({"uptime": 1.2})
    with pytest.raises(ValueError, match="negative"):
        make_weighted_trust({"uptime": -1.0})


def test_trust_vectors_become_edge_weights_through_each_evaluators_function() -> None:
    vectors = {("a", "b"): {"delivery_ratio": 0.5, "uptime": 1.0}, ("c", "b"): {"uptime": 0.2}}
    strict = make_weighted_trust({"delivery_ratio": 1.0})
    edges = trust_edges_from_vectors(vectors, {"a": strict})
    assert edges[("a", "b")] == 0.5  # a only looks at deliveries
    assert edges[("c", "b")] == pytest.approx(0.2)  # c uses the default weights
    assert trust_edges_from_vectors(vectors)[("a", "b")] == pytest.approx((0.2 + 0.2) / 0.6)


def test_a_trust_function_returning_out_of_range_values_is_rejected() -> None:
    with pytest.raises(ValueError, match="outside"):
        trust_edges_from_vectors({(1, 2): {}}, lambda v: 1.5)
