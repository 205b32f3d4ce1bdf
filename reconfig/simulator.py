"""Rounds of OCBR local reconfiguration over a model overlay, without sockets.

The live overlay runs one master at a time per neighbourhood: a broker whose timer fires locks
itself and its neighbours, plans, applies its plan, and unlocks. This simulator reproduces those
semantics round by round with the same cost and search code the brokers use:

* each round every broker's timer fires once, in a random order (``schedule="random"``) or by a
  fixed phase plus jitter (``schedule="jitter"``, closer to periodic timers);
* a broker already locked this round by another master cannot act; a broker whose neighbourhood
  holds a locked broker is refused (it retries next round). Masters of one round therefore have
  disjoint neighbourhoods, so running them one after another is the same as running them
  concurrently;
* convergence: a full sweep with no move, i.e. every broker's latest turn as master found no plan
  and its local view has not changed since. A plan changes the local views of the brokers of its
  own neighbourhood only (for any other broker the neighbourhood lies inside one of its regions,
  whose members do not change), so those are the only brokers that must plan again.

Also here: the clustered workload generator used by the tests and the benchmark.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from overlay.tree import Tree, broker_names, link, random_tree
from reconfig.cost import CostModel, Demands, SwapEvaluator
from reconfig.ocbr import DEFAULT_PARAMS, OcbrPlan, TabuParams, plan_local

__all__ = [
    "RoundRecord",
    "SimulationResult",
    "Workload",
    "clustered_workload",
    "geometric_model",
    "global_cost",
    "simulate",
]

Schedule = Literal["random", "jitter"]


@dataclass(frozen=True)
class Workload:
    """An overlay with clients attached and the traffic classes they exchange.

    Attributes:
        tree: the initial overlay (random tree, clients at random brokers).
        demands: traffic classes (client sets) → messages per window.
        clusters: client → the cluster it belongs to.
    """

    tree: Tree
    demands: Mapping[frozenset[str], float]
    clusters: Mapping[str, int]


@dataclass(frozen=True)
class RoundRecord:
    """What happened in one round.

    Attributes:
        index: round number, from 0.
        masters: brokers that locked their neighbourhood and planned, in order.
        refused: brokers that could not lock their neighbourhood this round.
        plans: plans applied, in order.
        cost: global cost at the end of the round, recomputed from scratch.
    """

    index: int
    masters: tuple[str, ...]
    refused: int
    plans: tuple[OcbrPlan, ...]
    cost: float

    @property
    def saving(self) -> float:
        """Sum of the applied plans' local improvements (equals the global cost drop)."""
        return sum(p.improvement for p in self.plans)


@dataclass(frozen=True)
class SimulationResult:
    """Outcome of :func:`simulate`.

    Attributes:
        initial: the overlay before the first round.
        final: the overlay after the last round.
        initial_cost: global cost of ``initial``.
        rounds: one record per round run.
        converged: whether a full sweep without a move was seen before ``max_rounds``.
    """

    initial: Tree
    final: Tree
    initial_cost: float
    rounds: tuple[RoundRecord, ...]
    converged: bool

    @property
    def final_cost(self) -> float:
        """Global cost after the last round."""
        return self.rounds[-1].cost if self.rounds else self.initial_cost

    @property
    def moves(self) -> int:
        """Plans applied over all rounds."""
        return sum(len(r.plans) for r in self.rounds)

    @property
    def links_changed(self) -> int:
        """Links added over all rounds (each plan removes as many as it adds)."""
        return sum(len(p.change.add) for r in self.rounds for p in r.plans)


def global_cost(tree: Tree, demands: Demands, model: CostModel) -> float:
    """The SPEC §5 cost of ``tree`` (fast path; same value as ``routing_cost``)."""
    return SwapEvaluator.from_tree(tree, demands, model).cost


def simulate(
    tree: Tree,
    demands: Demands,
    model: CostModel,
    *,
    rng: random.Random,
    params: TabuParams = DEFAULT_PARAMS,
    max_rounds: int = 300,
    schedule: Schedule = "random",
    jitter: float = 0.1,
) -> SimulationResult:
    """Run rounds of local reconfiguration until convergence or ``max_rounds``.

    Args:
        tree: the initial overlay.
        demands: global traffic classes; each master sees them through its local view.
        model: cost weights.
        rng: the only source of randomness (schedule and searches).
        params: tabu parameters of every master.
        max_rounds: upper bound on rounds.
        schedule: ``"random"`` (fresh order each round) or ``"jitter"`` (fixed phase per
            broker plus uniform jitter of ±``jitter`` of the period).
        jitter: see ``schedule``.
    """
    brokers = sorted(tree.brokers)
    phase = {b: rng.random() for b in brokers}
    initial, initial_cost = tree, global_cost(tree, demands, model)
    quiet: set[str] = set()
    rounds: list[RoundRecord] = []
    converged = False
    for index in range(max_rounds):
        if schedule == "random":
            order = brokers[:]
            rng.shuffle(order)
        else:
            fire = {b: phase[b] + rng.uniform(-jitter, jitter) for b in brokers}
            order = sorted(brokers, key=lambda b: (fire[b], b))
        locked: set[str] = set()
        masters: list[str] = []
        plans: list[OcbrPlan] = []
        refused = 0
        for b in order:
            if b in locked:
                continue
            nbrs = tree.neighbours(b)
            if len(nbrs) < 2:
                # A leaf has one spanning tree to choose from: it never plans, never locks.
                quiet.add(b)
                continue
            hood = {b} | nbrs
            if hood & locked:
                refused += 1
                continue
            locked |= hood
            masters.append(b)
            plan = plan_local(tree, b, demands, model, rng=rng, params=params)
            if plan is None:
                quiet.add(b)
                continue
            tree = tree.apply(plan.change)
            plans.append(plan)
            # Only the brokers of this neighbourhood see a different local view now: for any
            # other broker the neighbourhood lies inside one of its regions, which keeps its
            # members. Their earlier "no plan" still holds.
            quiet -= hood
        rounds.append(
            RoundRecord(
                index=index,
                masters=tuple(masters),
                refused=refused,
                plans=tuple(plans),
                cost=global_cost(tree, demands, model),
            )
        )
        if len(quiet) == len(brokers):
            converged = True
            break
    return SimulationResult(initial, tree, initial_cost, tuple(rounds), converged)


def clustered_workload(
    n_brokers: int,
    rng: random.Random,
    *,
    clients_per_broker: float = 2.0,
    cluster_size: int = 8,
    classes_per_broker: float = 2.0,
    class_size: tuple[int, int] = (2, 4),
    cross_cluster: float = 0.1,
    max_demand: int = 100,
) -> Workload:
    """Clients in groups that talk among themselves, attached at random brokers.

    Each class draws 2–4 clients (``class_size``) from one cluster; every member is swapped for
    a client of another cluster with probability ``cross_cluster``. Demands are log-uniform in
    [1, ``max_demand``], so a few heavy classes dominate, as observed traffic does. The overlay
    is a uniformly random labelled tree: locality between brokers that serve one cluster is what
    reconfiguration has to discover.
    """
    lo, hi = class_size
    if n_brokers < 1 or lo < 1 or hi < lo or cluster_size < 1:
        raise ValueError("invalid workload parameters")
    brokers = broker_names(n_brokers)
    n_clients = max(hi, round(clients_per_broker * n_brokers))
    clients = broker_names(n_clients, prefix="c")
    n_clusters = max(2, math.ceil(n_clients / cluster_size))
    cluster_of = {c: i % n_clusters for i, c in enumerate(clients)}
    members: list[list[str]] = [[] for _ in range(n_clusters)]
    for c in clients:
        members[cluster_of[c]].append(c)
    attach = {c: rng.choice(brokers) for c in clients}
    tree = random_tree(brokers, rng, attach)
    demands: dict[frozenset[str], float] = {}
    for _ in range(max(1, round(classes_per_broker * n_brokers))):
        home = rng.randrange(n_clusters)
        size = min(rng.randint(lo, hi), len(members[home]))
        chosen = set(rng.sample(members[home], size))
        for c in sorted(chosen):
            if rng.random() < cross_cluster:
                chosen.discard(c)
                chosen.add(rng.choice(clients))
        key = frozenset(chosen)
        demands[key] = demands.get(key, 0) + int(max_demand ** rng.random())
    return Workload(tree, demands, cluster_of)


def geometric_model(
    brokers: list[str] | tuple[str, ...],
    rng: random.Random,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    scale: float = 10.0,
) -> CostModel:
    """A cost model where a link costs ``scale`` × the distance between its brokers.

    Brokers get random positions in the unit square (a stand-in for measured round-trip
    times). Unlike unit link costs, where a star is nearly always best, distances make the
    optimum a real trade-off between short links and few hops. Access links keep cost 1.
    """
    pos = {b: (rng.random(), rng.random()) for b in brokers}
    costs = {
        link(a, b): scale * math.dist(pos[a], pos[b])
        for i, a in enumerate(brokers)
        for b in brokers[i + 1 :]
    }
    return CostModel(alpha=alpha, beta=beta, link_costs=costs)
