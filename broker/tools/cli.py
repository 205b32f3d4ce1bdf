"""The ``trellis`` command line.

Each subcommand imports what it needs inside its handler: ``trellis broker`` starts a
daemon per process (a local overlay starts dozens), so it must not pay for the SDK, the
local-overlay tools or the MTPSTO solvers (networkx).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from broker.errors import TrellisError

if TYPE_CHECKING:
    from broker.client import Delivery
    from broker.language.filters import Filter
    from overlay.tree import Tree

log = logging.getLogger("trellis.cli")

T = TypeVar("T")


def setup_logging(level: str = "info") -> None:
    """One line per event: time, level, logger, message."""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop when available."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


# -- broker ---------------------------------------------------------------------------


def cmd_broker(args: argparse.Namespace) -> int:
    from broker.daemon.config import load_config
    from broker.daemon.server import run

    overrides = {
        "id": args.id,
        "host": args.host,
        "port": args.port,
        "admin_port": args.admin_port,
        "ready_file": args.ready_file,
        "log_level": args.log_level,
    }
    config = load_config(args.config, overrides)
    setup_logging(config.log_level)
    run(config)
    return 0


# -- pub / sub --------------------------------------------------------------------------


def delivery_json(msg: Delivery) -> str:
    """One JSON object per delivery; payload as text when it is UTF-8, else base64."""
    import base64

    obj: dict[str, Any] = {"publisher": msg.publisher, "seq": msg.seq, "attrs": msg.attrs}
    try:
        obj["payload"] = msg.payload.decode("utf-8")
    except UnicodeDecodeError:
        obj["payload_base64"] = base64.b64encode(msg.payload).decode("ascii")
    return json.dumps(obj, sort_keys=True)


def advertisement_for(attrs: dict[str, Any]) -> Filter:
    """The narrowest advertisement covering publications with exactly these attributes."""
    from broker.language.filters import Filter

    return Filter.from_wire([[name, "eq", value] for name, value in attrs.items()])


async def _pub(args: argparse.Namespace) -> int:
    from broker.client import Client
    from broker.language.grammar import parse_attrs

    attrs = parse_attrs(args.attrs)
    payload = args.payload.encode("utf-8")
    interval = 1.0 / args.rate if args.rate else 0.0
    client = Client(
        args.endpoint.split(","), client_id=args.client_id, key_refresh=args.key_refresh
    )
    async with client:
        await client.advertise(args.advertise or advertisement_for(attrs))
        started = time.perf_counter()
        for i in range(args.count):
            await client.publish(
                attrs, payload, ack=not args.no_ack, confidential=args.confidential
            )
            if interval:
                await asyncio.sleep(max(0.0, started + (i + 1) * interval - time.perf_counter()))
        await client.drain()
        elapsed = time.perf_counter() - started
    print(f"published {args.count} in {elapsed:.3f} s", file=sys.stderr)
    return 0


async def _sub(args: argparse.Namespace) -> int:
    from broker.client import Client
    from broker.errors import SlowConsumerError

    received = 0
    client = Client(args.endpoint.split(","), client_id=args.client_id, manifest=args.manifest)
    async with client, client.subscribe(args.filter) as sub:
        if args.ready_file:
            await asyncio.to_thread(Path(args.ready_file).write_text, "subscribed\n")
        deadline = time.monotonic() + args.timeout if args.timeout else None
        while args.count is None or received < args.count:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            try:
                msg = await sub.get(remaining)
            except SlowConsumerError as exc:
                print(f"warning: {exc}", file=sys.stderr)
                continue
            except TrellisError:
                break
            received += 1
            if args.json:
                print(delivery_json(msg), flush=not args.quiet)
            elif not args.quiet:
                print(f"{msg.publisher}#{msg.seq} {msg.attrs} {msg.payload!r}", flush=True)
    if args.count is not None and received < args.count:
        print(f"received {received} of {args.count} before the timeout", file=sys.stderr)
        return 1
    return 0


def cmd_pub(args: argparse.Namespace) -> int:
    return run_async(_pub(args))


def cmd_sub(args: argparse.Namespace) -> int:
    return run_async(_sub(args))


# -- local overlay ----------------------------------------------------------------------


def tree_for(topology: str, brokers: int, seed: int) -> Tree:
    """The overlay tree named on the command line: line, star, random or a JSON file."""
    import random

    from overlay.tree import Tree, broker_names, line_tree, random_tree, star_tree

    names = broker_names(brokers)
    if topology == "line":
        return line_tree(names)
    if topology == "star":
        return star_tree(names)
    if topology == "random":
        return random_tree(names, random.Random(seed))
    return Tree.from_dict(json.loads(Path(topology).read_text()))


def replica_counts(text: str, vns: list[str]) -> dict[str, int]:
    """``--replicas 3`` (every VN) or ``--replicas 3,1,5`` (one per VN, in order)."""
    counts = [int(part) for part in text.split(",")]
    if len(counts) == 1:
        counts *= len(vns)
    if len(counts) != len(vns) or min(counts) < 1:
        raise ValueError(f"--replicas needs 1 or {len(vns)} positive counts, got {text!r}")
    return dict(zip(vns, counts, strict=True))


def byzantine_modes(items: list[str]) -> dict[str, dict[str, Any]]:
    """``--byzantine b1.0=drop`` (repeatable) as per-broker config overrides."""
    overrides: dict[str, dict[str, Any]] = {}
    for item in items:
        broker_id, sep, mode = item.partition("=")
        if not sep:
            raise ValueError(f"--byzantine takes BROKER=MODE, got {item!r}")
        overrides[broker_id] = {"byzantine": mode}
    return overrides


def cmd_up(args: argparse.Namespace) -> int:
    from broker.tools.local import start_overlay

    tree = tree_for(args.topology, args.vns, args.seed)
    settings: dict[str, Any] = {"covering": not args.no_covering}
    if args.reconfig:
        settings["reconfig"] = {"enabled": True, "interval": args.reconfig_interval}
    overlay = start_overlay(
        Path(args.dir),
        tree,
        settings,
        replicas=replica_counts(args.replicas, sorted(tree.brokers)),
        overrides=byzantine_modes(args.byzantine),
    )
    print(json.dumps(overlay.describe(), indent=2))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from broker.tools.local import stop_overlay

    stopped = stop_overlay(Path(args.dir))
    print(f"stopped {len(stopped)} brokers: {' '.join(stopped)}")
    return 0


def cmd_topology(args: argparse.Namespace) -> int:
    from broker.tools.local import fetch_json, read_overlay, vn_links

    info = read_overlay(Path(args.dir))
    for broker in info["brokers"]:
        try:
            broker["health"] = fetch_json(broker["admin"] + "/healthz")
        except OSError as exc:
            broker["health"] = {"status": f"unreachable: {exc}"}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for broker in info["brokers"]:
        h = broker["health"]
        print(
            f"{broker['id']:<6} {broker['endpoint']:<21} pid {broker['pid']:<7} "
            f"{h.get('status')}: links={','.join(h.get('links', []))} "
            f"clients={h.get('clients', '-')} srt={h.get('srt', '-')} prt={h.get('prt', '-')}"
        )
    vn_of = {b: vn for vn, members in info["vns"].items() for b in members}
    live = vn_links({b["id"]: b["health"] for b in info["brokers"]}, vn_of)
    print("links: " + " ".join(f"{a}-{b}" for a, b in sorted(live)))
    if live != {tuple(lk) for lk in info["links"]}:
        print("started as: " + " ".join(f"{a}-{b}" for a, b in info["links"]))
    return 0


# -- reconfig ---------------------------------------------------------------------------


def measured_cost(states: dict[str, dict[str, Any]], vns: dict[str, list[str]]) -> dict[str, float]:
    """Routing cost so far from the brokers' own counters, one replica per VN.

    With exact routing a publication costs β·C_b at every VN that routes it and α·C_l on
    every link it crosses, access links included (its publish and each delivery): the
    SPEC §5 cost, summed over the traffic actually carried.
    """
    cost = published = 0.0
    for members in vns.values():
        state = next((states[b] for b in sorted(members) if b in states), None)
        if state is None:
            continue
        t, m = state["traffic"], state["model"]
        hops = t["forwarded"] + t["published"] + t["delivered"]
        cost += m["alpha"] * m["link_cost"] * hops + m["beta"] * m["broker_cost"] * t["routed"]
        published += t["published"]
    return {"cost": cost, "published": published}


def describe_round(record: dict[str, Any]) -> str:
    line = f"{record['round']:<14} master {record['master']:<6} {record['outcome']}"
    if "change" in record:
        old = " ".join(f"{a}-{b}" for a, b in record["neighbourhood"])
        new = " ".join(f"{a}-{b}" for a, b in record["new_neighbourhood"])
        line += (
            f"\n    {old}  ->  {new}\n    local cost {record['cost_before']:.0f} -> "
            f"{record['cost_after']:.0f}"
        )
    return line


def cmd_reconfig(args: argparse.Namespace) -> int:
    from broker.tools.local import fetch_json, read_overlay

    info = read_overlay(Path(args.dir))
    admin = {b["id"]: b["admin"] for b in info["brokers"]}
    shown: set[str] = set()
    rounds = 0
    last: dict[str, float] | None = None
    deadline = time.monotonic() + args.timeout if args.timeout else None
    while True:
        states = {}
        for broker_id, url in admin.items():
            try:
                states[broker_id] = fetch_json(url + "/reconfig")
            except OSError as exc:
                log.warning("broker %s unreachable: %s", broker_id, exc)
        records = sorted(
            (r for s in states.values() for r in s["rounds"] if r["round"] not in shown),
            key=lambda r: r["time"],
        )
        for record in records:
            shown.add(record["round"])
            if last is not None or args.rounds is None:
                rounds += 1
                print(describe_round(record), flush=True)
        now = measured_cost(states, info["vns"])
        if last is not None and now["published"] > last["published"]:
            per = (now["cost"] - last["cost"]) / (now["published"] - last["published"])
            print(
                f"{time.strftime('%H:%M:%S')} global cost {per:.2f} per publication "
                f"({now['published'] - last['published']:.0f} published)",
                flush=True,
            )
        last = now
        if not args.watch and args.rounds is None:
            applied = sum(s["applied"] for s in states.values())
            print(f"{applied} rounds applied; brokers: {len(states)}/{len(admin)} reachable")
            return 0
        if args.rounds is not None and rounds >= args.rounds:
            return 0
        if deadline is not None and time.monotonic() > deadline:
            return 0
        time.sleep(args.every)


# -- demo -------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    import tempfile

    from broker.tools.demo import run_demo

    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="trellis-demo-"))
    return run_async(run_demo(workdir, count=args.count))


# -- parser -----------------------------------------------------------------------------


def build_parser(*, pst: bool = False) -> argparse.ArgumentParser:
    """The ``trellis`` parser; with ``pst``, the MTPSTO solvers' subcommands in full."""
    parser = argparse.ArgumentParser(prog="trellis", description="Trellis pub/sub broker overlay")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("broker", help="run a broker daemon")
    p.add_argument("--config", help="TOML config file")
    p.add_argument("--id", help="broker id (overrides the config)")
    p.add_argument("--host", help="listen address (overrides the config)")
    p.add_argument("--port", type=int, help="listen port, 0 for a free one (overrides the config)")
    p.add_argument("--admin-port", type=int, help="HTTP port for /metrics and /healthz")
    p.add_argument("--ready-file", help="write host/port here once listening")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser("pub", help="publish messages")
    p.add_argument("--endpoint", required=True, help="HOST:PORT (comma-separated for several)")
    p.add_argument("--attrs", required=True, help="e.g. \"class='stock',price=5\"")
    p.add_argument("--payload", default="", help="payload text")
    p.add_argument("--count", type=int, default=1, help="how many messages")
    p.add_argument(
        "--rate", type=float, default=0.0, help="messages per second (0 = as fast as possible)"
    )
    p.add_argument(
        "--advertise", help="advertisement filter (default: the attributes' exact values)"
    )
    p.add_argument("--client-id", help="publisher identity")
    p.add_argument("--no-ack", action="store_true", help="stream without waiting for each ack")
    p.add_argument(
        "--confidential", action="store_true", help="encrypt; the key travels as Shamir shares"
    )
    p.add_argument(
        "--key-refresh", type=int, default=1, help="confidential messages per content key"
    )
    p.set_defaults(func=cmd_pub)

    p = sub.add_parser("sub", help="subscribe and print deliveries")
    p.add_argument("filter", help="e.g. \"class = 'stock' and price < 100\"")
    p.add_argument("--endpoint", required=True, help="HOST:PORT (comma-separated for several)")
    p.add_argument("--count", type=int, help="exit after this many deliveries")
    p.add_argument("--timeout", type=float, help="exit after this many seconds")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--quiet", action="store_true", help="count only, print nothing per message")
    p.add_argument("--client-id", help="subscriber identity")
    p.add_argument("--manifest", help="overlay manifest, to decrypt confidential publications")
    p.add_argument("--ready-file", help="write a line here once the subscription is active")
    p.set_defaults(func=cmd_sub)

    p = sub.add_parser("up", help="start a local overlay of broker processes")
    p.add_argument("--vns", "--brokers", type=int, default=5, help="number of tree nodes (VNs)")
    p.add_argument(
        "--replicas", default="1", help="replicas per VN: one count, or one per VN ('3,1,3')"
    )
    p.add_argument(
        "--byzantine",
        action="append",
        default=[],
        metavar="BROKER=MODE",
        help="fault injection: drop, corrupt, equivocate or collude (repeatable)",
    )
    p.add_argument(
        "--topology", default="line", help="line, star, random, or a JSON file (overlay.tree)"
    )
    p.add_argument("--seed", type=int, default=1, help="seed for --topology random")
    p.add_argument("--dir", required=True, help="where configs, logs and overlay.json go")
    p.add_argument("--no-covering", action="store_true", help="disable subscription covering")
    p.add_argument("--reconfig", action="store_true", help="brokers rearrange the tree (OCBR)")
    p.add_argument(
        "--reconfig-interval", type=float, default=2.0, help="seconds between master turns"
    )
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("down", help="stop a local overlay")
    p.add_argument("--dir", required=True)
    p.set_defaults(func=cmd_down)

    p = sub.add_parser("topology", help="show a local overlay and its brokers' state")
    p.add_argument("--dir", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_topology)

    p = sub.add_parser("reconfig", help="show live reconfiguration rounds and the global cost")
    p.add_argument("--dir", required=True, help="a local overlay's directory (trellis up)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--rounds", type=int, help="follow until this many new rounds ran")
    how.add_argument("--watch", action="store_true", help="follow until interrupted")
    p.add_argument("--every", type=float, default=1.0, help="seconds between polls")
    p.add_argument("--timeout", type=float, help="stop following after this many seconds")
    p.set_defaults(func=cmd_reconfig)

    p = sub.add_parser("demo", help="the embedded default: a local broker with live traffic")
    p.add_argument("--dir", help="working directory for broker files (default: a temp dir)")
    p.add_argument("--count", type=int, default=2000, help="publications to send")
    p.set_defaults(func=cmd_demo)

    add_pst_parser(sub, real=pst)
    return parser


# -- pst --------------------------------------------------------------------------------


def add_pst_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], *, real: bool
) -> None:
    """``trellis pst``: the solvers' own parser when ``pst`` runs (``real``), else only its
    entry in the command list, so that no other command imports the solvers."""
    if real:
        from reconfig.mtpsto.cli import add_pst_parser as add_solver_parser

        add_solver_parser(subparsers)
        return
    subparsers.add_parser("pst", help="most trusted publish/subscribe trees (MTPSTO)")


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(pst=words[:1] == ["pst"])
    args = parser.parse_args(words)
    if args.command != "broker":
        setup_logging("warning")
    try:
        return int(args.func(args) or 0)
    except (TrellisError, ValueError) as exc:
        print(f"trellis {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
