"""Real brokers, the real job, then ``trellis trust show`` and ``trellis rebuild --dry-run``.

A line of 6 VNs b0…b5; b2 (in a transit position: b0 and b1 publish to b3, b4 and b5) has 5
replicas, of which b2.1 corrupts every payload and sub-share it forwards and b2.2 drops every
publication and share. Traffic flows (every publication delivered), the brokers' traffic logs
go through ``trellis analytics run`` (Spark local mode), and from the job's outputs the trust
command names both culprits and why, and the planner moves b2 out of every transit path
within the cost budget, raising the social trust. Applying the plan live is not built yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.client import Client
from broker.tools.cli import main
from broker.tools.local import LocalOverlay
from overlay.tree import line_tree

pytest.importorskip("pyarrow.parquet")
pytest.importorskip("pyspark")

pytestmark = pytest.mark.slow

PLAIN, CONFIDENTIAL = 30, 6
CORRUPTER, DROPPER = "b2.1", "b2.2"
PUBLISHERS, SUBSCRIBERS = ("b0", "b1"), ("b3", "b4", "b5")


async def traffic(overlay: LocalOverlay) -> dict[str, int]:
    """Every publisher's publications reach every subscriber; returns deliveries per VN."""
    subs = [
        Client(overlay.endpoints(s), client_id=f"sub-{s}", manifest=overlay.manifest)
        for s in SUBSCRIBERS
    ]
    pubs = [Client(overlay.endpoints(p), client_id=f"pub-{p}") for p in PUBLISHERS]
    got = dict.fromkeys(SUBSCRIBERS, 0)
    async with contextlib.AsyncExitStack() as stack:
        for c in [*subs, *pubs]:
            await stack.enter_async_context(c)
        streams = [await stack.enter_async_context(c.subscribe("class = 'q'")) for c in subs]
        for c in pubs:
            await c.advertise("class = 'q'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(PLAIN + CONFIDENTIAL):
            for c in pubs:
                await c.publish({"class": "q", "i": i}, b"x" * 40, confidential=i >= PLAIN)
        for vn, stream in zip(SUBSCRIBERS, streams, strict=True):
            for _ in range(len(pubs) * (PLAIN + CONFIDENTIAL)):
                await stream.get(20.0)
                got[vn] += 1
    return got


def test_a_faulty_transit_vn_is_named_and_planned_out_of_every_transit_path(
    run_overlay: Callable[..., LocalOverlay],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs, out = tmp_path / "traffic", tmp_path / "out"
    overlay = run_overlay(
        line_tree([f"b{i}" for i in range(6)]),
        name="ov",
        replicas={"b2": 5},
        overrides={CORRUPTER: {"byzantine": "corrupt"}, DROPPER: {"byzantine": "drop"}},
        heartbeat_interval=1.0,
        traffic_log={"dir": str(logs), "flush_interval": 0.2},
        reconfig={"interval": 3600.0},
    )
    got = asyncio.run(traffic(overlay))
    assert got == dict.fromkeys(SUBSCRIBERS, len(PUBLISHERS) * (PLAIN + CONFIDENTIAL))
    overlay.stop()  # a graceful stop writes every broker's last batch

    started = time.monotonic()
    done = subprocess.run(
        [
            *(sys.executable, "-m", "broker", "analytics", "run", "--logs", str(logs)),
            *("--out", str(out), "--window", "1e9", "--master", "local[2]", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    job_wall = time.monotonic() - started
    job_seconds = json.loads(done.stdout)["seconds"]

    assert main(["trust", "show", "--from", str(out), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    trust = {b["broker"]: b for b in shown["brokers"]}
    assert trust[CORRUPTER]["trust"] == 0.0
    assert trust[CORRUPTER]["pulled_down_by"] in ("delivery_ratio", "share_integrity")
    assert trust[DROPPER]["trust"] == 0.0
    assert trust[DROPPER]["pulled_down_by"] == "delivery_ratio"
    for broker, report in trust.items():
        if broker not in (CORRUPTER, DROPPER):
            assert report["trust"] == 1.0, (broker, report)
    assert shown["vns"]["b2"] == 0.0

    argv = ["rebuild", "--dir", str(overlay.workdir), "--from", str(out), "--dry-run"]
    started = time.monotonic()
    assert main([*argv, "--json"]) == 0
    plan_wall = time.monotonic() - started
    plan = json.loads(capsys.readouterr().out)
    assert plan["distrusted"] == ["b2"]
    assert plan["demoted"] == ["b2"]
    assert plan["flagged"] == ["b2"]  # trust 0 < 0.1: flagged for detach even as a leaf
    assert plan["moves"]
    assert plan["after"]["social_trust"] > plan["before"]["social_trust"]
    assert plan["after"]["cost"] <= plan["budget"]
    after = {tuple(lk) for lk in plan["links_after"]}
    assert sum("b2" in lk for lk in after) == 1  # a leaf: no transit traffic

    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "distrusted in transit: b2 -> none" in text
    print(text)  # shown with -s: the plan as an operator sees it
    print(
        f"cycle: job {job_wall:.1f} s wall ({job_seconds:.1f} s in the job), "
        f"trust + plan {plan_wall * 1000:.0f} ms, moves not applied"
    )
