"""A replica that comes back on links saved before a round its siblings applied takes their
neighbours (f + 1 siblings agreeing) before it serves, on real broker processes.

A replica killed during a round that goes on without it restarts on the ``links_file`` it
saved before that round. The test makes that state deterministically: the round runs with
every replica up, then one replica is stopped and its links file put back as it was before
the round (as the kill would have left it), then it is restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.client import Client, TrellisTimeout
from broker.tools.local import LocalOverlay, fetch_json
from broker.tools.rebuild_apply import apply_moves_live, live_tree
from overlay.tree import line_tree
from reconfig.rebuild import Move

pytestmark = pytest.mark.slow

COUNT = 20


def wait_health(overlay: LocalOverlay, broker_id: str, want_links: set[str]) -> dict[str, object]:
    """``/healthz`` of ``broker_id`` once it reports exactly ``want_links`` and no missing
    link (the last one seen when that does not happen within 10 s)."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            health = fetch_json(overlay.brokers[broker_id].admin_url + "/healthz")
        except OSError:
            health = {}
        if health.get("status") == "ok" and set(health.get("links", ())) == want_links:
            return health
        if time.monotonic() > deadline:
            return health
        time.sleep(0.1)


async def exact_traffic(overlay: LocalOverlay) -> dict[str, int]:
    """Publishers at c0 and c1 publish ``COUNT`` each; subscribers at c0, c1 and c2 get every
    publication once, in order. Returns deliveries per subscriber VN."""
    vns = ("c0", "c1", "c2")
    tag = f"{time.monotonic_ns() % 10**6}"
    subs = [
        Client(overlay.endpoints(vn), client_id=f"sub-{vn}-{tag}", manifest=overlay.manifest)
        for vn in vns
    ]
    pubs = [
        Client(overlay.endpoints(vn), client_id=f"pub-{vn}-{tag}", manifest=overlay.manifest)
        for vn in ("c0", "c1")
    ]
    got: dict[str, list[tuple[str, int]]] = {vn: [] for vn in vns}
    async with contextlib.AsyncExitStack() as stack:
        for c in [*subs, *pubs]:
            await stack.enter_async_context(c)
        streams = [await stack.enter_async_context(c.subscribe("class = 'q'")) for c in subs]
        for c in pubs:
            await c.advertise("class = 'q'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(COUNT):
            for c in pubs:
                await c.publish({"class": "q", "i": i}, f"{c.client_id}:{i}".encode())
        for vn, stream in zip(vns, streams, strict=True):
            for _ in range(len(pubs) * COUNT):
                try:
                    d = await stream.get(10.0)
                except TrellisTimeout:
                    break  # what is missing shows below
                got[vn].append((d.publisher, int(d.attrs["i"])))
            with pytest.raises(TrellisTimeout):
                await stream.get(0.5)  # nothing more: no duplicate arrives late
    for vn, items in got.items():
        for c in pubs:
            mine = [i for p, i in items if p == c.client_id]
            assert mine == list(range(COUNT)), f"{vn} from {c.client_id}: {mine}"
    return {vn: len(items) for vn, items in got.items()}


def test_a_replica_restarted_on_links_from_before_a_round_takes_its_siblings_links(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    # c0-c1-c2, c1 of 3 replicas; the move c0-c1 -> c0-c2 leaves c1 a leaf under c2.
    overlay = run_overlay(
        line_tree(["c0", "c1", "c2"]),
        name="siblings",
        replicas={"c1": 3},
        heartbeat_interval=1.0,
        reconfig={"enabled": True, "interval": 3600.0, "step_timeout": 1.0},
    )
    info = json.loads((overlay.workdir / "overlay.json").read_text())
    before = live_tree(info)
    assert before is not None
    links_file = Path(overlay.config_for("c1.2")["links_file"])
    saved = links_file.read_bytes() if links_file.exists() else None

    report = asyncio.run(
        apply_moves_live(info, before, [Move("c1", "c0", "c2")], timeout=10.0, settle=1.0)
    )
    assert report.ok, report.describe()
    assert overlay.live_tree().links == {("c0", "c2"), ("c1", "c2")}

    # c1.2 comes back on the links it had saved before the round.
    overlay.brokers["c1.2"].stop(5.0)
    if saved is None:
        links_file.unlink(missing_ok=True)
    else:
        links_file.write_bytes(saved)
    overlay.start("c1.2")

    health = wait_health(overlay, "c1.2", {"c2"})
    assert health.get("status") == "ok", health
    assert health.get("links") == ["c2"], health
    siblings = {
        tuple(fetch_json(overlay.brokers[b].admin_url + "/reconfig")["neighbours"])
        for b in overlay.replicas_of("c1")
    }
    assert siblings == {("c2",)}
    assert json.loads(links_file.read_text()) == {"neighbours": ["c2"]}
    assert overlay.live_tree().links == {("c0", "c2"), ("c1", "c2")}

    # Traffic through it is exact; c1.2 delivers every publication to its subscriber.
    delivered = fetch_json(overlay.brokers["c1.2"].admin_url + "/healthz")["deliveries"]
    assert asyncio.run(exact_traffic(overlay)) == dict.fromkeys(("c0", "c1", "c2"), 2 * COUNT)
    after = fetch_json(overlay.brokers["c1.2"].admin_url + "/healthz")["deliveries"]
    assert after - delivered == 2 * COUNT
