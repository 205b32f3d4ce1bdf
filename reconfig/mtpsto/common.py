"""What every MTPSTO solver returns, and the reachability and pruning helpers they share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from overlay.pst import PST, Evaluation, Instance, evaluate

__all__ = ["Solution", "prune_router_leaves", "reachable", "solution_to_dict"]


@dataclass(frozen=True)
class Solution:
    """A solver's answer.

    Attributes:
        solver: which solver produced it.
        tree: the PST, or None when no PST exists at all (subscribers unreachable) or, for the
            exact solver, when no PST fits the budget.
        evaluation: the tree's score (None with the tree).
        proven_optimal: the exact solver finished its search (always False for heuristics).
        seconds: wall time spent.
        stats: solver-specific counters (search nodes, iterations...).
    """

    solver: str
    tree: PST | None
    evaluation: Evaluation | None
    proven_optimal: bool
    seconds: float
    stats: Mapping[str, Any] = field(default_factory=dict)


def reachable(inst: Instance) -> bool:
    """Whether every subscriber is connected to the publisher (else no PST exists)."""
    seen = {inst.publisher}
    stack = [inst.publisher]
    while stack:
        u = stack.pop()
        for v in inst.adj[u]:
            if v not in seen:
                seen.add(v)
                stack.append(v)
    return all(s in seen for s in inst.subscribers)


def prune_router_leaves(inst: Instance, parent: dict[int, int]) -> dict[int, int]:
    """Drop router leaves repeatedly (a relay with nobody below it carries nothing)."""
    parent = dict(parent)
    kids: dict[int, int] = {}
    for p in parent.values():
        kids[p] = kids.get(p, 0) + 1
    stack = [n for n in parent if n in inst.routers and kids.get(n, 0) == 0]
    while stack:
        n = stack.pop()
        if n not in parent:
            continue
        p = parent.pop(n)
        kids[p] -= 1
        if kids[p] == 0 and p in inst.routers and p in parent:
            stack.append(p)
    return parent


def solution_to_dict(sol: Solution) -> dict[str, Any]:
    """JSON form printed by ``trellis pst solve``."""
    out: dict[str, Any] = {
        "solver": sol.solver,
        "feasible": bool(sol.evaluation is not None and sol.evaluation.within_budget),
        "proven_optimal": sol.proven_optimal,
        "seconds": round(sol.seconds, 6),
        "stats": dict(sol.stats),
    }
    if sol.tree is None or sol.evaluation is None:
        out.update(tree=None, trust=None, overhead=None, individual=None)
        return out
    out["tree"] = {
        "root": sol.tree.root,
        "parent": {str(c): p for c, p in sorted(sol.tree.parent.items())},
        "edges": [list(e) for e in sol.tree.edges()],
    }
    out["trust"] = sol.evaluation.trust
    out["overhead"] = sol.evaluation.overhead
    out["individual"] = {str(k): v for k, v in sorted(sol.evaluation.individual.items())}
    return out


def score(inst: Instance, parent: Mapping[int, int]) -> tuple[PST, Evaluation]:
    tree = PST(inst.publisher, dict(parent))
    return tree, evaluate(inst, tree)
