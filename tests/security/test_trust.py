"""The trust model: individual trust functions, the path semiring and analytical leximin."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from security.trust import (
    FEEDBACK_COUNTS,
    OBSERVED_WEIGHTS,
    TRUST_FUNCTIONS,
    TrustConfig,
    broker_trust,
    inferred_trust,
    leximin_owa,
    leximin_weights,
    make_weighted_trust,
    most_trusted_paths,
    observed_trust_edges,
    path_trust,
    semiring_plus,
    semiring_times,
    trust_curve,
    trust_edges_from_vectors,
    trust_losses,
    vector_from_counts,
    vn_trust,
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


# -- trust from observation ------------------------------------------------------------------


def feedback_row(
    w: float,
    evaluator: str,
    broker: str,
    vn: str | None = "v2",
    *,
    expected: int = 100,
    missing: int = 0,
    conflicting: int = 0,
    late: int = 0,
    shares_ok: int = 100,
    bad_shares: int = 0,
) -> dict[str, object]:
    """One ``trust_feedback`` row with the job's derived columns filled in consistently."""
    received = expected - missing
    failures = missing + conflicting + bad_shares
    events = expected + shares_ok + bad_shares
    return {
        "w": w,
        "evaluator": evaluator,
        "broker": broker,
        "broker_vn": vn,
        "expected": expected,
        "received": received,
        "missing": missing,
        "conflicting": conflicting,
        "bad_signatures": 0,
        "timely": received - late,
        "shares_ok": shares_ok,
        "bad_shares": bad_shares,
        "failures": failures,
        "events": events,
        "failure_ratio": failures / events,
        "delivery_ratio": (received - conflicting) / expected,
        "share_integrity": shares_ok / (shares_ok + bad_shares) if shares_ok + bad_shares else None,
        "timeliness": (received - late) / received if received else None,
    }


def test_vector_from_counts_matches_the_jobs_ratios() -> None:
    row = feedback_row(0.0, "v1.0", "v2.1", missing=10, conflicting=5, late=9, bad_shares=25)
    vector = vector_from_counts({k: float(row[k]) for k in FEEDBACK_COUNTS}, prior=0.7)  # type: ignore[arg-type]
    assert vector["delivery_ratio"] == pytest.approx(row["delivery_ratio"])
    assert vector["share_integrity"] == pytest.approx(row["share_integrity"])
    assert vector["timeliness"] == pytest.approx(row["timeliness"])
    assert vector["reliability"] == pytest.approx(1 - row["failure_ratio"])  # type: ignore[operator]
    assert vector["operator_prior"] == 0.7


def test_no_evidence_leaves_only_the_prior() -> None:
    assert vector_from_counts({}, prior=0.4) == {"operator_prior": 0.4}
    reports = broker_trust([], TrustConfig(prior=0.4), brokers={"v9.0": "v9"})
    assert reports["v9.0"].trust == pytest.approx(0.4)
    assert reports["v9.0"].pulled_down_by == "operator_prior"


def test_a_share_corrupting_replica_is_distrusted_and_blamed_on_share_integrity() -> None:
    rows = [
        feedback_row(0.0, "v1.0", "v2.0"),
        feedback_row(0.0, "v1.0", "v2.1", shares_ok=0, bad_shares=100),
        feedback_row(0.0, "v3.0", "v2.1", shares_ok=10, bad_shares=90),
    ]
    reports = broker_trust(rows, TrustConfig())
    assert reports["v2.0"].trust == pytest.approx(1.0)
    assert reports["v2.0"].pulled_down_by is None
    assert reports["v2.1"].trust < 0.2
    assert reports["v2.1"].pulled_down_by == "share_integrity"
    # A VN is as trusted as its least trusted replica.
    assert vn_trust(reports) == {"v2": reports["v2.1"].trust}


def test_the_lenient_functions_would_keep_a_corrupting_replica_trusted() -> None:
    # Why the default is min: with weights 0.4/0.4/0.1/0.1 the weighted mean of a replica
    # whose every other share is bad is 0.8, the geometric mean 0.76.
    rows = [feedback_row(0.0, "v1.0", "v2.1", shares_ok=50, bad_shares=50)]
    weighted = broker_trust(rows, TrustConfig(function="weighted"))["v2.1"]
    geometric = broker_trust(rows, TrustConfig(function="geometric"))["v2.1"]
    strict = broker_trust(rows, TrustConfig())["v2.1"]
    assert weighted.trust == pytest.approx(0.8)
    assert geometric.trust == pytest.approx(0.5**0.4)
    assert strict.trust == pytest.approx(0.5)
    assert weighted.pulled_down_by == geometric.pulled_down_by == "share_integrity"
    assert strict.pulled_down_by == "share_integrity"


def test_a_dropping_replica_is_blamed_on_delivery() -> None:
    rows = [feedback_row(0.0, "v1.0", "v2.2", missing=60)]
    report = broker_trust(rows, TrustConfig())["v2.2"]
    assert report.trust == pytest.approx(0.4)
    assert report.pulled_down_by == "delivery_ratio"


def test_operator_priors_apply_per_broker_then_per_vn() -> None:
    config = TrustConfig(priors={"v2.1": 0.2, "v2": 0.5})
    assert config.prior_of("v2.1", "v2") == 0.2
    assert config.prior_of("v2.0", "v2") == 0.5
    assert config.prior_of("v3.0", "v3") == 1.0
    rows = [feedback_row(0.0, "v1.0", "v2.1"), feedback_row(0.0, "v1.0", "v2.0")]
    reports = broker_trust(rows, config)
    assert reports["v2.1"].trust < reports["v2.0"].trust < 1.0
    assert reports["v2.1"].pulled_down_by == "operator_prior"


def test_a_brokers_trust_recovers_once_its_faults_stop() -> None:
    bad = [feedback_row(float(w), "v1.0", "v2.1", bad_shares=80, shares_ok=20) for w in range(3)]
    clean = [feedback_row(float(w), "v1.0", "v2.1") for w in range(3, 10)]
    curve = trust_curve(bad + clean, TrustConfig(half_life=1.0), "v2.1")
    values = [t for _w, t in curve]
    assert len(values) == 10
    assert max(values[:3]) < 0.5  # distrusted while the faults last
    assert all(b > a for a, b in itertools.pairwise(values[2:]))  # rises every clean window
    assert values[-1] > 0.9  # and is trusted again
    # Without decay the old faults never fade as fast.
    flat = [t for _w, t in trust_curve(bad + clean, TrustConfig(half_life=0.0), "v2.1")]
    assert flat[-1] < values[-1]


def test_observed_trust_edges_form_the_trust_graph() -> None:
    rows = [
        feedback_row(0.0, "v1.0", "v2.1", shares_ok=0, bad_shares=10),
        feedback_row(0.0, "v3.0", "v2.1"),
        feedback_row(0.0, "v1.0", "v3.0", vn="v3"),
        feedback_row(0.0, "client", "v1.0", vn=None),  # a publisher's shares: not a broker
    ]
    edges = observed_trust_edges(rows, TrustConfig())
    assert set(edges) == {("v1.0", "v2.1"), ("v3.0", "v2.1"), ("v1.0", "v3.0")}
    assert edges[("v1.0", "v2.1")] == 0.0
    assert edges[("v3.0", "v2.1")] == pytest.approx(1.0)
    # Inferred through the graph: v1.0 has its own (bad) opinion of v2.1, so it keeps it.
    assert inferred_trust(edges, ["v2.1"], "v1.0") == {"v2.1": 0.0}


def test_trust_config_parses_strictly_and_names_the_bad_key() -> None:
    config = TrustConfig.from_mapping(
        {"prior": 0.9, "function": "min", "weights": {"timeliness": 0}, "priors": {"v2": 0.3}}
    )
    assert config.weights["timeliness"] == 0.0
    assert config.weights["share_integrity"] == OBSERVED_WEIGHTS["share_integrity"]
    assert config.tau()({"timeliness": 0.1, "delivery_ratio": 0.8}) == 0.8
    with pytest.raises(ValueError, match=r"trust\.wieghts: unknown key"):
        TrustConfig.from_mapping({"wieghts": {}})
    with pytest.raises(ValueError, match=r"trust\.function"):
        TrustConfig.from_mapping({"function": "median"})
    with pytest.raises(ValueError, match=r"trust\.priors\.v2"):
        TrustConfig.from_mapping({"priors": {"v2": 1.5}})
    with pytest.raises(ValueError, match=r"trust\.weights"):
        TrustConfig.from_mapping({"weights": dict.fromkeys(OBSERVED_WEIGHTS, 0)})


@given(
    st.dictionaries(
        st.sampled_from(sorted(OBSERVED_WEIGHTS)), st.floats(0, 1), min_size=1, max_size=5
    ),
    st.sampled_from(TRUST_FUNCTIONS),
)
def test_every_trust_function_stays_in_the_unit_interval_and_blames_a_present_property(
    vector: dict[str, float], function: str
) -> None:
    config = TrustConfig(function=function)
    value = config.tau()(vector)
    assert 0.0 <= value <= 1.0
    losses = trust_losses(vector, config.weights, function)
    assert set(losses) <= set(vector)
    if function == "weighted" and losses:
        assert math.fsum(losses.values()) == pytest.approx(1.0 - value, abs=1e-9)
