"""``trellis pst``: solve MTPSTO problem files and generate the seed's problem sets.

``broker/tools/cli.py`` calls :func:`add_pst_parser` only when ``trellis pst`` runs (so no other
command loads the solvers) and dispatches ``args.func(args)``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from overlay.pst import InvalidProblem, compile_problem, problem_from_dict
from reconfig.mtpsto.common import Solution, solution_to_dict
from reconfig.mtpsto.exact import solve_exact
from reconfig.mtpsto.generator import SETS, generate_set, write_problems
from reconfig.mtpsto.heuristics import solve_spt, solve_tm
from reconfig.mtpsto.tabu import solve_tabu_direct, solve_tabu_seed

__all__ = ["SOLVERS", "add_pst_parser", "cmd_generate", "cmd_solve"]

SOLVERS = ("exact", "tabu", "tabu-direct", "tm", "spt")


def add_pst_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    *,
    positive_int: Callable[[str], int] = int,
    positive_float: Callable[[str], float] = float,
) -> None:
    """Register ``pst solve`` and ``pst generate`` on the top-level subparsers.

    ``positive_int`` and ``positive_float`` parse ``--graphs-per-size`` and
    ``--time-limit``: the ``trellis`` command passes its own, which refuse 0 and below in the
    words of its other commands.
    """
    pst = subparsers.add_parser("pst", help="most trusted publish/subscribe trees (MTPSTO)")
    sub = pst.add_subparsers(dest="pst_command", required=True)

    solve = sub.add_parser("solve", help="solve a problem file and print the tree as JSON")
    solve.add_argument(
        "problem", type=Path, help="problem JSON (format: README.md, MTPSTO problem files)"
    )
    solve.add_argument(
        "--solver", choices=SOLVERS, default="exact", help="which solver (default: %(default)s)"
    )
    solve.add_argument(
        "--time-limit",
        type=positive_float,
        metavar="S",
        default=None,
        help="seconds (exact: return the best tree so far, unproven; default: none, but 1 "
        "for tabu-direct)",
    )
    solve.set_defaults(func=cmd_solve)

    gen = sub.add_parser("generate", help="write the seed's problem sets as JSON files")
    gen.add_argument(
        "--set",
        dest="set_name",
        choices=sorted(SETS),
        required=True,
        help="problem set by number of routers: A 0-9, B 10-19, C 20-100 (in tens)",
    )
    gen.add_argument("--seed", type=int, required=True, help="random seed (the same set again)")
    gen.add_argument("--out", type=Path, required=True, help="output directory")
    gen.add_argument(
        "--graphs-per-size",
        type=positive_int,
        metavar="N",
        default=1,
        help="connectivity graphs per number of routers (default: %(default)s)",
    )
    gen.set_defaults(func=cmd_generate)


def _run(solver: str, problem_path: Path, time_limit: float | None) -> Solution:
    problem = problem_from_dict(json.loads(problem_path.read_text()))
    inst = compile_problem(problem)
    if solver == "exact":
        return solve_exact(inst, time_limit=time_limit)
    if solver == "tabu":
        return solve_tabu_seed(inst, time_limit=time_limit)
    if solver == "tabu-direct":
        return solve_tabu_direct(inst, time_limit=1.0 if time_limit is None else time_limit)
    if solver == "tm":
        return solve_tm(inst)
    return solve_spt(inst)


def cmd_solve(args: argparse.Namespace) -> int:
    """Print the solution as one JSON object; exit 2 on a bad problem file, 1 if no tree."""
    try:
        sol = _run(args.solver, args.problem, args.time_limit)
    except OSError as exc:
        print(f"trellis pst solve: error: {args.problem}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except (ValueError, InvalidProblem) as exc:
        print(f"trellis pst solve: error: {args.problem}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(solution_to_dict(sol), sort_keys=True))
    return 0 if sol.tree is not None else 1


def cmd_generate(args: argparse.Namespace) -> int:
    """Write one file per problem and list the paths on stdout."""
    problems = generate_set(args.set_name, args.seed, graphs_per_size=args.graphs_per_size)
    for path in write_problems(problems, args.out):
        print(path)
    return 0
