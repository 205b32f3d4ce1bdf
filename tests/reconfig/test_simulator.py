"""Rounds of local reconfiguration over a model overlay, and the clustered workload."""

from __future__ import annotations

import random

import pytest

from reconfig.cost import CostModel, routing_cost
from reconfig.ocbr import TabuParams
from reconfig.simulator import clustered_workload, global_cost, simulate

MODELS = [
    CostModel(),
    CostModel(alpha=1.0, beta=0.0),
    CostModel(alpha=0.2, beta=2.0, default_link_cost=3.0),
]


@pytest.mark.parametrize("schedule", ["random", "jitter"])
@pytest.mark.parametrize(("n", "seed"), [(8, 0), (15, 1), (30, 2)])
def test_repeated_local_rounds_never_increase_global_cost(n: int, seed: int, schedule: str) -> None:
    work = clustered_workload(n, random.Random(seed))
    for model in MODELS:
        result = simulate(
            work.tree,
            work.demands,
            model,
            rng=random.Random(seed),
            max_rounds=40,
            schedule=schedule,  # type: ignore[arg-type]
        )
        previous = result.initial_cost
        for record in result.rounds:
            assert record.cost <= previous + 1e-9 * previous
            # Each plan's local improvement is exactly its share of the global drop.
            assert previous - record.cost == pytest.approx(record.saving, rel=1e-9, abs=1e-9)
            previous = record.cost
        assert result.final_cost == pytest.approx(
            routing_cost(result.final, work.demands, model), rel=1e-12
        )


def test_masters_of_one_round_hold_disjoint_neighbourhoods() -> None:
    work = clustered_workload(40, random.Random(4))
    result = simulate(work.tree, work.demands, CostModel(), rng=random.Random(4), max_rounds=1)
    (record,) = result.rounds
    # Replay the round: each master's neighbourhood is taken before its own plan is applied.
    tree = work.tree
    plans = {p.master: p for p in record.plans}
    locked: set[str] = set()
    for master in record.masters:
        hood = {master} | tree.neighbours(master)
        assert not hood & locked
        locked |= hood
        if master in plans:
            tree = tree.apply(plans[master].change)
    assert tree == result.final
    assert record.refused > 0


def test_simulation_converges_and_its_last_sweep_moves_nothing() -> None:
    work = clustered_workload(12, random.Random(9))
    result = simulate(
        work.tree,
        work.demands,
        CostModel(),
        rng=random.Random(9),
        params=TabuParams(6, 20, 3),
        max_rounds=200,
    )
    assert result.converged
    assert not result.rounds[-1].plans
    assert result.moves > 0
    assert result.final_cost < result.initial_cost
    assert result.links_changed >= result.moves


def test_clustered_workload_is_deterministic_and_mostly_intra_cluster() -> None:
    a = clustered_workload(50, random.Random(3))
    b = clustered_workload(50, random.Random(3))
    assert a == b
    assert len(a.tree.brokers) == 50
    assert set(a.tree.clients) == set(a.clusters)
    intra = sum(len({a.clusters[c] for c in members}) == 1 for members in a.demands)
    assert intra / len(a.demands) > 0.5
    assert all(1 <= len(members) <= 4 for members in a.demands)
    assert all(d >= 1 for d in a.demands.values())
    assert global_cost(a.tree, a.demands, CostModel()) == pytest.approx(
        routing_cost(a.tree, a.demands, CostModel())
    )
