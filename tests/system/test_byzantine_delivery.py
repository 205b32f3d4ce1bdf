"""Exact delivery with f Byzantine replicas in every VN, with real broker processes (SPEC §3).

The issue's two reproductions, over a line of three VNs, publisher at the first and
subscriber (on every replica) at the last: 50 plain publications at 50/s, then 80 with every
fourth plain and the rest confidential. For each fault mode one replica of every VN
misbehaves (so the fault sits in every position: the publisher's edge, the middle, the
subscriber's edge); with five replicas two per VN do, in mixed modes or both in one mode.
Confidential publications go once with each share form (records, then by the pass). Nothing
may be altered, lost, duplicated or reordered. ``bench/bench_byzantine.py`` runs the same
exchanges in a loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from broker.tools.local import LocalOverlay
from overlay.tree import broker_names, line_tree
from tests.support import exact_exchange

pytestmark = pytest.mark.slow

MODES = ["corrupt", "equivocate", "drop", "delay", "replay", "reorder"]
CLEAN = {"altered": 0, "lost": 0, "duplicated": 0, "reordered": 0}


def bad_replicas(modes: list[str], replicas: int) -> dict[str, dict[str, Any]]:
    """``modes[i]`` for replica ``(v + i) % replicas`` of VN ``v``: every VN gets every mode
    listed, at a different replica index in each VN."""
    return {
        f"b{v}.{(v + i * 2) % replicas}": {"byzantine": mode}
        for v in range(3)
        for i, mode in enumerate(modes)
    }


@pytest.fixture
def byzantine_line(run_overlay: Callable[..., LocalOverlay]) -> Callable[..., LocalOverlay]:
    def _run(replicas: int, modes: list[str]) -> LocalOverlay:
        names = broker_names(3)
        return run_overlay(
            line_tree(names),
            replicas=dict.fromkeys(names, replicas),
            overrides=bad_replicas(modes, replicas),
            heartbeat_interval=1.0,
        )

    return _run


@pytest.mark.parametrize("mode", MODES)
async def test_one_byzantine_replica_per_vn_alters_loses_duplicates_and_reorders_nothing(
    byzantine_line: Callable[..., LocalOverlay], mode: str
) -> None:
    overlay = byzantine_line(3, [mode])
    plain = await exact_exchange(overlay, "plain-pub", 50, plain_every=1, rate=50)
    assert plain.faults() == CLEAN, plain
    by_records = await exact_exchange(
        overlay, "record-pub", 80, plain_every=4, rate=100, share_form="record"
    )
    assert by_records.faults() == CLEAN, by_records
    by_pass = await exact_exchange(
        overlay, "pass-pub", 80, plain_every=4, rate=100, share_form="pass"
    )
    assert by_pass.faults() == CLEAN, by_pass
    if mode == "corrupt":
        # the subscriber's own edge VN has a corrupting replica: caught and named
        assert set(plain.blamed) == {"b2.2"}


@pytest.mark.parametrize(
    "modes", [["corrupt", "replay"], ["corrupt", "corrupt"], ["equivocate", "equivocate"]]
)
async def test_two_byzantine_replicas_per_vn_of_five_change_nothing(
    byzantine_line: Callable[..., LocalOverlay], modes: list[str]
) -> None:
    """Two of five per VN, in mixed modes or in one mode (two replicas corrupting alike
    send identical altered copies: still fewer than ``f + 1 = 3``)."""
    overlay = byzantine_line(5, modes)
    plain = await exact_exchange(overlay, "plain-pub", 50, plain_every=1, rate=50)
    assert plain.faults() == CLEAN, plain
    by_records = await exact_exchange(
        overlay, "record-pub", 80, plain_every=4, rate=100, share_form="record"
    )
    assert by_records.faults() == CLEAN, by_records
    by_pass = await exact_exchange(
        overlay, "pass-pub", 80, plain_every=4, rate=100, share_form="pass"
    )
    assert by_pass.faults() == CLEAN, by_pass
