"""The OCBR routing cost (SPEC §5), a master's local view of it, and a fast swap evaluator.

The cost of an overlay tree ST for traffic classes T with demands d(t) is::

    cost(ST) = Σ_t d(t) · ( α · Σ_{l ∈ E(ST_t)} C_l(l) + β · Σ_{b ∈ V(ST_t) ∩ B} C_b(b) )

where ST_t is the minimal subtree spanning t's clients. ST_t includes the clients' access links
(client–broker), exactly as the formula reads; they cost the same in every tree over the same
attachments, so they never change a comparison between trees, only the absolute figure.

Link costs. A :class:`CostModel` gives a cost to *every* pair of nodes, linked or not: an entry in
``link_costs`` or ``default_link_cost``. That is what lets a master price links that do not exist
yet (SPEC: "any pair may be linked in an IP overlay"): the local cost of a neighbour–neighbour link
n1–n2 is the model's cost of the pair (n1, n2), i.e. exactly what the global link n1–n2 costs once
the plan is applied. Local and global costs therefore use one function, which is what makes the
local improvement equal the global one.

Three levels of speed, same numbers:

* :func:`routing_cost` is the formula read literally (minimal subtree per class); it is the
  reference the tests trust.
* :func:`local_view` / :func:`local_cost` give the master's reduced problem over
  {master} ∪ neighbours.
* :class:`SwapEvaluator` prices every elementary move "add link a–b, remove a link of the cycle it
  closes" in time linear in the cycle plus the classes touching it, which is what the tabu
  searches (local and centralised) run in their inner loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from overlay.tree import Link, TopologyChange, TopologyError, Tree, link, rooted_path

__all__ = [
    "CostModel",
    "Demands",
    "LocalView",
    "SwapEvaluator",
    "class_cost",
    "local_cost",
    "local_view",
    "routing_cost",
]

Demands = Mapping[frozenset[str], float]
"""Traffic classes (sets of client ids, or broker ids in a local view) → demand d(t)."""


@dataclass(frozen=True)
class CostModel:
    """Weights and unit costs of the OCBR routing cost.

    Attributes:
        alpha: weight α of link (network) cost.
        beta: weight β of broker (processing) cost.
        link_costs: C_l for specific pairs, keyed by either orientation; normalised on creation.
            Covers access links (client–broker) and links that do not exist yet.
        broker_costs: C_b for specific brokers.
        default_link_cost: C_l of every pair without an entry.
        default_broker_cost: C_b of every broker without an entry.
    """

    alpha: float = 1.0
    beta: float = 1.0
    link_costs: Mapping[Link, float] = field(default_factory=dict)
    broker_costs: Mapping[str, float] = field(default_factory=dict)
    default_link_cost: float = 1.0
    default_broker_cost: float = 1.0

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "default_link_cost", "default_broker_cost"):
            _check_cost(getattr(self, name), name)
        links: dict[Link, float] = {}
        for (a, b), c in self.link_costs.items():
            links[link(a, b)] = _check_cost(c, f"link_costs[{a!r}, {b!r}]")
        for b, c in self.broker_costs.items():
            _check_cost(c, f"broker_costs[{b!r}]")
        object.__setattr__(self, "link_costs", MappingProxyType(links))
        object.__setattr__(self, "broker_costs", MappingProxyType(dict(self.broker_costs)))

    def link_cost(self, a: str, b: str) -> float:
        """C_l of the pair a–b, whether or not it is a link today."""
        return self.link_costs.get(link(a, b), self.default_link_cost)

    def broker_cost(self, broker: str) -> float:
        """C_b of ``broker``."""
        return self.broker_costs.get(broker, self.default_broker_cost)


def class_cost(tree: Tree, members: Iterable[str], model: CostModel) -> float:
    """α·Σ C_l + β·Σ C_b over the minimal subtree spanning ``members``: one message's cost."""
    nodes, links = tree.minimal_subtree(members)
    link_part = sum(model.link_cost(a, b) for a, b in links)
    broker_part = sum(model.broker_cost(x) for x in nodes if x in tree.brokers)
    return model.alpha * link_part + model.beta * broker_part


def routing_cost(tree: Tree, demands: Demands, model: CostModel) -> float:
    """SPEC §5 cost of ``tree`` for ``demands``, computed literally from minimal subtrees.

    Members of a class may be clients or brokers (a broker member stands for traffic that enters
    the tree there, as neighbours do in a local view).

    Raises:
        TopologyError: a class names a node that is not in ``tree``.
    """
    return sum(d * class_cost(tree, members, model) for members, d in demands.items() if d)


# -- the master's local view -----------------------------------------------------------------


@dataclass(frozen=True)
class LocalView:
    """A master's reduced demand over its neighbourhood (SPEC §5).

    Attributes:
        master: the broker that plans.
        neighbours: its adjacent brokers, sorted.
        local_clients: the clients attached to the master, sorted.
        classes: local classes → summed demand. A local class holds local client ids and
            neighbour ids; a neighbour stands for every client in its subtree.
    """

    master: str
    neighbours: tuple[str, ...]
    local_clients: tuple[str, ...]
    classes: Mapping[frozenset[str], float]

    @property
    def nodes(self) -> tuple[str, ...]:
        """The brokers of the local problem: the master first, then its neighbours."""
        return (self.master, *self.neighbours)

    def star(self) -> frozenset[Link]:
        """The current local tree: master linked to every neighbour."""
        return frozenset(link(self.master, n) for n in self.neighbours)

    def tree(self, links: Iterable[tuple[str, str]]) -> Tree:
        """The local problem as a small overlay: local clients hang off the master.

        Raises:
            TopologyError: ``links`` is not a spanning tree over :attr:`nodes`.
        """
        return Tree(self.nodes, links, dict.fromkeys(self.local_clients, self.master))

    def change(self, links: Iterable[tuple[str, str]]) -> TopologyChange:
        """The global topology change that replaces the star by the local tree ``links``.

        Only links inside the neighbourhood change: every other link, and every client
        attachment, stays as it is.
        """
        new = {link(*lk) for lk in links}
        star = self.star()
        return TopologyChange(remove=tuple(star - new), add=tuple(new - star))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (classes as sorted member lists with their demand)."""
        return {
            "master": self.master,
            "neighbours": list(self.neighbours),
            "local_clients": list(self.local_clients),
            "classes": [
                {"members": sorted(members), "demand": d}
                for members, d in sorted(self.classes.items(), key=lambda kv: sorted(kv[0]))
            ],
        }


def local_view(tree: Tree, master: str, demands: Demands) -> LocalView:
    """Build ``master``'s local view of the global ``demands`` (SPEC §5).

    Rules, in order: every member not attached to the master is replaced by the neighbour whose
    subtree holds it; a class that then names a single neighbour (all its members in one
    neighbour's subtree) is ignored, because no change inside the neighbourhood can touch its
    minimal subtree; classes that have become equal are merged, demands summed.

    Raises:
        TopologyError: ``master`` is not a broker, or a class names an unknown node.
    """
    regions = tree.neighbour_subtrees(master)
    region_of = {node: n for n, members in regions.items() for node in members}
    local = tree.clients_of(master)
    classes: dict[frozenset[str], float] = {}
    for members, d in demands.items():
        ends: set[str] = set()
        for m in members:
            if m in local or m == master:
                ends.add(m)
            else:
                try:
                    ends.add(region_of[m])
                except KeyError:
                    raise TopologyError(f"unknown node {m!r}", "unknown_node", (m,)) from None
        if not ends or (len(ends) == 1 and next(iter(ends)) in regions):
            continue
        key = frozenset(ends)
        classes[key] = classes.get(key, 0.0) + d
    return LocalView(
        master=master,
        neighbours=tuple(sorted(regions)),
        local_clients=tuple(sorted(local)),
        classes=MappingProxyType(classes),
    )


def local_cost(view: LocalView, links: Iterable[tuple[str, str]], model: CostModel) -> float:
    """The local cost of a spanning tree over {master} ∪ neighbours (local clients at master).

    For any two local trees, the difference of their local costs equals the difference of the
    global costs of the overlays they produce (:meth:`LocalView.change`): the cost is additive
    over a class's minimal subtree, and the parts outside the neighbourhood do not move.
    """
    return routing_cost(view.tree(links), view.classes, model)


# -- fast incremental evaluation -------------------------------------------------------------


class SwapEvaluator:
    """A mutable spanning tree with its cost, pricing swap moves without recomputing it.

    A swap adds a link a–b (closing the cycle formed with the tree path a…b) and removes one
    link of that cycle. Only links and nodes *on the cycle* change their role: everything that
    hangs off a cycle node stays on the same side of every other link. So with the cycle as a
    ring of hanging parts H_0…H_L, a class touching the ring positions P (|P| ≥ 2) uses every
    ring link and ring node except those inside the gap between consecutive positions of P that
    contains the removed link. Summing each class's saving over the gaps (difference array)
    prices every possible removal at once in O(L + Σ_t |P_t|).

    Args:
        nodes: the brokers.
        links: the current spanning tree.
        classes: pairs (terminal brokers, demand); a class's cost depends only on the brokers
            its members sit at.
        model: unit costs and weights.
        constant: cost that no swap can change (e.g. access links), added to :attr:`cost`.
    """

    def __init__(
        self,
        nodes: Iterable[str],
        links: Iterable[tuple[str, str]],
        classes: Iterable[tuple[Iterable[str], float]],
        model: CostModel,
        constant: float = 0.0,
    ) -> None:
        self.names: list[str] = sorted(set(nodes))
        self.index: dict[str, int] = {x: i for i, x in enumerate(self.names)}
        n = len(self.names)
        self._model = model
        self._alpha = model.alpha
        self._beta = model.beta
        self._nc = [model.broker_cost(x) for x in self.names]
        self._lc: dict[tuple[int, int], float] = {}
        merged: dict[frozenset[int], float] = {}
        for terms, d in classes:
            if not d:
                continue
            key = frozenset(self.index[t] for t in terms)
            if len(key) == 1:
                # A class at one broker costs β·C_b there in every tree.
                constant += d * self._beta * self._nc[next(iter(key))]
            elif key:
                merged[key] = merged.get(key, 0.0) + d
        self._dem: list[float] = []
        self._cls = [0] * n
        for t, (key, d) in enumerate(sorted(merged.items(), key=lambda kv: sorted(kv[0]))):
            self._dem.append(d)
            bit = 1 << t
            for x in key:
                self._cls[x] |= bit
        self._adj: list[set[int]] = [set() for _ in range(n)]
        for a, b in links:
            i, j = self.index[a], self.index[b]
            self._adj[i].add(j)
            self._adj[j].add(i)
        if n and sum(len(s) for s in self._adj) != 2 * (n - 1):
            raise TopologyError("links do not form a spanning tree", "malformed")
        self._constant = constant
        self._rebuild()
        self.cost: float = constant + self._variable_cost()

    @classmethod
    def from_tree(cls, tree: Tree, demands: Demands, model: CostModel) -> SwapEvaluator:
        """An evaluator whose :attr:`cost` equals ``routing_cost(tree, demands, model)``."""
        constant = 0.0
        classes: list[tuple[set[str], float]] = []
        for members, d in demands.items():
            if not d:
                continue
            terms: set[str] = set()
            for m in members:
                b = tree.broker_of(m)
                if b != m:
                    constant += d * model.alpha * model.link_cost(m, b)
                terms.add(b)
            classes.append((terms, d))
        return cls(tree.brokers, tree.links, classes, model, constant)

    @classmethod
    def from_view(
        cls, view: LocalView, model: CostModel, links: Iterable[tuple[str, str]] | None = None
    ) -> SwapEvaluator:
        """An evaluator over a local view, starting from ``links`` (default: the star)."""
        return cls.from_tree(
            view.tree(view.star() if links is None else links), view.classes, model
        )

    # -- queries ----------------------------------------------------------------------------

    def links(self) -> frozenset[Link]:
        """The current tree's links, as ids."""
        names = self.names
        return frozenset(
            link(names[i], names[j]) for i, nbrs in enumerate(self._adj) for j in nbrs if i < j
        )

    @property
    def class_count(self) -> int:
        """Classes whose cost depends on the tree (two or more terminal brokers, after merging)."""
        return len(self._dem)

    def has_link(self, i: int, j: int) -> bool:
        """Whether nodes ``i`` and ``j`` (indices into :attr:`names`) are linked."""
        return j in self._adj[i]

    def full_cost(self) -> float:
        """Recompute the cost from scratch (for checks; :attr:`cost` is kept up to date)."""
        return self._constant + self._variable_cost()

    def cycle(self, a: int, b: int) -> list[int]:
        """The tree path from ``a`` to ``b`` (indices), i.e. the cycle link a–b would close."""
        return rooted_path(self._parent, self._depth, a, b)

    def removal_deltas(self, a: int, b: int) -> tuple[list[int], list[float]]:
        """Price adding link a–b against removing each link of the cycle it closes.

        Returns:
            ``(path, deltas)``: the tree path a…b, and for each ``j`` the change of cost when
            link ``path[j]``–``path[j + 1]`` is removed and a–b added.
        """
        ring = self.cycle(a, b)
        m = len(ring)
        last = m - 1
        parent, children, sub, up, cls = (
            self._parent,
            self._children,
            self._sub,
            self._up,
            self._cls,
        )
        hs: list[int] = []
        seen = 0
        multi = 0
        for i, c in enumerate(ring):
            prev = ring[i - 1] if i else -1
            nxt = ring[i + 1] if i < last else -1
            h = cls[c]
            for ch in children[c]:
                if ch not in (prev, nxt):
                    h |= sub[ch]
            p = parent[c]
            if p >= 0 and p not in (prev, nxt):
                h |= up[c]
            hs.append(h)
            multi |= seen & h
            seen |= h
        # A class touching one hanging part only costs the same whatever link is cut; only
        # classes in `multi` are walked (the part above the cycle's top often touches them all).
        positions: dict[int, list[int]] = {}
        for i, part in enumerate(hs):
            h = part & multi
            while h:
                low = h & -h
                t = low.bit_length() - 1
                h ^= low
                lst = positions.get(t)
                if lst is None:
                    positions[t] = [i]
                else:
                    lst.append(i)
        # Ring link k joins ring[k] and ring[k + 1]; ring link `last` is the new link b–a.
        ec = [self._link_cost(ring[k], ring[k + 1]) for k in range(last)]
        ec.append(self._link_cost(b, a))
        nc = [self._nc[c] for c in ring]
        e2 = [0.0] * (2 * m + 1)
        n2 = [0.0] * (2 * m + 1)
        for k in range(2 * m):
            e2[k + 1] = e2[k] + ec[k % m]
            n2[k + 1] = n2[k] + nc[k % m]
        alpha, beta, dem = self._alpha, self._beta, self._dem
        diff = [0.0] * (m + 1)
        for t, ps in positions.items():
            d = dem[t]
            p = ps[-1]
            for pos in ps:
                q = pos + m if pos <= p else pos
                # Cutting any ring link in the gap p…q saves its links and interior nodes.
                v = d * (alpha * (e2[q] - e2[p]) + beta * (n2[q] - n2[p + 1]))
                diff[p] += v
                if q <= m:
                    diff[q] -= v
                else:
                    diff[m] -= v
                    diff[0] += v
                    diff[q - m] -= v
                p = q if q < m else q - m
        saving = [0.0] * m
        run = 0.0
        for k in range(m):
            run += diff[k]
            saving[k] = run
        current = saving[last]
        return ring, [current - saving[k] for k in range(last)]

    # -- changes ----------------------------------------------------------------------------

    def swap(self, add: tuple[int, int], remove: tuple[int, int], delta: float) -> None:
        """Apply a move priced by :meth:`removal_deltas` (indices), updating :attr:`cost`."""
        a, b = add
        x, y = remove
        self._adj[x].discard(y)
        self._adj[y].discard(x)
        self._adj[a].add(b)
        self._adj[b].add(a)
        self._rebuild()
        self.cost += delta

    def reset(self, links: Iterable[tuple[str, str]]) -> None:
        """Replace the tree by ``links`` (ids) and recompute the cost from scratch."""
        n = len(self.names)
        self._adj = [set() for _ in range(n)]
        for a, b in links:
            i, j = self.index[a], self.index[b]
            self._adj[i].add(j)
            self._adj[j].add(i)
        self._rebuild()
        self.cost = self.full_cost()

    # -- internals --------------------------------------------------------------------------

    def _link_cost(self, i: int, j: int) -> float:
        key = (i, j) if i < j else (j, i)
        c = self._lc.get(key)
        if c is None:
            c = self._model.link_cost(self.names[i], self.names[j])
            self._lc[key] = c
        return c

    def _rebuild(self) -> None:
        """Root the tree at node 0; per node, which classes touch its subtree and the rest."""
        n = len(self.names)
        parent = [-1] * n
        depth = [0] * n
        children: list[list[int]] = [[] for _ in range(n)]
        order: list[int] = []
        if n:
            seen = [False] * n
            seen[0] = True
            order.append(0)
            k = 0
            while k < len(order):
                x = order[k]
                k += 1
                for y in self._adj[x]:
                    if not seen[y]:
                        seen[y] = True
                        parent[y] = x
                        depth[y] = depth[x] + 1
                        children[x].append(y)
                        order.append(y)
            if len(order) != n:
                raise TopologyError("links do not form a spanning tree", "disconnected")
        cls = self._cls
        sub = list(cls)
        for x in reversed(order):
            p = parent[x]
            if p >= 0:
                sub[p] |= sub[x]
        up = [0] * n
        for x in order:
            chs = children[x]
            if not chs:
                continue
            base = up[x] | cls[x]
            suffix = [0] * (len(chs) + 1)
            for i in range(len(chs) - 1, -1, -1):
                suffix[i] = suffix[i + 1] | sub[chs[i]]
            acc = base
            for i, ch in enumerate(chs):
                up[ch] = acc | suffix[i + 1]
                acc |= sub[ch]
        self._parent, self._depth, self._children = parent, depth, children
        self._order, self._sub, self._up = order, sub, up

    def _weight(self, mask: int) -> float:
        dem = self._dem
        total = 0.0
        while mask:
            low = mask & -mask
            total += dem[low.bit_length() - 1]
            mask ^= low
        return total

    def _variable_cost(self) -> float:
        alpha, beta = self._alpha, self._beta
        parent, children, sub, up, cls = (
            self._parent,
            self._children,
            self._sub,
            self._up,
            self._cls,
        )
        total = 0.0
        for x in self._order:
            p = parent[x]
            if p >= 0:
                total += alpha * self._link_cost(x, p) * self._weight(sub[x] & up[x])
            seen = 0
            multi = 0
            sides = [sub[ch] for ch in children[x]]
            if p >= 0:
                sides.append(up[x])
            for s in sides:
                multi |= seen & s
                seen |= s
            total += beta * self._nc[x] * self._weight(cls[x] | multi)
        return total


def _check_cost(value: float, name: str) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)
