"""OCBR local reconfiguration vs a random initial tree and a centralised tabu (SPEC §10).

Not a test. Run from the repository root:

    .venv/bin/python bench/bench_ocbr.py            # full run, about 4.5 minutes on 2 cores
    .venv/bin/python bench/bench_ocbr.py --quick    # smoke run, seconds

For every overlay size and seed: a clustered workload on a uniformly random tree; rounds of local
reconfiguration (reconfig.simulator, locking semantics included) until a full sweep moves nothing
or the round cap; then, from the same initial tree, the same tabu move structure run centrally
over all brokers. Both are measured in this run, on the same instances; medians over seeds.

Two cost models: ``unit`` (SPEC defaults: every link and broker costs 1, α = β = 1) and ``geo``
(links cost 10 × the distance between random broker positions in the unit square, brokers 1).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from reconfig.cost import CostModel
from reconfig.ocbr import TabuParams, centralised_tabu
from reconfig.simulator import clustered_workload, geometric_model, simulate

LOCAL = {
    # N = 8, n = 30, tenure 3, grown to N >= nodes and n >= 2 x nodes around hubs.
    "adaptive": TabuParams(candidates=8, iterations=30, tenure=3, adaptive=True),
    # The same numbers, fixed whatever the neighbourhood's size.
    "fixed": TabuParams(candidates=8, iterations=30, tenure=3),
}


def central_params(n: int) -> TabuParams:
    """The baseline's budget: 60 candidates per iteration, 10 iterations per broker.

    600·n candidate moves priced, far more than any master prices in a whole simulation; at
    100 brokers about 15 s on one unloaded core.
    """
    return TabuParams(candidates=60, iterations=10 * n, tenure=10)


@dataclass
class Run:
    model: str
    n: int
    seed: int
    initial: float
    ocbr: float
    central: float
    converged: bool
    rounds: int
    moves: int
    links_changed: int
    ocbr_s: float
    central_s: float

    @property
    def below_initial(self) -> float:
        return 1.0 - self.ocbr / self.initial

    @property
    def vs_central(self) -> float:
        return self.ocbr / self.central - 1.0


def run_one(model_name: str, n: int, seed: int, max_rounds: int, local: TabuParams) -> Run:
    rng = random.Random(seed)
    work = clustered_workload(n, rng)
    if model_name == "unit":
        model = CostModel()
    else:
        model = geometric_model(sorted(work.tree.brokers), random.Random(seed + 10_000))
    t0 = time.perf_counter()
    sim = simulate(
        work.tree, work.demands, model, rng=random.Random(seed), params=local, max_rounds=max_rounds
    )
    t1 = time.perf_counter()
    central = centralised_tabu(
        work.tree, work.demands, model, rng=random.Random(seed), params=central_params(n)
    )
    t2 = time.perf_counter()
    return Run(
        model=model_name,
        n=n,
        seed=seed,
        initial=sim.initial_cost,
        ocbr=sim.final_cost,
        central=central.cost_after,
        converged=sim.converged,
        rounds=len(sim.rounds),
        moves=sim.moves,
        links_changed=sim.links_changed,
        ocbr_s=t1 - t0,
        central_s=t2 - t1,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 50, 100])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--seeds-large", type=int, default=5, help="seeds at >= 100 brokers")
    parser.add_argument("--models", nargs="+", default=["unit", "geo"], choices=["unit", "geo"])
    parser.add_argument("--max-rounds", type=int, default=300)
    parser.add_argument("--local", choices=sorted(LOCAL), default="adaptive", help="master params")
    parser.add_argument("--budget", type=float, default=540.0, help="stop starting runs after s")
    parser.add_argument("--quick", action="store_true", help="sizes 20 50, 2 seeds")
    parser.add_argument("--json", type=Path, help="also write every run as JSON here")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.seeds = [20, 50], 2

    start = time.perf_counter()
    runs: list[Run] = []
    skipped = 0
    for model_name in args.models:
        for n in args.sizes:
            for seed in range(args.seeds if n < 100 else min(args.seeds, args.seeds_large)):
                if time.perf_counter() - start > args.budget:
                    skipped += 1
                    continue
                run = run_one(model_name, n, seed, args.max_rounds, LOCAL[args.local])
                runs.append(run)
                print(
                    f"{model_name:4} n={n:3} seed={seed} initial={run.initial:10.0f} "
                    f"ocbr={run.ocbr:9.0f} central={run.central:9.0f} "
                    f"below_initial={run.below_initial:6.1%} vs_central={run.vs_central:+6.1%} "
                    f"rounds={run.rounds:3}{'' if run.converged else '*'} moves={run.moves:3} "
                    f"ocbr={run.ocbr_s:5.1f}s central={run.central_s:5.1f}s",
                    flush=True,
                )

    print()
    print(
        "| model | brokers | seeds | below random initial | vs centralised tabu | worst vs central "
        "| converged | rounds | moves | OCBR wall s | central wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model_name in args.models:
        for n in args.sizes:
            group = [r for r in runs if r.model == model_name and r.n == n]
            if not group:
                continue
            med = statistics.median
            print(
                f"| {model_name} | {n} | {len(group)} "
                f"| {med(r.below_initial for r in group):.1%} "
                f"| {med(r.vs_central for r in group):+.1%} "
                f"| {max(r.vs_central for r in group):+.1%} "
                f"| {sum(r.converged for r in group)}/{len(group)} "
                f"| {med(r.rounds for r in group):.0f} "
                f"| {med(r.moves for r in group):.0f} "
                f"| {med(r.ocbr_s for r in group):.2f} "
                f"| {med(r.central_s for r in group):.2f} |"
            )
    total = time.perf_counter() - start
    print(f"\ntotal wall time {total:.0f} s; runs skipped for the time budget: {skipped}")
    print("(* = round cap reached before a full sweep without a move)")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    asdict(r) | {"below_initial": r.below_initial, "vs_central": r.vs_central}
                    for r in runs
                ],
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
