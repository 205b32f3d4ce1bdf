"""Replica placement (SPEC §4): how many replicas each virtual node should have.

Three phases over the end-to-end publisher → subscriber paths of the VN tree, pure and exact
(rational arithmetic, so a plan is the same on every machine and checkable by hand):

1. Each path gets a priority ``ρ = hops × γ × ω``: ``hops`` the VN links it crosses, ``γ``
   its share of all path failures in the window, ``ω`` the operator's weight. The replica
   budget is split over the paths in proportion to ρ (largest remainders, ties to the path
   that sorts first).
2. Each path's replicas are split over its VNs in proportion to each VN's share of the
   failures on that path (ties: more failures, then the VN id). A VN on several paths
   collects a batch from each. With ``once_per_node`` a VN keeps only the batch of its
   highest-priority path; the batches it would have received again are a surplus handed one
   replica at a time to the under-provisioned VNs on paths (``r < 3``), the one with the
   highest failure ratio first (ties: fewer replicas, then the VN id).
3. No path may hold more than ``max_per_path`` placed replicas: paths are checked in priority
   order, and a path over the limit loses replicas one at a time from its VN with the lowest
   failure ratio (ties: fewer failures, then the VN id).

Where the window saw no path failures at all, γ is the same for every path (the plan then
follows length and weight alone); a path none of whose VNs failed splits its replicas evenly.
A VN always keeps at least one broker: a VN that receives nothing is planned at ``r = 1`` (its
floor is not taken from the budget). The plan warns for every VN left with ``r < 3`` (no
confidentiality against its own brokers, no Byzantine replica tolerated) and every path whose
VNs all have ``r < 3``; :func:`diff` compares it with the overlay that runs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, TypeVar

from overlay.tree import Tree
from security.errors import InvalidRequest

__all__ = [
    "CONFIDENTIAL_MIN",
    "NodeFailures",
    "PathAllocation",
    "PathKey",
    "PlacementError",
    "PlacementWarning",
    "Plan",
    "ReplicaChange",
    "apportion",
    "diff",
    "path_weights",
    "place",
    "vn_failures",
]

PathKey = tuple[str, str]
"""An end-to-end path: (publisher edge VN, subscriber edge VN)."""

CONFIDENTIAL_MIN = 3
"""The fewest replicas that give a VN confidentiality against its own brokers (k = 2 of 3)."""

K = TypeVar("K", bound=Hashable)


class PlacementError(InvalidRequest):
    """The placement input is inconsistent (an unknown VN, a negative count or weight)."""

    code = "placement"


@dataclass(frozen=True)
class NodeFailures:
    """Failures a VN's brokers caused over the window, out of the events they were judged on."""

    failures: int = 0
    events: int = 0

    def __post_init__(self) -> None:
        if self.failures < 0 or self.events < 0:
            raise PlacementError(f"negative failure counts {self.failures}/{self.events}")

    @property
    def ratio(self) -> Fraction:
        """failures / events (a VN with failures but no recorded events counts as 1)."""
        if not self.failures:
            return Fraction(0)
        return Fraction(self.failures, max(self.events, self.failures))

    def __add__(self, other: NodeFailures) -> NodeFailures:
        return NodeFailures(self.failures + other.failures, self.events + other.events)


@dataclass(frozen=True)
class PathAllocation:
    """What phases 1 and 2 gave one path (before the once-per-node variant and phase 3)."""

    path: PathKey
    nodes: tuple[str, ...]
    hops: int
    gamma: Fraction
    omega: Fraction
    priority: Fraction
    replicas: int
    by_node: Mapping[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": list(self.path),
            "nodes": list(self.nodes),
            "hops": self.hops,
            "gamma": float(self.gamma),
            "omega": float(self.omega),
            "priority": float(self.priority),
            "replicas": self.replicas,
            "by_node": dict(sorted(self.by_node.items())),
        }


@dataclass(frozen=True)
class PlacementWarning:
    """A VN (``kind="vn"``) or a path (``kind="path"``) left without confidentiality."""

    kind: str
    subject: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "subject": self.subject, "message": self.message}


@dataclass(frozen=True)
class Plan:
    """A placement plan.

    Attributes:
        replicas: every VN of the tree → its planned replica count (at least 1).
        placed: VN → replicas the phases placed on it (0 for VNs that received none).
        paths: per path, what phases 1 and 2 gave it, in priority order.
        surplus: replicas the once-per-node variant took back from VNs already served.
        cut: VN → replicas phase 3 removed from it.
        unplaced: budget replicas the plan could not place (no path with a priority, a
            surplus with no under-provisioned VN to take it, or phase 3 cuts).
        warnings: VNs with ``r < 3`` and paths whose VNs all have ``r < 3``.
    """

    budget: int
    replicas: Mapping[str, int]
    placed: Mapping[str, int]
    paths: tuple[PathAllocation, ...]
    surplus: int
    cut: Mapping[str, int]
    unplaced: int
    warnings: tuple[PlacementWarning, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "replicas": dict(sorted(self.replicas.items())),
            "placed": dict(sorted(self.placed.items())),
            "paths": [p.to_dict() for p in self.paths],
            "surplus": self.surplus,
            "cut": dict(sorted(self.cut.items())),
            "unplaced": self.unplaced,
            "warnings": [w.to_dict() for w in self.warnings],
        }


@dataclass(frozen=True)
class ReplicaChange:
    """One VN's replica count now and in the plan."""

    vn: str
    current: int
    planned: int

    @property
    def delta(self) -> int:
        return self.planned - self.current

    @property
    def action(self) -> str:
        """``attach``, ``detach`` or ``keep``."""
        return "attach" if self.delta > 0 else "detach" if self.delta < 0 else "keep"

    def to_dict(self) -> dict[str, Any]:
        return {
            "vn": self.vn,
            "current": self.current,
            "planned": self.planned,
            "delta": self.delta,
            "action": self.action,
        }


def apportion(
    total: int, weights: Sequence[tuple[K, Fraction]], order: Callable[[K], Any]
) -> dict[K, int]:
    """Split ``total`` into integers in proportion to ``weights`` (largest remainders).

    Every share is the floor of its quota or one more; the units left after the floors go
    to the largest remainders, ties to the key that ``order`` ranks first. All weights zero
    (or no weights): nothing is given.
    """
    whole = sum((w for _, w in weights), Fraction(0))
    if total <= 0 or whole <= 0:
        return {key: 0 for key, _ in weights}
    quotas = {key: total * w / whole for key, w in weights}
    shares = {key: int(q) for key, q in quotas.items()}  # floor: quotas are not negative
    left = total - sum(shares.values())
    ranked = sorted(quotas, key=lambda key: (-(quotas[key] - shares[key]), order(key)))
    for key in ranked[:left]:
        shares[key] += 1
    return shares


def place(
    tree: Tree,
    paths: Iterable[PathKey],
    *,
    budget: int,
    path_failures: Mapping[PathKey, int] | None = None,
    node_failures: Mapping[str, NodeFailures] | None = None,
    weights: Mapping[PathKey, float | Fraction] | None = None,
    max_per_path: int | None = None,
    once_per_node: bool = False,
) -> Plan:
    """The three-phase placement of SPEC §4 (see the module docstring for the rules).

    Args:
        tree: the VN tree.
        paths: end-to-end paths (publisher edge VN, subscriber edge VN); duplicates merge.
        budget: replicas to place.
        path_failures: failed publications per path in the window (γ); missing paths: 0.
        node_failures: per VN, the failures of its brokers in the window; missing VNs: none.
        weights: ω per path (default 1; 0 leaves a path out).
        max_per_path: the most placed replicas a path's VNs may hold together.
        once_per_node: the variant that gives a VN only one batch (see module docstring).

    Raises:
        PlacementError: a path names a VN not in the tree, or a count or weight is negative.
    """
    if budget < 0:
        raise PlacementError(f"the replica budget must be 0 or more, got {budget}")
    if max_per_path is not None and max_per_path < 0:
        raise PlacementError(f"max_per_path must be 0 or more, got {max_per_path}")
    keys = sorted({(str(a), str(b)) for a, b in paths})
    for src, dst in keys:
        for vn in (src, dst):
            if vn not in tree.brokers:
                raise PlacementError(f"path {src} -> {dst}: no VN {vn!r} in the tree")
    path_failures = dict(path_failures or {})
    node_failures = dict(node_failures or {})
    weights = dict(weights or {})
    for key, n in path_failures.items():
        if n < 0:
            raise PlacementError(f"path {key[0]} -> {key[1]}: negative failure count {n}")
    for key, w in weights.items():
        if w < 0:
            raise PlacementError(f"path {key[0]} -> {key[1]}: negative weight {w}")

    def fails(vn: str) -> NodeFailures:
        return node_failures.get(vn, NodeFailures())

    # Phase 1: priorities and the budget over the paths.
    nodes = {key: tuple(tree.path(*key)) for key in keys}
    all_failed = sum(path_failures.get(key, 0) for key in keys)
    gamma = {
        key: Fraction(path_failures.get(key, 0), all_failed)
        if all_failed
        else Fraction(1, max(len(keys), 1))
        for key in keys
    }
    omega = {key: Fraction(weights.get(key, 1)) for key in keys}
    priority = {key: (len(nodes[key]) - 1) * gamma[key] * omega[key] for key in keys}
    per_path = apportion(budget, [(key, priority[key]) for key in keys], lambda key: key)

    # Phase 2: each path's replicas over its VNs, by their share of the path's failures.
    in_order = sorted(keys, key=lambda key: (-priority[key], key))
    placed = dict.fromkeys(sorted(tree.brokers), 0)
    served: set[str] = set()
    surplus = 0
    allocations = []
    for key in in_order:
        path_nodes = nodes[key]
        on_path = sum(fails(vn).failures for vn in path_nodes)
        shares = [
            (vn, Fraction(fails(vn).failures) if on_path else Fraction(1)) for vn in path_nodes
        ]
        batch = apportion(per_path[key], shares, lambda vn: (-fails(vn).failures, vn))
        allocations.append(
            PathAllocation(
                key,
                path_nodes,
                len(path_nodes) - 1,
                gamma[key],
                omega[key],
                priority[key],
                per_path[key],
                batch,
            )
        )
        for vn, n in batch.items():
            if once_per_node and vn in served:
                surplus += n
                continue
            placed[vn] += n
            if n:
                served.add(vn)
    unplaced = budget - sum(per_path.values()) + surplus
    if surplus:
        on_paths = sorted({vn for key in keys for vn in nodes[key]})
        for _ in range(surplus):
            short = [vn for vn in on_paths if placed[vn] < CONFIDENTIAL_MIN]
            if not short:
                break
            vn = min(short, key=lambda v: (-fails(v).ratio, placed[v], v))
            placed[vn] += 1
            unplaced -= 1

    # Phase 3: no path over max_per_path; the VN with the lowest failure ratio gives first.
    cut: dict[str, int] = {}
    if max_per_path is not None:
        for key in in_order:
            while sum(placed[vn] for vn in nodes[key]) > max_per_path:
                holding = [vn for vn in nodes[key] if placed[vn] > 0]
                vn = min(holding, key=lambda v: (fails(v).ratio, fails(v).failures, v))
                placed[vn] -= 1
                cut[vn] = cut.get(vn, 0) + 1
                unplaced += 1

    replicas = {vn: max(1, n) for vn, n in placed.items()}
    return Plan(
        budget=budget,
        replicas=replicas,
        placed=placed,
        paths=tuple(allocations),
        surplus=surplus,
        cut=dict(sorted(cut.items())),
        unplaced=unplaced,
        warnings=_warnings(replicas, keys, nodes),
    )


def _warnings(
    replicas: Mapping[str, int], keys: Sequence[PathKey], nodes: Mapping[PathKey, tuple[str, ...]]
) -> tuple[PlacementWarning, ...]:
    out = [
        PlacementWarning(
            "vn",
            vn,
            f"VN {vn} has r = {r} < {CONFIDENTIAL_MIN}: no confidentiality against its own "
            f"brokers and no Byzantine replica tolerated",
        )
        for vn, r in sorted(replicas.items())
        if r < CONFIDENTIAL_MIN
    ]
    out += [
        PlacementWarning(
            "path",
            f"{key[0]} -> {key[1]}",
            f"path {key[0]} -> {key[1]}: every VN on it ({', '.join(nodes[key])}) has "
            f"r < {CONFIDENTIAL_MIN}",
        )
        for key in keys
        if all(replicas[vn] < CONFIDENTIAL_MIN for vn in nodes[key])
    ]
    return tuple(out)


def diff(plan: Mapping[str, int], running: Mapping[str, int]) -> list[ReplicaChange]:
    """Per VN (sorted), its replica count in the running overlay and in ``plan``.

    A VN only one side knows counts 0 on the other.
    """
    return [
        ReplicaChange(vn, running.get(vn, 0), plan.get(vn, 0))
        for vn in sorted(set(plan) | set(running))
    ]


def vn_failures(
    per_broker: Mapping[str, NodeFailures], vn_of: Callable[[str], str | None]
) -> dict[str, NodeFailures]:
    """Per-broker failures summed per VN (brokers ``vn_of`` maps to None are skipped)."""
    out: dict[str, NodeFailures] = {}
    for broker, counts in sorted(per_broker.items()):
        vn = vn_of(broker)
        if vn is not None:
            out[vn] = out.get(vn, NodeFailures()) + counts
    return out


def path_weights(
    paths: Iterable[PathKey],
    *,
    by_path: Mapping[PathKey, float] | None = None,
    by_pair: Mapping[tuple[str, str], float] | None = None,
    by_publisher: Mapping[str, float] | None = None,
    client_vn: Mapping[str, str] | None = None,
) -> dict[PathKey, float]:
    """ω per path from the operator's weights; the most specific one that applies wins.

    A client pair (publisher client, subscriber client) applies to the path between the
    clients' VNs (``client_vn``); the largest pair weight wins when several pairs share a
    path. Then a weight for the path itself, then the publisher's (the largest among the
    publishers at the path's source VN), then 1.

    Raises:
        PlacementError: a pair or publisher names a client ``client_vn`` does not place.
    """
    client_vn = client_vn or {}

    def where(client: str) -> str:
        try:
            return client_vn[client]
        except KeyError:
            raise PlacementError(
                f"weight for client {client!r}: no VN given for it (placement.clients)"
            ) from None

    pairs: dict[PathKey, float] = {}
    for (pub, sub), w in (by_pair or {}).items():
        key = (where(pub), where(sub))
        pairs[key] = max(w, pairs.get(key, w))
    publishers: dict[str, float] = {}
    for pub, w in (by_publisher or {}).items():
        vn = where(pub)
        publishers[vn] = max(w, publishers.get(vn, w))
    out = {}
    for key in sorted(set(paths)):
        if key in pairs:
            out[key] = pairs[key]
        elif by_path and key in by_path:
            out[key] = by_path[key]
        elif key[0] in publishers:
            out[key] = publishers[key[0]]
        else:
            out[key] = 1.0
    return out
