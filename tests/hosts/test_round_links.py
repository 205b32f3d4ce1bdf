"""A live round needs the links it drains and vouches over: a member missing one refuses the
lock (the round changes nothing), and the same move is applied once the link is back.

Seen before the rule (``reconf-kill``): a round that began as replicas restarted, their links
still coming up, split VNs for a repair interval (the master VN's replicas vouched for
different tables; some members switched, their siblings went back)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.tools.local import replica_ids
from broker.tools.rebuild_apply import ask_move
from overlay.tree import Tree
from reconfig.rebuild import Move
from tests.hosts.net import HostOverlay, Network, start_host_overlay
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("hosts_available")]

TREE = Tree(["b", "c", "d"], [("b", "c"), ("b", "d")])
REPLICAS = {"b": 3, "c": 1, "d": 1}
MOVE = Move("b", "d", "c")  # at master b: d leaves b for c


def missing(overlay: HostOverlay, broker: str) -> list[str]:
    return list(overlay.health()[broker]["missing_links"])


def test_a_round_whose_member_lacks_a_link_to_a_master_replica_is_refused_until_it_is_up(
    tmp_path: Path,
) -> None:
    network = Network.create(
        [b for vn in sorted(TREE.brokers) for b in replica_ids(vn, REPLICAS[vn])]
    )
    try:
        overlay = start_host_overlay(
            tmp_path,
            network,
            TREE,
            REPLICAS,
            {"heartbeat_interval": 0.5, "reconfig": {"enabled": True, "interval": 3600.0}},
        )
        # b.2 and c lose each other; the coordinator b.0 still reaches every member.
        network.cut(["b.2"], ["c"])
        wait_for(
            lambda: missing(overlay, "c") == ["b.2"], 20, "for c to notice its link to b.2 is down"
        )
        ok, error, coordinator = asyncio.run(ask_move(overlay.describe(), MOVE, "cut", 30.0))
        assert not ok
        assert coordinator == "b.0"
        assert "refused" in error
        assert "links to c are not up" in error or "links to b.2 are not up" in error, error
        assert set(overlay.live_tree(10.0).neighbours("d")) == {"b"}  # unchanged

        network.heal()
        wait_for(
            lambda: not missing(overlay, "c") and not missing(overlay, "b.2"),
            30,
            "for the link b.2-c to come back",
        )
        ok, error, _ = asyncio.run(ask_move(overlay.describe(), MOVE, "healed", 30.0))
        assert ok, error
        wait_for(
            lambda: set(overlay.live_tree(10.0).neighbours("d")) == {"c"}, 20, "for d to move to c"
        )
    finally:
        network.close()
