"""The config rewrite that keeps broker config files true to a VN's membership."""

from __future__ import annotations

from typing import Any

from broker.tools.placement_apply import with_members


def entry(broker: str, vn: str, replica: int, size: int) -> dict[str, Any]:
    return {"id": broker, "endpoint": f"h:{broker}", "vn": vn, "replica": replica, "vn_size": size}


B1_AFTER = [(f"b1.{i}", f"h:b1.{i}") for i in range(4)]


def test_a_neighbour_lists_every_replica_of_the_grown_vn_with_its_new_size() -> None:
    config = {
        "id": "b0.0",
        "vn": "b0",
        "vn_size": 1,
        "neighbours": [entry(f"b1.{i}", "b1", i, 3) for i in range(3)],
        "peers": [entry("b2", "b2", 0, 1)],
    }
    out = with_members(config, "b1", B1_AFTER)
    assert out["neighbours"] == [entry(f"b1.{i}", "b1", i, 4) for i in range(4)]
    assert out["peers"] == config["peers"]
    assert out["vn_size"] == 1


def test_a_non_neighbour_learns_them_as_peers_and_a_sibling_its_own_size() -> None:
    far = {"id": "b2", "vn": "b2", "neighbours": [], "peers": [entry("b1.0", "b1", 0, 3)]}
    assert with_members(far, "b1", B1_AFTER)["peers"] == [
        entry(f"b1.{i}", "b1", i, 4) for i in range(4)
    ]
    sibling = {"id": "b1.1", "vn": "b1", "replica": 1, "vn_size": 3, "neighbours": [], "peers": []}
    out = with_members(sibling, "b1", B1_AFTER)
    assert (out["vn_size"], out["replica"]) == (4, 1)
    assert [p["id"] for p in out["peers"]] == ["b1.0", "b1.2", "b1.3"]


def test_a_replica_that_left_is_forgotten() -> None:
    config = {
        "id": "b0.0",
        "vn": "b0",
        "neighbours": [entry(f"b1.{i}", "b1", i, 4) for i in range(4)],
    }
    out = with_members(config, "b1", B1_AFTER[:3])
    assert [n["id"] for n in out["neighbours"]] == ["b1.0", "b1.1", "b1.2"]
    assert {n["vn_size"] for n in out["neighbours"]} == {3}
