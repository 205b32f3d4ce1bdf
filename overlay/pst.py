"""Publish/subscribe trees (PSTs): the MTPSTO problem, its overhead and its social trust.

A PST is a tree of the connectivity graph rooted at the publisher that spans the publisher and
every subscriber; routers may appear only as internal nodes. This module states, once, how a
PST is scored (SPEC §6):

* **overhead** O_T(E) = Σ_i (r+f)·Φ_E(¬s_i ∧ s'_i) + f·Φ_E(s_i ∧ s'_i) in the
  numbers-interval model (subscriptions are closed intervals, events are reals);
* **individual trust** of the publisher (leximin over its paths to the subscribers), of a
  terminal subscriber (its path to the publisher) and of an internal subscriber (the minimum
  over that path and its paths to the subscribers below it, each ending with its trust in
  that subscriber);
* **social trust**: the analytical leximin over the publisher and all subscribers.

Because only the subscribers' subscriptions matter, a node's effective subscription is fully
described by the *set of subscribers in its subtree*; :class:`Instance` therefore counts
matching events per subscriber subset (a bitset of events per subscriber, memoised by subset
mask), which makes overhead evaluation O(tree size) whatever the number of events.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from security.errors import InvalidRequest
from security.trust import DEFAULT_DELTA, inferred_trust, leximin_owa

__all__ = [
    "MAX_BUDGET",
    "PST",
    "Evaluation",
    "Instance",
    "InvalidPST",
    "InvalidProblem",
    "Problem",
    "better",
    "check_pst",
    "compile_problem",
    "evaluate",
    "individual_trust",
    "overhead",
    "problem_from_dict",
    "problem_to_dict",
    "subtree_masks",
    "tree_from_edges",
]

#: The seed's "no budget" value, 2^31 − 1.
MAX_BUDGET = 2**31 - 1

FORMAT_TAG = "trellis-mtpsto/1"


class InvalidProblem(InvalidRequest):
    """A problem description is inconsistent (fix the input file)."""


class InvalidPST(InvalidRequest):
    """A tree is not a valid PST for its problem; ``reasons`` lists every violation."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


@dataclass(frozen=True)
class Problem:
    """One MTPSTO instance, as plain data (node ids are ints).

    Attributes:
        publisher: the root of every PST.
        subscribers: the subscriber nodes (each has a subscription interval).
        routers: nodes that may relay but never be leaves.
        edges: undirected connectivity-graph edges.
        trust: directed trust-graph edges (i, j) → i's trust in j, in [0, 1].
        events: the event values E (reals).
        subscriptions: subscriber → closed interval (lo, hi).
        advertisement: the publisher's advertised interval.
        budget: the overhead budget B.
        r: receive cost; f: forward cost; delta: the leximin Δ.
    """

    publisher: int
    subscribers: tuple[int, ...]
    routers: tuple[int, ...]
    edges: tuple[tuple[int, int], ...]
    trust: Mapping[tuple[int, int], float]
    events: tuple[float, ...]
    subscriptions: Mapping[int, tuple[float, float]]
    advertisement: tuple[float, float] = (0.333, 0.666)
    budget: float = MAX_BUDGET
    r: float = 1.0
    f: float = 1.0
    delta: float = DEFAULT_DELTA
    name: str = ""


@dataclass(frozen=True)
class PST:
    """A rooted tree: ``parent`` maps every non-root node to its parent."""

    root: int
    parent: Mapping[int, int]

    @property
    def nodes(self) -> frozenset[int]:
        return frozenset(self.parent) | {self.root}

    def edges(self) -> list[tuple[int, int]]:
        """(parent, child) pairs, sorted, for stable output."""
        return sorted((p, c) for c, p in self.parent.items())


@dataclass(frozen=True)
class Evaluation:
    """How a PST scores: social trust F, overhead O_T(E), and the individual values."""

    trust: float
    overhead: float
    individual: Mapping[int, float]
    within_budget: bool


@dataclass
class Instance:
    """A problem compiled for fast evaluation (adjacency, inferred trust, event bitsets)."""

    problem: Problem
    publisher: int
    subscribers: tuple[int, ...]
    routers: frozenset[int]
    adj: dict[int, frozenset[int]]
    tau: dict[int, dict[int, float]]
    sub_bit: dict[int, int]
    sub_events: dict[int, int]
    r: float
    f: float
    delta: float
    budget: float
    all_mask: int
    publisher_term: float
    _count: dict[int, int] = field(default_factory=dict)

    def count(self, mask: int) -> int:
        """Φ_E of the union of the subscriptions of the subscribers in ``mask``."""
        got = self._count.get(mask)
        if got is None:
            bits = 0
            m = mask
            i = 0
            while m:
                if m & 1:
                    bits |= self.sub_events[self.subscribers[i]]
                m >>= 1
                i += 1
            got = bits.bit_count()
            self._count[mask] = got
        return got

    def term(self, node: int, child_mask: int) -> float:
        """Node ``node``'s overhead term given the subscribers below it (``child_mask``).

        ``(r+f)·Φ(¬s_i ∧ s'_i) + f·Φ(s_i ∧ s'_i)``: events it must receive only to forward
        cost r+f, events it wanted anyway cost only the forward f. Routers and the publisher
        have no subscription of their own.
        """
        if not child_mask:
            return 0.0
        bit = self.sub_bit.get(node)
        if bit is None:
            return (self.r + self.f) * self.count(child_mask)
        own = self.count(bit)
        both = self.count(child_mask | bit)
        return (self.r + self.f) * (both - own) + self.f * (self.count(child_mask) + own - both)

    def trust_in(self, evaluator: int, node: int) -> float:
        return self.tau[evaluator][node]


def _check_problem(p: Problem) -> None:
    nodes = [p.publisher, *p.subscribers, *p.routers]
    if len(set(nodes)) != len(nodes):
        raise InvalidProblem("publisher, subscribers and routers must be distinct nodes")
    if not p.subscribers:
        raise InvalidProblem("a PST needs at least one subscriber")
    known = set(nodes)
    for u, v in p.edges:
        if u not in known or v not in known:
            raise InvalidProblem(f"edge ({u}, {v}) names an unknown node")
        if u == v:
            raise InvalidProblem(f"self-loop on {u}")
    for (i, j), w in p.trust.items():
        if i not in known or j not in known:
            raise InvalidProblem(f"trust edge ({i}, {j}) names an unknown node")
        if not 0.0 <= w <= 1.0 or math.isnan(w):
            raise InvalidProblem(f"trust weight {w} on ({i}, {j}) outside [0, 1]")
    for s in p.subscribers:
        if s not in p.subscriptions:
            raise InvalidProblem(f"subscriber {s} has no subscription")
        lo, hi = p.subscriptions[s]
        if lo > hi:
            raise InvalidProblem(f"subscription of {s} is an empty interval [{lo}, {hi}]")
    if p.r < 0 or p.f < 0 or p.budget < 0:
        raise InvalidProblem("r, f and the budget must be non-negative")
    if p.delta <= 0:
        raise InvalidProblem("Δ must be positive")


def compile_problem(p: Problem) -> Instance:
    """Validate ``p`` and precompute everything evaluation needs."""
    _check_problem(p)
    nodes = [p.publisher, *p.subscribers, *p.routers]
    adj: dict[int, set[int]] = {n: set() for n in nodes}
    for u, v in p.edges:
        adj[u].add(v)
        adj[v].add(u)
    tau = {t: inferred_trust(p.trust, nodes, t) for t in (p.publisher, *p.subscribers)}
    sub_bit = {s: 1 << i for i, s in enumerate(p.subscribers)}
    sub_events: dict[int, int] = {}
    for s in p.subscribers:
        lo, hi = p.subscriptions[s]
        bits = 0
        for k, e in enumerate(p.events):
            if lo <= e <= hi:
                bits |= 1 << k
        sub_events[s] = bits
    all_mask = (1 << len(p.subscribers)) - 1
    inst = Instance(
        problem=p,
        publisher=p.publisher,
        subscribers=tuple(p.subscribers),
        routers=frozenset(p.routers),
        adj={n: frozenset(a) for n, a in adj.items()},
        tau=tau,
        sub_bit=sub_bit,
        sub_events=sub_events,
        r=p.r,
        f=p.f,
        delta=p.delta,
        budget=p.budget,
        all_mask=all_mask,
        publisher_term=0.0,
    )
    inst.publisher_term = inst.term(p.publisher, all_mask)
    return inst


def check_pst(inst: Instance, tree: PST) -> list[str]:
    """Every reason ``tree`` is not a valid PST of ``inst`` (empty when it is valid)."""
    reasons: list[str] = []
    if tree.root != inst.publisher:
        reasons.append(f"rooted at {tree.root}, not at the publisher {inst.publisher}")
    if tree.root in tree.parent:
        reasons.append("the root has a parent")
    for child, par in tree.parent.items():
        if child not in inst.adj:
            reasons.append(f"unknown node {child}")
        elif par not in inst.adj[child]:
            reasons.append(f"({par}, {child}) is not a connectivity-graph edge")
        if par != tree.root and par not in tree.parent:
            reasons.append(f"parent {par} of {child} is not in the tree")
    for s in inst.subscribers:
        if s not in tree.parent:
            reasons.append(f"subscriber {s} is not spanned")
    for child in tree.parent:
        seen = {child}
        node = child
        while node != tree.root:
            node = tree.parent.get(node, tree.root)
            if node in seen:
                reasons.append(f"cycle through {child}")
                break
            seen.add(node)
    has_child = set(tree.parent.values())
    for node in tree.parent:
        if node in inst.routers and node not in has_child:
            reasons.append(f"router {node} is a leaf")
    return reasons


def _children(tree: PST) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for c, p in tree.parent.items():
        kids.setdefault(p, []).append(c)
    for lst in kids.values():
        lst.sort()
    return kids


def subtree_masks(inst: Instance, tree: PST) -> dict[int, int]:
    """Per node: the subscribers strictly below it, as a bit mask."""
    kids = _children(tree)
    order: list[int] = [tree.root]
    for n in order:
        order.extend(kids.get(n, ()))
    below: dict[int, int] = {}
    for n in reversed(order):
        m = 0
        for c in kids.get(n, ()):
            m |= below[c] | inst.sub_bit.get(c, 0)
        below[n] = m
    return below


def overhead(inst: Instance, tree: PST) -> float:
    """O_T(E) of a PST (SPEC §6, with the publisher owning no subscription)."""
    below = subtree_masks(inst, tree)
    return math.fsum(inst.term(n, m) for n, m in below.items())


def individual_trust(inst: Instance, tree: PST) -> dict[int, float]:
    """The publisher's and every subscriber's individual PST trust.

    Products are taken from the evaluator outwards (publisher: top-down; subscriber: up to
    the publisher, or down to a descendant with its trust in that descendant last) so that a
    given path always yields the same float in every solver.
    """
    p = inst.publisher
    tau_p = inst.tau[p]
    to_pub: list[float] = []
    value: dict[int, float] = {}
    chains: dict[int, list[int]] = {}
    for s in inst.subscribers:
        chain = [s]
        node = s
        while node != p:
            node = tree.parent[node]
            chain.append(node)
        chains[s] = chain
        down = 1.0
        for k in reversed(chain[1:-1]):
            down *= tau_p[k]
        to_pub.append(down)
        tau_s = inst.tau[s]
        up = 1.0
        for k in chain[1:-1]:
            up *= tau_s[k]
        value[s] = up
    for d, chain in chains.items():
        # chain[i] for i ≥ 1 is an ancestor of d; subscriber ancestors evaluate the path down.
        for i in range(1, len(chain) - 1):
            a = chain[i]
            if a not in inst.sub_bit:
                continue
            tau_a = inst.tau[a]
            v = 1.0
            for k in range(i - 1, 0, -1):
                v *= tau_a[chain[k]]
            v *= tau_a[d]
            value[a] = min(value[a], v)
    result = {p: leximin_owa(to_pub, inst.delta)}
    result.update(value)
    return result


def evaluate(inst: Instance, tree: PST) -> Evaluation:
    """Social trust and overhead of a PST (assumed valid; see :func:`check_pst`)."""
    ind = individual_trust(inst, tree)
    f_value = leximin_owa(ind.values(), inst.delta)
    o = overhead(inst, tree)
    return Evaluation(trust=f_value, overhead=o, individual=ind, within_budget=o <= inst.budget)


def better(a: Evaluation, b: Evaluation | None) -> bool:
    """MTPSTO order: within budget first, then higher social trust, then lower overhead.

    Among over-budget trees (only ever compared by heuristics) lower overhead wins first,
    since no amount of trust makes an infeasible tree acceptable.
    """
    if b is None:
        return True
    if a.within_budget != b.within_budget:
        return a.within_budget
    if not a.within_budget:
        return (a.overhead, -a.trust) < (b.overhead, -b.trust)
    if a.trust != b.trust:
        return a.trust > b.trust
    return a.overhead < b.overhead


# -- plain-data (JSON) form -------------------------------------------------------------


def problem_to_dict(p: Problem) -> dict[str, Any]:
    """The documented JSON form (see "MTPSTO problem files" in README.md)."""
    return {
        "format": FORMAT_TAG,
        "name": p.name,
        "publisher": p.publisher,
        "subscribers": list(p.subscribers),
        "routers": list(p.routers),
        "edges": [list(e) for e in p.edges],
        "trust": [[i, j, w] for (i, j), w in sorted(p.trust.items())],
        "events": list(p.events),
        "subscriptions": {str(s): list(p.subscriptions[s]) for s in p.subscribers},
        "advertisement": list(p.advertisement),
        "budget": p.budget,
        "r": p.r,
        "f": p.f,
        "delta": p.delta,
    }


def problem_from_dict(d: Mapping[str, Any]) -> Problem:
    """Parse the JSON form; unknown keys are an error naming the key (typos must not pass)."""
    allowed = {
        "format",
        "name",
        "publisher",
        "subscribers",
        "routers",
        "edges",
        "trust",
        "events",
        "subscriptions",
        "advertisement",
        "budget",
        "r",
        "f",
        "delta",
    }
    extra = set(d) - allowed
    if extra:
        raise InvalidProblem(f"unknown key(s) in problem: {', '.join(sorted(extra))}")
    if d.get("format", FORMAT_TAG) != FORMAT_TAG:
        raise InvalidProblem(f"unsupported format {d.get('format')!r}, expected {FORMAT_TAG!r}")
    try:
        subs = tuple(int(s) for s in d["subscribers"])
        lo_a, hi_a = (float(x) for x in d.get("advertisement", (0.333, 0.666)))
        intervals = {int(k): (float(v[0]), float(v[1])) for k, v in d["subscriptions"].items()}
        problem = Problem(
            publisher=int(d["publisher"]),
            subscribers=subs,
            routers=tuple(int(r) for r in d.get("routers", ())),
            edges=tuple((int(u), int(v)) for u, v in d["edges"]),
            trust={(int(i), int(j)): float(w) for i, j, w in d.get("trust", ())},
            events=tuple(float(e) for e in d["events"]),
            subscriptions=intervals,
            advertisement=(lo_a, hi_a),
            budget=float(d.get("budget", MAX_BUDGET)),
            r=float(d.get("r", 1.0)),
            f=float(d.get("f", 1.0)),
            delta=float(d.get("delta", DEFAULT_DELTA)),
            name=str(d.get("name", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, InvalidProblem):
            raise
        raise InvalidProblem(f"malformed problem: {exc!r}") from exc
    _check_problem(problem)
    return problem


def tree_from_edges(root: int, edges: Iterable[tuple[int, int]]) -> PST:
    """Orient an undirected edge list away from ``root``."""
    adj: dict[int, list[int]] = {}
    for u, v in edges:
        adj.setdefault(u, []).append(v)
        adj.setdefault(v, []).append(u)
    parent: dict[int, int] = {}
    stack = [root]
    seen = {root}
    while stack:
        u = stack.pop()
        for v in adj.get(u, ()):
            if v not in seen:
                seen.add(v)
                parent[v] = u
                stack.append(v)
    return PST(root, parent)
