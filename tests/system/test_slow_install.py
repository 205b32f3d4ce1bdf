"""A replica of the master VN whose install outlasts its lease, with real broker processes.

The overlay of ``test_byzantine_coordinator``: a line b0 - b1 - b2 - b3 (b0, b1, b2 of three
replicas), a publisher at b0 streaming to subscribers at b2 and b3. An operator moves b2 from
b1 to b0 (one round, master b1, coordinator b1.0). b1.1 and b1.2 are slow
(``byzantine = slow-install``): at install they compute their tables for a lease and a
second, as a loaded machine's thread pool once made them; their leases end meanwhile and
they go back. They must then neither vouch for the tables nor switch: members of b0 and b2
would have switched on their vouches while they stayed, and they would have switched after
going back (seen under load: VN d left without links, ``tests/hosts`` ``reconf-kill``).
Here only b1.0 vouches, so nobody else switches either; b1.0, which did, takes its siblings'
links back at its next repair. Every publication arrives exactly once, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from broker.tools.local import LocalOverlay, fetch_json
from broker.tools.rebuild_apply import ask_move
from overlay.tree import line_tree
from reconfig.rebuild import Move
from tests.system.test_byzantine_coordinator import Stream, saved_vns, stream_until

pytestmark = pytest.mark.slow

RECONFIG = {
    "enabled": True,
    "interval": 3600.0,  # no round but the operator's
    "lock_lease": 1.5,
    "step_timeout": 3.0,
    "repair_interval": 2.0,
}


def neighbours(overlay: LocalOverlay, broker: str) -> tuple[str, ...]:
    info: dict[str, Any] = fetch_json(overlay.brokers[broker].admin_url + "/reconfig")
    return tuple(info["neighbours"])


def agreed(overlay: LocalOverlay) -> bool:
    """Every VN's replicas keep the same neighbour VNs, and saved those for a restart."""
    for vn in ("b0", "b1", "b2"):
        replicas = overlay.replicas_of(vn)
        live = {frozenset(neighbours(overlay, b)) for b in replicas}
        if len(live) != 1:
            return False
        kept = live.pop()
        if any(saved_vns(overlay, b) not in (None, kept) for b in replicas):
            return False
    return True


async def test_a_master_replica_whose_install_outlasts_its_lease_neither_vouches_nor_switches(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = run_overlay(
        line_tree(["b0", "b1", "b2", "b3"]),
        replicas={"b0": 3, "b1": 3, "b2": 3},
        overrides={b: {"byzantine": "slow-install"} for b in ("b1.1", "b1.2")},
        heartbeat_interval=1.0,
        reconfig=RECONFIG,
    )
    stream = Stream()
    outcome: list[tuple[bool, str, str]] = []

    async def move() -> None:
        await asyncio.sleep(1.0)  # while the stream flows
        outcome.append(await ask_move(overlay.describe(), Move("b1", "b2", "b0"), "slow", 30.0))

    mover = asyncio.create_task(move())
    await stream_until(overlay, stream, lambda: bool(outcome), timeout=40)
    await mover
    ok, error, _ = outcome[0]
    assert not ok, error
    rounds = fetch_json(overlay.brokers["b1.0"].admin_url + "/reconfig")["rounds"]
    failed = [e for r in rounds for e in r.get("install_failed", [])]
    for slow in ("b1.1", "b1.2"):
        assert any(
            e.startswith(f"{slow}: round ") and e.endswith(" ended here (lease)") for e in failed
        ), failed

    expected = [(i, f"quote {i}".encode()) for i in range(1, stream.published + 1)]
    for name, got in stream.received.items():
        assert got == expected, f"{name}: {len(got)} of {stream.published}"
    assert set(stream.received) == {"sub2", "sub3"}

    # b1.0 went forward alone: it takes its siblings' links back at its repair, and then
    # every VN's replicas agree, on the tree as it was (nobody else switched).
    async with asyncio.timeout(20.0):
        while not await asyncio.to_thread(agreed, overlay):  # noqa: ASYNC110 - brokers over HTTP
            await asyncio.sleep(0.2)
    tree = await asyncio.to_thread(overlay.live_tree, 10.0)
    assert set(tree.neighbours("b2")) == {"b1", "b3"}
