"""Exact MTPSTO: branch and bound over canonical path attachments, plus brute force.

The seed enumerated every Steiner tree (a modified Char spanning-tree enumeration) and needed
27 hours at 9 routers. This solver proves optima instead of listing trees:

**Canonical generation.** Subscribers are taken in a fixed order. The next unattached
subscriber s is joined to the current tree by a simple path s → v_1 → … → v_m → x through
nodes not yet in the tree (routers or later subscribers), ending at a tree node x. Every PST
is generated exactly once — in a finished tree T, the path of s to the tree built so far is
unique — and every router so placed has a child, so only valid PSTs come out.

**Bounds.** Trust values only fall as the tree grows: a path product gains factors ≤ 1, an
internal subscriber's minimum gains terms; unattached subscribers are bounded by their most
trusted path in the whole graph (computed once per evaluator). The analytical leximin OWA is
monotone in every value, so the OWA of these bounds bounds the social trust of every
completion. The overhead only grows too (terms grow with the subscriber sets below a node),
so a partial tree over budget is dropped.

**Dominance.** A path whose router-only stretch has a chord (a node of the path, or the tree
node it ends at, adjacent to an earlier path node with only routers between) is skipped: the
shortcut drops routers, which removes factors ≤ 1 from every path through them and removes
their overhead terms, so the shortcut tree is at least as good and is generated elsewhere.
In the seed's dense graphs (density ≈ 0.5) this leaves very few long paths.

Path products are computed in the same order as :func:`overlay.pst.individual_trust` (from the
evaluator outwards), so values at the leaves are bit-identical to the canonical evaluation;
partial bounds whose association differs are inflated by a relative 1e-12 so that rounding
can never prune an optimum. The result is exact for the objective as defined in IEEE doubles:
highest social trust, ties to lower overhead.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass

from overlay.pst import PST, Evaluation, Instance, better, check_pst, evaluate
from reconfig.mtpsto.common import Solution, reachable
from reconfig.mtpsto.heuristics import spt_tree, tm_tree
from security.trust import leximin_owa, most_trusted_paths

__all__ = ["enumerate_psts", "solve_bruteforce", "solve_exact"]

_INFLATE = 1.0 + 1e-12


@dataclass(slots=True)
class _State:
    parent: dict[int, int]
    below: dict[int, int]
    pre_p: dict[int, float]
    val: dict[int, float]
    pp: dict[int, float]
    attached: int
    over: float


class _TimeUp(Exception):
    pass


class _Search:
    def __init__(self, inst: Instance, deadline: float | None) -> None:
        self.inst = inst
        self.p = inst.publisher
        self.tau = inst.tau
        self.tau_p = inst.tau[inst.publisher]
        self.adj = inst.adj
        self.bit = inst.sub_bit
        self.delta = inst.delta
        self.limit = inst.budget * _INFLATE
        self.deadline = deadline
        self.nodes = 0
        best_from_p, _ = most_trusted_paths(inst.adj, self.p, self.tau_p.__getitem__)
        self.b_p: dict[int, float] = {}
        self.b_s: dict[int, float] = {}
        for s in inst.subscribers:
            from_s, _ = most_trusted_paths(inst.adj, s, inst.tau[s].__getitem__)
            self.b_s[s] = min(1.0, from_s.get(self.p, 0.0) * _INFLATE)
            self.b_p[s] = min(1.0, best_from_p.get(s, 0.0) * _INFLATE)
        # Cheapest way an unattached subscriber j can hang under a node that is not in the
        # tree: a fresh router costs (r+f)·Φ(s_j) at least, a fresh subscriber k term(k, {j}).
        self.fresh_cost: dict[int, float] = {}
        for j in inst.subscribers:
            costs = [inst.term(x, self.bit[j]) for x in inst.adj[j] if x != self.p]
            self.fresh_cost[j] = min(costs, default=float("inf"))
        # Hardest subscribers first: they fix the leximin minimum early and prune the rest.
        self.order = sorted(inst.subscribers, key=lambda s: (min(self.b_s[s], self.b_p[s]), s))
        self.inc: tuple[PST, Evaluation] | None = None

    # -- incumbent ---------------------------------------------------------------------

    def offer(self, tree: PST, ev: Evaluation) -> None:
        if ev.within_budget and (self.inc is None or better(ev, self.inc[1])):
            self.inc = (tree, ev)

    def dominated(self, ub: float, lb_over: float) -> bool:
        if self.inc is None:
            return False
        inc = self.inc[1]
        return ub < inc.trust or (ub == inc.trust and lb_over >= inc.overhead)

    def descendant_trust(self, y: int, path: list[int]) -> float:
        """Subscriber ``y``'s best trust in a subscriber on ``path`` that would end up below it
        (2.0, above any trust, when there is none): the product of its trust in the nodes
        between them and in that subscriber."""
        ty = self.tau[y]
        best = 2.0
        for j in range(len(path) - 1, -1, -1):
            d = path[j]
            if d in self.bit:
                w = 1.0
                for k in range(len(path) - 1, j, -1):
                    w *= ty[path[k]]
                w *= ty[d]
                best = min(best, w)
        return best

    def bound(self, st: _State, extra_val: dict[int, float], extra_pp: dict[int, float]) -> float:
        zp = []
        zs = []
        for s in self.inst.subscribers:
            if s in st.val:
                zp.append(st.pp[s])
                zs.append(st.val[s])
            elif s in extra_val:
                zp.append(extra_pp[s])
                zs.append(extra_val[s])
            else:
                zp.append(self.b_p[s])
                zs.append(self.b_s[s])
        zs.append(leximin_owa(zp, self.delta))
        return leximin_owa(zs, self.delta)

    def extra_overhead(self, st: _State) -> float:
        """A lower bound on the overhead still to come, from any one unattached subscriber.

        Subscriber j not adjacent to the publisher needs a parent x ≠ p, whose final term is
        at least its term with j added (terms grow with the subscriber set below a node):
        the exact increment for a tree node, ``fresh_cost`` for any other neighbour.
        """
        inst = self.inst
        worst = 0.0
        for j in inst.subscribers:
            bj = self.bit[j]
            if st.attached & bj or self.p in self.adj[j]:
                continue
            lb = self.fresh_cost[j]
            for x in self.adj[j]:
                if lb <= worst:
                    break
                m = st.below.get(x)
                if m is not None and x != self.p:
                    lb = min(lb, inst.term(x, m | bj) - inst.term(x, m))
            worst = max(worst, lb)
        return worst

    # -- state transitions -------------------------------------------------------------

    def attach(self, st: _State, path: list[int], x: int) -> _State:
        inst = self.inst
        p = self.p
        bit = self.bit
        parent = dict(st.parent)
        below = dict(st.below)
        pre_p = dict(st.pre_p)
        val = dict(st.val)
        pp = dict(st.pp)
        m = len(path) - 1
        for i in range(m):
            parent[path[i]] = path[i + 1]
        parent[path[m]] = x
        over = st.over
        mask = 0
        for v in path:
            below[v] = mask
            over += inst.term(v, mask)
            mask |= bit.get(v, 0)
        anc = [x]
        node = x
        while node != p:
            old = below[node]
            new = old | mask
            if new != old:
                over += inst.term(node, new) - inst.term(node, old)
                below[node] = new
            node = parent[node]
            anc.append(node)
        below[p] = below[p] | mask
        acc = pre_p[x]
        for v in reversed(path):
            acc = acc * self.tau_p[v]
            pre_p[v] = acc
        tail = anc[:-1]
        for i, v in enumerate(path):
            if v not in bit:
                continue
            pp[v] = pre_p[path[i + 1]] if i < m else pre_p[x]
            tv = self.tau[v]
            up = 1.0
            for k in path[i + 1 :]:
                up *= tv[k]
            for k in tail:
                up *= tv[k]
            for j in range(i):
                d = path[j]
                if d in bit:
                    w = 1.0
                    for k in range(i - 1, j, -1):
                        w *= tv[path[k]]
                    w *= tv[d]
                    up = min(up, w)
            val[v] = up
        for t, a in enumerate(tail):
            if a not in bit:
                continue
            ta = self.tau[a]
            head = 1.0
            for k in range(t - 1, -1, -1):
                head *= ta[tail[k]]
            for j, d in enumerate(path):
                if d not in bit:
                    continue
                w = head
                for k in range(m, j, -1):
                    w *= ta[path[k]]
                w *= ta[d]
                val[a] = min(val[a], w)
        return _State(parent, below, pre_p, val, pp, st.attached | mask, over)

    # -- search ------------------------------------------------------------------------

    def tick(self) -> None:
        self.nodes += 1
        if self.deadline is not None and not self.nodes & 255 and time.monotonic() > self.deadline:
            raise _TimeUp

    def solve(self, st: _State) -> None:
        self.tick()
        if st.attached == self.inst.all_mask:
            tree = PST(self.p, st.parent)
            self.offer(tree, evaluate(self.inst, tree))
            return
        s = next(s for s in self.order if not st.attached & self.bit[s])
        self.extend(st, [s], ups={s: 1.0}, pps={s: 1.0}, desc={s: 2.0}, pterms=0.0, t=0)

    def extend(
        self,
        st: _State,
        path: list[int],
        *,
        ups: dict[int, float],
        pps: dict[int, float],
        desc: dict[int, float],
        pterms: float,
        t: int,
    ) -> None:
        """Grow ``path`` (from its subscriber end) until it meets the tree.

        ``ups[v]``: canonical fold of v's trust over the path nodes above it so far;
        ``pps[v]``: the publisher's product over them (any order, inflated when used);
        ``desc[v]``: v's exact minimum over its descendants on the path (2.0 = none);
        ``t``: index of the last subscriber on the path (only routers after it).
        """
        inst = self.inst
        adj = self.adj
        last = path[-1]
        stretch = [adj[path[j]] for j in range(t, len(path) - 1)]
        completions: list[tuple[float, float, _State]] = []
        extensions: list[tuple[float, float, int]] = []
        on_path = set(path)
        pmask = 0
        masks: dict[int, int] = {}
        for v in path:
            masks[v] = pmask
            pmask |= self.bit.get(v, 0)
        # Overhead still owed by each other unattached subscriber j: its parent's term must
        # grow by at least base[j] (see extra_overhead), unless the new node y is cheaper.
        base: dict[int, float] = {}
        for j in inst.subscribers:
            bj = self.bit[j]
            if st.attached & bj or j in on_path or self.p in adj[j]:
                continue
            lb = self.fresh_cost[j]
            for x in adj[j]:
                m = st.below.get(x)
                if m is None:
                    m = masks.get(x)
                if m is not None and x != self.p:
                    lb = min(lb, inst.term(x, m | bj) - inst.term(x, m))
            base[j] = lb
        best_desc: dict[int, float] = {}
        for y in adj[last]:
            if y in on_path or any(y in a for a in stretch):
                continue
            if y == self.p or y in st.parent:
                nst = self.attach(st, path, y)
                if nst.over > self.limit:
                    continue
                lb_over = nst.over + self.extra_overhead(nst)
                if lb_over > self.limit:
                    continue
                ub = self.bound(nst, {}, {})
                if not self.dominated(ub, lb_over):
                    completions.append((ub, lb_over, nst))
                continue
            # y is a router or a not-yet-attached subscriber: extend the path through it.
            y_term = inst.term(y, pmask)
            owed = 0.0
            for j, lb_j in base.items():
                via_y = lb_j
                if j != y and y in adj[j]:
                    via_y = min(lb_j, inst.term(y, pmask | self.bit[j]) - y_term)
                owed = max(owed, via_y)
            lb = st.over + pterms + y_term + owed
            if lb > self.limit:
                continue
            ev: dict[int, float] = {}
            ep: dict[int, float] = {}
            for v, u in ups.items():
                ev[v] = min(u * self.tau[v][y], desc[v])
                ep[v] = min(1.0, pps[v] * self.tau_p[y] * _INFLATE)
            if y in self.bit:
                best_desc[y] = self.descendant_trust(y, path)
                ev[y] = min(self.b_s[y], best_desc[y])
                ep[y] = self.b_p[y]
            ub = self.bound(st, ev, ep)
            if not self.dominated(ub, lb):
                extensions.append((ub, lb, y))
        completions.sort(key=lambda c: (-c[0], c[1]))
        for ub, over, nst in completions:
            if not self.dominated(ub, over):
                self.solve(nst)
        extensions.sort(key=lambda e: (-e[0], e[1], e[2]))
        for ub, lb, y in extensions:
            if self.dominated(ub, lb):
                continue
            self.tick()
            nups: dict[int, float] = {}
            npps: dict[int, float] = {}
            ndesc = dict(desc)
            for v, u in ups.items():
                nups[v] = u * self.tau[v][y]
                npps[v] = pps[v] * self.tau_p[y]
            nt = t
            if y in self.bit:
                nups[y] = 1.0
                npps[y] = 1.0
                ndesc[y] = best_desc[y]
                nt = len(path)
            self.extend(
                st,
                [*path, y],
                ups=nups,
                pps=npps,
                desc=ndesc,
                pterms=pterms + inst.term(y, pmask),
                t=nt,
            )


def solve_exact(
    inst: Instance,
    *,
    time_limit: float | None = None,
    warm_start: tuple[PST, Evaluation] | None = None,
    warm: bool = True,
) -> Solution:
    """Prove the MTPSTO optimum by branch and bound.

    Args:
        inst: the compiled problem.
        time_limit: seconds; when it runs out the best tree found so far is returned with
            ``proven_optimal=False``.
        warm_start: a known PST to prune with from the start (optional; the result does
            not depend on it except through exact ties).
        warm: also seed the incumbent with the shortest-path and Takahashi–Matsuyama trees.

    Returns:
        The optimum, or a solution with ``tree=None`` when no PST fits the budget.
    """
    start = time.monotonic()
    if not reachable(inst):
        return Solution("exact", None, None, True, time.monotonic() - start, {"nodes": 0})
    deadline = None if time_limit is None else start + time_limit
    search = _Search(inst, deadline)
    if warm_start is not None and not check_pst(inst, warm_start[0]):
        search.offer(warm_start[0], evaluate(inst, warm_start[0]))
    if warm:
        # Cheap constructive trees give the bound something to prune against from the start.
        for build in (spt_tree, tm_tree):
            tree = build(inst)
            if tree is not None:
                search.offer(tree, evaluate(inst, tree))
    root = _State(
        parent={},
        below={inst.publisher: 0},
        pre_p={inst.publisher: 1.0},
        val={},
        pp={},
        attached=0,
        over=inst.publisher_term,
    )
    proven = True
    try:
        search.solve(root)
    except _TimeUp:
        proven = False
    tree, ev = search.inc if search.inc is not None else (None, None)
    return Solution("exact", tree, ev, proven, time.monotonic() - start, {"nodes": search.nodes})


# -- brute force (ground truth for tests) --------------------------------------------------


def enumerate_psts(inst: Instance) -> Iterator[PST]:
    """Every PST, by listing router subsets and every parent assignment over each.

    Independent of the branch and bound on purpose (no shared pruning or path logic): for
    each router subset U, every node of S ∪ U picks a parent among its neighbours in
    {p} ∪ S ∪ U, and assignments that are cyclic or leave a router of U childless are
    dropped. Each PST is listed exactly once (its node set fixes U). Exponential — tiny
    problems only, as ground truth in tests.
    """
    p = inst.publisher
    routers = sorted(inst.routers)
    for k in range(len(routers) + 1):
        for subset in itertools.combinations(routers, k):
            members = [*inst.subscribers, *subset]
            present = {p, *members}
            choices = [sorted(inst.adj[v] & present) for v in members]
            if any(not c for c in choices):
                continue
            for pick in itertools.product(*choices):
                parent = dict(zip(members, pick, strict=True))
                if not set(subset) <= set(pick):
                    continue  # some router has no child
                if _acyclic(parent, p):
                    yield PST(p, parent)


def _acyclic(parent: dict[int, int], root: int) -> bool:
    ok = {root}
    for v in parent:
        trail = []
        node = v
        while node not in ok:
            if node in trail:
                return False
            trail.append(node)
            node = parent[node]
        ok.update(trail)
    return True


def solve_bruteforce(inst: Instance) -> Solution:
    """The optimum by exhaustive enumeration (tiny problems only)."""
    start = time.monotonic()
    best: tuple[PST, Evaluation] | None = None
    count = 0
    for tree in enumerate_psts(inst):
        count += 1
        ev = evaluate(inst, tree)
        if ev.within_budget and (best is None or better(ev, best[1])):
            best = (tree, ev)
    best_tree, best_ev = best if best is not None else (None, None)
    return Solution(
        "bruteforce", best_tree, best_ev, True, time.monotonic() - start, {"trees": count}
    )
