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
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "DEFAULT_DELTA",
    "DEFAULT_PROPERTY_WEIGHTS",
    "OBSERVED_WEIGHTS",
    "TRUST_FUNCTIONS",
    "BrokerTrust",
    "TrustConfig",
    "TrustFunction",
    "TrustVector",
    "broker_trust",
    "inferred_trust",
    "leximin_owa",
    "leximin_weights",
    "make_weighted_trust",
    "min_trust",
    "most_trusted_paths",
    "observed_trust_edges",
    "observed_vectors",
    "path_trust",
    "pooled_feedback",
    "semiring_plus",
    "semiring_times",
    "trust_curve",
    "trust_edges_from_vectors",
    "trust_losses",
    "vector_from_counts",
    "vn_trust",
    "weighted_geometric_trust",
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


# -- trust from observation ------------------------------------------------------------------

#: Default weights of the observed trust vector (the analytics job's ``trust_feedback``
#: columns plus the operator's prior). ``reliability`` (1 − failure_ratio) restates the
#: others' failures pooled, so it is shown but weighs nothing unless configured.
OBSERVED_WEIGHTS: Mapping[str, float] = {
    "delivery_ratio": 0.4,
    "share_integrity": 0.4,
    "timeliness": 0.1,
    "reliability": 0.0,
    "operator_prior": 0.1,
}

#: The individual trust functions a ``[trust]`` section may name.
TRUST_FUNCTIONS = ("geometric", "weighted", "min")

#: Counts of a ``trust_feedback`` row that are pooled (summed) across evaluators and windows.
FEEDBACK_COUNTS = (
    "expected",
    "received",
    "conflicting",
    "bad_signatures",
    "timely",
    "shares_ok",
    "bad_shares",
    "failures",
    "events",
)


def weighted_geometric_trust(vector: TrustVector, weights: Mapping[str, float]) -> float:
    """Π v_i^(w_i/Σw) over the weighted properties present: one property at 0 gives 0.

    A weighted *arithmetic* mean lets a broker that corrupts every share keep 1 − w of its
    trust; the geometric mean does not (but is still lenient with partial faults).
    """
    log_sum = 0.0
    weight_sum = 0.0
    for name, value in vector.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"trust property {name!r}={value} outside [0, 1]")
        w = weights.get(name, 0.0)
        if w < 0.0:
            raise ValueError(f"negative weight {w} for trust property {name!r}")
        if w == 0.0:
            continue
        if value == 0.0:
            return 0.0
        log_sum += w * math.log(value)
        weight_sum += w
    if weight_sum == 0.0:
        return 0.0
    return min(1.0, math.exp(log_sum / weight_sum))


def min_trust(vector: TrustVector, weights: Mapping[str, float]) -> float:
    """The smallest property with a positive weight (0.0 when there is none)."""
    values = [v for name, v in vector.items() if weights.get(name, 0.0) > 0.0]
    for v in values:
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"trust property value {v} outside [0, 1]")
    return min(values) if values else 0.0


def trust_losses(
    vector: TrustVector, weights: Mapping[str, float], function: str = "min"
) -> dict[str, float]:
    """How much each weighted property pulls trust below 1, in the function's own terms.

    weighted: w_i(1 − v_i)/Σw (the terms sum to 1 − trust); geometric: −(w_i/Σw)·ln v_i (they
    sum to −ln trust; a zero property is infinite); min: 1 − v_i of the properties at the
    minimum, 0 for the others.
    """
    present = {n: v for n, v in vector.items() if weights.get(n, 0.0) > 0.0}
    total = sum(weights[n] for n in present)
    if not present or total == 0.0:
        return {}
    if function == "weighted":
        return {n: weights[n] * (1.0 - v) / total for n, v in present.items()}
    if function == "geometric":
        return {
            n: (math.inf if v == 0.0 else -weights[n] * math.log(v) / total)
            for n, v in present.items()
        }
    if function == "min":
        low = min(present.values())
        return {n: (1.0 - v if v == low else 0.0) for n, v in present.items()}
    raise ValueError(f"unknown trust function {function!r}; choose from {TRUST_FUNCTIONS}")


@dataclass(frozen=True)
class TrustConfig:
    """The operator's ``[trust]`` section.

    Attributes:
        prior: the operator prior of every broker without its own entry.
        priors: broker id (or VN id, for all its replicas) → prior in [0, 1].
        weights: property → weight (see :data:`OBSERVED_WEIGHTS`).
        function: the individual trust function, one of :data:`TRUST_FUNCTIONS`. The default
            is ``min`` over the properties with a positive weight: a broker is as trusted as
            its worst observed behaviour, so a replica that corrupts 80% of its shares or
            drops 60% of publications is distrusted whatever it does well. ``weighted`` (the
            SPEC's arithmetic mean) keeps such a replica at 1 − w of its trust, ``geometric``
            at v^w (0.4^0.4 = 0.69 for a 60% drop): both are there for operators who want
            leniency.
        half_life: older windows count for 2^(−age/half_life), age in windows, so that a
            broker whose faults stop regains trust; 0 pools every window alike.
    """

    prior: float = 1.0
    priors: Mapping[str, float] = field(default_factory=dict)
    weights: Mapping[str, float] = field(default_factory=lambda: dict(OBSERVED_WEIGHTS))
    function: str = "min"
    half_life: float = 2.0

    def __post_init__(self) -> None:
        _unit(self.prior, "trust.prior")
        for k, v in self.priors.items():
            _unit(v, f"trust.priors.{k}")
        for k, v in self.weights.items():
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"trust.weights.{k}: must be a number >= 0, got {v!r}")
        if not any(self.weights.values()):
            raise ValueError("trust.weights: at least one weight must be positive")
        if self.function not in TRUST_FUNCTIONS:
            raise ValueError(
                f"trust.function: {self.function!r} is not one of {', '.join(TRUST_FUNCTIONS)}"
            )
        if not isinstance(self.half_life, (int, float)) or self.half_life < 0:
            raise ValueError(f"trust.half_life: must be >= 0, got {self.half_life!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> TrustConfig:
        """Parse a ``[trust]`` table strictly: an unknown key is an error naming it.

        Keys: ``prior``, ``function``, ``half_life``, ``priors`` (a table), ``weights`` (a
        table, merged over the defaults: name a property with 0 to ignore it).
        """
        known = {"prior", "priors", "weights", "function", "half_life"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"trust.{unknown[0]}: unknown key (expected one of {', '.join(sorted(known))})"
            )
        kwargs: dict[str, Any] = {}
        for key in ("prior", "half_life"):
            if key in data:
                kwargs[key] = _number(data[key], f"trust.{key}")
        if "function" in data:
            kwargs["function"] = str(data["function"])
        for key in ("priors", "weights"):
            if key in data:
                table = data[key]
                if not isinstance(table, Mapping):
                    raise ValueError(f"trust.{key}: must be a table")
                kwargs[key] = {str(k): _number(v, f"trust.{key}.{k}") for k, v in table.items()}
        if "weights" in kwargs:
            kwargs["weights"] = {**OBSERVED_WEIGHTS, **kwargs["weights"]}
        return cls(**kwargs)

    def prior_of(self, broker: str, vn: str | None = None) -> float:
        """The operator prior of ``broker`` (its own entry, else its VN's, else the default)."""
        if broker in self.priors:
            return self.priors[broker]
        if vn is not None and vn in self.priors:
            return self.priors[vn]
        return self.prior

    def tau(self) -> TrustFunction:
        """The configured individual trust function."""
        weights = dict(self.weights)
        if self.function == "weighted":
            return lambda v: weighted_trust(v, weights)
        if self.function == "min":
            return lambda v: min_trust(v, weights)
        return lambda v: weighted_geometric_trust(v, weights)


@dataclass(frozen=True)
class BrokerTrust:
    """One broker's observed trust.

    Attributes:
        broker: the broker (replica) id.
        vn: its VN.
        trust: τ(vector).
        vector: the properties, each in [0, 1] (those without evidence are absent).
        events: the (decayed) evidence behind it: expected copies + shares judged.
        pulled_down_by: the property that costs the most trust, None when nothing does.
    """

    broker: str
    vn: str | None
    trust: float
    vector: Mapping[str, float]
    events: float
    pulled_down_by: str | None


def vector_from_counts(counts: Mapping[str, float], prior: float) -> dict[str, float]:
    """The trust vector of pooled ``trust_feedback`` counts (same ratios as the job)."""
    out: dict[str, float] = {}
    expected = counts.get("expected", 0.0)
    received = counts.get("received", 0.0)
    bad_sig = counts.get("bad_signatures", 0.0)
    if expected > 0:
        out["delivery_ratio"] = _clip(
            (received - counts.get("conflicting", 0.0) - bad_sig) / expected
        )
    judged = counts.get("shares_ok", 0.0) + counts.get("bad_shares", 0.0)
    if judged > 0:
        out["share_integrity"] = _clip(counts.get("shares_ok", 0.0) / judged)
    copies = received - bad_sig
    if copies > 0:
        out["timeliness"] = _clip(counts.get("timely", 0.0) / copies)
    events = counts.get("events", 0.0)
    if events > 0:
        out["reliability"] = _clip(1.0 - counts.get("failures", 0.0) / events)
    out["operator_prior"] = prior
    return out


def pooled_feedback(
    rows: Iterable[Mapping[str, Any]], half_life: float, until: float | None = None
) -> dict[tuple[str, str], tuple[str | None, dict[str, float]]]:
    """Sum ``trust_feedback`` counts per (evaluator, broker) over windows, older ones decayed.

    Rows of windows after ``until`` are ignored; a window's age is the number of distinct
    windows between it and the newest one kept. Rows without a ``broker_vn`` (a publisher's
    shares: clients are not brokers) are skipped.

    Returns:
        (evaluator, broker) → (broker's VN, decayed counts).
    """
    kept = [
        r
        for r in rows
        if r.get("broker_vn") is not None and (until is None or float(r["w"]) <= until)
    ]
    windows = sorted({float(r["w"]) for r in kept})
    age = {w: len(windows) - 1 - i for i, w in enumerate(windows)}
    out: dict[tuple[str, str], tuple[str | None, dict[str, float]]] = {}
    for r in kept:
        weight = 0.5 ** (age[float(r["w"])] / half_life) if half_life > 0 else 1.0
        key = (str(r["evaluator"]), str(r["broker"]))
        _vn, counts = out.setdefault(key, (str(r["broker_vn"]), {}))
        for name in FEEDBACK_COUNTS:
            value = r.get(name)
            if value is not None:
                counts[name] = counts.get(name, 0.0) + weight * float(value)
    return out


def observed_vectors(
    rows: Iterable[Mapping[str, Any]], config: TrustConfig
) -> dict[tuple[str, str], dict[str, float]]:
    """The trust graph's vectors Λ_{evaluator, broker} from the job's ``trust_feedback``."""
    return {
        (e, b): vector_from_counts(counts, config.prior_of(b, vn))
        for (e, b), (vn, counts) in pooled_feedback(rows, config.half_life).items()
    }


def observed_trust_edges(
    rows: Iterable[Mapping[str, Any]], config: TrustConfig
) -> dict[tuple[str, str], float]:
    """The trust graph: evaluator → broker edges weighted by τ of their observed vector."""
    return trust_edges_from_vectors(observed_vectors(rows, config), config.tau())


def broker_trust(
    rows: Iterable[Mapping[str, Any]],
    config: TrustConfig,
    *,
    brokers: Mapping[str, str] | None = None,
    until: float | None = None,
) -> dict[str, BrokerTrust]:
    """Each broker's trust from every evaluator's evidence pooled (the overlay's view of it).

    Args:
        rows: ``trust_feedback`` rows.
        config: the ``[trust]`` section.
        brokers: broker → VN of brokers to report even without evidence (trust = τ(prior)).
        until: ignore windows after this one (for recovery curves).
    """
    pooled: dict[str, tuple[str | None, dict[str, float]]] = {}
    for (_e, b), (vn, counts) in pooled_feedback(rows, config.half_life, until).items():
        _v, total = pooled.setdefault(b, (vn, {}))
        for name, value in counts.items():
            total[name] = total.get(name, 0.0) + value
    for b, vn in (brokers or {}).items():
        pooled.setdefault(b, (vn, {}))
    tau = config.tau()
    out: dict[str, BrokerTrust] = {}
    for b, (vn, counts) in sorted(pooled.items()):
        vector = vector_from_counts(counts, config.prior_of(b, vn))
        value = tau(vector)
        losses = trust_losses(vector, config.weights, config.function)
        worst = max(sorted(losses), key=lambda n: losses[n], default=None)
        pulled = worst if worst is not None and losses[worst] > 1e-9 else None
        events = counts.get("events", 0.0)
        out[b] = BrokerTrust(b, vn, value, vector, events, pulled)
    return out


def vn_trust(reports: Mapping[str, BrokerTrust]) -> dict[str, float]:
    """A VN's trust: its least trusted replica's (any replica can corrupt what it forwards)."""
    out: dict[str, float] = {}
    for r in reports.values():
        if r.vn is not None:
            out[r.vn] = min(out.get(r.vn, 1.0), r.trust)
    return out


def trust_curve(
    rows: Iterable[Mapping[str, Any]], config: TrustConfig, broker: str
) -> list[tuple[float, float]]:
    """``broker``'s trust as it stood after each window: (window start, trust)."""
    kept = list(rows)
    windows = sorted({float(r["w"]) for r in kept})
    curve = []
    for w in windows:
        report = broker_trust(kept, config, until=w).get(broker)
        if report is not None:
            curve.append((w, report.trust))
    return curve


def _unit(value: object, name: str) -> float:
    v = _number(value, name)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name}: must lie in [0, 1], got {value!r}")
    return v


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    return float(value)


def _clip(value: float) -> float:
    return min(1.0, max(0.0, value))
