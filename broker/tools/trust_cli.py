"""``trellis trust show`` and ``trellis rebuild``: observed trust and the trust-aware planner.

Both read the analytics job's *outputs* (``trellis analytics run --out OUT``): the Parquet
tables ``trust_feedback`` and ``classes`` and ``summary.json``, with pyarrow, so neither loads
Spark (nor imports ``analytics``: the tables' columns are the contract). The operator's
``[trust]`` section comes from a TOML file (``--config``; for ``rebuild``, ``DIR/trust.toml``
when present). ``trellis rebuild`` plans from the overlay's live tree and, without
``--dry-run``, applies the plan's moves live one at a time (:mod:`broker.tools.rebuild_apply`);
the hysteresis memory of a fully applied plan is kept in ``DIR/rebuild-state.json``.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.tools.analytics_outputs import read_table

if TYPE_CHECKING:  # the handlers import these: `trellis broker` must not pay for them
    from reconfig.rebuild import DemandClasses, RebuildPlan
    from security.trust import BrokerTrust, TrustConfig

__all__ = ["add_rebuild_parser", "add_trust_parser", "load_trust_config"]

STATE_FILE = "rebuild-state.json"
"""Where ``trellis rebuild`` keeps the hysteresis memory between runs, in ``--dir``."""


def load_trust_config(path: Path | None) -> TrustConfig:
    """The ``[trust]`` section of a TOML file (defaults without a file or a section)."""
    from security.trust import TrustConfig

    if path is None:
        return TrustConfig()
    try:
        data = tomllib.loads(path.read_text("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None
    section = data.get("trust", {})
    if not isinstance(section, Mapping):
        raise ValueError(f"{path}: [trust] must be a table")
    try:
        return TrustConfig.from_mapping(section)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


# -- trellis trust show ------------------------------------------------------------------------


def add_trust_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``trellis trust show --from OUT [--config FILE] [--curve BROKER] [--json]``."""
    p = sub.add_parser("trust", help="brokers' trust from the analytics job's trust feedback")
    verbs = p.add_subparsers(dest="verb", required=True, help="show: each broker's trust")
    show = verbs.add_parser("show", help="each broker's trust and what pulled it down")
    show.add_argument("--from", dest="source", required=True, help="analytics output (--out)")
    show.add_argument("--config", type=Path, help="TOML file with a [trust] section")
    show.add_argument("--curve", metavar="BROKER", help="also print BROKER's trust per window")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=cmd_trust_show)


def cmd_trust_show(args: argparse.Namespace) -> int:
    from security.trust import broker_trust, trust_curve, vn_trust

    config = load_trust_config(args.config)
    rows = read_table(Path(args.source), "trust_feedback")
    reports = broker_trust(rows, config)
    vns = vn_trust(reports)
    if args.curve is not None and args.curve not in reports:
        raise ValueError(
            f"--curve {args.curve}: no such broker in the trust feedback of {args.source}; "
            + (f"its brokers are {' '.join(reports)}" if reports else "it judges no broker")
        )
    curve = trust_curve(rows, config, args.curve) if args.curve else None
    if args.json:
        print(
            json.dumps(
                {
                    "function": config.function,
                    "brokers": [_report_dict(r) for r in reports.values()],
                    "vns": dict(sorted(vns.items())),
                    **({"curve": [list(p) for p in curve]} if curve is not None else {}),
                },
                indent=2,
            )
        )
        return 0
    if not reports:
        print("no trust feedback in the analytics output (no broker was judged)")
        return 0
    print(f"{'broker':<10} {'vn':<6} {'trust':>6}  {'evidence':>8}  pulled down by")
    for r in reports.values():
        why = (
            "-"
            if r.pulled_down_by is None
            else (f"{r.pulled_down_by} = {r.vector[r.pulled_down_by]:.3f}")
        )
        print(f"{r.broker:<10} {r.vn or '-':<6} {r.trust:>6.3f}  {r.events:>8.0f}  {why}")
    print(
        "VN trust (least trusted replica): "
        + ", ".join(f"{vn} {t:.3f}" for vn, t in sorted(vns.items()))
    )
    if curve is not None:
        print(f"{args.curve} per window: " + ", ".join(f"{w:g}: {t:.3f}" for w, t in curve))
    return 0


def _report_dict(r: BrokerTrust) -> dict[str, Any]:
    return {
        "broker": r.broker,
        "vn": r.vn,
        "trust": r.trust,
        "pulled_down_by": r.pulled_down_by,
        "events": r.events,
        "vector": dict(r.vector),
    }


# -- trellis rebuild --------------------------------------------------------------------------


def add_rebuild_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``trellis rebuild --dir DIR --from OUT [--epsilon E] [--dry-run] [--json]``."""
    p = sub.add_parser(
        "rebuild", help="plan a trust-aware rebuild of a local overlay from analytics outputs"
    )
    p.add_argument("--dir", required=True, help="the overlay's directory (trellis up --dir)")
    p.add_argument("--from", dest="source", required=True, help="analytics output (--out)")
    p.add_argument(
        "--epsilon",
        type=float,
        default=0.1,
        metavar="E",
        help="cost budget: (1+E) x the best cost found (default: %(default)s)",
    )
    p.add_argument("--config", type=Path, help="[trust] TOML file (default: DIR/trust.toml)")
    p.add_argument("--dry-run", action="store_true", help="print the plan only")
    p.add_argument(
        "--move-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds one live move may take (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_rebuild)


@dataclass(frozen=True)
class PlannedRebuild:
    """A plan and what it was made from (the live tree, the VNs' trust, the demand)."""

    info: Mapping[str, Any]
    tree_from: str
    trust: Mapping[str, float]
    classes: DemandClasses
    plan: RebuildPlan


def plan_for_overlay(
    workdir: Path, out: Path, *, epsilon: float = 0.1, config_path: Path | None = None
) -> PlannedRebuild:
    """Plan a rebuild of the local overlay in ``workdir`` from the analytics outputs ``out``,
    starting from its live tree (the tree it started as when no broker answers) and the
    hysteresis memory of the last applied plan (``DIR/rebuild-state.json``)."""
    from broker.tools.local import read_overlay
    from broker.tools.rebuild_apply import live_tree
    from overlay.tree import Tree
    from reconfig.cost import CostModel
    from reconfig.rebuild import RebuildParams, TrustState, classes_from_rows, plan_rebuild
    from security.trust import broker_trust, vn_trust

    if config_path is None and (workdir / "trust.toml").is_file():
        config_path = workdir / "trust.toml"
    config = load_trust_config(config_path)
    info = read_overlay(workdir)
    vn_of = {b: vn for vn, members in info["vns"].items() for b in members}
    source = "live links"
    tree = live_tree(info, timeout=2.0) if info.get("brokers") else None
    if tree is None:
        tree = Tree(info["vns"], [tuple(lk) for lk in info["links"]])
        source = "the tree it started as (brokers not answering)"
    classes = classes_from_rows(read_table(out, "classes"))
    reports = broker_trust(read_table(out, "trust_feedback"), config, brokers=vn_of)
    trust = {vn: t for vn, t in vn_trust(reports).items() if vn in tree.brokers}
    state_path = workdir / STATE_FILE
    state = (
        TrustState.from_dict(json.loads(state_path.read_text("utf-8")))
        if state_path.is_file()
        else TrustState()
    )
    plan = plan_rebuild(
        tree, classes, trust, CostModel(), params=RebuildParams(epsilon=epsilon), state=state
    )
    return PlannedRebuild(info, source, trust, classes, plan)


def save_state(workdir: Path, plan: RebuildPlan) -> None:
    """Keep the plan's hysteresis memory for the next plan (written atomically)."""
    path = workdir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan.state.to_dict(), indent=2) + "\n", "utf-8")
    tmp.replace(path)


def cmd_rebuild(args: argparse.Namespace) -> int:
    import asyncio

    from broker.tools.rebuild_apply import apply_moves_live

    workdir = Path(args.dir)
    planned = plan_for_overlay(
        workdir, Path(args.source), epsilon=args.epsilon, config_path=args.config
    )
    plan = planned.plan
    if args.dry_run:
        if args.json:
            print(
                json.dumps(
                    {"tree_from": planned.tree_from, "trust": planned.trust, **plan.to_dict()},
                    indent=2,
                )
            )
        else:
            print(planned_text(planned))
        return 0
    if not args.json:
        print(planned_text(planned), flush=True)
    report = asyncio.run(
        apply_moves_live(planned.info, plan.before, plan.moves, timeout=args.move_timeout)
    )
    if report.ok:
        save_state(workdir, plan)  # the next plan starts from the tree this one made
    if args.json:
        print(
            json.dumps(
                {
                    "tree_from": planned.tree_from,
                    "trust": planned.trust,
                    **plan.to_dict(),
                    "applied": report.to_dict(),
                },
                indent=2,
            )
        )
    else:
        print(report.describe())
    return 0 if report.ok else 1


def planned_text(planned: PlannedRebuild) -> str:
    """The tree a plan starts from, then the plan (:func:`describe_plan`)."""
    tree = planned.plan.before
    return (
        f"tree ({planned.tree_from}): "
        + " ".join(f"{a}-{b}" for a, b in sorted(tree.links))
        + "\n"
        + describe_plan(planned.plan, planned.trust, planned.classes)
    )


def describe_plan(plan: RebuildPlan, trust: Mapping[str, float], classes: DemandClasses) -> str:
    """The plan for people: moves, cost and social trust before/after, demoted and flagged."""
    from reconfig.rebuild import transit_vns

    b, a = plan.score_before, plan.score_after
    lines = [
        "VN trust: " + ", ".join(f"{vn} {t:.3f}" for vn, t in sorted(trust.items())),
        f"distrusted: {', '.join(sorted(plan.distrusted)) or 'none'}",
        f"cost: {b.cost:g} -> {a.cost:g} (best found {plan.best_cost:g}, budget {plan.budget:g})",
        f"social trust: {b.social:.4f} -> {a.social:.4f}",
        f"distrusted in transit: "
        f"{', '.join(sorted(transit_vns(plan.before, classes) & plan.distrusted)) or 'none'}"
        f" -> {', '.join(sorted(transit_vns(plan.after, classes) & plan.distrusted)) or 'none'}",
        f"demoted to leaves: {', '.join(plan.demoted) or 'none'}",
        f"flagged for detach: {', '.join(plan.flagged) or 'none'}",
        f"decision: {plan.reason}{' (exhaustive search)' if plan.exact else ''}, "
        f"{len(plan.moves)} move(s)",
    ]
    for i, m in enumerate(plan.moves, 1):
        lines.append(f"  {i}. at {m.master}: {m.remove[0]}-{m.remove[1]} -> {m.add[0]}-{m.add[1]}")
    return "\n".join(lines)
