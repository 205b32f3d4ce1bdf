"""The ``trellis`` command line.

Each subcommand imports what it needs inside its handler: ``trellis broker`` starts a
daemon per process (a local overlay starts dozens), so it must not pay for the SDK, the
local-overlay tools or the MTPSTO solvers (networkx).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import logging
import re
import signal
import sys
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from broker.errors import TrellisError
from broker.tools.tls_args import add_tls_arguments

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
    from broker.tools.launcher import run_async as run

    return run(coro)


class UsageError(ValueError):
    """An argument the person must fix (exit code 2, one line, no traceback)."""


# The signal that interrupted the command (SIGINT unless a SIGTERM or SIGHUP came).
_interrupted_by: list[int] = []


def _terminate_as_interrupt() -> None:
    """Make SIGTERM and SIGHUP interrupt like Ctrl-C, so that a command that starts
    processes stops them on every way it can be told to stop."""

    def interrupt(signum: int, _frame: object) -> None:
        _interrupted_by.append(signum)
        if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
            raise KeyboardInterrupt  # SIGINT ignored (a background job): interrupt anyway
        signal.raise_signal(signal.SIGINT)  # as Ctrl-C, which asyncio.Runner handles too

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


# -- broker ---------------------------------------------------------------------------


def cmd_broker(args: argparse.Namespace) -> int:
    from broker.daemon.config import config_paths, load_config
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
    try:
        run(config)
    except OSError as exc:
        if exc.filename is None:  # binding the listener (or the admin endpoint)
            raise TrellisError(_listen_error(exc, config.host, config.port)) from None
        raise TrellisError(_file_error(exc, config_paths(config))) from None
    return 0


def _file_error(exc: OSError, paths: dict[str, Path]) -> str:
    """One line for a file a broker cannot use: the config key that names it, and why."""
    names = [str(name) for name in (exc.filename, exc.filename2) if name is not None]
    reason = exc.strerror or str(exc)
    for key, path in paths.items():
        for name in names:
            if name == str(path) or name.startswith(f"{path}."):  # the file, or its temporary
                return f"{key} = {path}: {reason}"
            if name.startswith(f"{path}/"):
                return f"{key} = {path}: {reason}: {name}"
    return f"{names[0]}: {reason}"


def _listen_error(exc: OSError, host: str, port: int) -> str:
    """One line for a broker that cannot listen: which address and what to do."""
    found = re.search(r"\('([^']*)', (\d+)\)", str(exc))
    where = f"{found.group(1)}:{found.group(2)}" if found else f"{host}:{port}"
    # The broker listens on ``port`` and on its admin port: an address that is not the
    # first is the second.
    flag = "--port" if found is None or int(found.group(2)) == port else "--admin-port"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {where}: the address is already in use; stop what holds it or "
            f"choose another port with {flag} (0 picks a free one)"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {where}: no such local address; check --host"
    if exc.errno == errno.EACCES:
        return f"cannot listen on {where}: permission denied; use a port above 1023"
    return f"cannot listen on {where}: {exc.strerror or exc}"


# -- pub / sub --------------------------------------------------------------------------


def tls_options(args: argparse.Namespace) -> dict[str, Any]:
    """The SDK's TLS arguments from ``--ca``/``--cert``/``--key``.

    Raises:
        UsageError: --cert without --key (or the reverse), or either without --ca.
    """
    if (args.cert is None) != (args.key is None):
        raise UsageError("--cert and --key go together (a certificate and its private key)")
    if args.cert is not None and args.ca is None:
        raise UsageError("--cert needs --ca too: the CA that issued the brokers' certificates")
    return {"ca": args.ca, "cert": args.cert, "key": args.key}


def client_target(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """The endpoints and TLS arguments of ``pub``/``sub``: ``--endpoint`` (and ``--ca``...),
    or ``--dir DIR --vn VN``, a VN of a local overlay, whose replicas' endpoints and (on a
    ``--tls`` overlay) client certificate come from ``DIR/overlay.json``; ``--ca`` given
    as well overrides that certificate.

    Raises:
        UsageError: neither or both of ``--endpoint`` and ``--dir``, ``--vn`` without
            ``--dir`` or the reverse (the message lists the overlay's VNs), TLS flags astray.
    """
    tls = tls_options(args)
    if args.endpoint and args.dir:
        raise UsageError("give --endpoint or --dir with --vn, not both")
    if args.endpoint:
        if args.vn:
            raise UsageError("--vn names a VN of a local overlay: give --dir DIR too")
        return args.endpoint.split(","), tls
    if not args.dir:
        raise UsageError(
            "give --endpoint HOST:PORT, or --dir DIR --vn VN for a VN of a local overlay "
            "(trellis up --dir DIR)"
        )
    from broker.tools.local import read_overlay, vn_client_access

    if not args.vn:
        vns = ", ".join(sorted(read_overlay(Path(args.dir)).get("vns", {})))
        raise UsageError(f"--dir needs --vn, one of the overlay's VNs: {vns}")
    endpoints, overlay_tls = vn_client_access(Path(args.dir), args.vn)
    return endpoints, tls if args.ca else {**tls, **overlay_tls}


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """``--endpoint``, or ``--dir`` and ``--vn``: where ``pub``/``sub`` connect."""
    parser.add_argument(
        "--endpoint", help="HOST:PORT (comma-separated for several); or --dir with --vn"
    )
    parser.add_argument(
        "--dir", help="a local overlay (trellis up --dir DIR): connect to the replicas of --vn"
    )
    parser.add_argument("--vn", help="with --dir: the VN whose replicas to connect to, e.g. b0")


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


def format_attrs(attrs: dict[str, Any]) -> str:
    """Attributes as ``--attrs`` takes them: ``class='x',price=5,ok=true``."""

    def literal(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            escaped = value.replace("\\", "\\\\").replace("'", "\\'")
            escaped = escaped.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
            return f"'{escaped}'"
        return str(value)

    return ",".join(f"{name}={literal(value)}" for name, value in attrs.items())


def delivery_line(msg: Delivery) -> str:
    """One plain line per delivery: ``publisher#seq attrs payload`` (payload as text when it
    is printable UTF-8, else its size and base64)."""
    import base64

    line = f"{msg.publisher}#{msg.seq} {format_attrs(msg.attrs)}"
    try:
        text: str | None = msg.payload.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        return f"{line} {text}" if text else line
    return f"{line} <{len(msg.payload)} bytes, base64 {base64.b64encode(msg.payload).decode()}>"


def first_seq_for(given: int | None, *, fixed_id: bool) -> int:
    """The first sequence number of a ``trellis pub`` run.

    Brokers and subscribers deduplicate by (publisher, seq): a publisher that runs again
    under the same identity must continue its numbering, or every publication of the new
    run is taken for a conflicting copy of the old run's. The clock continues it without
    state on disk (a run publishes far fewer than a million messages per second)."""
    if given is not None:
        return given
    return time.time_ns() // 1000 if fixed_id else 1


async def _pub(args: argparse.Namespace, endpoints: list[str], tls: dict[str, Any]) -> int:
    from broker.client import Client
    from broker.language.grammar import parse_attrs

    attrs = parse_attrs(args.attrs)
    if not attrs:
        raise UsageError(
            "--attrs is empty: a publication needs at least one attribute, "
            "e.g. --attrs \"class='stock',price=5\""
        )
    payload = args.payload.encode("utf-8")
    interval = 1.0 / args.rate if args.rate else 0.0
    from broker.tools.topic_cli import client_identity

    identity = client_identity(args)
    client = Client(
        endpoints,
        key_refresh=args.key_refresh,
        share_form=args.share_form,
        first_seq=first_seq_for(args.first_seq, fixed_id=identity["client_id"] is not None),
        **identity,
        **tls,
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


class _NoManifestHint(logging.Filter):
    """The SDK warns once per held-back confidential publication when it has no manifest;
    a person needs to hear it once, with what to do."""

    said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("confidential publication") or "no manifest" not in str(
            record.msg
        ):
            return True
        if not self.said:
            self.said = True
            print(
                "trellis sub: confidential publications arrive but cannot be decrypted without "
                "the overlay manifest (they are held back): run again with --manifest "
                "DIR/manifest.json",
                file=sys.stderr,
                flush=True,
            )
        return False


async def _sub(
    args: argparse.Namespace, endpoints: list[str], tls: dict[str, Any], manifest: str | None
) -> int:
    from broker.client import Client
    from broker.errors import SlowConsumerError

    if manifest is None:
        logging.getLogger("trellis.client").addFilter(_NoManifestHint())
    received = 0
    from broker.tools.topic_cli import client_identity

    client = Client(endpoints, manifest=manifest, **client_identity(args), **tls)
    try:
        async with client, client.subscribe(args.filter) as sub:
            where = f"VN {args.vn} of {args.dir}" if args.dir else args.endpoint
            print(f"subscribed to {args.filter} at {where}", file=sys.stderr, flush=True)
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
                if args.quiet:
                    continue
                print(delivery_json(msg) if args.json else delivery_line(msg), flush=True)
    finally:
        if args.quiet:
            print(received, flush=True)
    if args.count is not None and received < args.count:
        print(f"received {received} of {args.count} before the timeout", file=sys.stderr)
        return 1
    return 0


def cmd_pub(args: argparse.Namespace) -> int:
    return run_async(_pub(args, *client_target(args)))


def cmd_sub(args: argparse.Namespace) -> int:
    manifest = args.manifest
    if manifest is None and args.dir and (Path(args.dir) / "manifest.json").is_file():
        manifest = str(Path(args.dir) / "manifest.json")
    return run_async(_sub(args, *client_target(args), manifest))


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
    try:
        data = json.loads(Path(topology).read_text())
    except FileNotFoundError:
        raise UsageError(
            f"--topology {topology!r}: not line, star or random, and no such file"
        ) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--topology {topology!r}: cannot read a JSON topology: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(
            f"--topology {topology!r}: not a topology: expected "
            '{"brokers": ["b0", "b1"], "links": [["b0", "b1"]]}'
        )
    return Tree.from_dict(data)


def replica_counts(text: str, vns: list[str]) -> dict[str, int]:
    """``--replicas 3`` (every VN) or ``--replicas 3,1,5`` (one per VN, in order)."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if len(counts) == 1:
        counts *= len(vns)
    if len(counts) != len(vns) or min(counts) < 1:
        raise UsageError(f"--replicas needs 1 or {len(vns)} positive counts, got {text!r}")
    return dict(zip(vns, counts, strict=True))


def byzantine_modes(items: list[str]) -> dict[str, dict[str, Any]]:
    """``--byzantine b1.0=drop`` (repeatable) as per-broker config overrides."""
    from broker.daemon.config import BYZANTINE_MODES

    overrides: dict[str, dict[str, Any]] = {}
    for item in items:
        broker_id, sep, mode = item.partition("=")
        if not sep or not broker_id:
            raise UsageError(f"--byzantine takes BROKER=MODE, e.g. b1.2=corrupt; got {item!r}")
        if mode not in BYZANTINE_MODES:
            raise UsageError(
                f"--byzantine {item!r}: no mode {mode!r}; choose {', '.join(BYZANTINE_MODES)}"
            )
        overrides[broker_id] = {"byzantine": mode}
    return overrides


def _up_progress(name: str, up: int, total: int) -> None:
    print(f"{'' if up > 1 else 'brokers up:'} {name}", end="", file=sys.stderr, flush=True)
    if up == total:
        print(f" ({total}); linking...", file=sys.stderr, flush=True)


def cmd_up(args: argparse.Namespace) -> int:
    from broker.tools.local import LocalOverlay, start_overlay

    tree = tree_for(args.topology, args.vns, args.seed)
    replicas = replica_counts(args.replicas, sorted(tree.brokers))
    overrides = byzantine_modes(args.byzantine)
    names = LocalOverlay(Path(args.dir), tree, replicas=replicas).broker_ids
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise UsageError(
            f"--byzantine: no broker {', '.join(unknown)} in this overlay; "
            f"its brokers are {' '.join(names)}"
        )
    settings: dict[str, Any] = {"covering": not args.no_covering, "log_level": args.log_level}
    if args.adaptive:
        from broker.tools.adaptive import adaptive_broker_settings

        settings.update(adaptive_broker_settings(args.analytics_interval, args.reconfig))
    if args.reconfig:
        settings["reconfig"] = {"enabled": True, "interval": args.reconfig_interval}
    try:
        overlay = start_overlay(
            Path(args.dir),
            tree,
            settings,
            replicas=replicas,
            overrides=overrides,
            progress=_up_progress,
            tls=args.tls,
        )
    except KeyboardInterrupt:
        print("\ntrellis up: interrupted; stopped every broker it had started", file=sys.stderr)
        raise
    print(json.dumps(overlay.describe(), indent=2))
    vns = sorted(tree.brokers)
    first, last = vns[0], vns[-1]
    print(
        f'clients: trellis sub --dir {args.dir} --vn {last} "*"; '
        f"trellis pub --dir {args.dir} --vn {first} --attrs \"class='x'\" --payload hi; "
        f"stop with: trellis down --dir {args.dir}",
        file=sys.stderr,
    )
    if args.adaptive:
        return run_adaptive_loop(args)
    return 0


def run_adaptive_loop(args: argparse.Namespace) -> int:
    """``trellis up --adaptive``: run the loop's cycles in the foreground until
    ``--cycles`` ran or Ctrl-C / SIGTERM; the brokers keep running either way."""
    import asyncio

    from broker.tools.adaptive import AdaptiveSettings, run_adaptive
    from broker.tools.adaptive_cycles import describe_cycle

    settings = AdaptiveSettings(
        interval=args.analytics_interval, epsilon=args.epsilon, cycles=args.cycles
    )
    print(
        f"adaptive loop: a cycle every {settings.interval:g} s (logs, analytics job, plan, "
        f"moves), recorded in {args.dir}/adaptive-cycles.jsonl; Ctrl-C stops the loop",
        file=sys.stderr,
        flush=True,
    )
    try:
        asyncio.run(
            run_adaptive(
                Path(args.dir), settings, report=lambda r: print(describe_cycle(r), flush=True)
            )
        )
    except KeyboardInterrupt:
        print(
            f"\nadaptive loop stopped; the brokers keep running (trellis down --dir {args.dir})",
            file=sys.stderr,
        )
        raise
    print(f"adaptive loop done; the brokers keep running (trellis down --dir {args.dir})")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from broker.tools.local import stop_overlay

    stopped = stop_overlay(Path(args.dir))
    if stopped:
        plural = "" if len(stopped) == 1 else "s"
        print(f"stopped {len(stopped)} broker{plural}: {' '.join(stopped)}")
    else:
        print(f"nothing to stop: no broker of the overlay in {args.dir} is running")
    return 0


def _not_running(directory: str) -> str:
    return (
        f"the overlay in {directory} is not running (no broker answers); "
        f"start it with: trellis up --dir {directory}"
    )


def cmd_topology(args: argparse.Namespace) -> int:
    from broker.tools.local import fetch_json, read_overlay, vn_links

    info = read_overlay(Path(args.dir))
    down = []
    for broker in info["brokers"]:
        try:
            broker["health"] = fetch_json(broker["admin"] + "/healthz")
        except OSError as exc:
            broker["health"] = {"status": f"unreachable: {exc}"}
            down.append(broker["id"])
    if not info["brokers"] or len(down) == len(info["brokers"]):
        print(f"trellis topology: {_not_running(args.dir)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for broker in info["brokers"]:
            h = broker["health"]
            print(
                f"{broker['id']:<6} {broker['endpoint']:<21} pid {broker['pid']:<7} "
                f"{h.get('status')}: links={','.join(h.get('links', []))} "
                f"clients={h.get('clients', '-')} srt={h.get('srt', '-')} "
                f"prt={h.get('prt', '-')}"
            )
        vn_of = {b: vn for vn, members in info["vns"].items() for b in members}
        live = vn_links(
            {b["id"]: b["health"] for b in info["brokers"] if b["id"] not in down}, vn_of
        )
        print("links: " + " ".join(f"{a}-{b}" for a, b in sorted(live)))
        if live != {tuple(lk) for lk in info["links"]}:
            print("started as: " + " ".join(f"{a}-{b}" for a, b in info["links"]))
    if down:
        print(
            f"trellis topology: {len(down)} of {len(info['brokers'])} brokers do not answer: "
            f"{' '.join(down)}",
            file=sys.stderr,
        )
        return 1
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
    if "requested" in record:
        line += f" (asked: {record['requested'].get('tag') or 'an operator'})"
    if "change" in record:
        old = " ".join(f"{a}-{b}" for a, b in record["neighbourhood"])
        new = " ".join(f"{a}-{b}" for a, b in record["new_neighbourhood"])
        line += (
            f"\n    {old}  ->  {new}\n    local cost {record['cost_before']:.0f} -> "
            f"{record['cost_after']:.0f}"
        )
    return line


def cmd_reconfig(args: argparse.Namespace) -> int:
    from broker.tools.adaptive_cycles import describe_cycle, read_cycles
    from broker.tools.local import fetch_json, read_overlay

    info = read_overlay(Path(args.dir))
    cycles_shown = 0
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
        if not states:
            print(f"trellis reconfig: {_not_running(args.dir)}", file=sys.stderr)
            return 1
        if not any(s.get("enabled", True) for s in states.values()):
            print(
                f"trellis reconfig: reconfiguration is off in the overlay in {args.dir} (it was "
                f"started without --reconfig); restart it with: trellis down --dir {args.dir}; "
                f"trellis up --reconfig --dir {args.dir}",
                file=sys.stderr,
            )
            return 1
        records = sorted(
            (r for s in states.values() for r in s["rounds"] if r["round"] not in shown),
            key=lambda r: r["time"],
        )
        for record in records:
            shown.add(record["round"])
            if last is not None or args.rounds is None:
                rounds += 1
                print(describe_round(record), flush=True)
        for cycle in read_cycles(Path(args.dir))[cycles_shown:]:
            cycles_shown += 1
            print(describe_cycle(cycle), flush=True)
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
            if args.rounds is None:
                return 0
            print(
                f"trellis reconfig: {rounds} of {args.rounds} rounds ran before the timeout "
                f"({args.timeout:g} s)",
                file=sys.stderr,
            )
            return 1
        time.sleep(args.every)


# -- demo -------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from broker.tools.demo import run_demo

    keep = args.keep or args.dir is not None
    workdir = Path(args.dir or tempfile.mkdtemp(prefix="trellis-demo-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"working directory: {workdir} ("
        + ("kept" if keep else "removed at the end; --keep keeps it")
        + ")",
        flush=True,
    )
    # Clients' warnings (bad key shares from the Byzantine replicas, ...) are part of the
    # show, but they belong in a log, not in the middle of the summary.
    log_file = logging.FileHandler(workdir / "demo.log")
    log_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    saved, root.handlers = root.handlers, [log_file]
    try:
        return run_demo(workdir, count=args.count)
    except KeyboardInterrupt:
        print("\ntrellis demo: interrupted; every broker it started is stopped", flush=True)
        raise
    finally:
        root.handlers = saved
        log_file.close()
        warnings = sum(1 for _ in (workdir / "demo.log").open()) if keep else 0
        if keep:
            print(f"client warnings: {warnings}, in {workdir / 'demo.log'}; broker logs beside it")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
            print(f"removed {workdir}")


# -- parser -----------------------------------------------------------------------------


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


class _FaultModes(argparse._AppendAction):
    """``up --byzantine``, whose help lists the brokers' fault modes: read from the broker
    config when the help is shown, as importing it (pydantic) costs every command 0.4 s."""

    @property
    def help(self) -> str:
        from broker.daemon.config import BYZANTINE_MODES

        return (
            f"fault injection, MODE one of: {', '.join(BYZANTINE_MODES)} "
            "(repeatable; default: none)"
        )

    @help.setter
    def help(self, _value: str | None) -> None:
        """argparse sets it; the property says it."""


class _Version(argparse.Action):
    """``--version``, read from the installed package only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("trellis")
        except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
            text = "unknown (not installed)"
        print(f"trellis {text}")
        parser.exit()


POSITIVE_INT = _positive(int)
POSITIVE_FLOAT = _positive(float)
LOG_LEVELS = ["debug", "info", "warning", "error"]


def build_parser(*, pst: bool = False) -> argparse.ArgumentParser:
    """The ``trellis`` parser; with ``pst``, the MTPSTO solvers' subcommands in full."""
    from broker.tools.topic_cli import add_identity_options

    parser = argparse.ArgumentParser(prog="trellis", description="Trellis pub/sub broker overlay")
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("broker", help="run a broker daemon")
    p.add_argument("--config", help="TOML config file (default: none, built-in defaults)")
    p.add_argument("--id", help="broker id (overrides the config; default broker-1)")
    p.add_argument("--host", help="listen address (overrides the config; default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=int,
        help="listen port, 0 for a free one (overrides the config; default 7700)",
    )
    p.add_argument(
        "--admin-port", type=int, help="HTTP port for /metrics and /healthz (default: none)"
    )
    p.add_argument("--ready-file", help="write host/port here once listening (default: none)")
    p.add_argument("--log-level", choices=LOG_LEVELS, help="overrides the config (default: info)")
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser("pub", help="publish messages")
    add_target_arguments(p)
    p.add_argument(
        "--attrs", required=True, help="attributes, at least one, e.g. \"class='stock',price=5\""
    )
    p.add_argument("--payload", default="", help="payload text (default: empty)")
    p.add_argument(
        "--count", type=POSITIVE_INT, default=1, help="how many messages (default: %(default)s)"
    )
    p.add_argument(
        "--rate",
        type=_non_negative,
        default=0.0,
        help="messages per second, 0 = as fast as possible (default: %(default)s)",
    )
    p.add_argument(
        "--advertise", help="advertisement filter (default: the attributes' exact values)"
    )
    p.add_argument("--client-id", help="publisher identity (default: a random one)")
    p.add_argument(
        "--first-seq",
        type=POSITIVE_INT,
        help="sequence number of the first publication (default: 1 for a random identity; "
        "for a fixed one (--client-id, --identity) microseconds since 1970, so a later run "
        "continues the numbering: brokers and subscribers deduplicate by (publisher, seq))",
    )
    p.add_argument("--no-ack", action="store_true", help="stream without waiting for each ack")
    p.add_argument(
        "--confidential", action="store_true", help="encrypt; the key travels as Shamir shares"
    )
    p.add_argument(
        "--key-refresh",
        type=POSITIVE_INT,
        default=1,
        help="confidential messages per content key (default: %(default)s)",
    )
    p.add_argument(
        "--share-form",
        choices=("record", "pass"),
        default="pass",
        help="how confidential key shares travel: one record per share, or by the pass "
        "(one split and statement per splitter, next VN and pass) (default: %(default)s)",
    )
    add_tls_arguments(p)
    add_identity_options(p)
    p.set_defaults(func=cmd_pub)

    p = sub.add_parser("sub", help="subscribe and print deliveries")
    p.add_argument("filter", help="e.g. \"class = 'stock' and price < 100\"; * for everything")
    add_target_arguments(p)
    p.add_argument(
        "--count", type=POSITIVE_INT, help="exit after this many deliveries (default: never)"
    )
    p.add_argument(
        "--timeout", type=POSITIVE_FLOAT, help="exit after this many seconds (default: never)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--quiet", action="store_true", help="print nothing per message, only the count at the end"
    )
    p.add_argument("--client-id", help="subscriber identity (default: a random one)")
    p.add_argument(
        "--manifest",
        help="overlay manifest (DIR/manifest.json of trellis up), to decrypt confidential "
        "publications (default: none; with --dir, DIR/manifest.json)",
    )
    p.add_argument(
        "--ready-file", help="write a line here once the subscription is active (default: none)"
    )
    add_tls_arguments(p)
    add_identity_options(p)
    p.set_defaults(func=cmd_sub)

    p = sub.add_parser("up", help="start a local overlay of broker processes")
    p.add_argument(
        "--vns",
        "--brokers",
        type=POSITIVE_INT,
        default=5,
        help="number of tree nodes (VNs) (default: %(default)s)",
    )
    p.add_argument(
        "--replicas",
        default="1",
        help="replicas per VN: one count, or one per VN ('3,1,3') (default: %(default)s)",
    )
    p.add_argument(
        "--byzantine",
        action=_FaultModes,
        default=[],
        metavar="BROKER=MODE",
    )
    p.add_argument(
        "--topology",
        default="line",
        help="line, star, random, or a JSON file (overlay.tree) (default: %(default)s)",
    )
    p.add_argument(
        "--seed", type=int, default=1, help="seed for --topology random (default: %(default)s)"
    )
    p.add_argument("--dir", required=True, help="where configs, logs and overlay.json go")
    p.add_argument("--no-covering", action="store_true", help="disable subscription covering")
    p.add_argument("--reconfig", action="store_true", help="brokers rearrange the tree (OCBR)")
    p.add_argument(
        "--tls",
        action="store_true",
        help="brokers speak TLS only: a CA and certificates in DIR/tls (default: plaintext)",
    )
    p.add_argument(
        "--reconfig-interval",
        type=POSITIVE_FLOAT,
        default=2.0,
        help="seconds between master turns (default: %(default)s)",
    )
    p.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="the brokers' log level, in DIR/<id>.log (default: %(default)s)",
    )
    p.add_argument(
        "--adaptive",
        action="store_true",
        help="then run the trust-aware loop in the foreground: logs, analytics job, plan, "
        "live moves, every --analytics-interval",
    )
    p.add_argument(
        "--analytics-interval",
        type=POSITIVE_FLOAT,
        default=120.0,
        metavar="S",
        help="seconds between adaptive cycles (default: %(default)s)",
    )
    p.add_argument(
        "--cycles",
        type=POSITIVE_INT,
        help="with --adaptive: stop the loop after this many cycles (default: never)",
    )
    p.add_argument(
        "--epsilon",
        type=POSITIVE_FLOAT,
        default=0.1,
        help="with --adaptive: cost budget (1+E) x the best cost found (default: %(default)s)",
    )
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("down", help="stop a local overlay")
    p.add_argument("--dir", required=True, help="the overlay's directory (trellis up --dir)")
    p.set_defaults(func=cmd_down)

    p = sub.add_parser("topology", help="show a local overlay and its brokers' state")
    p.add_argument("--dir", required=True, help="the overlay's directory (trellis up --dir)")
    p.add_argument("--json", action="store_true", help="overlay.json with each broker's /healthz")
    p.set_defaults(func=cmd_topology)

    p = sub.add_parser("reconfig", help="show live reconfiguration rounds and the global cost")
    p.add_argument("--dir", required=True, help="a local overlay's directory (trellis up)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--rounds", type=POSITIVE_INT, help="follow until this many new rounds ran")
    how.add_argument("--watch", action="store_true", help="follow until interrupted")
    p.add_argument(
        "--every",
        type=POSITIVE_FLOAT,
        default=1.0,
        help="seconds between polls (default: %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=POSITIVE_FLOAT,
        help="stop following after this many seconds (default: never)",
    )
    p.set_defaults(func=cmd_reconfig)

    p = sub.add_parser(
        "demo",
        help="the embedded default: local overlays of broker processes with live traffic, "
        "Byzantine replicas and live reconfiguration",
    )
    p.add_argument(
        "--dir", help="working directory for broker files, kept (default: a temp dir, removed)"
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dir (configs, keys, logs)")
    p.add_argument(
        "--count",
        type=POSITIVE_INT,
        default=2000,
        help="plain quotes to publish (default: %(default)s)",
    )
    p.set_defaults(func=cmd_demo)

    from broker.tools.ca_cli import add_ca_parser

    add_ca_parser(sub)
    add_pst_parser(sub, real=pst)
    add_analytics_parser(sub)
    from broker.tools.trust_cli import add_rebuild_parser, add_trust_parser

    add_trust_parser(sub)
    add_rebuild_parser(sub)
    from broker.tools.placement_cli import add_placement_parser

    add_placement_parser(sub)
    from broker.tools.bridge import add_bridge_parser

    add_bridge_parser(sub)
    from broker.tools.tdn_cli import add_tdn_parser
    from broker.tools.topic_cli import add_topic_parser

    add_tdn_parser(sub)
    add_topic_parser(sub)
    return parser


def add_analytics_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """``trellis analytics ...``: runs ``python -m analytics.cli`` with the same arguments, so
    that no other command loads PySpark (and the tools layer does not import analytics)."""
    p = subparsers.add_parser(
        "analytics",
        add_help=False,  # --help is analytics.cli's: it lists run and export
        help="traffic-log analytics on Spark: run (the job), export (logs as JSON Lines)",
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="passed to analytics.cli")

    def run(args: argparse.Namespace) -> int:
        import subprocess

        return subprocess.call([sys.executable, "-m", "analytics.cli", *args.args])

    p.set_defaults(func=run)


# -- pst --------------------------------------------------------------------------------


def add_pst_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], *, real: bool
) -> None:
    """``trellis pst``: the solvers' own parser when ``pst`` runs (``real``), else only its
    entry in the command list, so that no other command imports the solvers."""
    if real:
        from reconfig.mtpsto.cli import add_pst_parser as add_solver_parser

        add_solver_parser(subparsers, positive_int=POSITIVE_INT, positive_float=POSITIVE_FLOAT)
        return
    subparsers.add_parser("pst", help="most trusted publish/subscribe trees (MTPSTO)")


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            chosen: argparse.ArgumentParser = action.choices[name]
            return chosen
    return parser


def as_flags(message: str) -> str:
    """An SDK error as the CLI says it: the SDK's hints name its keyword arguments
    (``needs ca=``), where a command takes the options of the same name (``--ca``)."""
    return re.sub(r"(?<![\w-])(ca|cert|key)=(?=[\s),;]|$)", r"--\1", message)


# Commands that start processes: SIGTERM and SIGHUP interrupt them like Ctrl-C does.
STARTS_PROCESSES = ("up", "demo", "analytics")


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(pst=words[:1] == ["pst"])
    args, extra = parser.parse_known_args(words)
    if args.command == "analytics":  # every word after it is analytics.cli's, --help too
        args.args, extra = words[1:], []
    if extra:  # a typo in a subcommand's flag: that subcommand's usage, not the top one's
        _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command != "broker":
        setup_logging("warning")
    if args.command in STARTS_PROCESSES:
        _terminate_as_interrupt()
    try:
        return int(args.func(args) or 0)
    except (TrellisError, ValueError) as exc:
        print(f"trellis {args.command}: error: {as_flags(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path given on the command line (2), or the system refused (1)
        where = f": {exc.filename}" if exc.filename else ""
        print(f"trellis {args.command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2 if exc.filename else 1
    except KeyboardInterrupt:
        return 128 + (_interrupted_by[0] if _interrupted_by else signal.SIGINT)


if __name__ == "__main__":
    sys.exit(main())
