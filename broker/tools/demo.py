"""`trellis demo`: the embedded default job.

Starts a local overlay of real broker processes: a line of virtual nodes, each a group of
three replica brokers, two of them with a Byzantine replica. Subscribers with different
content filters attach at different VNs; a publisher streams plain stock quotes and
confidential orders (encrypted, key shares re-split at every hop, by the pass, the SDK's
default). The summary compares
what each subscriber got with what an oracle computed from the filters alone, and shows
the routing tables, per-link traffic, key shares and the blame for bad shares. The same
overlay then closes the loop of SPEC §6–§7 once: the brokers' traffic logs go through the Spark
job, whose failure figures and trust feedback drive a trust-aware rebuild applied live and a
replica placement plan; a replica then joins the publisher's edge VN live and leaves again
while publications flow (the publisher follows both changes). Then a second overlay
reconfigures itself live (OCBR) under traffic, and the OCBR simulator runs on a larger
generated model (no sockets).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from broker.client import Client, Delivery, Subscription
from broker.errors import TrellisError
from broker.language.filters import Value
from broker.language.grammar import parse_filter
from broker.tools.adaptive import (
    WORK_DIR,
    AdaptiveSettings,
    adaptive_broker_settings,
    run_cycle,
    spark_job,
)
from broker.tools.launcher import run_async
from broker.tools.local import LocalOverlay, metric_by_label, signals_deferred, start_overlay
from overlay.tree import Tree, broker_names, line_tree

VNS = 4
REPLICAS = 3
BYZANTINE = {"b1.2": "corrupt", "b2.0": "equivocate"}
SUBSCRIBERS = {
    # name: (VN index along the line, filter)
    "cheap-acme": (3, "class = 'stock' and symbol = 'ACME' and price < 50"),
    "tech-range": (
        2,
        "class = 'stock' and symbol in ('INIT', 'TECH') and price >= 20 and price <= 80",
    ),
    "all-stock": (3, "class = 'stock'"),
    "a-names": (1, "class = 'stock' and symbol prefix 'A'"),
    "big-orders": (3, "class = 'order' and qty >= 500"),
    "bonds": (2, "class = 'bond'"),
}
SYMBOLS = ("ACME", "ABCO", "INIT", "TECH", "ZETA")


async def _collect(sub: Subscription, expected: int, deadline: float) -> list[Delivery]:
    got: list[Delivery] = []
    while len(got) < expected:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            got.append(await sub.get(remaining))
        except (TrellisError, StopAsyncIteration):
            break
    return got


async def _await_trailing_shares(
    clients: list[Client], received: dict[str, list[Delivery]], limit: float = 10.0
) -> None:
    """Wait (bounded) until no more key shares arrive: bad shares are attributed once the
    shares that trail the deliveries are in."""
    epochs = {(d.publisher, d.sec.epoch) for got in received.values() for d in got if d.sec}

    def count() -> int:
        return sum(c.key_shares(p, e) for c in clients for p, e in epochs)

    deadline = time.monotonic() + limit
    seen = count()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = count()
        if now == seen:
            return
        seen = now


async def _traffic(overlay: LocalOverlay, names: list[str], count: int, rng: random.Random) -> int:
    quotes: list[dict[str, Value]] = [
        {"class": "stock", "symbol": rng.choice(SYMBOLS), "price": round(rng.uniform(1, 100), 2)}
        for _ in range(count)
    ]
    orders: list[dict[str, Value]] = [
        {"class": "order", "symbol": rng.choice(SYMBOLS), "qty": rng.randrange(1, 1000)}
        for _ in range(count // 20)
    ]
    # The stream in publication order, payloads included: subscribers must get exactly these
    # bytes, in this order (a Byzantine replica altering a payload must show as a mismatch).
    stream: list[tuple[dict[str, Value], bytes, bool]] = []
    for i, quote in enumerate(quotes):
        stream.append((quote, f"quote {quote['symbol']} {quote['price']}".encode(), False))
        if i % 20 == 19:
            order = orders[i // 20]
            secret = f"order {order['symbol']} x{order['qty']} for account 42".encode()
            stream.append((order, secret, True))
    filters = {name: parse_filter(text) for name, (_, text) in SUBSCRIBERS.items()}
    expected = {
        name: [(a, p) for a, p, _ in stream if flt.matches(a)] for name, flt in filters.items()
    }
    manifest = overlay.manifest
    clients, subs = [], {}
    try:
        for name, (at, text) in SUBSCRIBERS.items():
            client = Client(overlay.endpoints(names[at]), client_id=name, manifest=manifest)
            clients.append(client)
            await client.connect()
            subs[name] = client.subscribe(text)
            await subs[name].__aenter__()
        async with Client(overlay.endpoints(names[0]), client_id="exchange", key_refresh=10) as pub:
            await pub.advertise("class = 'stock'")
            await pub.advertise("class = 'order'")
            await asyncio.to_thread(overlay.wait_quiet)
            started = time.perf_counter()
            deadline = time.monotonic() + 60
            collectors = {
                name: asyncio.create_task(_collect(sub, len(expected[name]), deadline))
                for name, sub in subs.items()
            }
            for attrs, payload, confidential in stream:
                await pub.publish(attrs, payload, ack=False, confidential=confidential)
            # The brokers may still be working through the stream: the same deadline.
            await pub.drain(max(1.0, deadline - time.monotonic()))
            received = {name: await task for name, task in collectors.items()}
            elapsed = time.perf_counter() - started
            for name, sub in subs.items():  # anything more would be a wrong delivery
                while True:
                    try:
                        received[name].append(await sub.get(0.3))
                    except (TrellisError, StopAsyncIteration):
                        break
            # Copies from a lagging (here: corrupting) replica still arrive after every
            # delivery: the counts are read once every broker's counters stopped moving.
            health = await asyncio.to_thread(overlay.wait_quiet)
            metrics = {b: await asyncio.to_thread(overlay.metrics, b) for b in overlay.brokers}
        await _await_trailing_shares(clients, received)
        culprits = set().union(*(c.share_culprits() for c in clients))
    finally:  # interrupted too: brokers then stop at once, not after shutdown_timeout
        for client in clients:
            await client.close()

    total = sum(len(v) for v in received.values())
    print(
        f"\npublished {len(quotes)} plain quotes and {len(orders)} confidential orders (key "
        f"shares by the pass) at "
        f"{names[0]} in {elapsed:.2f} s; {total} deliveries ({total / elapsed:,.0f}/s end to end)"
    )
    print(f"\n{'subscriber':<11} {'at':<3} {'expected':>8} {'received':>8}  filter")
    ok = True
    for name, (at, text) in SUBSCRIBERS.items():
        got = [(d.attrs, d.payload) for d in received[name]]
        want = list(expected[name])
        match = got == want
        ok &= match
        mark = "" if match else "  <-- MISMATCH"
        print(f"{name:<11} {names[at]:<3} {len(want):>8} {len(got):>8}  {text}{mark}")
    orders_seen = list(received["big-orders"])
    if orders_seen:
        print(f'  e.g. big-orders decrypted: "{orders_seen[0].payload.decode()}"')
    # "shares in/split": the slash of every row under the header's
    row = "{:<18} {:>3} {:>4}  {:<24} {:>9}/{:<5}  {}"
    print(
        "\n"
        + row.format(
            "broker", "SRT", "PRT", "forwarded per VN link", "shares in", "split", "blamed"
        )
    )
    for b in sorted(overlay.brokers):
        forwarded = metric_by_label(metrics[b], "trellis_publications_forwarded_total", "link")
        blamed = {
            f"{k} (shares)": v
            for k, v in metric_by_label(metrics[b], "trellis_share_blame_total", "culprit").items()
        }
        for culprit, fault, times in re.findall(
            r'trellis_copy_blame_total\{broker="[^"]+",culprit="([^"]+)",fault="([^"]+)"\} (\S+)',
            metrics[b],
        ):
            blamed[f"{culprit} ({fault})"] = int(float(times))
        shares_in = re.search(r"trellis_shares_received_total\{[^}]*\} (\S+)", metrics[b])
        split = re.search(r"trellis_shares_split_total\{[^}]*\} (\S+)", metrics[b])
        role = f" ({BYZANTINE[b]})" if b in BYZANTINE else ""
        print(
            row.format(
                b + role,
                health[b]["srt"],
                health[b]["prt"],
                ", ".join(f"->{k}: {v}" for k, v in sorted(forwarded.items())) or "-",
                int(float(shares_in.group(1))) if shares_in else 0,
                int(float(split.group(1))) if split else 0,
                ", ".join(f"{k} x{v}" for k, v in blamed.items()) or "-",
            )
        )
    print(
        "  SRT / PRT: entries in the broker's subscription routing table (advertisements) and\n"
        "    publication routing table (subscriptions)\n"
        "  forwarded: publications sent to each neighbouring VN\n"
        "  shares in/split: key shares received / re-split for the next VN\n"
        "  blamed: brokers whose key shares this one rejected, or whose publication copies were\n"
        "    altered (differ from what f + 1 replicas agreed on) or silent (x how many)"
    )
    print(f"subscribers attributed bad key shares to: {', '.join(sorted(culprits)) or 'nobody'}")
    print("\n" + ("all deliveries match the oracle" if ok else "MISMATCH: see above"))
    return 0 if ok else 1


LOOP = AdaptiveSettings(interval=600.0, history=1, cycles=1, job_timeout=300.0)
"""One cycle of ``trellis up --adaptive`` on the line, over all of its traffic logs."""


def _closed_loop(workdir: Path, tree: Tree) -> int:
    """One adaptive cycle on the running line overlay, printed: 0, or 1 when it failed.

    The placement plan follows ``tree``, the tree the traffic crossed (the cycle's moves
    have changed the live one since)."""
    from broker.tools.adaptive_cycles import describe_cycle
    from broker.tools.placement_cli import format_report, make_plan

    print(
        "\nclosed loop: traffic logs -> Spark job (local[2], JVM start included) -> trust -> "
        "trust-aware rebuild applied live, and a replica placement plan",
        flush=True,
    )
    record = run_async(run_cycle(workdir, 1, LOOP, spark_job(LOOP)))
    out = workdir / WORK_DIR / "cycle-1" / "out"
    summary_file = out / "summary.json"
    if not summary_file.is_file():
        print(f"  {describe_cycle(record)}")
        return 1
    summary = json.loads(summary_file.read_text("utf-8"))
    bad = summary["brokers_with_failures"]
    print(
        f"  {summary['records']} records, {summary['publications']} publications in "
        f"{summary['classes']} traffic class(es); brokers with failures:" + ("" if bad else " none")
    )
    for b in bad:
        print(f"    {b['broker']}: {b['failures']} of {b['events']} ({b['failure_ratio']:.1%})")
    trust = record.get("trust", {})
    print("  VN trust: " + ", ".join(f"{vn} {t:.2f}" for vn, t in sorted(trust.items())))
    print(f"  {describe_cycle(record)}")
    for m in record.get("applied", {}).get("moves", []):
        (a, b), (c, d) = m["remove"], m["add"]
        done = f"applied by {m['coordinator']}" if m["ok"] else f"FAILED: {m['error']}"
        print(f"    move {m['number']} at {m['master']}: {a}-{b} -> {c}-{d}: {done}")
    _indented(format_report(make_plan(workdir, out, None, tree)))
    failed = not str(record.get("outcome", "")).startswith(("applied", "kept"))
    return 1 if failed else 0


async def _live_placement(overlay: LocalOverlay, names: list[str], count: int = 300) -> int:
    """Attach a replica to the first VN (the publisher's edge) and detach it again while
    publications (at least ``count``, every other one confidential) flow to the last VN;
    printed: 0 when every publication arrived exactly once, in order, byte for byte, else 1."""
    from broker.tools.placement_apply import LocalReplicas

    edge, far = names[0], names[-1]
    print(
        f"\nlive replica placement: a replica joins {edge} (the publisher's edge VN) and "
        f"leaves again while publications flow to {far}",
        flush=True,
    )
    replicas = LocalReplicas(overlay.workdir)
    pub = Client(overlay.endpoints(edge), client_id="placement-pub")
    sub = Client(overlay.endpoints(far), client_id="placement-sub", manifest=overlay.manifest_path)
    published: list[tuple[int, bytes]] = []
    seen: list[str] = []
    try:
        async with pub, sub, sub.subscribe("class = 'placement'") as subscription:
            await pub.advertise("class = 'placement'")
            await asyncio.to_thread(overlay.wait_quiet)

            def changes() -> None:
                for action in (replicas.attach, replicas.detach):
                    change = action(edge)
                    seen.append(
                        f"{change.action} {change.broker}: {change.seconds:.2f} s, the publisher "
                        f"then agreed with {pub.quorum} of {len(pub.replica_endpoints)} replicas "
                        f"and split keys for {pub.vn_size}"
                    )

            changing = asyncio.create_task(asyncio.to_thread(changes))
            i = 0
            while (i < count or not changing.done()) and i < 10 * count:
                payload = f"placement {i}".encode()
                seq = await pub.publish(
                    {"class": "placement", "i": i}, payload, confidential=i % 2 == 0
                )
                published.append((seq, payload))
                i += 1
                await asyncio.sleep(0.01)
            await changing
            deadline = time.monotonic() + 20.0
            got = [(d.seq, d.payload) for d in await _collect(subscription, i, deadline)]
    except TrellisError as exc:
        print(f"  FAILED: {exc}")
        return 1
    finally:
        for proc in replicas.started.values():
            proc.stop()
    for line in seen:
        print(f"  {line}")
    if got == published:
        print(f"  {far} got all {len(published)} exactly once, in order, byte for byte")
        return 0
    print(f"  MISMATCH: {far} got {len(got)} of {len(published)} (or out of order, or altered)")
    return 1


def _indented(text: str) -> None:
    print("\n".join(f"  {line}" for line in text.splitlines()))


def _reconfiguration_summary(seed: int) -> None:
    """OCBR rounds on a model overlay (the same cost and search code the brokers use)."""
    from reconfig.cost import CostModel
    from reconfig.simulator import clustered_workload, simulate

    rng = random.Random(seed)
    workload = clustered_workload(50, rng)
    model = CostModel()
    result = simulate(workload.tree, workload.demands, model, rng=rng)
    saving = 1 - result.final_cost / result.initial_cost
    print(
        f"\nOCBR simulation, 50 brokers, clustered traffic: routing cost "
        f"{result.initial_cost:,.0f} -> {result.final_cost:,.0f} ({saving:.0%} lower) in "
        f"{len(result.rounds)} rounds, {result.moves} moves"
        + ("" if result.converged else " (not converged)")
    )


LIVE_GROUPS = {
    # group: (publisher's VN, subscribers' VNs) on a line of six VNs: far apart on purpose
    "g0": ("b0", ("b5", "b3")),
    "g1": ("b1", ("b4",)),
    "g2": ("b5", ("b0", "b2")),
}


def _round_line(record: dict[str, Any]) -> str:
    old = " ".join("-".join(lk) for lk in record["neighbourhood"])
    new = " ".join("-".join(lk) for lk in record["new_neighbourhood"])
    return f"  round {record['round']:<6} {old}  ->  {new}"


async def _show_rounds(overlay: LocalOverlay, shown: set[str], every: float = 0.25) -> None:
    """Print each applied round as soon as a broker reports it (until cancelled)."""
    from broker.tools.local import fetch_json

    def poll() -> list[dict[str, Any]]:
        records = []
        for proc in overlay.brokers.values():
            with contextlib.suppress(OSError, ValueError):
                records += fetch_json(proc.admin_url + "/reconfig", timeout=1.0)["rounds"]
        return records

    while True:
        records = await asyncio.to_thread(poll)
        for record in sorted(records, key=lambda r: r["time"]):
            if record["outcome"] == "applied" and record["round"] not in shown:
                shown.add(record["round"])
                print(_round_line(record), flush=True)
        await asyncio.sleep(every)


async def _live_reconfiguration(overlay: LocalOverlay, seconds: float = 6.0) -> bool:
    """Traffic on a line of six brokers that rearranges itself; returns whether every
    subscriber got every publication of its group exactly once, in order."""
    from broker.tools.local import fetch_json
    from overlay.tree import Tree
    from reconfig.cost import CostModel, routing_cost

    published: dict[str, int] = dict.fromkeys(LIVE_GROUPS, 0)
    received: dict[str, list[int]] = {}
    shown: set[str] = set()
    before = await asyncio.to_thread(overlay.live_tree)
    print(f"  tree before: {' '.join('-'.join(lk) for lk in sorted(before.links))}")
    print(
        "  traffic for 6 s; rounds as they are applied (b2#1: the first round led by VN b2;\n"
        "  each lists the master's neighbourhood before -> after):",
        flush=True,
    )
    async with contextlib.AsyncExitStack() as stack:
        pubs = {}
        for group, (pub_vn, sub_vns) in LIVE_GROUPS.items():
            topic = f"class = '{group}'"
            pubs[group] = await stack.enter_async_context(
                Client(overlay.endpoints(pub_vn), client_id=f"{group}-pub")
            )
            for i, vn in enumerate(sub_vns):
                name = f"{group}-sub{i}@{vn}"
                client = await stack.enter_async_context(
                    Client(overlay.endpoints(vn), client_id=name)
                )
                sub = await stack.enter_async_context(client.subscribe(topic))
                received[name] = []
                stack.push_async_callback(_cancel, asyncio.create_task(_seqs(sub, received[name])))
            await pubs[group].advertise(topic)
        await asyncio.to_thread(overlay.wait_quiet)
        stack.push_async_callback(_cancel, asyncio.create_task(_show_rounds(overlay, shown)))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for group, pub in pubs.items():
                published[group] += 1
                await pub.publish({"class": group}, b"tick", ack=published[group] % 25 == 0)
            await asyncio.sleep(0.005)
        for pub in pubs.values():
            await pub.drain()
        await asyncio.sleep(1.0)
    after = await asyncio.to_thread(overlay.live_tree)
    states = await asyncio.to_thread(
        lambda: [fetch_json(p.admin_url + "/reconfig") for p in overlay.brokers.values()]
    )
    clients = {}
    demands = {}
    for group, (pub_vn, sub_vns) in LIVE_GROUPS.items():
        members = {f"{group}-pub": pub_vn}
        members.update({f"{group}-sub{i}@{vn}": vn for i, vn in enumerate(sub_vns)})
        clients.update(members)
        demands[frozenset(members)] = float(published[group])
    cost = [
        routing_cost(Tree(t.brokers, t.links, clients), demands, CostModel())
        for t in (before, after)
    ]
    applied = [r for s in states for r in s["rounds"] if r["outcome"] == "applied"]
    for r in sorted(applied, key=lambda r: r["time"]):
        if r["round"] not in shown:  # applied after the last poll
            print(_round_line(r))
    print(f"  tree after:  {' '.join('-'.join(lk) for lk in sorted(after.links))}")
    print(
        f"  {len(applied)} rounds applied; routing cost of the traffic delivered "
        f"{cost[0]:,.0f} on the first tree -> {cost[1]:,.0f} on the final one "
        f"({1 - cost[1] / cost[0]:.0%} lower)"
    )
    print("  subscriber (g0-sub0@b5: group g0's subscriber 0, attached at VN b5):")
    ok = True
    for name, seqs in sorted(received.items()):
        group = name.split("-")[0]
        exact = seqs == list(range(1, published[group] + 1))
        ok &= exact
        print(
            f"  {name:<12} {len(seqs):>5} of {published[group]:>5} "
            + ("exactly once, in order" if exact else "MISMATCH")
        )
    return ok


async def _seqs(sub: Subscription, into: list[int]) -> None:
    async for msg in sub:
        into.append(msg.seq)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _progress(name: str, up: int, total: int) -> None:
    """One line that grows as brokers come up (start-up takes seconds)."""
    print(f"{'' if up > 1 else '  brokers up:'} {name}", end="", flush=True)
    if up == total:
        print(f" ({total}); linking...", flush=True)


def _stop(overlay: LocalOverlay) -> None:
    with signals_deferred():
        overlay.stop(timeout=5.0)


def run_demo(workdir: Path, count: int = 2000, seed: int = 7) -> int:
    """Run the three parts of the demo; every broker it starts is stopped when it returns,
    fails or is interrupted (KeyboardInterrupt)."""
    rng = random.Random(seed)
    names = broker_names(VNS)
    print(
        f"starting {VNS} virtual nodes x {REPLICAS} replica brokers in a line "
        f"({' - '.join(names)}); Byzantine: "
        + ", ".join(f"{b} {mode}s" for b, mode in BYZANTINE.items()),
        flush=True,
    )
    overlay = start_overlay(
        workdir / "line",
        line_tree(names),
        adaptive_broker_settings(LOOP.interval, ocbr_turns=False),
        replicas=dict.fromkeys(names, REPLICAS),
        overrides={b: {"byzantine": mode} for b, mode in BYZANTINE.items()},
        progress=_progress,
    )
    print(f"{len(overlay.brokers)} broker processes up; streaming traffic...", flush=True)
    try:
        code = run_async(_traffic(overlay, names, count, rng))
        code = _closed_loop(overlay.workdir, overlay.tree) or code
        code = run_async(_live_placement(overlay, names)) or code
    finally:
        _stop(overlay)

    live = broker_names(6)
    print(f"\nlive reconfiguration: {' - '.join(live)}, master turns every 0.3 s", flush=True)
    overlay = start_overlay(
        workdir / "reconfig",
        line_tree(live),
        {"reconfig": {"enabled": True, "interval": 0.3, "min_traffic": 15}},
        progress=_progress,
    )
    try:
        ok = run_async(_live_reconfiguration(overlay))
    finally:
        _stop(overlay)
    if not ok:
        print("MISMATCH in the live reconfiguration run: see above")
        code = code or 1
    _reconfiguration_summary(seed)
    sys.stdout.flush()
    return code
