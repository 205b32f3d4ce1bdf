"""Constructive MTPSTO heuristics: Takahashi–Matsuyama and the shortest-path tree.

Both build a PST quickly without looking at the budget; the tabu searches use them as start
points and for diversification, and they are benchmarked on their own. Distances are trust
distances: entering node v costs −log of a trust in v (products of trust become sums), with
hop count breaking ties so that equally trusted routes stay short.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Mapping
from functools import partial

from overlay.pst import PST, Instance, evaluate
from reconfig.mtpsto.common import Solution, prune_router_leaves, reachable
from security.trust import most_trusted_paths

__all__ = ["cheap_tree", "solve_spt", "solve_tm", "spt_tree", "tm_tree"]

_TINY = 1e-300


def _cost(t: float) -> float:
    return -math.log(max(t, _TINY))


def _tm_weight(tau_p: Mapping[int, float], tau_s: Mapping[int, float], v: int) -> float:
    return _cost(tau_p[v] * tau_s[v])


def _cheap_weight(inst: Instance, bit: int, tau_s: Mapping[int, float], v: int) -> float:
    return inst.term(v, bit) + 1e-6 * _cost(tau_s[v])


def spt_tree(inst: Instance) -> PST | None:
    """The publisher's most-trusted-path tree, cut down to the subscribers.

    Every subscriber gets the path its publisher trusts most (Dijkstra in the (max, ×)
    semiring); the union of predecessor paths is a tree, and routers left as leaves are
    pruned.
    """
    if not reachable(inst):
        return None
    _, pred = most_trusted_paths(inst.adj, inst.publisher, inst.tau[inst.publisher].__getitem__)
    parent: dict[int, int] = {}
    for s in inst.subscribers:
        node = s
        while node != inst.publisher and node not in parent:
            up = pred[node]
            assert up is not None
            parent[node] = up
            node = up
    return PST(inst.publisher, prune_router_leaves(inst, parent))


def _path_to_tree(
    inst: Instance, source: int, in_tree: set[int], weight: Callable[[int], float]
) -> tuple[float, list[int]] | None:
    """Cheapest path from ``source`` to any tree node through non-tree nodes.

    Returns (cost, [source, v1, ..., x]) with x the tree node reached, or None.
    """
    dist: dict[int, tuple[float, int]] = {source: (0.0, 0)}
    pred: dict[int, int] = {}
    heap: list[tuple[float, int, int]] = [(0.0, 0, source)]
    done: set[int] = set()
    while heap:
        d, h, u = heapq.heappop(heap)
        if u in done:
            continue
        done.add(u)
        if u in in_tree:
            path = [u]
            while path[-1] != source:
                path.append(pred[path[-1]])
            path.reverse()
            return d, path
        step = 0.0 if u == source else weight(u)
        for v in inst.adj[u]:
            if v in done:
                continue
            nd = (d + step, h + 1)
            if nd < dist.get(v, (math.inf, 0)):
                dist[v] = nd
                pred[v] = u
                heapq.heappush(heap, (nd[0], nd[1], v))
    return None


def tm_tree(inst: Instance) -> PST | None:
    """Takahashi–Matsuyama: repeatedly join the subscriber closest to the tree.

    Closeness of subscriber s through node v costs −log(τ_p(v)·τ_s(v)): both the publisher
    (its path to s) and s (its path to p) pay for every relay on the way.
    """
    if not reachable(inst):
        return None
    p = inst.publisher
    tau_p = inst.tau[p]
    parent: dict[int, int] = {}
    in_tree = {p}
    left = set(inst.subscribers)
    while left:
        best: tuple[float, int, list[int]] | None = None
        for s in sorted(left):
            found = _path_to_tree(inst, s, in_tree, partial(_tm_weight, tau_p, inst.tau[s]))
            if found is None:
                continue
            cost, path = found
            if best is None or (cost, len(path)) < (best[0], len(best[2])):
                best = (cost, s, path)
        assert best is not None
        _, _, path = best
        for a, b in itertools.pairwise(path):
            parent[a] = b
            in_tree.add(a)
            left.discard(a)
    return PST(p, prune_router_leaves(inst, parent))


def cheap_tree(inst: Instance) -> PST | None:
    """A low-overhead PST: Takahashi–Matsuyama with overhead instead of trust as distance.

    Entering node v on the way to subscriber s costs v's overhead term with s below it; the
    tree node reached costs the growth of its own term. Trust only breaks ties. It gives the
    direct tabu search a start that is within budget whenever a cheap tree exists.
    """
    if not reachable(inst):
        return None
    p = inst.publisher
    parent: dict[int, int] = {}
    below: dict[int, int] = {p: 0}
    left = set(inst.subscribers)
    while left:
        best: tuple[float, int, list[int]] | None = None
        for s in sorted(left):
            bit = inst.sub_bit[s]
            weight = partial(_cheap_weight, inst, bit, inst.tau[s])
            found = _path_to_tree(inst, s, set(below), weight)
            if found is None:
                continue
            cost, path = found
            x = path[-1]
            if x != p:
                cost += inst.term(x, below[x] | bit) - inst.term(x, below[x])
            if best is None or (cost, len(path)) < (best[0], len(best[2])):
                best = (cost, s, path)
        assert best is not None
        _, _, path = best
        mask = 0
        for a, b in itertools.pairwise(path):
            parent[a] = b
            below[a] = mask
            mask |= inst.sub_bit.get(a, 0)
            left.discard(a)
        node = path[-1]
        while True:
            below[node] |= mask
            if node == p:
                break
            node = parent[node]
    return PST(p, prune_router_leaves(inst, parent))


def _solve_with(name: str, inst: Instance, build: Callable[[Instance], PST | None]) -> Solution:
    start = time.monotonic()
    tree = build(inst)
    ev = None if tree is None else evaluate(inst, tree)
    return Solution(name, tree, ev, False, time.monotonic() - start)


def solve_tm(inst: Instance) -> Solution:
    """The Takahashi–Matsuyama tree on its own."""
    return _solve_with("tm", inst, tm_tree)


def solve_spt(inst: Instance) -> Solution:
    """The shortest-(most-trusted-)path tree on its own."""
    return _solve_with("spt", inst, spt_tree)
