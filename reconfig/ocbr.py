"""OCBR local reconfiguration: a master's tabu search over its neighbourhood (SPEC §5).

A master broker sees its neighbourhood ({master} ∪ neighbours) and its local view of demand, and
searches spanning trees over the neighbourhood, starting from the current star:

* a move adds a random link that is not in the tree and not in the ``removedLinks`` tabu list,
  and removes the link of the cycle it closes whose removal lowers the cost most, skipping links
  in the ``addedLinks`` tabu list (if every link of the cycle is tabu the move is not possible);
* each iteration prices N such candidate moves and applies the best one even if it is worse
  (that is what lets the search leave a local optimum), then makes the added link tabu to remove
  and the removed link tabu to re-add for ``tenure`` iterations;
* the best tree seen over n iterations is the result, and it becomes a plan only if it is
  strictly cheaper than the star.

Because local and global costs differ by a constant (see :mod:`reconfig.cost`), a plan's local
improvement is exactly the global one: applying plans never raises the overlay's cost.

:func:`centralised_tabu` runs the same move structure over the whole tree; it is the baseline the
benchmark compares local reconfiguration against. Everything here is pure: plans are data
(:class:`overlay.tree.TopologyChange`), randomness comes from the ``random.Random`` passed in.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from overlay.tree import Link, TopologyChange, Tree
from reconfig.cost import CostModel, Demands, LocalView, SwapEvaluator, local_view

__all__ = [
    "DEFAULT_PARAMS",
    "CentralisedResult",
    "OcbrPlan",
    "SearchResult",
    "TabuParams",
    "centralised_tabu",
    "plan_local",
    "plan_view",
    "tabu_search",
]

# Enumerate candidate links when there are at most this many node pairs; sample above it.
_ENUMERATE_PAIRS = 2048


@dataclass(frozen=True)
class TabuParams:
    """Tabu search parameters.

    Attributes:
        candidates: N, candidate moves priced per iteration.
        iterations: n, iterations per search.
        tenure: how many iterations a moved link stays tabu (0 disables the tabu lists).
        adaptive: grow N and n with the problem: at least one candidate per node and two
            iterations per node. A hub with 50 neighbours has over a thousand possible links;
            8 random candidates a round barely sample them, and such a hub then keeps a poor
            star (measured in bench/RESULTS-ocbr.md).
    """

    candidates: int = 8
    iterations: int = 30
    tenure: int = 3
    adaptive: bool = False

    def __post_init__(self) -> None:
        if self.candidates < 1 or self.iterations < 0 or self.tenure < 0:
            raise ValueError(f"invalid tabu parameters: {self!r}")

    def for_size(self, nodes: int) -> TabuParams:
        """The parameters to use on a problem of ``nodes`` brokers."""
        if not self.adaptive:
            return self
        return TabuParams(
            candidates=max(self.candidates, nodes),
            iterations=max(self.iterations, 2 * nodes),
            tenure=self.tenure,
            adaptive=False,
        )


DEFAULT_PARAMS = TabuParams(candidates=8, iterations=30, tenure=3, adaptive=True)
"""Defaults for a master: a short search for a handful of neighbours, longer around hubs."""


@dataclass(frozen=True)
class SearchResult:
    """Outcome of one tabu search.

    Attributes:
        start_links: the tree the search started from.
        start_cost: its cost.
        best_links: the cheapest tree seen (``start_links`` if none was cheaper).
        best_cost: its cost, recomputed from scratch (no accumulated rounding).
        moves: moves applied during the search (including worsening ones).
    """

    start_links: frozenset[Link]
    start_cost: float
    best_links: frozenset[Link]
    best_cost: float
    moves: int

    @property
    def improved(self) -> bool:
        """Whether the best tree is strictly cheaper than the start (beyond rounding)."""
        return self.best_cost < self.start_cost - _tolerance(self.start_cost)


@dataclass(frozen=True)
class OcbrPlan:
    """A master's decision: replace its star by a cheaper local tree.

    Attributes:
        master: the planning broker.
        change: the links to remove (master–neighbour) and to add (inside the neighbourhood).
        cost_before: local cost of the star.
        cost_after: local cost of the planned local tree.
    """

    master: str
    change: TopologyChange
    cost_before: float
    cost_after: float

    @property
    def improvement(self) -> float:
        """Cost saved, locally and therefore globally (always > 0)."""
        return self.cost_before - self.cost_after

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form for logs, the admin page and the live protocol."""
        return {
            "master": self.master,
            "change": self.change.to_dict(),
            "cost_before": self.cost_before,
            "cost_after": self.cost_after,
        }


@dataclass(frozen=True)
class CentralisedResult:
    """Outcome of :func:`centralised_tabu`.

    Attributes:
        tree: the best overlay found (the input tree if nothing was cheaper).
        cost_before: global cost of the input tree.
        cost_after: global cost of ``tree``.
        moves: moves applied during the search.
    """

    tree: Tree
    cost_before: float
    cost_after: float
    moves: int


def tabu_search(
    evaluator: SwapEvaluator, *, rng: random.Random, params: TabuParams = DEFAULT_PARAMS
) -> SearchResult:
    """Run the SPEC §5 tabu search from the evaluator's current tree.

    The evaluator is moved around during the search and is left on the best tree found.
    """
    ev = evaluator
    n = len(ev.names)
    start_links = ev.links()
    start_cost = ev.cost
    best_links, best_cost = start_links, start_cost
    moves = 0
    if n < 3 or ev.class_count == 0:
        return SearchResult(start_links, start_cost, best_links, best_cost, moves)
    pairs = list(combinations(range(n), 2)) if n * (n - 1) // 2 <= _ENUMERATE_PAIRS else None
    removed_tabu: dict[tuple[int, int], int] = {}  # link -> first iteration it may be re-added
    added_tabu: dict[tuple[int, int], int] = {}  # link -> first iteration it may be removed
    params = params.for_size(n)
    tenure = params.tenure
    for it in range(params.iterations):
        candidates = _candidates(
            ev, pairs, params.candidates, removed_tabu=removed_tabu, it=it, rng=rng
        )
        best_move: tuple[float, tuple[int, int], tuple[int, int]] | None = None
        for add in candidates:
            path, deltas = ev.removal_deltas(*add)
            choice: tuple[float, tuple[int, int]] | None = None
            for k, d in enumerate(deltas):
                x, y = path[k], path[k + 1]
                key = (x, y) if x < y else (y, x)
                if added_tabu.get(key, 0) > it:
                    continue
                if choice is None or d < choice[0]:
                    choice = (d, key)
            if choice is not None and (best_move is None or choice[0] < best_move[0]):
                best_move = (choice[0], add, choice[1])
        if best_move is None:
            continue
        delta, add, remove = best_move
        ev.swap(add, remove, delta)
        moves += 1
        if tenure:
            added_tabu[add] = it + 1 + tenure
            removed_tabu[remove] = it + 1 + tenure
        if ev.cost < best_cost - _tolerance(best_cost):
            best_cost = ev.cost
            best_links = ev.links()
    if best_links != start_links:
        ev.reset(best_links)
        best_cost = ev.cost
    elif ev.links() != start_links:
        ev.reset(start_links)
    return SearchResult(start_links, start_cost, best_links, best_cost, moves)


def plan_view(
    view: LocalView,
    model: CostModel,
    *,
    rng: random.Random,
    params: TabuParams = DEFAULT_PARAMS,
) -> OcbrPlan | None:
    """Plan a master's reconfiguration from its local view; None when the star is best found.

    A master with fewer than two neighbours has a single spanning tree to choose from and never
    plans.
    """
    if len(view.neighbours) < 2 or not any(len(members) > 1 for members in view.classes):
        return None
    result = tabu_search(SwapEvaluator.from_view(view, model), rng=rng, params=params)
    if not result.improved:
        return None
    return OcbrPlan(
        master=view.master,
        change=view.change(result.best_links),
        cost_before=result.start_cost,
        cost_after=result.best_cost,
    )


def plan_local(
    tree: Tree,
    master: str,
    demands: Demands,
    model: CostModel,
    *,
    rng: random.Random,
    params: TabuParams = DEFAULT_PARAMS,
) -> OcbrPlan | None:
    """Build ``master``'s local view of ``demands`` on ``tree`` and plan from it."""
    return plan_view(local_view(tree, master, demands), model, rng=rng, params=params)


def centralised_tabu(
    tree: Tree,
    demands: Demands,
    model: CostModel,
    *,
    rng: random.Random,
    params: TabuParams = DEFAULT_PARAMS,
) -> CentralisedResult:
    """The same tabu search over every broker of the overlay (the benchmark's baseline).

    It needs a global view of the demand and of the topology, which a live overlay does not
    have; it is here to measure how much local reconfiguration leaves on the table.
    """
    ev = SwapEvaluator.from_tree(tree, demands, model)
    result = tabu_search(ev, rng=rng, params=params)
    best = tree if not result.improved else Tree(tree.brokers, result.best_links, tree.clients)
    cost_after = result.best_cost if result.improved else result.start_cost
    return CentralisedResult(best, result.start_cost, cost_after, result.moves)


def _candidates(
    ev: SwapEvaluator,
    pairs: Iterable[tuple[int, int]] | None,
    count: int,
    *,
    removed_tabu: dict[tuple[int, int], int],
    it: int,
    rng: random.Random,
) -> list[tuple[int, int]]:
    """Up to ``count`` distinct random links not in the tree and not tabu to add."""
    if pairs is not None:
        valid = [
            (i, j) for i, j in pairs if not ev.has_link(i, j) and removed_tabu.get((i, j), 0) <= it
        ]
        return rng.sample(valid, min(count, len(valid)))
    n = len(ev.names)
    chosen: dict[tuple[int, int], None] = {}
    for _ in range(50 * count):
        if len(chosen) >= count:
            break
        i, j = rng.randrange(n), rng.randrange(n)
        if i == j:
            continue
        key = (i, j) if i < j else (j, i)
        if key in chosen or ev.has_link(i, j) or removed_tabu.get(key, 0) > it:
            continue
        chosen[key] = None
    return list(chosen)


def _tolerance(cost: float) -> float:
    """Slack for float rounding when deciding that one cost beats another."""
    return 1e-9 * max(1.0, abs(cost))
