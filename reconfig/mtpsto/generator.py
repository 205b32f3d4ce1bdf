"""The seed's benchmark problems, regenerated (SPEC §6).

* numbers-interval model: advertisement [0.333, 0.666]; 1000 events from N(μ, σ) with
  μ = (a+b)/2 and σ = (μ−a)/3, out-of-range draws discarded; |S| = 5 subscriptions, each the
  sorted pair of two draws from the same distribution;
* connectivity graph: a connected random graph at density ≈ 0.5 rewired into power-law degrees
  by Eppstein–Wang (1000 iterations), then repaired so that it is connected and no router has
  degree < 2 (a degree-1 router can never be in a PST);
* trust graph: Klemm–Eguíluz (μ = 0.1, m = 5) over the same nodes, each direction weighted
  from N(0.5, (0.5/3)²) truncated to [0, 1];
* budgets 2000, 3000, 4000, 5000 and 2^31 − 1; sets A (0–9 routers), B (10–19), C (20–100).

Node ids: publisher 0, subscribers 1–5, routers 6…; the trust-graph roles are shuffled so the
publisher is not always in the model's initial clique. Everything flows from one
``random.Random(seed)``, so a (set, seed) pair names the same problems forever.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Sequence
from pathlib import Path

from overlay.pst import MAX_BUDGET, Problem, problem_to_dict

__all__ = [
    "BUDGETS",
    "SETS",
    "eppstein_wang_graph",
    "generate_problems",
    "generate_set",
    "klemm_eguiluz_graph",
    "write_problems",
]

ADVERTISEMENT = (0.333, 0.666)
N_EVENTS = 1000
N_SUBSCRIBERS = 5
BUDGETS: tuple[int, ...] = (2000, 3000, 4000, 5000, MAX_BUDGET)
SETS: dict[str, tuple[int, ...]] = {
    "A": tuple(range(10)),
    "B": tuple(range(10, 20)),
    "C": tuple(range(20, 101, 10)),
}


def _interval_draw(rng: random.Random) -> float:
    a, b = ADVERTISEMENT
    mu = (a + b) / 2
    sigma = (mu - a) / 3
    while True:
        x = rng.gauss(mu, sigma)
        if a <= x <= b:
            return x


def _truncated_trust(rng: random.Random) -> float:
    while True:
        x = rng.gauss(0.5, 0.5 / 3)
        if 0.0 <= x <= 1.0:
            return x


def eppstein_wang_graph(
    n: int, density: float, rng: random.Random, iterations: int = 1000, protected: int = 0
) -> set[tuple[int, int]]:
    """A connected graph on 0..n−1 with power-law-ish degrees (Eppstein & Wang rewiring).

    Start from a random connected graph with round(density·n(n−1)/2) edges; repeatedly take a
    random vertex x with an edge, drop a random edge (x, y), and add an edge (v, w) with v
    uniform and w chosen proportionally to degree (skipped if it exists). Afterwards join any
    components and give every node numbered ≥ ``protected`` degree ≥ 2.
    """
    pairs = n * (n - 1) // 2
    m = max(n - 1, min(pairs, round(density * pairs)))
    edges: set[tuple[int, int]] = set()
    order = list(range(n))
    rng.shuffle(order)
    for i in range(1, n):
        u, v = order[i], order[rng.randrange(i)]
        edges.add((min(u, v), max(u, v)))
    while len(edges) < m:
        u, v = rng.sample(range(n), 2)
        edges.add((min(u, v), max(u, v)))
    if n > 2 and len(edges) < pairs:
        adj: dict[int, set[int]] = {i: set() for i in range(n)}
        for u, v in edges:
            adj[u].add(v)
            adj[v].add(u)
        elist = sorted(edges)
        where = {e: i for i, e in enumerate(elist)}
        for _ in range(iterations):
            x = rng.choice([i for i in range(n) if adj[i]])
            y = rng.choice(sorted(adj[x]))
            v = rng.randrange(n)
            w = rng.choice(elist[rng.randrange(len(elist))])  # ∝ degree
            old = (min(x, y), max(x, y))
            e = (min(v, w), max(v, w))
            if v == w or e in where or e == old:
                continue
            i = where.pop(old)
            elist[i] = e
            where[e] = i
            adj[x].discard(y)
            adj[y].discard(x)
            adj[v].add(w)
            adj[w].add(v)
        edges = set(elist)
    _repair(n, edges, rng, protected)
    return edges


def _repair(n: int, edges: set[tuple[int, int]], rng: random.Random, protected: int) -> None:
    adj: dict[int, set[int]] = {i: set() for i in range(n)}
    for u, v in edges:
        adj[u].add(v)
        adj[v].add(u)
    seen: set[int] = set()
    comps: list[list[int]] = []
    for s in range(n):
        if s in seen:
            continue
        comp = [s]
        seen.add(s)
        for u in comp:
            for v in adj[u]:
                if v not in seen:
                    seen.add(v)
                    comp.append(v)
        comps.append(comp)
    for a, b in itertools.pairwise(comps):
        u, v = rng.choice(a), rng.choice(b)
        edges.add((min(u, v), max(u, v)))
        adj[u].add(v)
        adj[v].add(u)
    for u in range(protected, n):
        while len(adj[u]) < 2 and len(adj[u]) < n - 1:
            v = rng.choice([w for w in range(n) if w != u and w not in adj[u]])
            edges.add((min(u, v), max(u, v)))
            adj[u].add(v)
            adj[v].add(u)


def klemm_eguiluz_graph(
    n: int, rng: random.Random, m: int = 5, mu: float = 0.1
) -> set[tuple[int, int]]:
    """Klemm–Eguíluz: m active nodes; each newcomer links to every active node (or, with
    probability μ, to a degree-preferential random node), becomes active, and one active
    node is deactivated with probability ∝ 1/degree — small-world, scale-free, clustered.
    """
    edges: set[tuple[int, int]] = set()
    deg = [0] * n
    first = min(m, n)
    for i in range(first):
        for j in range(i + 1, first):
            edges.add((i, j))
            deg[i] += 1
            deg[j] += 1
    active = list(range(first))
    for new in range(first, n):
        for a in list(active):
            target = a
            if rng.random() < mu:
                pool = [v for v in range(new) if (min(v, new), max(v, new)) not in edges]
                if pool:
                    weights = [deg[v] + 1 for v in pool]
                    target = rng.choices(pool, weights=weights)[0]
            e = (min(target, new), max(target, new))
            if e not in edges:
                edges.add(e)
                deg[target] += 1
                deg[new] += 1
        leave = [1.0 / max(1, deg[a]) for a in active]
        active.pop(rng.choices(range(len(active)), weights=leave)[0])
        active.append(new)
    return edges


def generate_problems(n_routers: int, rng: random.Random, name: str = "") -> list[Problem]:
    """One graph, trust graph and event set, posed once per seed budget."""
    n = 1 + N_SUBSCRIBERS + n_routers
    events = tuple(_interval_draw(rng) for _ in range(N_EVENTS))
    subs = tuple(range(1, 1 + N_SUBSCRIBERS))
    subscriptions = {}
    for s in subs:
        lo, hi = sorted((_interval_draw(rng), _interval_draw(rng)))
        subscriptions[s] = (lo, hi)
    edges = eppstein_wang_graph(n, 0.5, rng, protected=1 + N_SUBSCRIBERS)
    roles = list(range(n))
    rng.shuffle(roles)
    trust: dict[tuple[int, int], float] = {}
    for u, v in sorted(klemm_eguiluz_graph(n, rng)):
        a, b = roles[u], roles[v]
        trust[(a, b)] = _truncated_trust(rng)
        trust[(b, a)] = _truncated_trust(rng)
    return [
        Problem(
            publisher=0,
            subscribers=subs,
            routers=tuple(range(1 + N_SUBSCRIBERS, n)),
            edges=tuple(sorted(edges)),
            trust=trust,
            events=events,
            subscriptions=subscriptions,
            advertisement=ADVERTISEMENT,
            budget=float(b),
            name=f"{name}-b{b}" if name else f"r{n_routers}-b{b}",
        )
        for b in BUDGETS
    ]


def generate_set(
    set_name: str, seed: int, graphs_per_size: int = 1, sizes: Sequence[int] | None = None
) -> list[Problem]:
    """All problems of set A, B or C for one seed (each size × graphs × 5 budgets)."""
    if set_name not in SETS:
        raise ValueError(f"unknown problem set {set_name!r}; expected one of {sorted(SETS)}")
    rng = random.Random(f"trellis-mtpsto-{set_name}-{seed}")
    out: list[Problem] = []
    for n_routers in SETS[set_name] if sizes is None else sizes:
        for g in range(graphs_per_size):
            out.extend(generate_problems(n_routers, rng, f"{set_name}{seed}-r{n_routers:03d}-g{g}"))
    return out


def write_problems(problems: Sequence[Problem], out_dir: Path) -> list[Path]:
    """Write one JSON file per problem; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, p in enumerate(problems):
        path = out_dir / f"{p.name or f'problem-{i:04d}'}.json"
        path.write_text(json.dumps(problem_to_dict(p)))
        paths.append(path)
    return paths
