"""``trellis placement plan``: the replica placement of SPEC §4 for a local overlay.

Reads the overlay ``trellis up`` started in ``--dir`` (``manifest.json``: the VN tree and which
broker belongs to which VN; ``overlay.json``: the replicas each VN runs; the brokers'
``/healthz``: the VN tree as live reconfiguration left it, when they answer), the operator's
``[placement]`` section (``--config``) and, with ``--from``, the analytics job's outputs: the
Parquet tables ``classes`` (the end-to-end paths, unless the config lists them),
``path_failures`` (γ) and ``broker_failures`` (each VN's failures, summed over its replicas),
read with pyarrow so that neither Spark nor the ``analytics`` package is loaded (the tables'
columns are the contract). Prints the plan, its warnings and the diff against the overlay.

``trellis placement apply`` computes the same plan and makes it so live: it attaches and
detaches replicas one at a time (:mod:`broker.tools.placement_apply`), or, with
``--dry-run`` or when no broker of the overlay runs, prints the actions it would take.

With ``--compose FILE`` (the deployment's ``docker-compose.yml``; ``--project`` its compose
project) both act on the compose deployment instead: ``--dir`` is then its keys dir
(``compose_gen.py keys --dir``), the replica counts are the manifest's, the running brokers
the project's containers (:mod:`broker.tools.placement_compose`). A ``--dir`` that holds a
manifest, ``ca/`` and ``tls/ca.crt`` but no ``overlay.json`` is a compose keys dir: without
``--compose`` it is refused, naming the option, rather than read as a local overlay.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.tools.analytics_outputs import read_table

if TYPE_CHECKING:  # the handler imports these: `trellis broker` must not pay for them
    from broker.tools.placement_apply import Replicas
    from overlay.placement import NodeFailures, PathKey, Plan, ReplicaChange
    from overlay.placement_config import PlacementConfig
    from overlay.tree import Tree

__all__ = ["Evidence", "add_placement_parser", "read_evidence"]


@dataclass
class Evidence:
    """What the analytics outputs say, over the windows kept."""

    windows: list[float] = field(default_factory=list)
    paths: list[PathKey] = field(default_factory=list)
    path_failures: dict[PathKey, int] = field(default_factory=dict)
    broker_failures: dict[str, NodeFailures] = field(default_factory=dict)
    all_windows: int = 0


def read_evidence(out: Path, latest: int | None = None) -> Evidence:
    """Paths (from the demand classes), path failures and broker failures, summed over the
    ``latest`` windows of the output (all when None)."""
    from overlay.placement import NodeFailures

    classes = read_table(out, "classes")
    paths = read_table(out, "path_failures")
    brokers = read_table(out, "broker_failures")
    windows = sorted({float(r["w"]) for r in (*classes, *paths, *brokers)})
    kept = windows if latest is None else windows[-latest:]
    keep = set(kept)
    evidence = Evidence(windows=kept, all_windows=len(windows))
    seen: set[PathKey] = set()
    for row in classes:
        if float(row["w"]) in keep:
            for dst in row["dsts"] or []:
                seen.add((str(row["src"]), str(dst)))
    evidence.paths = sorted(seen)
    for row in paths:
        if float(row["w"]) in keep:
            key = (str(row["src"]), str(row["dst"]))
            evidence.path_failures[key] = evidence.path_failures.get(key, 0) + int(row["failed"])
    for row in brokers:
        if float(row["w"]) in keep:
            b = str(row["broker"])
            add = NodeFailures(int(row["failures"] or 0), int(row["events"] or 0))
            evidence.broker_failures[b] = evidence.broker_failures.get(b, NodeFailures()) + add
    return evidence


def running_replicas(workdir: Path) -> tuple[dict[str, int], int]:
    """Replicas per VN of the overlay in ``workdir`` (``overlay.json``), and how many of its
    brokers run now."""
    from broker.tools.local import read_overlay, running_brokers

    info = read_overlay(workdir)
    vns = info.get("vns")
    if not isinstance(vns, Mapping):
        raise ValueError(f"{workdir / 'overlay.json'}: no VNs listed")
    return {str(vn): len(ids) for vn, ids in vns.items()}, len(running_brokers(workdir))


def live_tree(workdir: Path, started: Tree) -> Tree | None:
    """The VN tree the running brokers' links form now (live reconfiguration may have moved
    links since ``started``), or None when no broker answers or the links are not a tree at
    this moment (a reconfiguration round in flight)."""
    from broker.tools.local import fetch_json, read_overlay

    info = read_overlay(workdir)
    vn_of = {b: vn for vn, members in info.get("vns", {}).items() for b in members}
    health = {}
    for broker in info.get("brokers", []):
        try:
            health[broker["id"]] = fetch_json(broker["admin"] + "/healthz")
        except (OSError, ValueError):
            continue
    return tree_of_links(started, health, vn_of)


def tree_of_links(
    started: Tree, health: Mapping[str, Any], vn_of: Mapping[str, str]
) -> Tree | None:
    """The VN tree the links in ``health`` (``/healthz`` by broker) form, or None (no broker
    answered, or not a tree now)."""
    from broker.tools.local import vn_links
    from overlay.tree import TopologyError, Tree

    if not health:
        return None
    try:
        return Tree(started.brokers, vn_links(dict(health), dict(vn_of)))
    except TopologyError:
        return None


def open_deployment(
    workdir: Path, compose: Path | None, project: str | None = None
) -> Replicas | None:
    """The compose deployment to act on (``--compose``), or None for a local overlay.

    Raises:
        OverlayError: ``workdir`` is a compose keys dir but no compose file was given.
    """
    from broker.tools.local import OverlayError
    from broker.tools.placement_compose import ComposeReplicas, is_compose_keys_dir

    if compose is not None:
        return ComposeReplicas(workdir, compose, project)
    if is_compose_keys_dir(workdir):
        raise OverlayError(
            f"{workdir} is a compose deployment's keys dir (manifest, ca/, tls/, no "
            "overlay.json): give --compose FILE (its docker-compose.yml) and, if it is not the "
            "default, --project NAME"
        )
    return None


@dataclass
class PlanReport:
    plan: Plan
    changes: list[ReplicaChange]
    config: PlacementConfig
    evidence: Evidence | None
    running: int
    workdir: Path
    tree_source: str

    def to_dict(self) -> dict[str, Any]:
        ev = self.evidence
        return {
            "dir": str(self.workdir),
            "brokers_running": self.running,
            "tree": self.tree_source,
            "windows": None if ev is None else ev.windows,
            "plan": self.plan.to_dict(),
            "diff": [c.to_dict() for c in self.changes],
        }


def make_plan(
    workdir: Path,
    source: Path | None,
    config_path: Path | None,
    tree: Tree | None = None,
    deployment: Replicas | None = None,
) -> PlanReport:
    """Everything ``trellis placement plan`` prints, as data.

    Paths follow ``tree`` when given (the tree the evidence was gathered on, say), else the
    overlay's live links, else the tree it started as. ``deployment``: a compose deployment
    (its manifest and containers) instead of the local overlay in ``workdir``.

    Raises:
        ValueError: a file is missing or invalid, or there are no paths to place on.
    """
    from broker.tools.local import OverlayError
    from overlay.manifest import Manifest
    from overlay.placement import diff, place, vn_failures
    from overlay.placement_config import load_placement_config

    config = load_placement_config(config_path)
    health: dict[str, Any] = {}
    if deployment is None:
        current, running = running_replicas(workdir)
    try:
        manifest = Manifest.load(workdir / "manifest.json")
    except FileNotFoundError:
        raise OverlayError(f"no overlay in {workdir} (missing manifest.json)") from None
    if deployment is not None:
        current = {vn: len(ids) for vn, ids in manifest.members.items()}
        health = deployment.health()
        running = len(health)
    if tree is not None:
        tree_source = "as given"
    else:
        if deployment is not None:
            vn_of = {b: vn for vn, ids in manifest.members.items() for b in ids}
            tree = tree_of_links(manifest.tree, health, vn_of)
        else:
            tree = live_tree(workdir, manifest.tree) if running else None
        tree_source = "live links" if tree is not None else "as started"
        tree = tree or manifest.tree
    evidence = None if source is None else read_evidence(source, config.windows)
    paths = config.path_keys()
    if paths is None:
        if evidence is None:
            raise ValueError(
                "no paths to place replicas on: give --from ANALYTICS_OUT (its demand classes) "
                "or list placement.paths in --config"
            )
        paths = evidence.paths
        if not paths:
            raise ValueError(f"{source}: no demand classes in the windows read; nothing to place")
    budget = config.budget if config.budget is not None else sum(current.values())
    plan = place(
        tree,
        paths,
        budget=budget,
        path_failures=None if evidence is None else evidence.path_failures,
        node_failures=None
        if evidence is None
        else vn_failures(evidence.broker_failures, manifest.owner),
        weights=config.omega(paths),
        max_per_path=config.max_per_path,
        once_per_node=config.once_per_node,
    )
    changes = diff(plan.replicas, current)
    return PlanReport(plan, changes, config, evidence, running, workdir, tree_source)


def format_report(report: PlanReport) -> str:
    plan, ev = report.plan, report.evidence
    source = (
        "no failure data (γ uniform, VNs even)"
        if ev is None
        else f"{len(ev.windows)} of {ev.all_windows} analytics window(s)"
    )
    variant = ", once per node" if report.config.once_per_node else ""
    limit = report.config.max_per_path
    lines = [
        f"placement plan for {report.workdir}: budget {plan.budget}"
        + (f", max {limit} per path" if limit is not None else "")
        + f"{variant}; {source}; VN tree: {report.tree_source}",
        "paths, by priority (ρ = hops × γ × ω):",
    ]
    for p in plan.paths:
        spread = " ".join(f"{vn}+{n}" for vn, n in p.by_node.items() if n) or "-"
        lines.append(
            f"  {p.path[0]} -> {p.path[1]}: hops {p.hops} γ {float(p.gamma):.3f} "
            f"ω {float(p.omega):g} ρ {float(p.priority):.3f} → {p.replicas} replica(s): {spread}"
        )
    extras = []
    if plan.surplus:
        extras.append(f"surplus {plan.surplus} handed to VNs with r < 3")
    if plan.cut:
        extras.append("cut by max_per_path: " + " ".join(f"{v}-{n}" for v, n in plan.cut.items()))
    if plan.unplaced:
        extras.append(f"{plan.unplaced} of the budget unplaced")
    lines += [f"  {e}" for e in extras]
    note = "" if report.running else " (no broker runs now: as last started)"
    lines.append(f"VN replicas, overlay{note} → plan:")
    for c in report.changes:
        what = {"attach": f"attach {c.delta}", "detach": f"detach {-c.delta}", "keep": "keep"}
        lines.append(f"  {c.vn}: {c.current} → {c.planned}  {what[c.action]}")
    if plan.warnings:
        lines.append("warnings:")
        lines += [f"  {w.message}" for w in plan.warnings]
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    workdir = Path(args.dir)
    report = make_plan(
        workdir,
        None if args.source is None else Path(args.source),
        None if args.config is None else Path(args.config),
        deployment=open_deployment(workdir, _path(args.compose), args.project),
    )
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
    return 0


def planned_actions(changes: list[ReplicaChange]) -> list[tuple[str, str]]:
    """(action, VN) one replica at a time: attaches first, so capacity never dips."""
    attach = [("attach", c.vn) for c in changes for _ in range(max(c.delta, 0))]
    detach = [("detach", c.vn) for c in changes for _ in range(max(-c.delta, 0))]
    return attach + detach


def cmd_apply(args: argparse.Namespace) -> int:
    from broker.tools.placement_apply import LocalReplicas

    workdir = Path(args.dir)
    deployment = open_deployment(workdir, _path(args.compose), args.project)
    report = make_plan(
        workdir,
        None if args.source is None else Path(args.source),
        None if args.config is None else Path(args.config),
        deployment=deployment,
    )
    actions = planned_actions(report.changes)
    print(format_report(report))
    if not actions:
        print("nothing to apply: the overlay already runs the plan")
        return 0
    if args.dry_run or not report.running:
        why = "dry run" if args.dry_run else "no broker of the overlay runs"
        print(f"actions ({why}; not applied):")
        for action, vn in actions:
            print(f"  {action} one replica {'to' if action == 'attach' else 'from'} {vn}")
        return 0
    replicas = deployment or LocalReplicas(workdir)
    print("applying:")
    for action, vn in actions:
        change = replicas.attach(vn) if action == "attach" else replicas.detach(vn)
        behind = (
            f"; {change.clients_behind} client connection(s) of {change.vn} did not follow "
            "in time (they are told again when they reconnect)"
            if change.clients_behind
            else ""
        )
        print(
            f"  {change.action} {change.broker} ({change.vn}): {change.seconds:.2f} s, "
            f"manifest version {change.version}{behind}",
            flush=True,
        )
    return 0


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


def add_placement_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """``trellis placement plan`` and ``trellis placement apply``."""
    p = subparsers.add_parser(
        "placement",
        help="plan replica placement for a local overlay or the compose deployment and apply "
        "it live",
    )
    sub = p.add_subparsers(
        dest="placement_command", required=True, metavar="COMMAND", help="plan, apply"
    )
    plan = sub.add_parser(
        "plan", help="print the three-phase placement plan and its diff against the overlay"
    )
    apply = sub.add_parser(
        "apply", help="compute the plan and attach/detach replicas live to make it so"
    )
    for parser in (plan, apply):
        parser.add_argument(
            "--dir",
            required=True,
            metavar="DIR",
            help="a local overlay's directory (trellis up), or with --compose the compose "
            "deployment's keys dir (compose_gen.py keys --dir)",
        )
        parser.add_argument(
            "--compose",
            metavar="FILE",
            help="act on the compose deployment of this docker-compose.yml (default: DIR is a "
            "local overlay)",
        )
        parser.add_argument(
            "--project",
            metavar="NAME",
            help="with --compose: its compose project (default: COMPOSE_PROJECT_NAME or the "
            "file's directory name, as docker-compose has it)",
        )
        parser.add_argument(
            "--from",
            dest="source",
            metavar="ANALYTICS_OUT",
            help="analytics output (trellis analytics run --out): demand classes and failures "
            "(default: none; paths then come from --config)",
        )
        parser.add_argument(
            "--config",
            metavar="FILE",
            help="TOML file with a [placement] section (default: built-in defaults)",
        )
    plan.add_argument("--json", action="store_true", help="the plan and the diff as JSON")
    plan.set_defaults(func=cmd_plan)
    apply.add_argument(
        "--dry-run", action="store_true", help="print the attach/detach actions, do nothing"
    )
    apply.set_defaults(func=cmd_apply)
