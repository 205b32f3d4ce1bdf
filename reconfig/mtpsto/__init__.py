"""MTPSTO: the most trusted publish/subscribe tree within an overhead budget (SPEC §6).

Solvers: :func:`solve_exact` (branch and bound, provably optimal), :func:`solve_bruteforce`
(exhaustive, tests only), :func:`solve_tabu_seed` (the seed's tabu search),
:func:`solve_tabu_direct` (PST-to-PST moves), :func:`solve_tm` and :func:`solve_spt`.
The problem model and scoring live in :mod:`overlay.pst`, trust in :mod:`security.trust`.
"""

from reconfig.mtpsto.common import Solution, solution_to_dict
from reconfig.mtpsto.exact import enumerate_psts, solve_bruteforce, solve_exact
from reconfig.mtpsto.generator import generate_problems, generate_set, write_problems
from reconfig.mtpsto.heuristics import solve_spt, solve_tm, spt_tree, tm_tree
from reconfig.mtpsto.tabu import solve_tabu_direct, solve_tabu_seed

__all__ = [
    "Solution",
    "enumerate_psts",
    "generate_problems",
    "generate_set",
    "solution_to_dict",
    "solve_bruteforce",
    "solve_exact",
    "solve_spt",
    "solve_tabu_direct",
    "solve_tabu_seed",
    "solve_tm",
    "spt_tree",
    "tm_tree",
    "write_problems",
]
