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
from collections.abc import Callable

import pytest

from broker.tools.local import LocalOverlay, fetch_json
from overlay.tree import line_tree
from tests.system.test_byzantine_coordinator import (
    Stream,
    assert_exactly_once_in_order,
    stream_until_padded,
)
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
        # (twice the default lease and step: on two cores beside another overlay's test, a
        # round computing and vouching 600 entries in parts outlasted a 5 s lease)
        reconfig={**RECONFIG, "lock_lease": 10.0, "step_timeout": 6.0},
    )
    stream = Stream()
    await stream_until_padded(
        overlay, stream, lambda: applied_rounds(overlay) >= 1, timeout=25, padding=PADDING
    )
    assert await asyncio.to_thread(applied_rounds, overlay) >= 1
    await asyncio.to_thread(assert_exactly_once_in_order, overlay, stream)
    for name in overlay.brokers:
        log = (overlay.workdir / f"{name}.log").read_text(encoding="utf-8")
        assert "too_large" not in log, name
    # every replica of b2 applied the move
    seen = {
        tuple(fetch_json(overlay.brokers[b].admin_url + "/reconfig")["neighbours"])
        for b in overlay.replicas_of("b2")
    }
    assert len(seen) == 1, seen
