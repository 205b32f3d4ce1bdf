"""``trellis rebuild`` applying a trust-aware plan live on real broker processes.

The plan comes from injected faults: a replica of a transit VN corrupts what it forwards,
the brokers' own traffic logs go through the analytics reference (the job's semantics in
plain Python, so no Spark here; ``tests/reconfig/test_rebuild_system.py`` runs the real
job), and the planner's moves run as live rounds while plain and confidential publications
flow. Refused moves (a Byzantine coordinator, a member that is down, a stale move) leave the
overlay as it was, and the report says which move failed, why and where the overlay stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.client import Client, TrellisTimeout
from broker.daemon.reconfig_agent import ControlChannel
from broker.tools.cli import main
from broker.tools.local import LocalOverlay, fetch_json, fetch_text
from broker.tools.rebuild_apply import apply_moves_live, ask_move, live_tree
from overlay.tree import line_tree
from reconfig.live import RequestedMove
from reconfig.rebuild import Move, transit_vns

pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")

pytestmark = pytest.mark.slow

PUBLISHERS, SUBSCRIBERS = ("b0", "b1"), ("b3", "b4")


def write_reference_outputs(logs: Path, out: Path) -> Path:
    """The analytics outputs (as ``trellis analytics run --out`` lays them out) computed
    from the overlay's logs by the job's reference semantics."""
    from analytics.reference import compute
    from analytics.schema import read_records

    tables = compute(read_records(logs), 1e9)
    out.mkdir()
    for name in ("trust_feedback", "classes"):
        (out / name).mkdir()
        rows = [{**r, "version": 1} for r in tables[name]]
        pq.write_table(pa.Table.from_pylist(rows), out / name / "part-00000.parquet")
    (out / "summary.json").write_text(json.dumps({"version": 1, "records": 0}))
    return out


async def publish_and_check(
    overlay: LocalOverlay, during: Callable[[], Any], count: int = 60
) -> dict[str, int]:
    """Publishers at b0 and b1 publish ``count`` each (every third confidential) while
    ``during()`` runs in a thread; every subscriber gets every publication once, in order,
    with its payload. Returns deliveries per subscriber VN."""
    subs = [
        Client(overlay.endpoints(s), client_id=f"sub-{s}", manifest=overlay.manifest)
        for s in SUBSCRIBERS
    ]
    # Publisher ids are new per call: a publisher's sequence numbers must not start again.
    tag = f"{time.monotonic_ns() % 10**6}"
    pubs = [Client(overlay.endpoints(p), client_id=f"pub-{p}-{tag}") for p in PUBLISHERS]
    got: dict[str, dict[str, list[tuple[int, bytes]]]] = {
        s: {c.client_id: [] for c in pubs} for s in SUBSCRIBERS
    }
    async with contextlib.AsyncExitStack() as stack:
        for c in [*subs, *pubs]:
            await stack.enter_async_context(c)
        streams = [await stack.enter_async_context(c.subscribe("class = 'q'")) for c in subs]
        for c in pubs:
            await c.advertise("class = 'q'")
        await asyncio.to_thread(overlay.wait_quiet)

        async def publish() -> None:
            for i in range(count):
                for c in pubs:
                    payload = f"{c.client_id}:{i}".encode() * 4
                    await c.publish({"class": "q", "i": i}, payload, confidential=i % 3 == 0)
                await asyncio.sleep(0.03)

        async def read(vn: str, stream: Any) -> None:
            for _ in range(len(pubs) * count):
                try:
                    d = await stream.get(20.0)
                except TrellisTimeout:
                    return  # what is missing shows below
                got[vn][d.publisher].append((int(d.attrs["i"]), d.payload))

        async with asyncio.TaskGroup() as tg:
            tg.create_task(publish())
            for vn, stream in zip(SUBSCRIBERS, streams, strict=True):
                tg.create_task(read(vn, stream))
            tg.create_task(asyncio.to_thread(during))
        for stream in streams:
            with pytest.raises(TrellisTimeout):
                await stream.get(0.5)  # nothing more: no duplicate arrives late
    for vn, by_pub in got.items():
        for pub, items in by_pub.items():
            want = [(i, f"{pub}:{i}".encode() * 4) for i in range(count)]
            missing = sorted({i for i, _ in want} - {i for i, _ in items})
            assert items == want, f"{vn} from {pub}: {len(items)} of {count}, missing {missing}"
    return {vn: sum(len(v) for v in by_pub.values()) for vn, by_pub in got.items()}


def test_a_plan_from_observed_faults_is_applied_live_without_loss_or_reorder(
    run_overlay: Callable[..., LocalOverlay],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A line b0-b1-b2-b3-b4; b2 (transit for b0, b1 -> b3, b4) has 3 replicas, b2.1 corrupts.
    logs = tmp_path / "traffic"
    overlay = run_overlay(
        line_tree([f"b{i}" for i in range(5)]),
        name="ov",
        replicas={"b2": 3},
        overrides={"b2.1": {"byzantine": "corrupt"}},
        heartbeat_interval=1.0,
        traffic_log={"dir": str(logs), "flush_interval": 0.2},
        reconfig={"enabled": True, "interval": 3600.0},  # no OCBR turns of their own
    )
    asyncio.run(publish_and_check(overlay, lambda: None, count=30))
    time.sleep(0.6)  # the logs' last batch is written
    out = write_reference_outputs(logs, tmp_path / "out")

    argv = ["rebuild", "--dir", str(overlay.workdir), "--from", str(out)]
    assert main([*argv, "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["tree_from"] == "live links"
    assert plan["distrusted"] == ["b2"]
    assert plan["moves"]

    results: list[int] = []

    def rebuild() -> None:
        time.sleep(0.3)  # publications are in flight
        results.append(main([*argv, "--json"]))

    got = asyncio.run(publish_and_check(overlay, rebuild, count=60))
    assert got == dict.fromkeys(SUBSCRIBERS, 120)
    assert results == [0]
    done = json.loads(capsys.readouterr().out)
    applied = done["applied"]
    assert applied["ok"]
    assert applied["applied"] == len(plan["moves"])
    assert applied["state"] == "the overlay is on the planned tree"

    tree = overlay.live_tree()
    assert {tuple(lk) for lk in plan["links_after"]} == set(tree.links)
    assert len(tree.neighbours("b2")) == 1  # a leaf: no transit traffic
    classes = {("b0", frozenset(SUBSCRIBERS)): 1.0, ("b1", frozenset(SUBSCRIBERS)): 1.0}
    assert "b2" not in transit_vns(tree, classes)
    assert done["after"]["social_trust"] > done["before"]["social_trust"]
    assert done["after"]["cost"] <= done["budget"]
    # Every replica of b2 agrees on its neighbours; the rounds are in /reconfig and metrics.
    seen = {
        tuple(fetch_json(overlay.brokers[b].admin_url + "/reconfig")["neighbours"])
        for b in overlay.replicas_of("b2")
    }
    assert len(seen) == 1
    rounds = [
        r
        for b in overlay.broker_ids
        for r in fetch_json(overlay.brokers[b].admin_url + "/reconfig")["rounds"]
        if "requested" in r
    ]
    assert len(rounds) == len(plan["moves"])
    assert all(r["outcome"] == "applied" for r in rounds)
    asked = sum(
        float(line.split()[-1])
        for b in overlay.broker_ids
        for line in fetch_text(overlay.brokers[b].admin_url + "/metrics").splitlines()
        if line.startswith("trellis_reconfig_requested_moves_total")
    )
    assert asked == len(plan["moves"])
    # The hysteresis memory of an applied plan is kept for the next one.
    state = json.loads((overlay.workdir / "rebuild-state.json").read_text())
    assert state["distrusted"] == ["b2"]


def test_moves_are_applied_on_an_overlay_that_speaks_only_tls(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = run_overlay(
        line_tree(["c0", "c1", "c2"]),
        name="tls",
        tls=True,
        reconfig={"enabled": True, "interval": 3600.0},
    )
    info = json.loads((overlay.workdir / "overlay.json").read_text())
    assert "tls" in info
    before = live_tree(info)
    assert before is not None
    report = asyncio.run(
        apply_moves_live(info, before, [Move("c1", "c0", "c2")], timeout=10.0, settle=1.0)
    )
    assert report.ok, report.describe()
    assert overlay.live_tree().links == {("c0", "c2"), ("c1", "c2")}


def test_refused_moves_leave_the_overlay_as_it_was_and_say_why(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    # c0-c1-c2-c3; c1's coordinator proposes wrong plans; c2 has a second replica.
    overlay = run_overlay(
        line_tree(["c0", "c1", "c2", "c3"]),
        name="refused",
        replicas={"c2": 2},
        overrides={"c1": {"byzantine": "misplan"}},
        heartbeat_interval=1.0,
        reconfig={"enabled": True, "interval": 3600.0, "step_timeout": 1.0},
    )
    info = json.loads((overlay.workdir / "overlay.json").read_text())
    before = live_tree(info)
    assert before is not None

    def apply(*moves: Move) -> Any:
        return asyncio.run(apply_moves_live(info, before, moves, timeout=10.0, settle=1.0))

    # A Byzantine coordinator: members refuse its plan, the round aborts.
    report = apply(Move("c1", "c0", "c2"), Move("c2", "c3", "c1"))
    assert not report.ok
    assert [o.ok for o in report.outcomes] == [False]  # the plan stopped at move 1
    assert "plan refused" in report.outcomes[0].error
    assert report.state.startswith("stopped at move 1; the overlay is as it was")
    assert "move 1 at c1: c0-c1 -> c0-c2: FAILED" in report.describe()
    assert overlay.live_tree().links == before.links

    # A stale move (c3 is not c1's neighbour): the tool does not ask, and a broker asked
    # anyway refuses it before any lock.
    report = apply(Move("c1", "c3", "c0"))
    assert report.outcomes[0].error.startswith("not asked")
    ok, error, _who = asyncio.run(ask_move(info, Move("c1", "c3", "c0"), "stale", 10.0))
    assert not ok
    assert "c3 is not a neighbour of master c1" in error
    assert overlay.live_tree().links == before.links

    # A peer broker may not ask for a move: only the broker's own id (the operator) may.
    async def ask_as_peer() -> str:
        endpoint = next(b["endpoint"] for b in info["brokers"] if b["id"] == "c2.0")
        channel = ControlChannel("c3", "c2.0", endpoint)
        try:
            await channel.open(2.0)
            reply = await channel.call(RequestedMove("c3", "c1"), 10.0)
        finally:
            await channel.close()
        assert not reply.ok
        return reply.error

    assert "asked under the broker's own id, not 'c3'" in asyncio.run(ask_as_peer())
    assert overlay.live_tree().links == before.links

    # A member of the neighbourhood is down: the round is refused, nothing changes.
    overlay.brokers["c2.1"].stop(5.0)
    report = apply(Move("c2", "c3", "c1"))
    assert not report.ok
    assert "c2.1 unreachable" in report.outcomes[0].error
    assert report.state.startswith("stopped at move 1; the overlay is as it was")
    assert overlay.live_tree().links == before.links


def test_an_adaptive_cycle_demotes_the_faulty_vn_and_later_cycles_keep_the_tree(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    from broker.tools.adaptive import AdaptiveSettings, adaptive_broker_settings, run_adaptive
    from broker.tools.adaptive_cycles import read_cycles

    # The first job runs until the loop has recorded a skipped tick (so a skip is certain,
    # whatever the machine's load); the first cycle then plans and applies its moves (live
    # rounds). A busy machine may make it overrun one more tick: that skip is recorded too.
    interval = 3.0
    overlay = run_overlay(
        line_tree([f"b{i}" for i in range(5)]),
        name="adaptive",
        replicas={"b2": 3},
        overrides={"b2.1": {"byzantine": "corrupt"}},
        heartbeat_interval=1.0,
        **adaptive_broker_settings(interval, ocbr_turns=False),
    )
    asyncio.run(publish_and_check(overlay, lambda: None, count=20))
    jobs: list[Path] = []
    seen: list[dict[str, Any]] = []
    skip_seen = asyncio.Event()

    def report(cycle: dict[str, Any]) -> None:
        seen.append(cycle)
        if cycle["outcome"].startswith("skipped"):
            skip_seen.set()

    async def reference_job(logs: Path, out: Path) -> dict[str, Any]:
        jobs.append(logs)
        if len(jobs) == 1:  # a slow job: it outlasts the next tick
            await asyncio.wait_for(skip_seen.wait(), interval * 5)
        await asyncio.to_thread(write_reference_outputs, logs, out)
        return {"records": 0}

    def loop() -> None:
        settings = AdaptiveSettings(interval=interval, cycles=2)
        asyncio.run(run_adaptive(overlay.workdir, settings, reference_job, report))

    # Traffic flows while the loop runs its cycles and applies the first one's moves.
    asyncio.run(publish_and_check(overlay, loop, count=150))
    cycles = read_cycles(overlay.workdir)
    assert [c["cycle"] for c in seen] == [c["cycle"] for c in cycles]
    assert cycles[0]["cycle"] == 2
    assert cycles[0]["outcome"].startswith("skipped")
    ran = [c for c in cycles if not c["outcome"].startswith("skipped")]
    assert [c["cycle"] for c in ran][:1] == [1], cycles
    first, second = ran
    # Every tick while a cycle ran is a skip, recorded when it happened (before the cycle).
    skipped = [c["cycle"] for c in cycles if c["outcome"].startswith("skipped")]
    assert skipped == list(range(2, second["cycle"])), cycles
    assert cycles.index(first) == len(skipped)
    assert cycles[-1] is second
    assert first["outcome"].startswith("applied"), first["outcome"]
    assert first["plan"]["distrusted"] == ["b2"]
    assert first["plan"]["after"]["social_trust"] > first["plan"]["before"]["social_trust"]
    assert first["plan"]["after"]["cost"] <= first["plan"]["budget"]
    assert second["outcome"].startswith("kept"), second["outcome"]  # no oscillation
    assert second["plan"]["distrusted"] == ["b2"]
    tree = overlay.live_tree()
    assert len(tree.neighbours("b2")) == 1
    tags = [
        r["requested"]["tag"]
        for b in overlay.broker_ids
        for r in fetch_json(overlay.brokers[b].admin_url + "/reconfig")["rounds"]
        if "requested" in r
    ]
    assert tags
    assert all(t.startswith("cycle 1 move") for t in tags)
