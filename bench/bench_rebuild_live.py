"""Applying a trust-aware rebuild plan live: wall time per plan and per move, idle vs loaded.

Not a test. Run from the repository root:

    .venv/bin/python bench/bench_rebuild_live.py            # about a minute on 2 cores
    .venv/bin/python bench/bench_rebuild_live.py --runs 1   # smoke run

Workload: a line of 8 VNs v0…v7 (v3 with 3 replicas, the rest 1), reconfiguration on with no
OCBR turns of their own. The planner is given v3 distrusted (trust 0) and the classes
v0 → {v5, v6, v7}, v1 → {v6, v7}; its plan demotes v3 to a leaf. The plan is applied with
``apply_moves_live`` (what ``trellis rebuild`` runs), then the reverse plan (back to the line)
so the next run starts from the same tree. Each is done idle and under load (publishers at v0
and v1, about 200 publications/s in all, every tenth confidential, subscribers at v5, v6,
v7), alternating, ``--runs`` times; the figures are medians, and the loaded/idle ratio is the
cost of draining live traffic. Every publication is checked delivered (counted).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from broker.client import Client
from broker.tools.local import LocalOverlay, start_overlay
from broker.tools.rebuild_apply import apply_moves_live
from overlay.tree import Tree, line_tree
from reconfig.cost import CostModel
from reconfig.rebuild import Move, RebuildParams, moves_between, plan_rebuild

VNS = [f"v{i}" for i in range(8)]
CLASSES = {("v0", frozenset({"v5", "v6", "v7"})): 10.0, ("v1", frozenset({"v6", "v7"})): 5.0}


async def apply_timed(
    overlay: LocalOverlay, before: Tree, moves: list[Move], load: bool
) -> dict[str, Any]:
    info = json.loads((overlay.workdir / "overlay.json").read_text())
    sent = received = 0
    async with contextlib.AsyncExitStack() as stack:
        streams = []
        pubs = []
        if load:
            for vn in ("v5", "v6", "v7"):
                c = await stack.enter_async_context(
                    Client(overlay.endpoints(vn), manifest=overlay.manifest)
                )
                streams.append(await stack.enter_async_context(c.subscribe("class = 'q'")))
            for vn in ("v0", "v1"):
                c = await stack.enter_async_context(Client(overlay.endpoints(vn)))
                await c.advertise("class = 'q'")
                pubs.append(c)
            await asyncio.to_thread(overlay.wait_quiet)
        done = asyncio.Event()

        async def publish() -> None:
            nonlocal sent
            i = 0
            while not done.is_set() and i < 20_000:
                for c in pubs:
                    await c.publish({"class": "q", "i": i}, b"x" * 64, confidential=i % 10 == 0)
                    sent += 1
                i += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(publish()) if load else None
        await asyncio.sleep(0.5 if load else 0)
        report = await apply_moves_live(info, before, moves, settle=5.0)
        done.set()
        if task is not None:
            await task
        for stream in streams:
            for _ in range(sent):  # every subscription matches every publication
                await stream.get(30.0)
                received += 1
    assert report.ok, report.describe()
    per_move = [o.seconds for o in report.outcomes]
    return {
        "seconds": report.seconds,
        "per_move": statistics.median(per_move) if per_move else 0.0,
        "moves": len(moves),
        "published": sent,
        "received": received,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    line = line_tree(VNS)
    plan = plan_rebuild(line, CLASSES, {"v3": 0.0}, CostModel(), params=RebuildParams())
    forward = list(plan.moves)
    back = moves_between(plan.after, line)
    print(f"plan: {len(forward)} moves forward, {len(back)} back; {plan.reason}", flush=True)
    rows: dict[str, list[dict[str, Any]]] = {"idle": [], "loaded": []}
    with tempfile.TemporaryDirectory(prefix="bench-rebuild-live-") as tmp:
        overlay = start_overlay(
            Path(tmp),
            line,
            {"reconfig": {"enabled": True, "interval": 1e9}, "heartbeat_interval": 1.0},
            replicas={"v3": 3},
        )
        try:
            for run in range(args.runs):
                for mode in ("idle", "loaded"):
                    for before, moves in ((line, forward), (plan.after, back)):
                        row = asyncio.run(apply_timed(overlay, before, moves, mode == "loaded"))
                        row["direction"] = "forward" if moves is forward else "back"
                        rows[mode].append(row)
                        print(f"run {run + 1} {mode}: {row}", flush=True)
        finally:
            overlay.stop()
    for mode, items in rows.items():
        plans = [r["seconds"] for r in items]
        per_move = [r["per_move"] for r in items]
        print(
            f"{mode}: plan median {statistics.median(plans):.3f} s, per move median "
            f"{statistics.median(per_move) * 1000:.0f} ms over {len(items)} plans",
            flush=True,
        )
    idle = statistics.median(r["per_move"] for r in rows["idle"])
    loaded = statistics.median(r["per_move"] for r in rows["loaded"])
    print(f"loaded/idle per move: {loaded / idle:.2f}")


if __name__ == "__main__":
    main()
