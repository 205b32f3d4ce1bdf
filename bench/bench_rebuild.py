"""The trust-aware rebuild planner: quality against exhaustive search, time at 20-200 VNs.

Not a test. Run from the repository root:

    .venv/bin/python bench/bench_rebuild.py            # full run, about 3 minutes on 2 cores
    .venv/bin/python bench/bench_rebuild.py --quick    # smoke run, seconds
    .venv/bin/python bench/bench_rebuild.py --mtpsto   # tabu-direct's misses, about 10 minutes

Workload (the same generator as tests/reconfig/test_rebuild.py): a uniformly random labelled
tree over n VNs; n/2 demand classes, each a random publisher VN with 3 random subscriber VNs and
a demand in 1..10; each VN's trust drawn from {1.0, 0.95, 0.9, 0.8, 0.6, 0.3} (so about one VN
in six is distrusted, below 0.5); OCBR cost with unit link and broker costs (SPEC defaults).

* **Quality**: on small trees the heuristic search (``exact_up_to=0``) is given the budget of
  the exhaustive optimum (all n^(n-2) trees) and compared with it: same number of distrusted
  non-leaves, and the social-trust gap.
* **Time**: the planner as ``trellis rebuild`` runs it (default parameters: ε = 0.1, exact up
  to 6 VNs, heuristic above), medians over 3 seeds: wall time, moves, cost and social trust
  before/after, distrusted VNs in transit before/after.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from overlay.tree import Tree, broker_names, random_tree
from reconfig.cost import CostModel
from reconfig.rebuild import (
    DemandClasses,
    RebuildParams,
    plan_rebuild,
    transit_vns,
)

TRUST_LEVELS = (1.0, 0.95, 0.9, 0.8, 0.6, 0.3)


def problem(n: int, seed: int) -> tuple[Tree, DemandClasses, dict[str, float]]:
    rng = random.Random(seed)
    names = broker_names(n, "v")
    tree = random_tree(names, rng)
    classes: dict[tuple[str, frozenset[str]], float] = {}
    for _ in range(max(2, n // 2)):
        src = rng.choice(names)
        dsts = frozenset(rng.sample([x for x in names if x != src], min(3, n - 1)))
        classes[(src, dsts)] = float(rng.randint(1, 10))
    trust = {x: rng.choice(TRUST_LEVELS) for x in names}
    return tree, classes, trust


def quality(sizes: list[int], seeds: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        optimal = 0
        gaps = []
        t_exact, t_heur = [], []
        for seed in range(seeds):
            tree, classes, trust = problem(n, seed)
            started = time.perf_counter()
            exact = plan_rebuild(
                tree, classes, trust, CostModel(), params=RebuildParams(exact_up_to=n)
            )
            t_exact.append(time.perf_counter() - started)
            started = time.perf_counter()
            heur = plan_rebuild(
                tree,
                classes,
                trust,
                CostModel(),
                params=RebuildParams(exact_up_to=0),
                budget=exact.budget,
                rng=random.Random(seed),
            )
            t_heur.append(time.perf_counter() - started)
            same_viol = heur.score_after.violations == exact.score_after.violations
            gap = exact.score_after.social - heur.score_after.social
            gaps.append(gap if same_viol else float("inf"))
            optimal += same_viol and gap <= 1e-9
        rows.append(
            {
                "n": n,
                "problems": seeds,
                "optimal": optimal,
                "worst_gap": max(gaps),
                "mean_gap": statistics.fmean(gaps),
                "exact_s": statistics.median(t_exact),
                "heuristic_s": statistics.median(t_heur),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def timing(sizes: list[int], seeds: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        runs = []
        for seed in range(seeds):
            tree, classes, trust = problem(n, seed)
            started = time.perf_counter()
            plan = plan_rebuild(tree, classes, trust, CostModel(), rng=random.Random(seed))
            seconds = time.perf_counter() - started
            bad_before = transit_vns(tree, classes) & plan.distrusted
            bad_after = transit_vns(plan.after, classes) & plan.distrusted
            runs.append(
                {
                    "seconds": seconds,
                    "moves": len(plan.moves),
                    "cost_before": plan.score_before.cost,
                    "cost_after": plan.score_after.cost,
                    "best_cost": plan.best_cost,
                    "trust_before": plan.score_before.social,
                    "trust_after": plan.score_after.social,
                    "distrusted": len(plan.distrusted),
                    "transit_before": len(bad_before),
                    "transit_after": len(bad_after),
                    "flagged": len(plan.flagged),
                }
            )
        row: dict[str, Any] = {"n": n}
        for key in runs[0]:
            row[key] = statistics.median(r[key] for r in runs)
        row["after_over_best_cost"] = statistics.median(
            r["cost_after"] / r["best_cost"] for r in runs
        )
        # Medians hide the one run in three that keeps a distrusted VN in transit: count them.
        row["runs"] = len(runs)
        row["runs_with_transit_after"] = sum(r["transit_after"] > 0 for r in runs)
        row["flagged_total"] = sum(r["flagged"] for r in runs)
        row["trust_after_min"] = min(r["trust_after"] for r in runs)
        row["seconds_max"] = max(r["seconds"] for r in runs)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def mtpsto(sets: list[tuple[str, int]]) -> dict[str, Any]:
    """tabu-direct as the planner inherits it, against the proven optimum (SPEC §6 problems).

    Three variants per problem: ``plain`` (no kicks, no exact first: the search as it was),
    ``kicks`` (the heuristic alone, with kicks) and ``default`` (exact first, then kicks);
    1 s limit each, as bench/bench_mtpsto.py gives tabu-direct.
    """
    from overlay.pst import compile_problem
    from reconfig.mtpsto import generate_set, solve_exact, solve_tabu_direct

    variants = {
        "plain": {"kicks": 0, "exact_share": None},
        "kicks": {"exact_share": None},
        "default": {},
    }
    gaps: dict[str, list[float]] = {v: [] for v in variants}
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    feasible = 0
    for set_name, seed in sets:
        for problem in generate_set(set_name, seed):
            inst = compile_problem(problem)
            exact = solve_exact(inst, time_limit=30.0)
            if exact.evaluation is None or not exact.proven_optimal:
                continue
            feasible += 1
            for v, kwargs in variants.items():
                sol = solve_tabu_direct(inst, time_limit=1.0, **kwargs)  # type: ignore[arg-type]
                ok = sol.evaluation is not None and sol.evaluation.within_budget
                trust = sol.evaluation.trust if ok and sol.evaluation else 0.0
                gaps[v].append(1.0 - trust / exact.evaluation.trust)
                seconds[v].append(sol.seconds)
    out: dict[str, Any] = {"sets": [f"{s}{seed}" for s, seed in sets], "feasible": feasible}
    for v in variants:
        out[v] = {
            "optimal": sum(g <= 1e-9 for g in gaps[v]),
            "worst_gap": max(gaps[v], default=0.0),
            "median_s": statistics.median(seconds[v]) if seconds[v] else 0.0,
            "max_s": max(seconds[v], default=0.0),
        }
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few seeds")
    parser.add_argument(
        "--mtpsto", action="store_true", help="only tabu-direct against the exact solver"
    )
    args = parser.parse_args()
    if args.mtpsto:
        mtpsto([("A", 2), ("A", 3), ("B", 2), ("B", 3), ("C", 2)])
        return
    if args.quick:
        quality([5], 3)
        timing([20], 1)
        return
    quality([4, 5, 6, 7], 30)
    timing([20, 50, 100, 200], 3)


if __name__ == "__main__":
    main()
