"""A live round whose routing tables outweigh one frame, with real broker processes.

A round's coordinator installs each member's tables on the new tree, and every replica of the
master VN vouches for its VN's tables to the members of the other VNs (marker wave 3); both
carried all of a VN's tables in one frame, so an overlay with some thousands of subscriptions
(a few hundred here, with a small ``max_frame``) made frames the receiver refused with
``too_large``, closing the link or control connection mid-round. The line b0 - b1 - b2 - b3
(b0, b1, b2 of three replicas) with a publisher at b0 and subscribers at b2 and b3: b1's
coordinator moves b2 next to b0, with 600 further subscriptions at b3 in its tables.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from broker.client import Client
from broker.tools.local import LocalOverlay, fetch_json
from overlay.tree import line_tree
from tests.system.test_reconfig_live import RECONFIG, applied_rounds

pytestmark = pytest.mark.slow

FRAME = 16 * 1024
PADDING = 600


async def test_a_round_with_tables_larger_than_a_frame_applies_and_loses_nothing(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = run_overlay(
        line_tree(["b0", "b1", "b2", "b3"]),
        replicas={"b0": 3, "b1": 3, "b2": 3},
        heartbeat_interval=1.0,
        max_frame=FRAME,
        reconfig=RECONFIG,
    )
    async with (
        Client(overlay.endpoints("b0"), client_id="pub") as pub,
        Client(overlay.endpoints("b2"), client_id="sub2") as sub2_client,
        Client(overlay.endpoints("b3"), client_id="sub3") as sub3_client,
        sub2_client.subscribe("class = 'q'") as sub2,
        sub3_client.subscribe("class = 'q'") as sub3,
    ):
        padding = [
            sub3_client.subscribe(f"class = 'pad' and tag = 'subscription number {i:05d}'")
            for i in range(PADDING)
        ]
        for subscription in padding:
            await subscription.__aenter__()
        await pub.advertise("class = 'q'")
        await pub.advertise("class = 'pad'")
        await asyncio.to_thread(overlay.wait_quiet)
        got: dict[str, list[int]] = {"sub2": [], "sub3": []}

        async def read(name: str, sub) -> None:  # type: ignore[no-untyped-def]
            async for msg in sub:
                got[name].append(msg.seq)

        readers = [
            asyncio.create_task(read("sub2", sub2)),
            asyncio.create_task(read("sub3", sub3)),
        ]
        sent = 0
        started = time.monotonic()
        while time.monotonic() - started < 25:
            sent += 1
            await pub.publish({"class": "q", "i": sent}, b"x", ack=sent % 25 == 0)
            await asyncio.sleep(0.005)
            if sent % 100 == 0 and await asyncio.to_thread(applied_rounds, overlay) >= 1:
                break
        await pub.drain()
        deadline = time.monotonic() + 15
        while (  # noqa: ASYNC110 - polls the readers
            any(len(g) < sent for g in got.values()) and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        for task in readers:
            task.cancel()
    assert await asyncio.to_thread(applied_rounds, overlay) >= 1
    for name, seqs in got.items():
        assert seqs == list(range(1, sent + 1)), f"{name}: {len(seqs)} of {sent}"
    for name in overlay.brokers:
        log = (overlay.workdir / f"{name}.log").read_text(encoding="utf-8")
        assert "too_large" not in log, name
    # every replica of b2 applied the move
    seen = {
        tuple(fetch_json(overlay.brokers[b].admin_url + "/reconfig")["neighbours"])
        for b in overlay.replicas_of("b2")
    }
    assert len(seen) == 1, seen
