"""A live round's lease, with real broker processes: each step renews it, and a coordinator
whose neighbourhood drained too slowly to install within the lease goes back everywhere.

Seen before (``reconf-kill`` in a loop): a round's ``install`` reached its members 7 s after
the drain, past their 5 s leases (counted from the lock). Members without f + 1 vouches
went back on their own while the master VN's replicas switched, and the VN stayed split
until the next repair. Here the drain is made slow on purpose: a publisher at a member says
it answers marks and never does, so the freeze waits its whole mark patience (1 s), longer
than most of a 1.2 s lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from broker.client import Client
from broker.tools.local import LocalOverlay, fetch_json
from broker.tools.rebuild_apply import ask_move
from broker.wire.protocol import MARKS_OPTION, Ack, MsgType
from overlay.tree import line_tree
from reconfig.rebuild import Move
from tests.wire import RawPeer

pytestmark = pytest.mark.slow

MOVE = Move("b1", "b2", "b0")  # at master b1: b2 leaves b1 for b0


def locked_by(overlay: LocalOverlay, broker: str) -> str | None:
    state = fetch_json(overlay.brokers[broker].admin_url + "/reconfig")
    return state["locked_by"]  # type: ignore[no-any-return]


async def test_a_round_that_drained_too_slowly_for_its_lease_goes_back_everywhere(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = run_overlay(
        line_tree(["b0", "b1", "b2"]),
        heartbeat_interval=10.0,  # the mute publisher answers no PING either
        reconfig={"enabled": True, "interval": 3600.0, "lock_lease": 1.2, "step_timeout": 3.0},
    )
    silent = await RawPeer.connect(overlay.endpoint("b0"))
    try:
        await silent.hello("mute-pub", {MARKS_OPTION: True})
        await silent.send(MsgType.ADVERTISE, 1, "a1", [["class", "eq", "q"]])
        assert await silent.receive() == Ack(1)
        await silent.send(MsgType.PUBLISH, 2, 1, {"class": "q"}, b"once", None)
        assert await silent.receive() == Ack(2)
        await asyncio.to_thread(overlay.wait_quiet)

        ok, error, _ = await ask_move(overlay.describe(), MOVE, "slow drain", 30.0)
        assert not ok
        assert "drained too slowly to install within the lease" in error, error
        tree = await asyncio.to_thread(overlay.live_tree, 10.0)
        assert set(tree.neighbours("b2")) == {"b1"}  # nobody switched
        for broker in ("b0", "b1", "b2"):
            assert await asyncio.to_thread(locked_by, overlay, broker) is None, broker

        # Traffic still flows on the old tree.
        async with (
            Client(overlay.endpoints("b2"), client_id="sub") as sc,
            sc.subscribe("class = 'r'") as sub,
            Client(overlay.endpoints("b0"), client_id="pub") as pc,
        ):
            await pc.advertise("class = 'r'")
            await pc.publish({"class": "r", "n": 1}, b"after")
            got = await sub.get(10)
            assert (got.attrs, got.payload) == ({"class": "r", "n": 1}, b"after")
    finally:
        await silent.close()
