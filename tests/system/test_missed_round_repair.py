"""A replica that misses a live round takes its siblings' links and tables, with real
broker processes.

The overlay of ``test_byzantine_coordinator``: a line b0 - b1 - b2 - b3 (b0, b1, b2 of three
replicas), a publisher at b0 streaming to subscribers at b2 and b3, so b1's coordinator has a
cheaper tree to propose (link b0 - b2). b2.2 fails every round's install and goes back
(``byzantine = goes-back``, as a replica restarted a moment before a round does); its
siblings switch. Without the repair b2.2 would keep b1 and not b0 for good. With it, b2.2
asks its siblings once it went back and takes the neighbour VNs and routing tables f + 1 of
them keep; every subscriber still gets every publication exactly once, in order.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from broker.tools.local import LocalOverlay, fetch_json
from overlay.tree import line_tree
from tests.system.test_byzantine_coordinator import (
    MEMBER_ONLY,
    RECONFIG,
    Stream,
    rounds_of,
    stream_until_padded,
)

pytestmark = pytest.mark.slow

FRAME = 8 * 1024
PADDING = 150  # (three parts or so: enough to need them, light on a loaded machine)


def reconfig_of(overlay: LocalOverlay, broker: str) -> dict[str, Any]:
    info: dict[str, Any] = fetch_json(overlay.brokers[broker].admin_url + "/reconfig")
    return info


def b2_views(overlay: LocalOverlay) -> dict[str, tuple[tuple[str, ...], int, int]]:
    """Per replica of b2: neighbour VNs, SRT and PRT sizes."""
    health = overlay.health()
    return {
        b: (tuple(reconfig_of(overlay, b)["neighbours"]), health[b]["srt"], health[b]["prt"])
        for b in overlay.replicas_of("b2")
    }


def assert_delivered_once_in_order(overlay: LocalOverlay, stream: Stream) -> None:
    """Every subscriber got everything once, in order, byte for byte; no replica delivered
    a copy twice. b2.2 delivers nothing while it is off its siblings' tree (its subscriber
    gets those publications from b2.0 and b2.1), so it is counted apart."""
    expected = [(i, f"quote {i}".encode()) for i in range(1, stream.published + 1)]
    assert set(stream.received) == {"sub2", "sub3"}
    for name, got in stream.received.items():
        assert got == expected, f"{name}: {len(got)} of {stream.published}"
    health = overlay.health()
    for b in ("b2.0", "b2.1", "b3"):
        assert health[b]["deliveries"] == stream.published, (b, health[b])
    assert health["b2.2"]["deliveries"] <= stream.published, health["b2.2"]


@pytest.mark.parametrize("padding", [0, PADDING], ids=["small-tables", "tables-in-parts"])
async def test_a_replica_that_went_back_on_a_round_takes_its_siblings_links_and_tables(
    run_overlay: Callable[..., LocalOverlay], padding: int
) -> None:
    """With ``padding`` further subscriptions at b3 and a small ``max_frame``, b2's tables
    outweigh a frame: the siblings answer b2.2 in parts (a control connection reads no frame
    over its broker's limit)."""
    frame = {"max_frame": FRAME} if padding else {}
    overlay = run_overlay(
        line_tree(["b0", "b1", "b2", "b3"]),
        replicas={"b0": 3, "b1": 3, "b2": 3},
        overrides={
            **{b: {"reconfig": MEMBER_ONLY} for b in ("b2.0", "b2.1", "b2.2")},
            # The periodic check never comes in this test: the repair is the one its
            # going back asks for.
            "b2.2": {
                "reconfig": {**MEMBER_ONLY, "repair_interval": 1000.0},
                "byzantine": "goes-back",
            },
        },
        heartbeat_interval=1.0,
        reconfig=RECONFIG,
        **frame,
    )
    stream = Stream()

    def repaired() -> bool:
        return bool(reconfig_of(overlay, "b2.2")["repaired"])

    await stream_until_padded(overlay, stream, repaired, timeout=40, padding=padding)
    # b2.2 refused the install: its coordinator says the round took only in part, and where
    # it did not (the round is not counted as applied).
    rounds = [r for b in ("b0.0", "b1.0") for r in rounds_of(overlay, b)]
    partial = [r for r in rounds if r["outcome"].startswith("applied in part")]
    assert partial, [r["outcome"] for r in rounds]
    refusal = "b2.2: install failed (goes-back)"
    assert all(
        r["outcome"] == f"applied in part: install failed at {refusal}"
        and r["install_failed"] == [refusal]
        for r in partial
    ), partial
    coordinators = {b: reconfig_of(overlay, b) for b in ("b0.0", "b1.0")}
    assert sum(c["partial"] for c in coordinators.values()) >= len(partial), coordinators
    assert await asyncio.to_thread(repaired)
    assert_delivered_once_in_order(overlay, stream)
    # The three replicas of b2 agree on their neighbours and hold the same tables (asked
    # until a moment between rounds: b2.2 goes back on every round it is part of).
    deadline = time.monotonic() + 20
    views = await asyncio.to_thread(b2_views, overlay)
    while len(set(views.values())) > 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        views = await asyncio.to_thread(b2_views, overlay)
    assert len(set(views.values())) == 1, views
    assert "b0" in views["b2.2"][0], views  # the round linked b0 - b2; b2.2 took it
    if padding:
        for name in overlay.brokers:
            log = (overlay.workdir / f"{name}.log").read_text(encoding="utf-8")
            assert "too_large" not in log, name
        b22 = (overlay.workdir / "b2.2.log").read_text(encoding="utf-8")
        assert re.search(r"sibling b2\.[01] sent its tables in \d+ parts", b22), b22[-3000:]
