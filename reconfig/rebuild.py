"""The trust-aware rebuild planner (SPEC §6 "Trust-aware overlay rebuild"): pure functions.

Given the VN tree, the demand classes (publisher edge VN → subscriber edge VNs, demand) and
each VN's trust, find the tree that maximises the *social trust* while its OCBR routing cost
(SPEC §5, :mod:`reconfig.cost`) stays within ``(1 + ε) ×`` the best cost found, and express it
as neighbourhood moves the live protocol can run one at a time.

The objective, read from SPEC §6 for one shared tree of VNs:

* every VN that publishes or receives traffic is a *client* of the tree; its *partners* are
  the VNs it exchanges traffic with (a publisher's subscribers, a subscriber's publishers);
* its trust in the path to a partner is the product of the trust of the VNs strictly between
  them (:func:`security.trust.path_trust`: direct neighbours have trust 1);
* its individual trust is the analytical leximin of those path trusts, and the tree's social
  trust is the analytical leximin of the individual values (:func:`security.trust.leximin_owa`).

Trust here is one value per VN (the overlay's consensus view of it, e.g. the minimum over its
replicas' trust, see :mod:`security.trust`), so a path's trust does not depend on who evaluates
it.

**Constraint on distrusted VNs.** A VN is *distrusted* when its trust falls below
``distrust_below``; a distrusted VN must be a leaf (degree ≤ 1), so no traffic between other
VNs crosses it. The search minimises, in this order: the distrusted VNs raised from a leaf into
a non-leaf position, the distrusted VNs that are not leaves, then maximises social trust, then
minimises cost. A distrusted VN still in a transit
position in the best tree within budget, or whose trust is below ``detach_below`` (as a leaf it
still carries its own clients' traffic), is *flagged for detach*.

**Hysteresis (the stated rule).** Two mechanisms stop a flapping trust value from making plans
oscillate:

1. *Trust band with probation.* A VN becomes distrusted as soon as its trust is below
   ``distrust_below``; it is trusted again only after ``probation`` consecutive plans with trust
   at or above ``trust_again_at`` (> ``distrust_below``). The memory is :class:`TrustState`,
   returned by every plan and passed to the next. A VN that misbehaves at least once every
   ``probation`` cycles therefore stays distrusted, and stays a leaf.
2. *Incumbent preference.* The current tree is kept (no moves) when it is within the cost
   budget, has no distrusted VN in a transit position, and the best tree found beats its social
   trust by no more than ``min_gain``.

So the tree changes only when a constraint is broken or a clear gain is on offer.

**Search.** Up to ``exact_up_to`` VNs the planner enumerates every labelled tree (Prüfer
sequences, n^(n-2) of them): the result is optimal. Above it, the best cost is found with the
OCBR tabu search (:func:`reconfig.ocbr.tabu_search`), and a tabu search over swap moves (add a
link, remove one of the cycle it closes) maximises the objective within the budget, from the
current tree and from the cheapest tree; candidate moves focus on the VNs that pull the social
trust down (distrusted non-leaves, the least trusted transit VN of the worst paths) plus random
swaps.

**Moves.** The target is reached by *neighbourhood moves*: at a master m, replace the link m–y
by x–y where x is another neighbour of m (the elementary change of the live protocol, SPEC §5).
Each keeps the tree connected and acyclic; any swap "remove u–v, add a–b" becomes a chain of
such moves that slide the link's ends along the tree, one hop at a time.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from overlay.tree import Link, Tree, link
from reconfig.cost import CostModel, Demands, SwapEvaluator
from reconfig.ocbr import TabuParams, tabu_search
from security.trust import DEFAULT_DELTA, leximin_owa

__all__ = [
    "DemandClasses",
    "Move",
    "RebuildParams",
    "RebuildPlan",
    "Score",
    "TrustState",
    "apply_moves",
    "classes_from_rows",
    "exhaustive_best",
    "moves_between",
    "ocbr_demands",
    "plan_rebuild",
    "raised_transit",
    "score_tree",
    "transit_vns",
    "update_trust_state",
]

DemandClasses = Mapping[tuple[str, frozenset[str]], float]
"""(publisher edge VN, subscriber edge VNs) → demand d(t), as the analytics ``classes`` table."""


@dataclass(frozen=True)
class RebuildParams:
    """Planner parameters.

    Attributes:
        epsilon: the cost budget is ``(1 + epsilon) ×`` the best cost found.
        distrust_below: a VN with trust below this is distrusted (must be a leaf).
        trust_again_at: a distrusted VN needs trust at least this ...
        probation: ... for this many consecutive plans to be trusted again.
        detach_below: a distrusted VN with trust below this is flagged for detach even as a leaf.
        min_gain: social-trust gain under which a valid current tree is kept.
        exact_up_to: enumerate every tree up to this many VNs (n^(n-2) trees).
        iterations: tabu iterations per start (None: 3 per VN, at least 40).
        tenure: how many iterations a moved link stays tabu.
        time_limit: wall-clock bound of the heuristic search, seconds.
        delta: Yager's Δ of the leximin operator.
    """

    epsilon: float = 0.1
    distrust_below: float = 0.5
    trust_again_at: float = 0.7
    probation: int = 3
    detach_below: float = 0.1
    min_gain: float = 0.01
    exact_up_to: int = 6
    iterations: int | None = None
    tenure: int = 5
    time_limit: float = 30.0
    delta: float = DEFAULT_DELTA

    def __post_init__(self) -> None:
        if self.epsilon < 0 or self.min_gain < 0 or self.probation < 0 or self.tenure < 0:
            raise ValueError(f"invalid rebuild parameters: {self!r}")
        if not 0.0 <= self.detach_below <= self.distrust_below <= self.trust_again_at <= 1.0:
            raise ValueError(
                "need 0 <= detach_below <= distrust_below <= trust_again_at <= 1, got "
                f"{self.detach_below}, {self.distrust_below}, {self.trust_again_at}"
            )


@dataclass(frozen=True)
class TrustState:
    """The hysteresis memory carried from one plan to the next.

    Attributes:
        distrusted: VNs currently treated as distrusted.
        clean: for each distrusted VN, consecutive plans it has spent at or above
            ``trust_again_at`` (its probation so far).
    """

    distrusted: frozenset[str] = frozenset()
    clean: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (to persist between cycles)."""
        return {"distrusted": sorted(self.distrusted), "clean": dict(sorted(self.clean.items()))}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrustState:
        """Parse :meth:`to_dict`'s form."""
        return cls(
            frozenset(str(v) for v in data.get("distrusted", ())),
            {str(k): int(v) for k, v in dict(data.get("clean", {})).items()},
        )


def update_trust_state(
    trust: Mapping[str, float], previous: TrustState, params: RebuildParams
) -> TrustState:
    """Apply the hysteresis rule to this cycle's trust values (VNs missing from ``trust``
    keep their previous status)."""
    distrusted: set[str] = set()
    clean: dict[str, int] = {}
    for vn in sorted(set(trust) | previous.distrusted):
        t = trust.get(vn)
        was = vn in previous.distrusted
        if t is None:
            if was:
                distrusted.add(vn)
                clean[vn] = previous.clean.get(vn, 0)
            continue
        if t < params.distrust_below:
            distrusted.add(vn)
            clean[vn] = 0
        elif was:
            streak = previous.clean.get(vn, 0) + 1 if t >= params.trust_again_at else 0
            if streak < params.probation:
                distrusted.add(vn)
                clean[vn] = streak
    return TrustState(frozenset(distrusted), clean)


@dataclass(frozen=True)
class Move:
    """A neighbourhood move: at ``master``, replace link master–vn by via–vn.

    ``via`` is another neighbour of ``master``, so the new link closes the triangle
    via–master–vn and removing master–vn leaves a tree.
    """

    master: str
    vn: str
    via: str

    @property
    def remove(self) -> Link:
        return link(self.master, self.vn)

    @property
    def add(self) -> Link:
        return link(self.via, self.vn)

    def to_dict(self) -> dict[str, Any]:
        return {"master": self.master, "remove": list(self.remove), "add": list(self.add)}


@dataclass(frozen=True)
class Score:
    """How a tree fares: the planner maximises ``(-violations, social, -cost)``.

    Attributes:
        social: analytical leximin over the clients' individual trust.
        individual: each client VN's individual trust.
        cost: OCBR routing cost.
        violations: distrusted VNs that are not leaves, each counting 1, or n + 1 (n VNs)
            for one that is a leaf in the current tree: raising a distrusted VN into a
            transit position is worse than any number of other violations, and only chosen
            when no tree within the budget avoids it (it is then flagged).
    """

    social: float
    individual: Mapping[str, float]
    cost: float
    violations: int

    def key(self) -> tuple[int, float, float]:
        return (-self.violations, self.social, -self.cost)


@dataclass(frozen=True)
class RebuildPlan:
    """The planner's decision.

    Attributes:
        before: the current tree.
        after: the planned tree (``before`` when kept).
        moves: neighbourhood moves from ``before`` to ``after``, in order.
        score_before: ``before``'s score.
        score_after: ``after``'s score.
        best_cost: the cheapest cost found (the budget's base).
        budget: ``(1 + ε) × best_cost``.
        distrusted: the VNs treated as distrusted (after hysteresis).
        demoted: distrusted VNs that were not leaves before and are leaves after.
        flagged: VNs flagged for detach.
        state: the hysteresis memory to pass to the next plan.
        exact: whether ``after`` is proven optimal (exhaustive search).
        reason: ``kept``, ``constraint`` (the current tree broke one) or ``gain``.
    """

    before: Tree
    after: Tree
    moves: tuple[Move, ...]
    score_before: Score
    score_after: Score
    best_cost: float
    budget: float
    distrusted: frozenset[str]
    demoted: tuple[str, ...]
    flagged: tuple[str, ...]
    state: TrustState
    exact: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary (for ``trellis rebuild`` and logs)."""

        def side(s: Score) -> dict[str, Any]:
            return {"cost": s.cost, "social_trust": s.social, "violations": s.violations}

        return {
            "reason": self.reason,
            "exact": self.exact,
            "moves": [m.to_dict() for m in self.moves],
            "before": side(self.score_before),
            "after": side(self.score_after),
            "best_cost": self.best_cost,
            "budget": self.budget,
            "distrusted": sorted(self.distrusted),
            "demoted": list(self.demoted),
            "flagged": list(self.flagged),
            "links_after": [list(lk) for lk in sorted(self.after.links)],
            "state": self.state.to_dict(),
        }


# -- inputs ----------------------------------------------------------------------------------


def classes_from_rows(
    rows: Iterable[Mapping[str, Any]],
) -> dict[tuple[str, frozenset[str]], float]:
    """Demand classes from ``classes`` table rows (``src``, ``dsts``, ``demand``), summed over
    windows; a subscriber equal to its publisher is dropped (local traffic)."""
    out: dict[tuple[str, frozenset[str]], float] = {}
    for row in rows:
        src = str(row["src"])
        dsts = frozenset(str(d) for d in row["dsts"]) - {src}
        if not dsts:
            continue
        key = (src, dsts)
        out[key] = out.get(key, 0.0) + float(row["demand"])
    return out


def ocbr_demands(classes: DemandClasses) -> Demands:
    """The OCBR traffic classes of ``classes``: member sets {publisher} ∪ subscribers."""
    out: dict[frozenset[str], float] = {}
    for (src, dsts), d in classes.items():
        key = frozenset({src, *dsts})
        out[key] = out.get(key, 0.0) + d
    return MappingProxyType(out)


def _partner_pairs(classes: DemandClasses) -> list[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    for (src, dsts), d in classes.items():
        if d <= 0:
            continue
        for s in dsts:
            if s != src:
                pairs.add((src, s) if src < s else (s, src))
    return sorted(pairs)


# -- scoring ---------------------------------------------------------------------------------


class _Scorer:
    """Social trust, violations and transit sets of trees given as adjacency over indices."""

    def __init__(
        self,
        names: list[str],
        classes: DemandClasses,
        trust: Mapping[str, float],
        distrusted: frozenset[str],
        delta: float,
        pinned: frozenset[str] = frozenset(),
    ) -> None:
        self.names = names
        index = {x: i for i, x in enumerate(names)}
        self.trust = [_check_trust(trust.get(x, 1.0), x) for x in names]
        self.pairs = [(index[a], index[b]) for a, b in _partner_pairs(classes)]
        self.partners: dict[int, list[int]] = {}
        for k, (a, b) in enumerate(self.pairs):
            self.partners.setdefault(a, []).append(k)
            self.partners.setdefault(b, []).append(k)
        self.partners = dict(sorted(self.partners.items()))
        self.distrusted = [x in distrusted for x in names]
        # A distrusted VN that is a leaf today must not be raised: as a non-leaf it weighs
        # more than every other violation together.
        self.weight = [
            (len(names) + 1 if x in pinned else 1) if x in distrusted else 0 for x in names
        ]
        self.delta = delta

    def paths(self, adj: list[set[int]]) -> list[list[int]]:
        """The intermediate nodes of every partner pair's path."""
        n = len(adj)
        parent = [-1] * n
        depth = [0] * n
        seen = [False] * n
        order = [0]
        seen[0] = True
        for x in order:
            for y in adj[x]:
                if not seen[y]:
                    seen[y] = True
                    parent[y] = x
                    depth[y] = depth[x] + 1
                    order.append(y)
        out: list[list[int]] = []
        for a, b in self.pairs:
            left: list[int] = []
            right: list[int] = []
            x, y = a, b
            while depth[x] > depth[y]:
                x = parent[x]
                left.append(x)
            while depth[y] > depth[x]:
                y = parent[y]
                right.append(y)
            while x != y:
                x = parent[x]
                y = parent[y]
                left.append(x)
                right.append(y)
            if left and right and left[-1] == right[-1]:
                right.pop()  # the common ancestor, reached from both sides
            out.append([m for m in left + right[::-1] if m not in (a, b)])
        return out

    def social(self, adj: list[set[int]]) -> tuple[float, dict[str, float], list[list[int]]]:
        paths = self.paths(adj)
        values = []
        for mid in paths:
            v = 1.0
            for m in mid:
                v *= self.trust[m]
            values.append(v)
        individual = {
            self.names[c]: values[ks[0]]
            if len(ks) == 1
            else leximin_owa([values[k] for k in ks], self.delta)
            for c, ks in self.partners.items()
        }
        social = leximin_owa(individual.values(), self.delta) if individual else 1.0
        return social, individual, paths

    def violations(self, adj: list[set[int]]) -> int:
        return sum(w for i, w in enumerate(self.weight) if w and len(adj[i]) > 1)


def _check_trust(value: float, vn: str) -> float:
    if not 0.0 <= value <= 1.0 or math.isnan(value):
        raise ValueError(f"trust of {vn!r} is {value}, outside [0, 1]")
    return float(value)


def score_tree(
    tree: Tree,
    classes: DemandClasses,
    trust: Mapping[str, float],
    model: CostModel,
    distrusted: Iterable[str] = (),
    delta: float = DEFAULT_DELTA,
    pinned: Iterable[str] = (),
) -> Score:
    """Score one tree (the reference the search's numbers agree with); ``pinned`` are the
    distrusted VNs that are leaves in the current tree (see :class:`Score`)."""
    from reconfig.cost import routing_cost

    names = sorted(tree.brokers)
    scorer = _Scorer(names, classes, trust, frozenset(distrusted), delta, frozenset(pinned))
    adj = _adjacency(names, tree.links)
    social, individual, _ = scorer.social(adj)
    cost = routing_cost(tree, ocbr_demands(classes), model)
    return Score(social, MappingProxyType(individual), cost, scorer.violations(adj))


def transit_vns(tree: Tree, classes: DemandClasses) -> frozenset[str]:
    """VNs strictly inside the path of some publisher–subscriber pair (transit positions)."""
    names = sorted(tree.brokers)
    scorer = _Scorer(names, classes, {}, frozenset(), DEFAULT_DELTA)
    return frozenset(names[m] for mid in scorer.paths(_adjacency(names, tree.links)) for m in mid)


def _adjacency(names: list[str], links: Iterable[tuple[str, str]]) -> list[set[int]]:
    index = {x: i for i, x in enumerate(names)}
    adj: list[set[int]] = [set() for _ in names]
    for a, b in links:
        adj[index[a]].add(index[b])
        adj[index[b]].add(index[a])
    return adj


def _links_of(names: list[str], adj: list[set[int]]) -> frozenset[Link]:
    return frozenset(link(names[i], names[j]) for i, ns in enumerate(adj) for j in ns if i < j)


# -- exhaustive search -----------------------------------------------------------------------


def _all_trees(n: int) -> Iterable[list[tuple[int, int]]]:
    """Every labelled tree over range(n), decoded from every Prüfer sequence."""
    if n == 1:
        yield []
        return
    if n == 2:
        yield [(0, 1)]
        return
    for seq in itertools.product(range(n), repeat=n - 2):
        degree = [1] * n
        for x in seq:
            degree[x] += 1
        edges = []
        for x in seq:
            leaf = next(i for i in range(n) if degree[i] == 1)
            edges.append((leaf, x))
            degree[leaf] -= 1
            degree[x] -= 1
        u, v = (i for i in range(n) if degree[i] == 1)
        edges.append((u, v))
        yield edges


def exhaustive_best(
    tree: Tree,
    classes: DemandClasses,
    trust: Mapping[str, float],
    model: CostModel,
    *,
    distrusted: Iterable[str] = (),
    epsilon: float = 0.1,
    budget: float | None = None,
    delta: float = DEFAULT_DELTA,
    pinned: Iterable[str] = (),
) -> tuple[frozenset[Link], Score, float]:
    """The optimum by enumerating all n^(n-2) trees over ``tree``'s VNs.

    Returns:
        (links, score, min_cost): the best tree within the budget (``budget`` if given, else
        ``(1 + epsilon) ×`` the true minimum cost), its score, and the true minimum cost.
    """
    names = sorted(tree.brokers)
    scorer = _Scorer(names, classes, trust, frozenset(distrusted), delta, frozenset(pinned))
    ev = SwapEvaluator.from_tree(tree, ocbr_demands(classes), model)
    assert ev.names == names
    candidates: list[tuple[list[tuple[int, int]], float]] = []
    for edges in _all_trees(len(names)):
        ev.reset((names[a], names[b]) for a, b in edges)
        candidates.append((edges, ev.cost))
    min_cost = min(c for _e, c in candidates)
    limit = (1.0 + epsilon) * min_cost if budget is None else budget
    limit += _tolerance(limit)
    best: tuple[tuple[int, float, float], list[set[int]], float, dict[str, float]] | None = None
    for edges, cost in candidates:
        if cost > limit:
            continue
        adj: list[set[int]] = [set() for _ in names]
        for a, b in edges:
            adj[a].add(b)
            adj[b].add(a)
        viol = scorer.violations(adj)
        if best is not None and -viol < best[0][0]:
            continue
        social, individual, _ = scorer.social(adj)
        key = (-viol, social, -cost)
        if best is None or key > best[0]:
            best = (key, adj, cost, individual)
    if best is None:
        raise ValueError("no tree within the budget")
    key, adj, cost, individual = best
    score = Score(key[1], MappingProxyType(individual), cost, -key[0])
    return _links_of(names, adj), score, min_cost


# -- heuristic search ------------------------------------------------------------------------


class _Search:
    """Tabu search over swaps, pricing a candidate's trust incrementally.

    Cutting link x–y splits the tree into the subtree under the child end and the rest; only
    partner pairs split by the cut change their path, and the new path is the old path from
    one end to the new link's end on its side, the new link, and the old path on the other
    side. With the tree rooted once per applied move (Euler intervals for "is v under c"),
    a candidate costs O(pairs + the changed paths), not a re-rooting.
    """

    def __init__(
        self,
        names: list[str],
        scorer: _Scorer,
        ev: SwapEvaluator,
        budget: float,
        params: RebuildParams,
        rng: random.Random,
    ) -> None:
        self.names = names
        self.scorer = scorer
        self.trust = scorer.trust
        self.ev = ev
        self.budget = budget + _tolerance(budget)
        self.params = params
        self.rng = rng
        self.by_trust = sorted(range(len(names)), key=lambda i: (-scorer.trust[i], i))
        self.adj: list[set[int]] = []
        self.values: list[float] = []
        self.min_cost = math.inf
        self.min_links: frozenset[Link] = frozenset()
        self.individual: list[float] = []
        # Clients in a fixed order; each pair's two clients as positions in that order.
        self.client_pairs = list(scorer.partners.values())
        position = {c: i for i, c in enumerate(scorer.partners)}
        self.pair_clients = [(position[a], position[b]) for a, b in scorer.pairs]

    # -- the current tree ---------------------------------------------------------------------

    def _set(self, adj: list[set[int]]) -> None:
        self.adj = adj
        n = len(adj)
        parent = [-1] * n
        depth = [0] * n
        tin = [0] * n
        tout = [0] * n
        clock = 0
        stack: list[tuple[int, bool]] = [(0, False)]
        seen = [False] * n
        seen[0] = True
        while stack:
            x, done = stack.pop()
            if done:
                tout[x] = clock
                continue
            tin[x] = clock
            clock += 1
            stack.append((x, True))
            for y in adj[x]:
                if not seen[y]:
                    seen[y] = True
                    parent[y] = x
                    depth[y] = depth[x] + 1
                    stack.append((y, False))
        self.parent, self.depth, self.tin, self.tout = parent, depth, tin, tout
        self.values = [self._product(self._chain(a, b)) for a, b in self.scorer.pairs]
        self.individual = [self._individual(ks, self.values) for ks in self.client_pairs]
        self.violations = self.scorer.violations(adj)

    def _chain(self, u: int, v: int) -> list[int]:
        """The current tree's path u…v, both ends included."""
        parent, depth = self.parent, self.depth
        left = [u]
        right = [v]
        x, y = u, v
        while depth[x] > depth[y]:
            x = parent[x]
            left.append(x)
        while depth[y] > depth[x]:
            y = parent[y]
            right.append(y)
        while x != y:
            x = parent[x]
            y = parent[y]
            left.append(x)
            right.append(y)
        right.pop()  # the meeting node is already the last of `left`
        left.extend(reversed(right))
        return left

    def _product(self, chain: list[int]) -> float:
        value = 1.0
        trust = self.trust
        for m in chain[1:-1]:
            value *= trust[m]
        return value

    def _individual(self, ks: list[int], values: list[float]) -> float:
        if len(ks) == 1:
            return values[ks[0]]
        return leximin_owa([values[k] for k in ks], self.params.delta)

    def _social(self, individual: list[float]) -> float:
        return leximin_owa(individual, self.params.delta) if individual else 1.0

    # -- candidates ---------------------------------------------------------------------------

    def _price(
        self, add: tuple[int, int], remove: tuple[int, int], cost: float
    ) -> tuple[int, float, float]:
        x, y = remove
        c = x if self.parent[x] == y else y
        lo, hi = self.tin[c], self.tout[c]
        tin = self.tin
        a, b = add
        a_in = lo <= tin[a] < hi
        values = self.values[:]
        touched: set[int] = set()
        for k, (p, q) in enumerate(self.scorer.pairs):
            p_in = lo <= tin[p] < hi
            if p_in == (lo <= tin[q] < hi):
                continue
            near, far = (p, q) if p_in == a_in else (q, p)
            value = self._product([*self._chain(near, a), *self._chain(b, far)])
            if value != values[k]:
                values[k] = value
                touched.update(self.pair_clients[k])
        individual = self.individual
        if touched:
            individual = individual[:]
            for i in touched:
                individual[i] = self._individual(self.client_pairs[i], values)
        degree_change: dict[int, int] = {}
        for node, d in ((x, -1), (y, -1), (a, 1), (b, 1)):
            degree_change[node] = degree_change.get(node, 0) + d
        violations = self.violations
        weight = self.scorer.weight
        for node, d in degree_change.items():
            if weight[node]:
                old = len(self.adj[node])
                violations += weight[node] * ((old + d > 1) - (old > 1))
        return (-violations, self._social(individual), -cost)

    def run(
        self, start: frozenset[Link], deadline: float
    ) -> tuple[tuple[int, float, float], frozenset[Link]]:
        names, ev = self.names, self.ev
        ev.reset(start)
        self._set(_adjacency(names, start))
        key = (-self.violations, self._social(self.individual), -ev.cost)
        best_key, best_links = key, start
        n = len(names)
        iterations = self.params.iterations or max(60, 3 * n)
        # On a handful of VNs a long tenure forbids most of the few possible links.
        tenure = min(self.params.tenure, max(1, n // 2))
        tabu: dict[tuple[int, int], int] = {}
        stall = 0
        restarts = _RESTARTS
        for it in range(iterations):
            if time.monotonic() > deadline:
                break
            if stall > max(10, n // 4):
                if not restarts:
                    break
                # Stuck in a basin: restart from the best tree, shaken by random swaps.
                restarts -= 1
                stall = 0
                tabu.clear()
                ev.reset(best_links)
                self._set(_adjacency(names, best_links))
                # Each restart shakes harder: a basin that 3 swaps cannot leave, more may.
                self._kick(3 + 2 * (_RESTARTS - 1 - restarts))
            if best_key[0] == 0 and best_key[1] >= _PERFECT:
                break  # nothing can beat it but a cheaper tree of equal trust
            chosen: Any = None
            priced: dict[tuple[int, int], tuple[list[int], list[float]]] = {}
            for add, remove in self._candidates():
                got = priced.get(add)
                if got is None:
                    got = priced[add] = ev.removal_deltas(*add)
                ring, deltas = got
                k = _ring_index(ring, remove)
                if k is None:
                    continue
                cost = ev.cost + deltas[k]
                if cost < self.min_cost:
                    self._note_cheaper(add, remove, cost)
                if cost > self.budget:
                    continue
                cand_key = self._price(add, remove, cost)
                is_tabu = tabu.get(add, -1) >= it or tabu.get(remove, -1) >= it
                if is_tabu and cand_key <= best_key:
                    continue
                if chosen is None or cand_key > chosen[0]:
                    chosen = (cand_key, add, remove, deltas[k])
            if chosen is None:
                stall += 1
                continue
            key, add, remove, delta = chosen
            ev.swap(add, remove, delta)
            adj = self.adj
            adj[remove[0]].discard(remove[1])
            adj[remove[1]].discard(remove[0])
            adj[add[0]].add(add[1])
            adj[add[1]].add(add[0])
            self._set(adj)
            tabu[add] = it + tenure
            tabu[remove] = it + tenure
            if key > best_key:
                best_key, best_links = key, _links_of(names, adj)
                stall = 0
            else:
                stall += 1
        return best_key, best_links

    def _note_cheaper(self, add: tuple[int, int], remove: tuple[int, int], cost: float) -> None:
        """Remember the cheapest tree priced (the budget is relative to the best cost found)."""
        links = set(_links_of(self.names, self.adj))
        links.discard(link(self.names[remove[0]], self.names[remove[1]]))
        links.add(link(self.names[add[0]], self.names[add[1]]))
        self.min_cost, self.min_links = cost, frozenset(links)

    def _kick(self, swaps: int) -> None:
        """Apply up to ``swaps`` random swaps that keep the cost within the budget."""
        ev, adj, rng, n = self.ev, self.adj, self.rng, len(self.adj)
        for _ in range(20 * swaps):
            if not swaps:
                break
            a, b = rng.randrange(n), rng.randrange(n)
            if a == b or b in adj[a]:
                continue
            ring, deltas = ev.removal_deltas(a, b)
            k = rng.randrange(len(deltas))
            if ev.cost + deltas[k] > self.budget:
                continue
            x, y = ring[k], ring[k + 1]
            ev.swap(_pair(a, b), _pair(x, y), deltas[k])
            adj[x].discard(y)
            adj[y].discard(x)
            adj[a].add(b)
            adj[b].add(a)
            swaps -= 1
        self._set(adj)

    def _candidates(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Swaps (add, remove) around the VNs that pull the objective down, plus random ones."""
        adj, trust, rng, n = self.adj, self.trust, self.rng, len(self.adj)
        distrusted = self.scorer.distrusted
        violators = [i for i in range(n) if distrusted[i] and len(adj[i]) > 1]
        rng.shuffle(violators)
        focus = violators[:4]
        worst = sorted(range(len(self.values)), key=lambda k: (self.values[k], k))[:3]
        for k in worst:
            a, b = self.scorer.pairs[k]
            mid = self._chain(a, b)[1:-1]
            if mid:
                focus.append(min(mid, key=lambda m: (trust[m], m)))
        out: list[tuple[tuple[int, int], tuple[int, int]]] = []
        seen: set[tuple[tuple[int, int], tuple[int, int]]] = set()

        def push(add: tuple[int, int], remove: tuple[int, int]) -> None:
            a, b = add
            key = (_pair(a, b), _pair(*remove))
            if a != b and b not in adj[a] and key not in seen:
                seen.add(key)
                out.append(key)

        tin, tout, parent = self.tin, self.tout, self.parent
        for x in dict.fromkeys(focus):
            for y in adj[x]:
                c = x if parent[x] == y else y
                lo, hi = tin[c], tout[c]
                x_in = lo <= tin[x] < hi

                def on_x_side(v: int, lo: int = lo, hi: int = hi, x_in: bool = x_in) -> bool:
                    return (lo <= tin[v] < hi) == x_in

                near_x = [i for i in adj[x] if i != y][:3]
                near_y = [y, *list(adj[y] - {x})[:3]]
                top_x = list(
                    itertools.islice((i for i in self.by_trust if i != x and on_x_side(i)), 4)
                )
                top_y = list(itertools.islice((i for i in self.by_trust if not on_x_side(i)), 4))
                for a in dict.fromkeys(near_x + top_x):
                    for b in dict.fromkeys(near_y + top_y):
                        push((a, b), (x, y))
                for _ in range(6):
                    a, b = rng.randrange(n), rng.randrange(n)
                    if a != x and on_x_side(a) and not on_x_side(b):
                        push((a, b), (x, y))
        if len(out) > _MAX_CANDIDATES:
            out = rng.sample(out, _MAX_CANDIDATES)
        for _ in range(max(12, n // 4)):
            a, b = rng.randrange(n), rng.randrange(n)
            if a == b or b in adj[a]:
                continue
            ring = self._chain(a, b)
            inner = ring[1:-1]
            if not inner:
                continue
            low = min(inner, key=lambda m: (trust[m], m))
            j = ring.index(low)
            push((a, b), (ring[j - 1], low))
            push((a, b), (low, ring[j + 1]))
        return out


_MAX_CANDIDATES = 128
"""Swaps priced per iteration at most (focused ones first)."""

_RESTARTS = 4
"""Restarts from the best tree (shaken) when the tabu search stalls."""

_PERFECT = 1.0 - 1e-12
"""Social trust this close to 1 cannot be beaten (rounding of the leximin sum aside)."""


def _pair(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


def _ring_index(ring: list[int], remove: tuple[int, int]) -> int | None:
    for k in range(len(ring) - 1):
        if _pair(ring[k], ring[k + 1]) == remove:
            return k
    return None


def _tolerance(cost: float) -> float:
    return 1e-9 * max(1.0, abs(cost))


# -- moves -----------------------------------------------------------------------------------


def _slide(current: Tree, remove: Link, add: Link, u_first: bool) -> tuple[list[Move], Tree]:
    """The moves of one swap: slide one end of the removed link, then the other."""
    u, v = remove
    a, b = add
    side_u, _side_v = current.sides((u, v))
    if a not in side_u:
        a, b = b, a
    if not u_first:  # slide the v end first: the same moves seen from the other side
        u, v, a, b = v, u, b, a
    moves: list[Move] = []
    # Slide the u end towards a: link (cur, v) becomes (nxt, v) at master cur.
    for cur, nxt in itertools.pairwise(current.path(u, a)):
        step = Move(master=cur, vn=v, via=nxt)
        current = current.swap(step.remove, step.add)
        moves.append(step)
    # Then the v end towards b: link (a, cur) becomes (a, nxt) at master cur.
    for cur, nxt in itertools.pairwise(current.path(v, b)):
        step = Move(master=cur, vn=a, via=nxt)
        current = current.swap(step.remove, step.add)
        moves.append(step)
    return moves, current


def _carried(tree: Tree, pairs: Iterable[tuple[str, str]], avoid: frozenset[str]) -> set[Any]:
    """(pair, VN) for every VN of ``avoid`` strictly inside a pair's path."""
    out: set[Any] = set()
    for p, q in pairs:
        for m in tree.path(p, q)[1:-1]:
            if m in avoid:
                out.add((p, q, m))
    return out


#: Above this many VNs, moves are ordered without checking what distrusted VNs carry.
_CAREFUL_MOVES_UP_TO = 40

#: Swaps compared per step when ordering moves carefully.
_CAREFUL_OPTIONS = 12


def moves_between(
    before: Tree,
    after: Tree,
    *,
    avoid: Iterable[str] = (),
    pairs: Iterable[tuple[str, str]] = (),
) -> list[Move]:
    """Neighbourhood moves turning ``before`` into ``after``, each leaving a spanning tree.

    The change is split into swaps (remove a link of ``before``, add one of ``after`` on the
    cycle it closes); a swap "remove u–v, add a–b" (a on u's side) slides one end of the
    link along the tree to its new end, then the other, one hop per move.

    With ``avoid`` (the distrusted VNs): each of them that ends as a leaf is demoted first,
    by re-hanging its other neighbours onto one trusted neighbour (moves at the distrusted
    VN itself, which never make it carry more). With ``pairs`` (traffic partners) too, the
    remaining swaps and the order of each swap's two slides are chosen greedily so that the
    trees on the way make a VN of ``avoid`` carry as few partner pairs it did not carry once
    demoted as possible (up to 40 VNs; above, the first valid order).
    """
    avoid_set = frozenset(avoid)
    pair_list = list(pairs)
    careful = bool(avoid_set and pair_list) and len(before.brokers) <= _CAREFUL_MOVES_UP_TO
    current = before
    moves: list[Move] = []
    # First demote each distrusted VN that ends as a leaf: at master d, re-hang every other
    # neighbour onto one trusted neighbour x. d then carries nothing it did not carry before
    # (pairs between x's side and y's side stop crossing it), and x is trusted.
    for d in sorted(avoid_set):
        if len(after.neighbours(d)) > 1 or len(current.neighbours(d)) <= 1:
            continue
        trusted = sorted(current.neighbours(d) - avoid_set)
        if not trusted:
            continue
        keep = next((x for x in trusted if x in after.neighbours(d)), trusted[0])
        for y in sorted(current.neighbours(d) - {keep}):
            step = Move(master=d, vn=y, via=keep)
            current = current.swap(step.remove, step.add)
            moves.append(step)
    # What distrusted VNs carry once demoted, or in the tree the search chose, is the bar:
    # the trees on the way should not add to it.
    baseline = (
        _carried(current, pair_list, avoid_set) | _carried(after, pair_list, avoid_set)
        if careful
        else set()
    )
    while current.links != after.links:
        pending = current.links - after.links
        options: list[tuple[Link, Link]] = []
        for new in sorted(after.links - current.links):
            path = current.path(*new)
            options.extend(
                (link(x, y), new) for x, y in itertools.pairwise(path) if link(x, y) in pending
            )
        options = options[:_CAREFUL_OPTIONS] if careful else options[:1]
        best: tuple[tuple[int, int], list[Move], Tree] | None = None
        for remove, new in options:
            for u_first in (True, False) if careful else (True,):
                steps, end = _slide(current, remove, new, u_first)
                raised = 0
                if careful:
                    tree = current
                    for step in steps:
                        tree = tree.swap(step.remove, step.add)
                        raised += len(_carried(tree, pair_list, avoid_set) - baseline)
                rank = (raised, len(steps))
                if best is None or rank < best[0]:
                    best = (rank, steps, end)
        assert best is not None  # a valid change always has a swap (exchange property)
        moves.extend(best[1])
        current = best[2]
    return moves


def raised_transit(
    before: Tree, moves: Iterable[Move], classes: DemandClasses, avoid: Iterable[str]
) -> list[tuple[int, str]]:
    """(move number, VN) whenever a move makes a VN of ``avoid`` carry a partner pair it
    carries neither before the first move nor after the last (the safety a plan's order is
    checked against: what the final tree makes a distrusted VN carry is the search's choice,
    weighed by social trust; the trees on the way must not expose more than the two ends)."""
    avoid_set = frozenset(avoid)
    pairs = _partner_pairs(classes)
    trees = apply_moves(before, moves)
    final = trees[-1] if trees else before
    baseline = _carried(before, pairs, avoid_set) | _carried(final, pairs, avoid_set)
    out: list[tuple[int, str]] = []
    for i, tree in enumerate(trees, 1):
        out.extend(
            (i, vn) for vn in sorted({m for *_p, m in _carried(tree, pairs, avoid_set) - baseline})
        )
    return out


def apply_moves(tree: Tree, moves: Iterable[Move]) -> list[Tree]:
    """The trees after each move, checking each is a neighbourhood move of the tree before.

    Raises:
        TopologyError: a move is not one (``vn`` or ``via`` not a neighbour of ``master``).
    """
    from overlay.tree import TopologyError

    out: list[Tree] = []
    for m in moves:
        nbrs = tree.neighbours(m.master)
        if m.vn not in nbrs or m.via not in nbrs or m.vn == m.via:
            raise TopologyError(f"{m} is not a neighbourhood move", "unknown_link", (m.master,))
        tree = tree.swap(m.remove, m.add)
        out.append(tree)
    return out


# -- the planner -----------------------------------------------------------------------------


def plan_rebuild(
    tree: Tree,
    classes: DemandClasses,
    trust: Mapping[str, float],
    model: CostModel,
    *,
    params: RebuildParams = RebuildParams(),
    state: TrustState = TrustState(),
    rng: random.Random | None = None,
    budget: float | None = None,
) -> RebuildPlan:
    """Plan a trust-aware rebuild of ``tree``.

    Args:
        tree: the current VN tree (brokers are VNs; clients are ignored).
        classes: demand classes, (publisher VN, subscriber VNs) → demand.
        trust: each VN's trust in [0, 1]; VNs missing are fully trusted.
        model: OCBR cost weights and unit costs.
        params: see :class:`RebuildParams`.
        state: the hysteresis memory returned by the previous plan.
        rng: randomness of the heuristic search (default: seeded with 0).
        budget: an explicit cost budget instead of ``(1 + ε) ×`` the best cost found.

    Returns:
        The plan; ``plan.moves`` is empty when the tree is kept.
    """
    rng = rng if rng is not None else random.Random(0)
    vns = Tree(tree.brokers, tree.links)
    names = sorted(vns.brokers)
    new_state = update_trust_state({v: trust.get(v, 1.0) for v in names}, state, params)
    distrusted = new_state.distrusted & vns.brokers
    pinned = frozenset(v for v in distrusted if len(vns.neighbours(v)) <= 1)
    scorer = _Scorer(names, classes, trust, distrusted, params.delta, pinned)
    demands = ocbr_demands(classes)
    ev = SwapEvaluator.from_tree(vns, demands, model)
    start_cost = ev.cost
    start_links = vns.links
    start_adj = _adjacency(names, start_links)
    social0, ind0, _ = scorer.social(start_adj)
    before = Score(social0, MappingProxyType(ind0), start_cost, scorer.violations(start_adj))

    exact = len(names) <= params.exact_up_to
    if exact:
        links, after_score, best_cost = exhaustive_best(
            vns,
            classes,
            trust,
            model,
            distrusted=distrusted,
            pinned=pinned,
            epsilon=params.epsilon,
            budget=budget,
            delta=params.delta,
        )
        limit = (1.0 + params.epsilon) * best_cost if budget is None else budget
    else:
        deadline = time.monotonic() + params.time_limit
        n = len(names)
        # At least 40 iterations: on a handful of VNs 2n left every tree in the budget unseen.
        iterations = max(40, min(2 * n, 120))
        cost_params = TabuParams(candidates=min(n, 32), iterations=iterations, tenure=3)
        cost_search = tabu_search(ev, rng=rng, params=cost_params)
        cheapest = cost_search.best_links
        best_cost = min(start_cost, cost_search.best_cost)
        if start_cost <= cost_search.best_cost:
            cheapest = start_links
        limit = (1.0 + params.epsilon) * best_cost if budget is None else budget
        search = _Search(names, scorer, ev, limit, params, rng)
        search.min_cost, search.min_links = best_cost, cheapest
        results = []
        if start_cost <= limit + _tolerance(limit) and start_links != cheapest:
            half = time.monotonic() + (deadline - time.monotonic()) / 2
            results.append(search.run(start_links, half))
        results.append(search.run(cheapest, deadline))
        _key, links = max(results, key=lambda r: r[0])
        # The trust search may price trees cheaper than the cost search found: the budget
        # follows the best cost found, and a plan over the tightened budget is searched again.
        for _ in range(3):
            if budget is not None or search.min_cost >= best_cost - _tolerance(best_cost):
                break
            best_cost, cheapest = search.min_cost, search.min_links
            limit = (1.0 + params.epsilon) * best_cost
            search.budget = limit + _tolerance(limit)
            ev.reset(links)
            if ev.cost <= search.budget:
                break
            _key, links = search.run(cheapest, max(deadline, time.monotonic() + 1.0))
        adj = _adjacency(names, links)
        ev.reset(links)
        social, ind, _ = scorer.social(adj)
        after_score = Score(social, MappingProxyType(ind), ev.cost, scorer.violations(adj))

    within = start_cost <= limit + _tolerance(limit)
    small_gain = before.violations == 0 and after_score.social <= before.social + params.min_gain
    if within and (small_gain or before.key() >= after_score.key()):
        reason = "kept"
        links, after_score = start_links, before
    else:
        reason = "constraint" if not within or before.violations else "gain"
    after = Tree(vns.brokers, links, tree.clients)
    moves = tuple(
        moves_between(
            Tree(vns.brokers, start_links, tree.clients),
            after,
            avoid=distrusted,
            pairs=_partner_pairs(classes),
        )
    )
    adj_after = _adjacency(names, links)
    demoted = tuple(
        v
        for v in sorted(distrusted)
        if len(start_adj[names.index(v)]) > 1 and len(adj_after[names.index(v)]) <= 1
    )
    flagged = tuple(
        v
        for v in sorted(distrusted)
        if len(adj_after[names.index(v)]) > 1 or trust.get(v, 1.0) < params.detach_below
    )
    return RebuildPlan(
        before=tree,
        after=after,
        moves=moves,
        score_before=before,
        score_after=after_score,
        best_cost=best_cost,
        budget=limit,
        distrusted=distrusted,
        demoted=demoted,
        flagged=flagged,
        state=new_state,
        exact=exact,
        reason=reason,
    )
