"""One adaptive cycle end to end: ``trellis up --adaptive`` with the real Spark job.

A line of 6 VNs b0…b5; b2 (in a transit position: b0 and b1 publish to b3, b4 and b5) has 5
replicas, of which b2.1 corrupts every payload and sub-share it forwards and b2.2 drops every
publication and share. The CLI starts the overlay and runs one cycle of the loop: the
brokers' real traffic logs go through ``trellis analytics run`` (Spark local mode), the
planner plans from the outputs and the live tree, and the moves run live. Plain and
confidential publications flow before, during and after the cycle, and every one is
delivered exactly once, in order, with its payload. From the cycle's outputs the trust
command names both culprits and why; the cycle moved b2 out of every transit path, raised
the social trust and kept the cost within the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from broker.client import Client
from broker.tools.adaptive_cycles import read_cycles
from broker.tools.cli import main
from overlay.manifest import Manifest

pytest.importorskip("pyarrow.parquet")
pytest.importorskip("pyspark")

pytestmark = pytest.mark.slow

CORRUPTER, DROPPER = "b2.1", "b2.2"
PUBLISHERS, SUBSCRIBERS = ("b0", "b1"), ("b3", "b4", "b5")
AFTER = 20  # publications each publisher sends once the cycle is over


def wait_started(work: Path, up: subprocess.Popen[str], brokers: int) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while up.poll() is None and time.monotonic() < deadline:
        path = work / "overlay.json"
        info = json.loads(path.read_text()) if path.is_file() else {}
        if len(info.get("brokers", [])) == brokers and not info.get("starting"):
            return info
        time.sleep(0.2)
    raise AssertionError(f"overlay not started: {up.poll()}")


async def traffic(info: dict[str, Any], manifest: Manifest, up: subprocess.Popen[str]) -> None:
    """Publish until the loop's cycle is over, then AFTER more each; check every delivery."""
    endpoints = {b["id"]: b["endpoint"] for b in info["brokers"]}

    def ends(vn: str) -> list[str]:
        return [endpoints[b] for b in info["vns"][vn]]

    got: dict[str, dict[str, list[tuple[int, bytes]]]] = {
        s: {f"pub-{p}": [] for p in PUBLISHERS} for s in SUBSCRIBERS
    }
    sent = 0
    async with contextlib.AsyncExitStack() as stack:
        subs = [
            await stack.enter_async_context(
                Client(ends(s), client_id=f"sub-{s}", manifest=manifest)
            )
            for s in SUBSCRIBERS
        ]
        pubs = [
            await stack.enter_async_context(Client(ends(p), client_id=f"pub-{p}"))
            for p in PUBLISHERS
        ]
        streams = [await stack.enter_async_context(c.subscribe("class = 'q'")) for c in subs]
        for c in pubs:
            await c.advertise("class = 'q'")
        await asyncio.sleep(2.0)

        async def publish_one() -> None:
            nonlocal sent
            for c in pubs:
                payload = f"{c.client_id}:{sent}".encode()
                await c.publish({"class": "q", "i": sent}, payload, confidential=sent % 3 == 0)
            sent += 1

        stop = time.monotonic() + 400
        while up.poll() is None and time.monotonic() < stop:
            await publish_one()
            await asyncio.sleep(0.2)
        during = sent
        for _ in range(AFTER):
            await publish_one()
        for vn, stream in zip(SUBSCRIBERS, streams, strict=True):
            for _ in range(len(pubs) * sent):
                d = await stream.get(30.0)
                got[vn][d.publisher].append((int(d.attrs["i"]), d.payload))
        for stream in streams:
            with pytest.raises(TimeoutError):
                await stream.get(0.5)  # no duplicate arrives late
    assert during > 100  # publications flowed through the whole cycle
    for vn, by_pub in got.items():
        for pub, items in by_pub.items():
            assert items == [(i, f"{pub}:{i}".encode()) for i in range(sent)], (vn, pub)


def test_an_adaptive_cycle_moves_the_faulty_transit_vn_out_while_traffic_flows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "up"
    argv = [
        *(sys.executable, "-m", "broker", "up", "--dir", str(work), "--vns", "6"),
        *("--replicas", "1,1,5,1,1,1", "--adaptive", "--analytics-interval", "15"),
        *("--byzantine", f"{CORRUPTER}=corrupt", "--byzantine", f"{DROPPER}=drop"),
        *("--cycles", "1"),
    ]
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info = wait_started(work, up, brokers=10)
        asyncio.run(traffic(info, Manifest.load(work / "manifest.json"), up))
        stdout, stderr = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        main(["down", "--dir", str(work)])
    assert up.returncode == 0, stderr[-3000:]
    assert "cycle 1: applied" in stdout

    (cycle,) = read_cycles(work)
    plan = cycle["plan"]
    assert cycle["outcome"] == f"applied {len(plan['moves'])} move(s)"
    assert plan["distrusted"] == ["b2"]
    assert plan["demoted"] == ["b2"]
    assert plan["flagged"] == ["b2"]  # trust 0 < 0.1: flagged for detach even as a leaf
    assert plan["after"]["social_trust"] > plan["before"]["social_trust"]
    assert plan["after"]["cost"] <= plan["budget"]
    applied = cycle["applied"]
    assert applied["ok"]
    assert applied["state"] == "the overlay is on the planned tree"
    now = {tuple(lk) for lk in applied["links_now"]}  # as the brokers reported them
    assert now == {tuple(lk) for lk in plan["links_after"]}
    assert sum("b2" in lk for lk in now) == 1  # a leaf: no transit traffic

    capsys.readouterr()
    out = work / "adaptive" / "cycle-1" / "out"
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
    print(
        f"\n{stdout.strip()}\ncycle: job {cycle['job_seconds']:.1f} s, plan "
        f"{cycle['plan_seconds'] * 1000:.0f} ms, {len(plan['moves'])} move(s) "
        f"{cycle['moves_seconds'] * 1000:.0f} ms; social trust {plan['before']['social_trust']:.4f}"
        f" -> {plan['after']['social_trust']:.4f}; cost {plan['before']['cost']:g} -> "
        f"{plan['after']['cost']:g} (budget {plan['budget']:g})"
    )
