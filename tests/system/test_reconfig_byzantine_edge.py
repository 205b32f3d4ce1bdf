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
The publisher streams as fast as it can, mixed plain and confidential.

The mirror image: the publisher at b3, outside b1's neighbourhood, subscribers at b2 and b0,
b2.2 Byzantine. b2's replicas read the publications over their links from b3, which their
freeze would stop at different points; they ask b3 for a mark instead (a ``RECONF marker``
of wave 4), which b3 writes on its links to all of them once f + 1 asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import pytest

from broker.client import Client, Subscription
from broker.tools.local import LocalOverlay, fetch_json, metric_by_label
from overlay.tree import line_tree
from tests.system.test_reconfig_live import RECONFIG, applied_rounds

pytestmark = pytest.mark.slow


def marked_at(overlay: LocalOverlay, replica: str) -> int:
    """Freezes at which ``replica`` read a stream from outside its round up to a mark."""
    rounds = fetch_json(overlay.brokers[replica].admin_url + "/reconfig")
    return int(rounds["marked"])


def moved_and_marked(overlay: LocalOverlay, honest: list[str]) -> bool:
    """Two rounds applied and every honest replica read up to a mark at least once: only
    some rounds freeze a replica that reads from outside them (those whose neighbourhood
    holds its VN but not its upstream), so two applied rounds alone may hold none."""
    if applied_rounds(overlay) < 2:
        return False
    return all(marked_at(overlay, replica) >= 1 for replica in honest)


async def stream_through_moves(
    overlay: LocalOverlay, publisher_vn: str, subscriber_vns: dict[str, str], honest: list[str]
) -> tuple[int, dict[str, list[tuple[int, bytes, bool]]]]:
    """Publish as fast as possible until rounds applied and froze every ``honest`` replica
    at a mark (:func:`moved_and_marked`), or 20 s; returns how many were sent and what each
    subscriber received (seq, payload, confidential)."""
    async with contextlib.AsyncExitStack() as stack:
        pub = await stack.enter_async_context(
            Client(overlay.endpoints(publisher_vn), client_id="pub")
        )
        subs: dict[str, Subscription] = {}
        for name, vn in subscriber_vns.items():
            client = await stack.enter_async_context(
                Client(overlay.endpoints(vn), client_id=name, manifest=overlay.manifest)
            )
            subs[name] = await stack.enter_async_context(client.subscribe("class = 'q'"))
        await pub.advertise("class = 'q'")
        await asyncio.to_thread(overlay.wait_quiet)
        got: dict[str, list[tuple[int, bytes, bool]]] = {name: [] for name in subs}

        async def read(name: str, sub: Subscription) -> None:
            async for msg in sub:
                got[name].append((msg.seq, msg.payload, msg.confidential))

        readers = [asyncio.create_task(read(name, sub)) for name, sub in subs.items()]
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
            if settled and await asyncio.to_thread(moved_and_marked, overlay, honest):
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
    return sent, got


async def assert_marked_and_exact(
    overlay: LocalOverlay,
    honest: list[str],
    sent: int,
    got: dict[str, list[tuple[int, bytes, bool]]],
) -> None:
    assert await asyncio.to_thread(applied_rounds, overlay) >= 1
    # the honest replicas that read from outside the round read up to a mark at every freeze
    for replica in honest:
        rounds = await asyncio.to_thread(
            fetch_json, overlay.brokers[replica].admin_url + "/reconfig"
        )
        assert rounds["marked"] >= 1, replica
        assert rounds["unmarked"] == 0, replica
        metrics = await asyncio.to_thread(overlay.metrics, replica)  # read after: ≥
        frozen = metric_by_label(metrics, "trellis_reconfig_streams_frozen_total", "how")
        assert frozen["marked"] >= rounds["marked"], replica
    expected = [(i, f"order {i}".encode(), i % 4 != 0) for i in range(1, sent + 1)]
    for name, received in got.items():
        missing = sorted({i for i, _, _ in expected} - {i for i, _, _ in received})
        assert received == expected, f"{name}: {len(received)} of {sent}, missing {missing[:20]}"


def line_with_a_byzantine_replica(
    run_overlay: Callable[..., LocalOverlay], byzantine: str, mode: str
) -> LocalOverlay:
    """The line b0 - b1 - b2 - b3 (b0, b1, b2 of three replicas) with ``byzantine`` faulty."""
    return run_overlay(
        line_tree(["b0", "b1", "b2", "b3"]),
        replicas={"b0": 3, "b1": 3, "b2": 3},
        overrides={byzantine: {"byzantine": mode}},
        heartbeat_interval=1.0,
        reconfig=RECONFIG,
    )


@pytest.mark.parametrize("mode", ["corrupt", "drop"])
async def test_a_move_with_a_byzantine_publisher_edge_replica_loses_nothing(
    run_overlay: Callable[..., LocalOverlay], mode: str
) -> None:
    overlay = line_with_a_byzantine_replica(run_overlay, "b0.2", mode)
    honest = ["b0.0", "b0.1"]
    sent, got = await stream_through_moves(overlay, "b0", {"sub2": "b2", "sub3": "b3"}, honest)
    await assert_marked_and_exact(overlay, honest, sent, got)


@pytest.mark.parametrize("mode", ["corrupt", "drop"])
async def test_a_move_whose_vn_reads_from_outside_with_a_byzantine_replica_loses_nothing(
    run_overlay: Callable[..., LocalOverlay], mode: str
) -> None:
    overlay = line_with_a_byzantine_replica(run_overlay, "b2.2", mode)
    honest = ["b2.0", "b2.1"]
    sent, got = await stream_through_moves(overlay, "b3", {"sub0": "b0", "sub2": "b2"}, honest)
    await assert_marked_and_exact(overlay, honest, sent, got)
