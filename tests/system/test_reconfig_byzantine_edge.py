"""A live move with a Byzantine replica in the publisher's edge VN loses nothing, with real
broker processes (issue 11: no loss because a bad replica was faster or slower).

The line b0 - b1 - b2 - b3 (b0, b1, b2 of three replicas) with the publisher at b0 and
subscribers at b2 and b3: b1 only relays, so its coordinator moves b2 next to b0. b0.2
corrupts (or drops) everything it forwards. Each replica of b0 freezes when its own freeze
arrives; had each stopped reading the publisher there, a publication read in between would
go one way at one honest replica (the old path, via b1) and the other way at the other (the
new link b0 - b2), each path then getting one good copy, fewer than the f + 1 a broker routes
on (1 or 2 lost in 2 of 18 runs before the fix). So a frozen replica asks the publisher for a
mark of the round and reads it up to the mark, which the SDK writes to every replica at one
point of its stream once f + 1 asked: the honest replicas switch at the same publication.
The publisher streams as fast as it can, mixed plain and confidential."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from broker.client import Client, Subscription
from broker.tools.local import LocalOverlay, fetch_json
from overlay.tree import line_tree
from tests.system.test_reconfig_live import RECONFIG, applied_rounds

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["corrupt", "drop"])
async def test_a_move_with_a_byzantine_publisher_edge_replica_loses_nothing(
    run_overlay: Callable[..., LocalOverlay], mode: str
) -> None:
    overlay = run_overlay(
        line_tree(["b0", "b1", "b2", "b3"]),
        replicas={"b0": 3, "b1": 3, "b2": 3},
        overrides={"b0.2": {"byzantine": mode}},
        heartbeat_interval=1.0,
        reconfig=RECONFIG,
    )
    async with (
        Client(overlay.endpoints("b0"), client_id="pub") as pub,
        Client(overlay.endpoints("b2"), client_id="sub2", manifest=overlay.manifest) as c2,
        Client(overlay.endpoints("b3"), client_id="sub3", manifest=overlay.manifest) as c3,
        c2.subscribe("class = 'q'") as s2,
        c3.subscribe("class = 'q'") as s3,
    ):
        await pub.advertise("class = 'q'")
        await asyncio.to_thread(overlay.wait_quiet)
        got: dict[str, list[tuple[int, bytes, bool]]] = {"sub2": [], "sub3": []}

        async def read(name: str, sub: Subscription) -> None:
            async for msg in sub:
                got[name].append((msg.seq, msg.payload, msg.confidential))

        readers = [asyncio.create_task(read("sub2", s2)), asyncio.create_task(read("sub3", s3))]
        sent = 0
        started = time.monotonic()
        while time.monotonic() - started < 20:
            sent += 1
            # Mixed: every fourth publication plain, the others confidential.
            await pub.publish(
                {"class": "q", "i": sent},
                f"order {sent}".encode(),
                confidential=sent % 4 != 0,
                ack=sent % 200 == 0,
            )
            await asyncio.sleep(0)  # the subscribers share this loop: let them read
            settled = sent % 50 == 0 and time.monotonic() - started > 2
            if settled and await asyncio.to_thread(applied_rounds, overlay) >= 2:
                break
        await pub.drain()
        deadline = time.monotonic() + 15
        while (  # noqa: ASYNC110 - polls the readers
            any(len(g) < sent for g in got.values()) and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a late duplicate would show up now
        for task in readers:
            task.cancel()
    assert await asyncio.to_thread(applied_rounds, overlay) >= 1
    # the honest replicas of b0 read the publisher up to its mark at every freeze
    for replica in ("b0.0", "b0.1"):
        rounds = await asyncio.to_thread(
            fetch_json, overlay.brokers[replica].admin_url + "/reconfig"
        )
        assert rounds["marked"] >= 1
        assert rounds["unmarked"] == 0
    expected = [(i, f"order {i}".encode(), i % 4 != 0) for i in range(1, sent + 1)]
    for name, received in got.items():
        missing = sorted({i for i, _, _ in expected} - {i for i, _, _ in received})
        assert received == expected, f"{name}: {len(received)} of {sent}, missing {missing[:20]}"
