"""Tabu searches for MTPSTO: the seed's router-set search and a direct PST-to-PST search.

**Seed tabu** (``solve_tabu_seed``). A solution is a set U of routers; its PST is *selected*
among the spanning trees of the graph induced by the publisher, the subscribers and U
(enumerated most-trusted first, router leaves pruned). "best" selection scores up to
``max_trees`` spanning trees per candidate; "adaptive" selection starts with few and doubles
the allowance whenever the search stalls. Moves insert or remove one router. Insert
candidates come from the *surrogate*: the most trusted path from the least trusting client
(lowest individual trust in the current tree) to the publisher, plus the routers next to the
tree that this client trusts most. Over-budget trees are penalised statically (trust halved)
or, optionally, with a near-feasibility-threshold (NFT) penalty. On stagnation the search
restarts from the Takahashi–Matsuyama, then the shortest-path-tree router set.

**Direct tabu** (``solve_tabu_direct``, the seed's suggested improvement). A solution is a
PST and every move yields a PST, so no spanning trees are enumerated: re-hang a subtree under
another tree node, route a subtree through a new router, remove a router (its children move
up), or swap a router for an outside one. Each neighbour is scored exactly. Budget handling
is lexicographic (any tree within budget beats any tree over it), so the search never settles
on an over-budget tree once it has seen a feasible one, and the best within-budget tree found
is returned.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import networkx as nx

from overlay.pst import PST, Evaluation, Instance, better, evaluate
from reconfig.mtpsto.common import Solution, prune_router_leaves, reachable
from reconfig.mtpsto.heuristics import cheap_tree, spt_tree, tm_tree
from security.trust import most_trusted_paths

__all__ = ["solve_tabu_direct", "solve_tabu_seed"]

#: How the seed's search ranks a scored tree against the budget (higher is better).
_Key = Callable[[Evaluation, float], tuple[float, float]]


@dataclass
class _Best:
    tree: PST | None = None
    ev: Evaluation | None = None

    def offer(self, tree: PST, ev: Evaluation) -> bool:
        if better(ev, self.ev):
            self.tree, self.ev = tree, ev
            return True
        return False


def _static(ev: Evaluation, budget: float) -> tuple[float, float]:
    """Seed's static penalty: an over-budget tree's trust is halved."""
    return (ev.trust if ev.within_budget else ev.trust / 2.0, -ev.overhead)


def _nft_factory(nft: float) -> _Key:
    """NFT penalty: trust shrinks with the squared excess over the budget, measured in units
    of the near-feasibility threshold (a fraction of B), reaching zero at one threshold."""

    def key(ev: Evaluation, budget: float) -> tuple[float, float]:
        if ev.within_budget:
            return (ev.trust, -ev.overhead)
        excess = (ev.overhead - budget) / max(nft * budget, 1e-9)
        return (ev.trust * max(0.0, 1.0 - excess * excess) / 2.0, -ev.overhead)

    return key


# -- the seed's tabu search ---------------------------------------------------------------


def _select_pst(
    inst: Instance, routers: frozenset[int], max_trees: int, key: _Key
) -> tuple[PST, Evaluation] | None:
    nodes = [inst.publisher, *inst.subscribers, *sorted(routers)]
    keep = set(nodes)
    graph: nx.Graph[int] = nx.Graph()
    graph.add_nodes_from(nodes)
    tau_p = inst.tau[inst.publisher]
    for u in nodes:
        for v in inst.adj[u]:
            if v in keep and u < v:
                w = -math.log(max(tau_p[u] * tau_p[v], 1e-300))
                graph.add_edge(u, v, weight=w)
    if not nx.is_connected(graph):
        return None
    best: tuple[PST, Evaluation] | None = None
    best_key: tuple[float, float] | None = None
    # types-networkx types G as a DiGraph, but the iterator walks undirected spanning trees.
    spans = nx.SpanningTreeIterator(graph)  # type: ignore[arg-type]
    for i, span in enumerate(spans):
        if i >= max_trees:
            break
        parent = dict(nx.bfs_predecessors(span, inst.publisher))
        tree = PST(inst.publisher, prune_router_leaves(inst, parent))
        ev = evaluate(inst, tree)
        k = key(ev, inst.budget)
        if best_key is None or k > best_key:
            best, best_key = (tree, ev), k
    return best


def solve_tabu_seed(
    inst: Instance,
    *,
    selection: str = "best",
    penalty: str = "static",
    nft: float = 0.1,
    max_iter: int = 30,
    stall_limit: int = 8,
    tenure: int = 5,
    max_trees: int = 40,
    k_insert: int = 5,
    time_limit: float | None = None,
) -> Solution:
    """The seed's tabu search over router sets (see module docstring).

    Args:
        selection: "best" (score up to ``max_trees`` spanning trees per candidate) or
            "adaptive" (start at 5 and double on stagnation, up to ``max_trees``).
        penalty: "static" (halve over-budget trust) or "nft".
    """
    if selection not in ("best", "adaptive"):
        raise ValueError(f"unknown PST selection {selection!r}")
    if penalty not in ("static", "nft"):
        raise ValueError(f"unknown penalty {penalty!r}")
    start = time.monotonic()
    name = "tabu"
    if not reachable(inst):
        return Solution(name, None, None, False, time.monotonic() - start)
    key = _static if penalty == "static" else _nft_factory(nft)
    p = inst.publisher
    restarts: list[frozenset[int]] = []
    for build in (tm_tree, spt_tree):
        t = build(inst)
        if t is not None:
            restarts.append(frozenset(n for n in t.parent if n in inst.routers))
    allowance = max_trees if selection == "best" else min(5, max_trees)
    cache: dict[tuple[frozenset[int], int], tuple[PST, Evaluation] | None] = {}

    def select(rs: frozenset[int]) -> tuple[PST, Evaluation] | None:
        k = (rs, allowance)
        if k not in cache:
            cache[k] = _select_pst(inst, rs, allowance, key)
        return cache[k]

    best = _Best()
    current_set = restarts.pop(0)
    current = select(current_set)
    assert current is not None
    best.offer(*current)
    best_key = key(current[1], inst.budget)
    tabu: dict[int, int] = {}
    stall = 0
    evaluations = 0
    it = 0
    for it in range(max_iter):
        if time_limit is not None and time.monotonic() - start > time_limit:
            break
        _tree, ev = current
        worst = min(ev.individual, key=lambda n: (ev.individual[n], n))
        tau_w = inst.tau[worst]
        _, pred = most_trusted_paths(inst.adj, worst, tau_w.__getitem__)
        surrogate: list[int] = []
        node = pred.get(p) if worst != p else None
        while node is not None and node != worst:
            if node in inst.routers and node not in current_set:
                surrogate.append(node)
            node = pred.get(node)
        members = {p, *inst.subscribers, *current_set}
        near = {v for u in members for v in inst.adj[u] if v in inst.routers} - current_set
        ranked = sorted(near, key=lambda r: (-tau_w[r], r))[:k_insert]
        moves = [("ins", r) for r in dict.fromkeys([*surrogate, *ranked])]
        moves += [("rem", r) for r in sorted(current_set)]
        chosen: tuple[tuple[float, float], frozenset[int], tuple[PST, Evaluation], int] | None
        chosen = None
        for kind, r in moves:
            rs = current_set | {r} if kind == "ins" else current_set - {r}
            got = select(rs)
            evaluations += 1
            if got is None:
                continue
            k = key(got[1], inst.budget)
            if tabu.get(r, -1) >= it and not k > best_key:
                continue
            if chosen is None or k > chosen[0]:
                chosen = (k, rs, got, r)
        if chosen is None:
            break
        k, current_set, current, r = chosen
        tabu[r] = it + tenure
        best.offer(*current)
        if k > best_key:
            best_key = k
            stall = 0
        else:
            stall += 1
        if stall >= stall_limit:
            if selection == "adaptive" and allowance < max_trees:
                allowance = min(max_trees, allowance * 2)
            if not restarts:
                break
            current_set = restarts.pop(0)
            got = select(current_set)
            if got is None:
                break
            current = got
            best.offer(*current)
            stall = 0
    stats = {"iterations": it + 1, "candidates": evaluations, "selection": selection}
    return Solution(name, best.tree, best.ev, False, time.monotonic() - start, stats)


# -- the direct PST-to-PST tabu search ----------------------------------------------------


def _neighbours(
    inst: Instance, parent: dict[int, int], k_router: int, over_budget: bool = False
) -> Iterator[tuple[tuple[str, int], dict[int, int]]]:
    """Every PST one move away, tagged with the tabu attribute the move touches.

    Outside routers are ranked by trust; while the tree is over budget, by how many tree
    nodes they touch instead (a well-connected relay lets several subtrees share it).
    """
    p = inst.publisher
    tau_p = inst.tau[p]
    kids: dict[int, list[int]] = {}
    for c, q in parent.items():
        kids.setdefault(q, []).append(c)
    in_tree = set(parent) | {p}
    subtree: dict[int, set[int]] = {}

    def below(v: int) -> set[int]:
        got = subtree.get(v)
        if got is None:
            got = {v}
            for c in kids.get(v, ()):
                got |= below(c)
            subtree[v] = got
        return got

    def evaluators(v: int) -> list[int]:
        return [n for n in below(v) if n in inst.sub_bit]

    outside = [r for r in inst.routers if r not in in_tree]
    # 0. gather: hang an outside router w under u and move under w every child of u that
    #    touches w (one relay shared by several subtrees is what makes many trees cheap).
    for u in sorted(in_tree):
        children = kids.get(u, [])
        if len(children) < 2:
            continue
        hubs: list[tuple[int, float, int, list[int]]] = []
        for w in outside:
            if u in inst.adj[w]:
                moved = [c for c in children if c in inst.adj[w]]
                if len(moved) >= 2:
                    hubs.append((-len(moved), -tau_p[w], w, moved))
        hubs.sort()
        for _, _, w, moved in hubs[:k_router]:
            new = dict(parent)
            new[w] = u
            for c in moved:
                new[c] = w
            yield ("router", w), new
    for v in sorted(parent):
        sub = below(v)
        # 1. re-hang v's subtree under another tree node.
        for u in sorted(inst.adj[v] & in_tree):
            if u == parent[v] or u in sub:
                continue
            new = dict(parent)
            new[v] = u
            yield ("node", v), prune_router_leaves(inst, new)
        # 2. route v's subtree through an outside router w hung under a tree node u.
        evs = evaluators(v)
        cands = [w for w in outside if w in inst.adj[v]]
        if over_budget:
            cands.sort(key=lambda w: (-len(inst.adj[w] & in_tree), w))
        else:
            cands.sort(key=lambda w: (-min([tau_p[w], *(inst.tau[s][w] for s in evs)]), w))
        for w in cands[:k_router]:
            for u in sorted(inst.adj[w] & in_tree):
                if u in sub:
                    continue
                new = dict(parent)
                new[v] = w
                new[w] = u
                yield ("router", w), prune_router_leaves(inst, new)
        if v not in inst.routers:
            continue
        # 3. remove router v: its children move up (or to another tree node they touch).
        up = parent[v]
        new = dict(parent)
        del new[v]
        ok = True
        for c in kids.get(v, ()):
            if up in inst.adj[c]:
                new[c] = up
                continue
            options = sorted(inst.adj[c] & in_tree - sub)  # outside v's subtree: no cycle
            if not options:
                ok = False
                break
            new[c] = max(options, key=lambda u: (tau_p.get(u, 1.0) if u != p else 2.0, -u))
        if ok:
            yield ("router", v), prune_router_leaves(inst, new)
        # 4. swap router v for an outside router touching v's parent and children.
        need = {up, *kids.get(v, ())}
        swaps = [w for w in outside if need <= inst.adj[w]]
        swaps.sort(key=lambda w: (-min([tau_p[w], *(inst.tau[s][w] for s in evs)]), w))
        for w in swaps[:k_router]:
            new = dict(parent)
            del new[v]
            new[w] = up
            for c in kids.get(v, ()):
                new[c] = w
            yield ("router", w), new


def solve_tabu_direct(
    inst: Instance,
    *,
    max_iter: int = 60,
    stall_limit: int = 12,
    tenure: int = 6,
    k_router: int = 6,
    time_limit: float | None = 1.0,
    kicks: int = 40,
    kick_moves: int = 3,
    exact_share: float | None = 0.5,
    seed: int = 0,
) -> Solution:
    """Tabu search whose moves map a PST directly to a PST (see module docstring).

    Two additions escape the basins the plain search settled in (bench/RESULTS-mtpsto.md):

    * **Exact first.** The branch and bound (:func:`~reconfig.mtpsto.exact.solve_exact`) gets
      ``exact_share`` of the time limit (0.5 s without one); when it proves an optimum in that
      time, that tree is the answer (``stats["exact"]`` is True). Otherwise its incumbent, if
      any, joins the search's starts; when it proves that no tree fits the budget, the
      search still returns its best over-budget tree, as before. ``exact_share=None`` runs the
      heuristic alone.
    * **Kicks.** When every start has stalled, the search restarts from the best tree shaken by
      ``kick_moves`` random moves, up to ``kicks`` times or until the time limit (iterated
      local search): a basin that needs two worsening moves in a row, such as routing two
      subtrees through one new relay, is left this way.
    """
    start = time.monotonic()
    name = "tabu-direct"
    if not reachable(inst):
        return Solution(name, None, None, False, time.monotonic() - start)
    rng = random.Random(seed)
    best = _Best()
    starts: list[PST] = []
    exact_stats: dict[str, object] = {}
    if exact_share is not None:
        from reconfig.mtpsto.exact import solve_exact

        share = 0.5 if time_limit is None else exact_share * time_limit
        exact = solve_exact(inst, time_limit=share)
        exact_stats = {"exact": exact.proven_optimal, "exact_seconds": exact.seconds}
        if exact.proven_optimal and exact.tree is not None:
            stats = {"iterations": 0, "scored": 0, "timed_out": False, **exact_stats}
            return Solution(
                name, exact.tree, exact.evaluation, False, time.monotonic() - start, stats
            )
        if exact.tree is not None and exact.evaluation is not None:
            best.offer(exact.tree, exact.evaluation)
            starts.append(exact.tree)
    builds = (tm_tree, spt_tree, cheap_tree)
    starts.extend(t for t in (b(inst) for b in builds) if t is not None)
    for t in starts:
        best.offer(t, evaluate(inst, t))
    seen: dict[frozenset[tuple[int, int]], Evaluation] = {}
    tabu: dict[tuple[str, int], int] = {}
    iterations = 0
    scored = 0
    timed_out = False
    kicked = 0

    def out_of_time() -> bool:
        return time_limit is not None and time.monotonic() - start > time_limit

    def descend(first: PST) -> bool:
        """One tabu descent from ``first``; False when the time ran out."""
        nonlocal iterations, scored
        current = first
        cur_ev = evaluate(inst, current)
        best.offer(current, cur_ev)
        local_best = cur_ev
        stall = 0
        for _ in range(max_iter):
            if out_of_time():
                return False
            iterations += 1
            choice: tuple[Evaluation, PST, tuple[str, int]] | None = None
            over = not cur_ev.within_budget
            for attr, parent in _neighbours(inst, dict(current.parent), k_router, over):
                if not scored % 64 and out_of_time():
                    return False
                sig = frozenset(parent.items())
                ev = seen.get(sig)
                if ev is None:
                    ev = evaluate(inst, PST(inst.publisher, parent))
                    seen[sig] = ev
                    scored += 1
                if tabu.get(attr, -1) >= iterations and not better(ev, best.ev):
                    continue
                if choice is None or better(ev, choice[0]):
                    choice = (ev, PST(inst.publisher, parent), attr)
            if choice is None:
                break
            cur_ev, current, attr = choice
            tabu[attr] = iterations + tenure
            best.offer(current, cur_ev)
            if better(cur_ev, local_best):
                local_best = cur_ev
                stall = 0
            else:
                stall += 1
                if stall >= stall_limit:
                    break
        return True

    for first in starts:
        if not descend(first):
            timed_out = True
            break
    while not timed_out and kicked < kicks and best.tree is not None:
        kicked += 1
        parent = dict(best.tree.parent)
        for _ in range(kick_moves):
            moves = [new for _attr, new in _neighbours(inst, parent, k_router)]
            if not moves:
                break
            parent = rng.choice(moves)
        tabu.clear()
        if not descend(PST(inst.publisher, parent)):
            timed_out = True
    stats = {
        "iterations": iterations,
        "scored": scored,
        "timed_out": timed_out,
        "kicks": kicked,
        **exact_stats,
    }
    return Solution(name, best.tree, best.ev, False, time.monotonic() - start, stats)
