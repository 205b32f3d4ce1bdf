"""The overlay topology as plain, immutable data.

Brokers are string ids joined by undirected links into one tree (the acyclic overlay); every
client is attached to exactly one broker. A :class:`Tree` is validated when it is built and never
changes afterwards: a topology change (:class:`TopologyChange`) yields a new tree, so the cost
model, the reconfiguration planners and the live broker can share one value without copying or
locking it.

Clients are nodes too (leaves hanging off their broker by an *access link*), because the routing
cost of the OCBR model (SPEC §5) is defined on the minimal subtree spanning a traffic class's
clients. Client ids and broker ids therefore share one namespace and must not clash.

This module depends on nothing but the standard library: ``overlay`` is imported by ``broker`` and
``reconfig``, never the other way round.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from security.errors import InvalidRequest

__all__ = [
    "Link",
    "TopologyChange",
    "TopologyError",
    "Tree",
    "broker_names",
    "line_tree",
    "link",
    "random_tree",
    "star_tree",
]

Link = tuple[str, str]
"""An undirected link in canonical form: the two end ids in sorted order (see :func:`link`)."""


class TopologyError(InvalidRequest):
    """A topology (or a change to one) is not a valid overlay tree.

    An :class:`~security.errors.InvalidRequest` (and so a ``ValueError``): fix the topology.

    Attributes:
        reason: a stable code: ``malformed``, ``unknown_node``, ``self_loop``, ``duplicate_link``,
            ``cycle``, ``disconnected``, ``id_clash``, ``unknown_link``, ``not_a_leaf``.
        nodes: the ids involved (for a cycle, the cycle's nodes in order).
    """

    def __init__(self, message: str, reason: str, nodes: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.nodes = tuple(nodes)


def link(a: str, b: str) -> Link:
    """Return the canonical form of the undirected link a–b.

    Links are compared, hashed and used as dict keys (link costs, tabu lists) by value, so both
    orientations must map to one tuple.

    Raises:
        TopologyError: ``a == b`` (a self-loop is never a valid overlay link).
    """
    if a == b:
        raise TopologyError(f"self-loop on {a!r}", "self_loop", (a,))
    return (a, b) if a < b else (b, a)


@dataclass(frozen=True)
class TopologyChange:
    """A set of links to remove and links to add, applied together (see :meth:`Tree.apply`).

    Kept as data so a planner can compute it, log it, send it to brokers, and a broker can check
    it against its own view before acting. :meth:`Tree.decompose` turns it into single swaps for
    a make-before-break protocol that only ever moves one link at a time.
    """

    remove: tuple[Link, ...] = ()
    add: tuple[Link, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "remove", tuple(sorted({link(*lk) for lk in self.remove})))
        object.__setattr__(self, "add", tuple(sorted({link(*lk) for lk in self.add})))

    def __bool__(self) -> bool:
        return bool(self.remove or self.add)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able form: ``{"remove": [[a, b], ...], "add": [[a, b], ...]}``."""
        return {"remove": [list(lk) for lk in self.remove], "add": [list(lk) for lk in self.add]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TopologyChange:
        """Parse the form written by :meth:`to_dict`.

        Raises:
            TopologyError: the data is not two lists of id pairs.
        """
        return cls(
            remove=tuple(_parse_links(data.get("remove", ()), "remove")),
            add=tuple(_parse_links(data.get("add", ()), "add")),
        )


class Tree:
    """A validated overlay: brokers, the links of a spanning tree over them, client attachments.

    Immutable and hashable. Queries that need a rooted view (paths, minimal subtrees) build it
    once, lazily, and reuse it.

    Args:
        brokers: the broker ids (non-empty strings).
        links: pairs of broker ids, in either orientation; they must form a spanning tree.
        clients: client id → the broker it is attached to.

    Raises:
        TopologyError: the input is not a tree (``reason`` says why; ``nodes`` says where).
    """

    def __init__(
        self,
        brokers: Iterable[str],
        links: Iterable[tuple[str, str]] = (),
        clients: Mapping[str, str] | None = None,
    ) -> None:
        broker_set = frozenset(brokers)
        for b in broker_set:
            _check_id(b, "broker")
        adj: dict[str, set[str]] = {b: set() for b in broker_set}
        canonical: set[Link] = set()
        parent = {b: b for b in broker_set}  # union-find: detect the first cycle as it closes

        def find(x: str) -> str:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for raw in links:
            if not isinstance(raw, (tuple, list)) or len(raw) != 2:
                raise TopologyError(f"a link must be a pair of ids, got {raw!r}", "malformed")
            a, b = raw
            for end in (a, b):
                if end not in broker_set:
                    raise TopologyError(
                        f"link {a!r}–{b!r} names unknown broker {end!r}", "unknown_node", (end,)
                    )
            lk = link(a, b)
            if lk in canonical:
                raise TopologyError(f"link {a!r}–{b!r} given twice", "duplicate_link", lk)
            ra, rb = find(a), find(b)
            if ra == rb:
                cycle = _bfs_path(adj, a, b)
                raise TopologyError(
                    f"link {a!r}–{b!r} closes the cycle {' – '.join(cycle)}", "cycle", cycle
                )
            parent[ra] = rb
            canonical.add(lk)
            adj[a].add(b)
            adj[b].add(a)
        if broker_set:
            roots = {find(b) for b in broker_set}
            if len(roots) > 1:
                start = min(broker_set)
                reached = _reach(adj, start)
                missing = sorted(broker_set - reached)
                raise TopologyError(
                    f"overlay is disconnected: {len(roots)} components; "
                    f"{len(missing)} broker(s) unreachable from {start!r}",
                    "disconnected",
                    missing,
                )

        attached: dict[str, set[str]] = {b: set() for b in broker_set}
        client_map: dict[str, str] = {}
        for c, b in (clients or {}).items():
            _check_id(c, "client")
            if c in broker_set:
                raise TopologyError(f"client id {c!r} is also a broker id", "id_clash", (c,))
            if b not in broker_set:
                raise TopologyError(
                    f"client {c!r} is attached to unknown broker {b!r}", "unknown_node", (c, b)
                )
            client_map[c] = b
            attached[b].add(c)

        self._brokers = broker_set
        self._links = frozenset(canonical)
        self._clients: Mapping[str, str] = MappingProxyType(client_map)
        self._adj = {b: frozenset(n) for b, n in adj.items()}
        self._attached = {b: frozenset(cs) for b, cs in attached.items()}

    # -- plain data -------------------------------------------------------------------------

    @property
    def brokers(self) -> frozenset[str]:
        """All broker ids."""
        return self._brokers

    @property
    def links(self) -> frozenset[Link]:
        """All broker–broker links, canonical form (access links of clients are not included)."""
        return self._links

    @property
    def clients(self) -> Mapping[str, str]:
        """Client id → broker id (read-only)."""
        return self._clients

    def neighbours(self, broker: str) -> frozenset[str]:
        """The brokers linked to ``broker``."""
        return self._adj[self._need_broker(broker)]

    def clients_of(self, broker: str) -> frozenset[str]:
        """The clients attached to ``broker``."""
        return self._attached[self._need_broker(broker)]

    def broker_of(self, node: str) -> str:
        """The broker a node sits at: a broker's own id, or the broker a client is attached to.

        Raises:
            TopologyError: ``node`` is neither a broker nor a client of this tree.
        """
        if node in self._brokers:
            return node
        try:
            return self._clients[node]
        except KeyError:
            raise TopologyError(f"unknown node {node!r}", "unknown_node", (node,)) from None

    def __contains__(self, node: object) -> bool:
        return node in self._brokers or node in self._clients

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tree):
            return NotImplemented
        return (
            self._brokers == other._brokers
            and self._links == other._links
            and self._clients == other._clients
        )

    def __hash__(self) -> int:
        return hash((self._brokers, self._links, frozenset(self._clients.items())))

    def __repr__(self) -> str:
        return (
            f"Tree(brokers={len(self._brokers)}, links={len(self._links)}, "
            f"clients={len(self._clients)})"
        )

    # -- queries ----------------------------------------------------------------------------

    def would_create_cycle(self, a: str, b: str) -> bool:
        """Whether adding the link a–b to this tree would close a cycle.

        Any two distinct members of a connected tree are already joined by a path, so this is
        True for them (and for ``a == b``, a self-loop); it is False only when at least one end
        is new to the tree, i.e. the link attaches a joining broker. A planner that wants to add
        a link must therefore also remove one on :meth:`path` ``(a, b)`` — see
        :meth:`can_swap`.
        """
        if a == b:
            return True
        return a in self._brokers and b in self._brokers

    def can_swap(self, remove: tuple[str, str], add: tuple[str, str]) -> bool:
        """Whether removing link ``remove`` and adding link ``add`` leaves a spanning tree."""
        rem = link(*remove)
        new = link(*add)
        if rem not in self._links or new in self._links:
            return False
        if not (new[0] in self._brokers and new[1] in self._brokers):
            return False
        path = self.path(*new)
        return any(link(x, y) == rem for x, y in pairwise(path))

    def path(self, a: str, b: str) -> list[str]:
        """The nodes on the unique path from ``a`` to ``b``, both included.

        ``a`` and ``b`` may be brokers or clients; a client appears only at an end of the path.

        Raises:
            TopologyError: an end is not in the tree.
        """
        ba, bb = self.broker_of(a), self.broker_of(b)
        if a == b:
            return [a]
        middle = self._broker_path(ba, bb)
        if a != ba:
            middle.insert(0, a)
        if b != bb:
            middle.append(b)
        return middle

    def minimal_subtree(self, nodes: Iterable[str]) -> tuple[frozenset[str], frozenset[Link]]:
        """The minimal subtree spanning ``nodes`` (brokers and/or clients): its nodes and links.

        Clients in ``nodes`` bring their access link; brokers on the way are included, other
        clients are not. This is ST_t of SPEC §5 for a traffic class t.

        Raises:
            TopologyError: a node is not in the tree.
        """
        terms = list(dict.fromkeys(nodes))
        if not terms:
            return frozenset(), frozenset()
        out_nodes: set[str] = set(terms)
        out_links: set[Link] = set()
        term_brokers = []
        for t in terms:
            b = self.broker_of(t)
            if b != t:
                out_links.add(link(t, b))
            term_brokers.append(b)
        parent, depth = self._rooted
        # Grow the subtree one terminal at a time: climb from the terminal until it meets the
        # subtree, or, if it passes above the subtree's top, until it meets the path up from
        # that top. Each node is visited once, so the whole union costs O(|subtree| + depth).
        top = term_brokers[0]
        marked = {top}
        for b in term_brokers[1:]:
            x = b
            while x not in marked and depth[x] > depth[top]:
                nxt = parent[x]
                marked.add(x)
                out_links.add(link(x, nxt))
                x = nxt
            if x in marked:
                continue
            y = top
            while x != y:
                if depth[x] >= depth[y]:
                    marked.add(x)
                    out_links.add(link(x, parent[x]))
                    x = parent[x]
                else:
                    marked.add(y)
                    out_links.add(link(y, parent[y]))
                    y = parent[y]
            marked.add(x)
            top = x
        out_nodes |= marked
        return frozenset(out_nodes), frozenset(out_links)

    def neighbour_subtrees(self, broker: str) -> dict[str, frozenset[str]]:
        """For each neighbour n of ``broker``: the brokers and clients reachable through n.

        These are the regions a master's local view maps remote clients to (SPEC §5). The
        clients attached to ``broker`` itself are in none of them.
        """
        self._need_broker(broker)
        out: dict[str, frozenset[str]] = {}
        for n in sorted(self._adj[broker]):
            seen = {broker, n}
            queue = deque([n])
            members: list[str] = [n]
            while queue:
                x = queue.popleft()
                members.extend(self._attached[x])
                for y in self._adj[x]:
                    if y not in seen:
                        seen.add(y)
                        members.append(y)
                        queue.append(y)
            out[n] = frozenset(members)
        return out

    def sides(self, lk: tuple[str, str]) -> tuple[frozenset[str], frozenset[str]]:
        """The two parts (brokers and clients) the tree falls into without link ``lk``.

        The first part holds ``lk[0]``, the second ``lk[1]``.

        Raises:
            TopologyError: ``lk`` is not a link of this tree.
        """
        a, b = lk
        if link(a, b) not in self._links:
            raise TopologyError(f"no link {a!r}–{b!r}", "unknown_link", (a, b))
        parts = self.neighbour_subtrees(a)
        side_b = parts[b]
        side_a = frozenset(self._brokers | self._clients.keys()) - side_b
        return side_a, side_b

    # -- changes ----------------------------------------------------------------------------

    def apply(self, change: TopologyChange) -> Tree:
        """Return the tree with ``change.remove`` taken out and ``change.add`` put in.

        Raises:
            TopologyError: a removed link is missing, an added one already present, or the
                result is not a spanning tree.
        """
        for lk in change.remove:
            if lk not in self._links:
                raise TopologyError(
                    f"cannot remove missing link {lk[0]!r}–{lk[1]!r}", "unknown_link", lk
                )
        for lk in change.add:
            if lk in self._links and lk not in change.remove:
                raise TopologyError(
                    f"cannot add existing link {lk[0]!r}–{lk[1]!r}", "duplicate_link", lk
                )
        links = (self._links - set(change.remove)) | set(change.add)
        return Tree(self._brokers, links, self._clients)

    def swap(self, remove: tuple[str, str], add: tuple[str, str]) -> Tree:
        """Return the tree with one link replaced by another (the elementary OCBR move)."""
        return self.apply(TopologyChange(remove=(remove,), add=(add,)))

    def decompose(self, change: TopologyChange) -> list[tuple[Link, Link]]:
        """Split ``change`` into single ``(remove, add)`` swaps, each leaving a spanning tree.

        The live protocol moves one link at a time (make-before-break); by the exchange property
        of spanning trees every added link closes a cycle through at least one link still to be
        removed, so such an order always exists when the change itself is valid.

        Raises:
            TopologyError: the change does not turn this tree into another spanning tree.
        """
        final = self.apply(change)  # validates the change as a whole
        current = self
        pending = set(change.remove) - set(change.add)
        steps: list[tuple[Link, Link]] = []
        for new in change.add:
            if new in current.links:
                continue
            path = current.path(*new)
            on_path = [link(x, y) for x, y in pairwise(path)]
            choice = next((lk for lk in on_path if lk in pending), None)
            if choice is None:  # pragma: no cover - impossible for a change apply() accepted
                raise TopologyError("change cannot be split into swaps", "cycle", new)
            pending.discard(choice)
            current = current.swap(choice, new)
            steps.append((choice, new))
        assert current == final
        return steps

    def attach(self, client: str, broker: str) -> Tree:
        """Return the tree with ``client`` attached to ``broker`` (moved there if attached)."""
        clients = dict(self._clients)
        clients[client] = broker
        return Tree(self._brokers, self._links, clients)

    def detach(self, client: str) -> Tree:
        """Return the tree without ``client``.

        Raises:
            TopologyError: ``client`` is not attached.
        """
        if client not in self._clients:
            raise TopologyError(f"unknown client {client!r}", "unknown_node", (client,))
        clients = {c: b for c, b in self._clients.items() if c != client}
        return Tree(self._brokers, self._links, clients)

    def add_broker(self, broker: str, neighbour: str | None = None) -> Tree:
        """Return the tree with a new leaf ``broker`` linked to ``neighbour``.

        ``neighbour`` may be None only for the first broker of an empty tree.

        Raises:
            TopologyError: ``broker`` already exists, or ``neighbour`` is unknown.
        """
        if broker in self:
            raise TopologyError(f"node {broker!r} already exists", "id_clash", (broker,))
        links: set[tuple[str, str]] = set(self._links)
        if neighbour is not None:
            links.add((broker, neighbour))
        return Tree(self._brokers | {broker}, links, self._clients)

    def remove_broker(self, broker: str) -> Tree:
        """Return the tree without leaf ``broker``.

        Raises:
            TopologyError: ``broker`` has more than one link or still has clients attached
                (``not_a_leaf``): reattach them first, so no client is silently lost.
        """
        self._need_broker(broker)
        if len(self._adj[broker]) > 1 or self._attached[broker]:
            raise TopologyError(
                f"broker {broker!r} is not a leaf without clients", "not_a_leaf", (broker,)
            )
        links = {lk for lk in self._links if broker not in lk}
        return Tree(self._brokers - {broker}, links, self._clients)

    # -- serialisation ----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able form with sorted contents (stable diffs and hashes)."""
        return {
            "brokers": sorted(self._brokers),
            "links": [list(lk) for lk in sorted(self._links)],
            "clients": dict(sorted(self._clients.items())),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tree:
        """Parse and validate the form written by :meth:`to_dict`.

        Raises:
            TopologyError: the data is malformed or not a tree.
        """
        if not isinstance(data, Mapping):
            raise TopologyError("topology must be a mapping", "malformed")
        brokers = data.get("brokers", [])
        clients = data.get("clients", {})
        if not isinstance(brokers, list) or not isinstance(clients, Mapping):
            raise TopologyError("'brokers' must be a list and 'clients' a mapping", "malformed")
        return cls(brokers, _parse_links(data.get("links", []), "links"), clients)

    # -- internals --------------------------------------------------------------------------

    def _need_broker(self, broker: str) -> str:
        if broker not in self._brokers:
            raise TopologyError(f"unknown broker {broker!r}", "unknown_node", (broker,))
        return broker

    @cached_property
    def _rooted(self) -> tuple[dict[str, str], dict[str, int]]:
        """Parent and depth of every broker, rooted at the smallest id (deterministic)."""
        parent: dict[str, str] = {}
        depth: dict[str, int] = {}
        if not self._brokers:
            return parent, depth
        root = min(self._brokers)
        parent[root] = root
        depth[root] = 0
        queue = deque([root])
        while queue:
            x = queue.popleft()
            for y in self._adj[x]:
                if y not in depth:
                    parent[y] = x
                    depth[y] = depth[x] + 1
                    queue.append(y)
        return parent, depth

    def _broker_path(self, a: str, b: str) -> list[str]:
        parent, depth = self._rooted
        return rooted_path(parent, depth, a, b)


N = TypeVar("N")
K_contra = TypeVar("K_contra", contravariant=True)
V_co = TypeVar("V_co", covariant=True)


class _Lookup(Protocol[K_contra, V_co]):
    """Read access by key: a mapping, or a list indexed by position."""

    def __getitem__(self, key: K_contra, /) -> V_co: ...


def rooted_path(parent: _Lookup[N, N], depth: _Lookup[N, int], a: N, b: N) -> list[N]:
    """The path a … b in a rooted tree given as parent and depth maps or lists, indexed by node
    (both ends included)."""
    left: list[N] = []
    right: list[N] = []
    while depth[a] > depth[b]:
        left.append(a)
        a = parent[a]
    while depth[b] > depth[a]:
        right.append(b)
        b = parent[b]
    while a != b:
        left.append(a)
        right.append(b)
        a, b = parent[a], parent[b]
    left.append(a)
    left.extend(reversed(right))
    return left


# -- generators ------------------------------------------------------------------------------


def broker_names(n: int, prefix: str = "b") -> list[str]:
    """``n`` broker ids, zero-padded so their sorted order is their numeric order."""
    width = len(str(max(n - 1, 0)))
    return [f"{prefix}{i:0{width}d}" for i in range(n)]


def random_tree(
    brokers: Sequence[str], rng: random.Random, clients: Mapping[str, str] | None = None
) -> Tree:
    """A uniformly random labelled tree over ``brokers`` (decoded from a random Prüfer sequence).

    Uniform over all n^(n-2) labelled trees, so it is the unbiased "random initial overlay" the
    OCBR figures are measured against. Deterministic for a given ``rng`` state and broker order.
    """
    names = list(brokers)
    n = len(names)
    if n <= 2:
        return line_tree(names, clients)
    seq = [rng.randrange(n) for _ in range(n - 2)]
    degree = [1] * n
    for x in seq:
        degree[x] += 1
    leaves = [i for i in range(n) if degree[i] == 1]
    heapq.heapify(leaves)
    links: list[tuple[str, str]] = []
    for x in seq:
        leaf = heapq.heappop(leaves)
        links.append((names[leaf], names[x]))
        degree[x] -= 1
        if degree[x] == 1:
            heapq.heappush(leaves, x)
    u, v = heapq.heappop(leaves), heapq.heappop(leaves)
    links.append((names[u], names[v]))
    return Tree(names, links, clients)


def line_tree(brokers: Sequence[str], clients: Mapping[str, str] | None = None) -> Tree:
    """Brokers linked in the given order (a path: the worst diameter)."""
    names = list(brokers)
    return Tree(names, pairwise(names), clients)


def star_tree(
    brokers: Sequence[str], centre: str | None = None, clients: Mapping[str, str] | None = None
) -> Tree:
    """Every broker linked to ``centre`` (default: the first broker)."""
    names = list(brokers)
    if not names:
        return Tree((), (), clients)
    hub = names[0] if centre is None else centre
    return Tree(names, [(hub, b) for b in names if b != hub], clients)


# -- helpers ---------------------------------------------------------------------------------


def _check_id(node: object, kind: str) -> None:
    if not isinstance(node, str) or not node:
        raise TopologyError(f"{kind} id must be a non-empty string, got {node!r}", "malformed")


def _parse_links(raw: object, field: str) -> list[tuple[str, str]]:
    if not isinstance(raw, (list, tuple)):
        raise TopologyError(f"{field!r} must be a list of [a, b] pairs", "malformed")
    out: list[tuple[str, str]] = []
    for item in raw:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise TopologyError(f"{field!r}: {item!r} is not an [a, b] pair", "malformed")
        a, b = item
        if not isinstance(a, str) or not isinstance(b, str):
            raise TopologyError(f"{field!r}: {item!r} must hold two string ids", "malformed")
        out.append((a, b))
    return out


def path_between(links: Iterable[tuple[str, str]], a: str, b: str) -> list[str]:
    """The nodes on a shortest path from ``a`` to ``b`` over ``links`` (any graph, e.g. the
    partial view of the overlay a broker learns from link-state announcements), both ends
    included; ``[]`` when ``b`` cannot be reached from ``a``."""
    adj: dict[str, set[str]] = {}
    for x, y in links:
        adj.setdefault(x, set()).add(y)
        adj.setdefault(y, set()).add(x)
    if a == b:
        return [a]
    if a not in adj or b not in _reach(adj, a):
        return []
    return _bfs_path(adj, a, b)


def _reach(adj: Mapping[str, Iterable[str]], start: str) -> set[str]:
    seen = {start}
    queue = deque([start])
    while queue:
        x = queue.popleft()
        for y in adj[x]:
            if y not in seen:
                seen.add(y)
                queue.append(y)
    return seen


def _bfs_path(adj: Mapping[str, Iterable[str]], a: str, b: str) -> list[str]:
    prev: dict[str, str] = {a: a}
    queue = deque([a])
    while queue:
        x = queue.popleft()
        if x == b:
            break
        for y in sorted(adj[x]):
            if y not in prev:
                prev[y] = x
                queue.append(y)
    out = [b]
    while out[-1] != a:
        out.append(prev[out[-1]])
    return out[::-1]
