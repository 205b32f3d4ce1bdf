"""The trust model: trust vectors, individual trust functions, path trust and leximin.

A client's opinion of a broker is a *trust vector* (delivery ratio, share integrity ratio,
uptime, an operator prior...); an *individual trust function* turns it into one number in
[0, 1]. Trust along a path is combined in the semiring ([0, 1], max, ×): the trust of one path
is the product of the evaluator's trust in each intermediate node, and the most trusted of
several paths is their maximum. Individual values are aggregated socially with Yager's
analytical leximin OWA, which gives (almost) all the weight to the least trusting party — a
Rawlsian welfare function (SPEC §6).

Everything here is a pure function over plain data so that the MTPSTO solvers
(``reconfig.mtpsto``) and the overlay planner share one definition of trust.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

__all__ = [
    "DEFAULT_DELTA",
    "DEFAULT_PROPERTY_WEIGHTS",
    "TrustFunction",
    "TrustVector",
    "inferred_trust",
    "leximin_owa",
    "leximin_weights",
    "make_weighted_trust",
    "most_trusted_paths",
    "path_trust",
    "semiring_plus",
    "semiring_times",
    "trust_edges_from_vectors",
    "weighted_trust",
]

N = TypeVar("N", bound=Hashable)

#: Yager's Δ for the analytical leximin operator (SPEC §6 default).
DEFAULT_DELTA = 0.001

#: A trust vector Λ_{i,j}: named properties of i's opinion of j, each in [0, 1].
TrustVector = Mapping[str, float]

#: An individual trust function τ_i: trust vector → [0, 1].
TrustFunction = Callable[[TrustVector], float]

#: Default weights of the weighted individual trust function; properties missing from a
#: vector are skipped (their weight is redistributed) rather than read as zero, because an
#: unobserved property is ignorance, not evidence of misbehaviour.
DEFAULT_PROPERTY_WEIGHTS: Mapping[str, float] = {
    "delivery_ratio": 0.4,
    "share_integrity_ratio": 0.3,
    "uptime": 0.2,
    "operator_prior": 0.1,
}


def weighted_trust(
    vector: TrustVector, weights: Mapping[str, float] = DEFAULT_PROPERTY_WEIGHTS
) -> float:
    """The default individual trust function: a normalised weighted mean of the vector.

    Args:
        vector: property name → value in [0, 1].
        weights: property name → non-negative weight; properties without a weight are ignored.

    Returns:
        The weighted mean over the properties present in both, or 0.0 when none are (no
        evidence at all earns no trust).

    Raises:
        ValueError: a property value lies outside [0, 1] or a weight is negative.
    """
    total = 0.0
    weight_sum = 0.0
    for name, value in vector.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"trust property {name!r}={value} outside [0, 1]")
        w = weights.get(name)
        if w is None:
            continue
        if w < 0.0:
            raise ValueError(f"negative weight {w} for trust property {name!r}")
        total += w * value
        weight_sum += w
    if weight_sum == 0.0:
        return 0.0
    return min(1.0, total / weight_sum)


def make_weighted_trust(weights: Mapping[str, float]) -> TrustFunction:
    """Build a configurable individual trust function with the given property weights."""
    frozen = dict(weights)
    for name, w in frozen.items():
        if w < 0.0:
            raise ValueError(f"negative weight {w} for trust property {name!r}")

    def tau(vector: TrustVector) -> float:
        return weighted_trust(vector, frozen)

    return tau


def trust_edges_from_vectors(
    vectors: Mapping[tuple[N, N], TrustVector],
    tau: TrustFunction | Mapping[N, TrustFunction] = weighted_trust,
) -> dict[tuple[N, N], float]:
    """Turn opinions Λ_{i,j} into trust-graph edge weights τ_i(Λ_{i,j}).

    ``tau`` is one trust function for everybody or one per evaluator i (each client may
    weigh delivery against integrity differently); evaluators missing from a mapping use
    :func:`weighted_trust`.
    """
    out: dict[tuple[N, N], float] = {}
    for (i, j), vector in vectors.items():
        fn = tau if callable(tau) else tau.get(i, weighted_trust)
        value = fn(vector)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"trust function of {i!r} returned {value} outside [0, 1]")
        out[(i, j)] = value
    return out


def semiring_plus(a: float, b: float) -> float:
    """Semiring addition: of two alternative paths the evaluator keeps the more trusted."""
    return a if a >= b else b


def semiring_times(a: float, b: float) -> float:
    """Semiring multiplication: trust erodes multiplicatively along a path."""
    return a * b


def path_trust(trust_of: Mapping[N, float] | Callable[[N], float], path: Sequence[N]) -> float:
    """The evaluator's trust in one path: the product of its trust in the intermediate nodes.

    ``path`` runs from the evaluator to the far end; both ends are excluded, so a path of one
    edge (direct neighbours) has trust 1. The product is taken in path order, from the
    evaluator outwards, so that the same path always yields the same float.
    """
    get = trust_of if callable(trust_of) else trust_of.__getitem__
    value = 1.0
    for node in path[1:-1]:
        value *= get(node)
    return value


def most_trusted_paths(
    graph: Mapping[N, Iterable[N]],
    source: N,
    node_trust: Callable[[N], float],
) -> tuple[dict[N, float], dict[N, N | None]]:
    """Best path trust from ``source`` to every reachable node, intermediates weighted.

    A Dijkstra in the ([0, 1], max, ×) semiring: the trust of reaching ``v`` is the product of
    ``node_trust`` over the nodes strictly between ``source`` and ``v``. Because every factor
    is at most 1 the products only shrink along a path, which is what makes the greedy
    settlement order correct. Ties are broken towards fewer hops so the returned predecessor
    tree is shallow.

    Returns:
        (best, pred): best path trust per reachable node (``source`` maps to 1.0) and the
        predecessor of each node on one most trusted path.
    """
    best: dict[N, float] = {source: 1.0}
    hops: dict[N, int] = {source: 0}
    pred: dict[N, N | None] = {source: None}
    done: set[N] = set()
    counter = 0
    heap: list[tuple[float, int, int, N]] = [(-1.0, 0, counter, source)]
    while heap:
        neg, h, _, u = heapq.heappop(heap)
        if u in done:
            continue
        done.add(u)
        through = 1.0 if u == source else -neg * node_trust(u)
        for v in graph[u]:
            if v in done:
                continue
            old = best.get(v, -1.0)
            if through > old or (through == old and h + 1 < hops[v]):
                best[v] = through
                hops[v] = h + 1
                pred[v] = u
                counter += 1
                heapq.heappush(heap, (-through, h + 1, counter, v))
    return best, pred


def inferred_trust(
    trust_edges: Mapping[tuple[N, N], float], nodes: Iterable[N], evaluator: N
) -> dict[N, float]:
    """The evaluator's trust in every node: the direct edge if present, else the best chain.

    SPEC §6 convention: a node's trust in a node it has no trust-graph edge to is the most
    trusted path between them in the trust graph, in the same semiring — here the product of
    the *edge weights* along the chain of recommendations (i trusts k, k trusts j). Nodes with
    no path get 0.
    """
    out: dict[N, list[tuple[N, float]]] = {}
    for (i, j), w in trust_edges.items():
        if not 0.0 <= w <= 1.0:
            raise ValueError(f"trust weight {w} on {i}->{j} outside [0, 1]")
        out.setdefault(i, []).append((j, w))
    best: dict[N, float] = {evaluator: 1.0}
    heap: list[tuple[float, int, N]] = [(-1.0, 0, evaluator)]
    counter = 0
    done: set[N] = set()
    while heap:
        neg, _, u = heapq.heappop(heap)
        if u in done:
            continue
        done.add(u)
        for v, w in out.get(u, ()):
            value = -neg * w
            if v not in done and value > best.get(v, 0.0):
                best[v] = value
                counter += 1
                heapq.heappush(heap, (-value, counter, v))
    result: dict[N, float] = {}
    for node in nodes:
        if node == evaluator:
            result[node] = 1.0
        elif (evaluator, node) in trust_edges:
            result[node] = trust_edges[(evaluator, node)]
        else:
            result[node] = best.get(node, 0.0)
    return result


@functools.lru_cache(maxsize=256)
def leximin_weights(n: int, delta: float = DEFAULT_DELTA) -> tuple[float, ...]:
    """Yager's analytical leximin OWA weights for ``n`` values sorted largest first.

    w_1 = Δ^{n-1}/(1+Δ)^{n-1}; w_j = Δ^{n-j}/(1+Δ)^{n+1-j} for 2 ≤ j ≤ n. They sum to 1 and
    put weight 1/(1+Δ) on the smallest value, Δ/(1+Δ)² on the next, and so on.
    """
    if n < 1:
        raise ValueError("leximin needs at least one value")
    if delta <= 0.0:
        raise ValueError("leximin Δ must be positive")
    weights = [delta ** (n - 1) / (1.0 + delta) ** (n - 1)]
    weights.extend(delta ** (n - j) / (1.0 + delta) ** (n + 1 - j) for j in range(2, n + 1))
    return tuple(weights)


def leximin_owa(values: Iterable[float], delta: float = DEFAULT_DELTA) -> float:
    """The analytical leximin value F = Σ w_j z_j (z_j the j-th largest of ``values``).

    The OWA value itself is the objective (no rounding to Δ). ``math.fsum`` makes the sum
    correctly rounded, so equal multisets of values give bit-identical results and the
    function is monotone in every argument — the branch and bound relies on both.
    """
    z = sorted(values, reverse=True)
    return math.fsum(w * v for w, v in zip(leximin_weights(len(z), delta), z, strict=True))
