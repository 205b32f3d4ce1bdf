"""Live OCBR reconfiguration with real broker processes (SPEC §5, issue 5).

The overlay starts as a line of VNs (two of them replica groups of three); groups of one
publisher and two subscribers sit at random VNs, so the line serves them badly. Brokers take
master turns every few hundred milliseconds while the publishers publish without pause. The
test runs phases of new groups until at least 20 rounds applied a move, then checks:

* every subscriber got every publication of its group exactly once, in publisher order,
  and the brokers' own delivery counters say no broker delivered a copy twice;
* the global cost (SPEC §5 formula over the live topology and the traffic actually
  delivered) fell in every phase;
* every replica of a VN ends with the same neighbours (they applied the same plans).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from broker.client import Client
from broker.tools.local import LocalOverlay, fetch_json, metric_by_label
from overlay.tree import Tree, broker_names, line_tree
from reconfig.cost import CostModel, routing_cost

pytestmark = pytest.mark.slow

RECONFIG = {"enabled": True, "interval": 0.3, "jitter": 0.3, "min_traffic": 15}


@dataclass
class Group:
    """One traffic class: a publisher and its subscribers, at given VNs."""

    name: str
    publisher_vn: str
    subscriber_vns: list[str]
    published: int = 0
    received: dict[str, list[int]] = field(default_factory=dict)

    def clients(self) -> dict[str, str]:
        """Client id -> the VN it is attached to."""
        out = {f"{self.name}-pub": self.publisher_vn}
        out.update({f"{self.name}-sub{i}": vn for i, vn in enumerate(self.subscriber_vns)})
        return out


def applied_rounds(overlay: LocalOverlay) -> int:
    """Rounds that applied a plan, over every coordinator of the overlay."""
    total = 0
    for proc in overlay.brokers.values():
        total += fetch_json(proc.admin_url + "/reconfig")["applied"]
    return total


def phase_cost(tree: Tree, groups: list[Group]) -> float:
    """SPEC §5 cost of the delivered traffic of ``groups`` on ``tree`` (unit costs)."""
    clients: dict[str, str] = {}
    demands: dict[frozenset[str], float] = {}
    for g in groups:
        clients.update(g.clients())
        demands[frozenset(g.clients())] = float(g.published)
    with_clients = Tree(tree.brokers, tree.links, clients)
    return routing_cost(with_clients, demands, CostModel())


async def run_group(
    overlay: LocalOverlay, group: Group, stop: asyncio.Event, ready: asyncio.Event
) -> None:
    """Subscribe, advertise, then publish until ``stop``; collect what each subscriber got."""
    topic = f"class = '{group.name}'"
    async with Client(overlay.endpoints(group.publisher_vn), client_id=f"{group.name}-pub") as pub:
        subs = []
        for i, vn in enumerate(group.subscriber_vns):
            client = Client(overlay.endpoints(vn), client_id=f"{group.name}-sub{i}")
            await client.__aenter__()
            subs.append((f"{group.name}-sub{i}", client, client.subscribe(topic)))
        readers = []
        try:
            for sub_id, _, subscription in subs:
                await subscription.__aenter__()
                group.received[sub_id] = []
                readers.append(asyncio.create_task(collect(subscription, group.received[sub_id])))
            await pub.advertise(topic)
            await ready.wait()
            while not stop.is_set():
                group.published += 1
                await pub.publish(
                    {"class": group.name, "i": group.published},
                    b"x" * 64,
                    ack=group.published % 25 == 0,
                )
                await asyncio.sleep(0.008)
            await pub.drain()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and any(  # noqa: ASYNC110 - polls other tasks
                len(r) < group.published for r in group.received.values()
            ):
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # a late duplicate would show up now
        finally:
            for task in readers:
                task.cancel()
            for _, client, subscription in subs:
                await subscription.__aexit__(None, None, None)
                await client.__aexit__(None, None, None)


async def collect(subscription, into: list[int]) -> None:
    async for msg in subscription:
        into.append(msg.seq)


async def test_live_reconfiguration_lowers_cost_and_loses_nothing(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    vns = broker_names(12)
    overlay = run_overlay(
        line_tree(vns),
        replicas={"b04": 3, "b07": 3},
        heartbeat_interval=1.0,
        reconfig=RECONFIG,
    )
    rng = random.Random(5)
    groups: list[Group] = []
    phases: list[tuple[float, float, int]] = []
    tasks = []
    for phase in range(6):
        phase_groups = []
        for k in range(5):
            pub_vn, *sub_vns = rng.sample(vns, 3)
            phase_groups.append(Group(f"p{phase}g{k}", pub_vn, sub_vns))
        ready = asyncio.Event()
        stop = asyncio.Event()
        tasks += [asyncio.create_task(run_group(overlay, g, stop, ready)) for g in phase_groups]
        await asyncio.sleep(1.0)  # clients connected and subscribed
        await asyncio.to_thread(overlay.wait_quiet)
        before_tree = await asyncio.to_thread(overlay.live_tree)
        before_applied = await asyncio.to_thread(applied_rounds, overlay)
        ready.set()
        started = time.monotonic()
        # Publish until this phase's reconfiguration settles (no move for 2 s) or 12 s pass.
        last_change, last_applied = started, before_applied
        while time.monotonic() - started < 12 and (
            time.monotonic() - started < 3 or time.monotonic() - last_change < 2.0
        ):
            await asyncio.sleep(0.25)
            now = await asyncio.to_thread(applied_rounds, overlay)
            if now != last_applied:
                last_change, last_applied = time.monotonic(), now
        stop.set()
        await asyncio.sleep(0.3)
        after_tree = await asyncio.to_thread(overlay.live_tree)
        groups += phase_groups
        phases.append(
            (
                phase_cost(before_tree, phase_groups),
                phase_cost(after_tree, phase_groups),
                last_applied - before_applied,
            )
        )
        if last_applied >= 20 and phase >= 1:
            break
    await asyncio.gather(*tasks)

    total_applied = await asyncio.to_thread(applied_rounds, overlay)
    print(f"\napplied rounds: {total_applied}; per phase (cost before, after, moves): {phases}")
    assert total_applied >= 20

    # Exactly once, in per-publisher order, at every subscriber.
    for g in groups:
        assert g.published > 0
        for sub_id, seqs in g.received.items():
            assert seqs == list(range(1, g.published + 1)), (
                f"{sub_id}: got {len(seqs)} of {g.published}, "
                f"first gap at {next((i for i, s in enumerate(seqs, 1) if s != i), None)}"
            )
    # No broker delivered a copy twice (the SDK would hide it): every replica of a
    # subscriber's VN delivered each publication once.
    health = await asyncio.to_thread(overlay.health)
    delivered = sum(h["deliveries"] for h in health.values())
    expected = sum(
        g.published * len(overlay.replicas_of(vn)) for g in groups for vn in g.subscriber_vns
    )
    assert delivered == expected

    # The global cost fell in every phase that moved links, and never rose.
    for before, after, moves in phases:
        assert after <= before
        if moves:
            assert after < before
    # Replicas of a VN applied the same plans.
    for vn in ("b04", "b07"):
        seen = {
            tuple(fetch_json(overlay.brokers[b].admin_url + "/reconfig")["neighbours"])
            for b in overlay.replicas_of(vn)
        }
        assert len(seen) == 1, seen


async def test_cli_follows_rounds_and_shows_the_moved_tree(tmp_path) -> None:
    """`trellis up --reconfig`, traffic that b1 only relays, then `trellis reconfig` and
    `trellis topology` report the move that took b1 off the path."""
    import json
    import subprocess
    import sys

    def trellis(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "broker", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    workdir = tmp_path / "ov"
    up = await asyncio.to_thread(
        trellis,
        "up",
        "--vns",
        "4",
        "--reconfig",
        "--reconfig-interval",
        "0.3",
        "--dir",
        str(workdir),
    )
    assert up.returncode == 0, up.stderr
    try:
        endpoints = {b["id"]: [b["endpoint"]] for b in json.loads(up.stdout)["brokers"]}
        # Follow every round (--watch) until b1's move is among them: with --rounds N the
        # CLI stops after any N rounds, and on a loaded machine b2's "no cheaper tree"
        # rounds can come first.
        follow = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "broker",
            "reconfig",
            "--dir",
            str(workdir),
            "--watch",
            "--every",
            "0.3",
            "--timeout",
            "30",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        lines: list[str] = []

        async def until_b1_moved() -> None:
            """Read rounds until b1's applied one and its two lines (old and new links,
            local cost)."""
            assert follow.stdout is not None
            async for line in follow.stdout:
                lines.append(line.decode())
                if "master b1     applied" in lines[-1]:
                    lines.extend([(await follow.stdout.readline()).decode() for _ in range(2)])
                    return

        moved = asyncio.create_task(until_b1_moved())
        async with (
            Client(endpoints["b0"], client_id="pub") as pub,
            Client(endpoints["b2"], client_id="sub") as sc,
            sc.subscribe("class = 'x'"),
        ):
            await pub.advertise("class = 'x'")
            await asyncio.sleep(0.5)
            while not moved.done():
                for _ in range(20):
                    await pub.publish({"class": "x"}, b"p", ack=False)
                await pub.drain()
                await asyncio.sleep(0.05)
        await moved
        with contextlib.suppress(ProcessLookupError):
            follow.terminate()
        _, err = await asyncio.wait_for(follow.communicate(), 10)
        assert follow.returncode in (0, -signal.SIGTERM), err.decode()  # ran, stopped or ended
        followed = "".join(lines)
        assert "master b1     applied" in followed, (followed, err.decode())
        assert "b0-b2" in followed
        shown = await asyncio.to_thread(trellis, "topology", "--dir", str(workdir))
        assert "started as: b0-b1 b1-b2 b2-b3" in shown.stdout
        assert "b0-b2" in shown.stdout.splitlines()[-2]
    finally:
        down = await asyncio.to_thread(trellis, "down", "--dir", str(workdir))
    assert down.returncode == 0, down.stderr


@pytest.mark.parametrize("key_refresh", [5, 1000], ids=["epochs-of-5", "one-long-epoch"])
async def test_confidential_publications_decrypt_across_moves(
    run_overlay: Callable[..., LocalOverlay], key_refresh: int
) -> None:
    """Key shares are verified along the path their certificates name, so moves that change
    a publication's path do not break decryption, even with a corrupting replica on the path
    the move takes away. An epoch that spans a move reaches b2 along both paths; neither set
    gets an honest replica blamed.

    The corrupting replica sits in b1, not in the publisher's edge VN b0: with a Byzantine
    replica in b0 the two honest ones may stop reading the publisher at different seqs when
    the round freezes them, and a publication between those seqs can then reach a path with
    one good copy, fewer than the f + 1 a broker routes on (a known gap, stated in the
    README)."""
    overlay = run_overlay(
        line_tree(["b0", "b1", "b2", "b3"]),
        replicas={"b0": 3, "b1": 3, "b2": 3},
        overrides={"b1.2": {"byzantine": "corrupt"}},
        heartbeat_interval=1.0,
        reconfig=RECONFIG,
    )
    async with (
        Client(overlay.endpoints("b0"), client_id="pub", key_refresh=key_refresh) as pub,
        Client(overlay.endpoints("b2"), client_id="sub", manifest=overlay.manifest) as sc,
        sc.subscribe("class = 'secret'") as sub,
    ):
        await pub.advertise("class = 'secret'")
        await asyncio.to_thread(overlay.wait_quiet)
        got: list[tuple[int, bytes]] = []

        async def read() -> None:
            async for msg in sub:
                assert msg.confidential
                got.append((msg.seq, msg.payload))

        reader = asyncio.create_task(read())
        sent = 0
        started = time.monotonic()
        while time.monotonic() - started < 12:
            sent += 1
            await pub.publish(
                {"class": "secret", "i": sent}, f"order {sent}".encode(), confidential=True
            )
            settled = sent % 50 == 0 and time.monotonic() - started > 3
            if settled and await asyncio.to_thread(applied_rounds, overlay):
                break
        await pub.drain()
        deadline = time.monotonic() + 15
        while len(got) < sent and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        reader.cancel()
    assert await asyncio.to_thread(applied_rounds, overlay) >= 1
    assert ("b0", "b2") in (await asyncio.to_thread(overlay.live_tree)).links
    assert got == [(i, f"order {i}".encode()) for i in range(1, sent + 1)]
    blamed = {
        culprit
        for b in overlay.brokers
        for culprit, count in metric_by_label(
            overlay.metrics(b), "trellis_share_blame_total", "culprit"
        ).items()
        if count > 0
    }
    assert blamed <= {"b1.2"}


async def test_a_master_that_vanishes_mid_round_leaves_nothing_frozen(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """A member frozen by a coordinator that then disappears unfreezes when the lease ends,
    and what its clients published meanwhile is delivered, in order."""
    from broker.wire.protocol import PROTOCOL_VERSION, MsgType
    from tests.wire import RawPeer

    overlay = run_overlay(
        line_tree(["b0", "b1"]),
        heartbeat_interval=1.0,
        reconfig={"enabled": True, "interval": 1000, "lock_lease": 1.5, "step_timeout": 0.5},
    )
    async with (
        Client(overlay.endpoints("b1"), client_id="pub") as pub,
        Client(overlay.endpoints("b0"), client_id="sub") as sc,
        sc.subscribe("class = 'x'") as sub,
    ):
        await pub.advertise("class = 'x'")
        await asyncio.to_thread(overlay.wait_quiet)
        master = await RawPeer.connect(overlay.endpoint("b1"))
        await master.send(MsgType.HELLO, PROTOCOL_VERSION, "broker", "b0", {"control": True})
        await master.receive()
        steps = [
            ("lock", {"master": "b0", "lease": 1.5}),
            ("prepare", {"master": "b0", "hood": ["b0", "b1"], "links": [["b0", "b1"]]}),
            ("connect", {}),
            ("freeze", {}),
        ]
        replies = []
        for op, data in steps:
            await master.send(MsgType.RECONF, op, {"round": "gone#1", **data})
            replies.append((await master.receive()).data)
        assert [r["ok"] for r in replies] == [True, True, True, False]
        assert "drain markers missing" in replies[-1]["error"]
        await master.close()  # the master is gone: b1 stays frozen until its lease ends
        state = await asyncio.to_thread(fetch_json, overlay.brokers["b1"].admin_url + "/reconfig")
        assert state["locked_by"] == "b0"
        for i in range(50):
            await pub.publish({"class": "x", "i": i}, b"held back", ack=False)
        got = [(await sub.get(10)).seq for _ in range(50)]
        assert got == list(range(1, 51))
    state = await asyncio.to_thread(fetch_json, overlay.brokers["b1"].admin_url + "/reconfig")
    assert state["locked_by"] is None


async def test_a_restarted_broker_rejoins_the_tree_as_reconfiguration_left_it(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = run_overlay(
        line_tree(["b0", "b1", "b2", "b3"]), heartbeat_interval=1.0, reconfig=RECONFIG
    )
    async with (
        Client(overlay.endpoints("b0"), client_id="pub") as pub,
        Client(overlay.endpoints("b2"), client_id="sub") as sc,
        sc.subscribe("class = 'x'") as sub,
    ):
        await pub.advertise("class = 'x'")
        await asyncio.to_thread(overlay.wait_quiet)
        sent = 0
        while not await asyncio.to_thread(applied_rounds, overlay):
            for _ in range(20):
                sent += 1
                await pub.publish({"class": "x"}, b"p", ack=False)
            await pub.drain()
            await asyncio.sleep(0.05)
            assert sent < 20_000, "no round applied a move"
        moved = await asyncio.to_thread(overlay.live_tree)
        assert ("b0", "b2") in moved.links
        for _ in range(sent):
            await sub.get(10)
        # b0's config still names b1; its links file names b2.
        overlay.brokers["b0"].kill()
        await asyncio.to_thread(overlay.start, "b0")
        deadline = time.monotonic() + 20
        while await asyncio.to_thread(overlay.live_tree) != moved:
            assert time.monotonic() < deadline, "b0 did not rejoin where it was"
            await asyncio.sleep(0.1)
        await pub.connected()
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(20):
            await pub.publish({"class": "x", "i": i}, b"after restart")
        got = [await sub.get(10) for _ in range(20)]
        assert [m.payload for m in got] == [b"after restart"] * 20
