"""A replica that stops reading its links, with real broker processes: its siblings carry the
publications and its upstream neighbour does not wait for it.

A broker link over ``send_buffer_limit`` made its broker stop reading every local client
until the link drained. A Byzantine replica that reads nothing while answering PINGs
(``byzantine = "stall"``) thus held every publisher of its upstream neighbours back for good
(until 2026-11-29), though its VN's other replicas carried the same publications. Now a
link is waited for only when what is queued to it may have no other way; a replica lagging
alone is not, and its link is closed once 4 x ``send_buffer_limit`` is queued to it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.client import Client
from broker.tools.local import LocalOverlay, fetch_json
from overlay.tree import line_tree
from tests.system.test_overlay import metric

pytestmark = pytest.mark.slow

LIMIT = 64 * 1024
COUNT = 3000
PAYLOAD = 8 * 1024


def line_with_a_stalled_replica(run_overlay: Callable[..., LocalOverlay]) -> LocalOverlay:
    return run_overlay(
        line_tree(["b0", "b1", "b2"]),
        replicas={"b1": 3},
        # The subscriber's broker may queue the whole stream to it: this test's client reads
        # its socket in the publisher's event loop, and with 64 KiB a busy machine made b2
        # drop deliveries to it as to a slow consumer (SlowConsumerError), which is not
        # what this test is about.
        overrides={
            "b1.2": {"byzantine": "stall"},
            "b2": {"send_buffer_limit": 4 * COUNT * PAYLOAD},
        },
        heartbeat_interval=1.0,
        send_buffer_limit=LIMIT,
    )


async def test_a_replica_that_stops_reading_does_not_hold_back_the_publisher(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = line_with_a_stalled_replica(run_overlay)
    async with (
        Client(overlay.endpoint("b0"), client_id="pub", request_timeout=10.0) as pub,
        Client(overlay.endpoint("b2"), client_id="sub") as sub_client,
        sub_client.subscribe("class = 'bulk'", queue_size=COUNT + 10) as sub,
    ):
        await pub.advertise("class = 'bulk'")
        await sub_client.flush()
        for i in range(1, COUNT + 1):
            # a held-back publisher's acknowledged publish times out (TrellisTimeout)
            await pub.publish(
                {"class": "bulk", "i": i}, bytes([i % 256]) * PAYLOAD, ack=i % 100 == 0
            )
        await pub.flush(timeout=30.0)
        got = []
        for _ in range(COUNT):
            msg = await sub.get(30)
            got.append((msg.seq, msg.payload))
    assert got == [(i, bytes([i % 256]) * PAYLOAD) for i in range(1, COUNT + 1)]
    closed = metric(overlay.metrics("b0"), "trellis_lagging_links_closed_total")
    assert closed >= 1
    log = (overlay.workdir / "b0.log").read_text(encoding="utf-8")
    assert "b0-b1.2 closed" in log
    health = fetch_json(overlay.brokers["b0"].admin_url + "/healthz")
    assert health["clients_unread"] == 0
