"""The trace ring (``broker/daemon/trace.py``) and the admin page's JSON documents, on
fake hops and on an in-process broker."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from broker.client import Client
from broker.daemon.trace import TraceRing, install
from broker.daemon.traffic_log import TrafficLog
from tests.broker.daemon.test_daemon_inprocess import endpoint, http_get, serving, until


@dataclass(frozen=True)
class FakeHop:
    peer_id: str
    is_broker: bool


PUB = FakeHop("pub", False)
SUB = FakeHop("sub", False)
B1 = FakeHop("b1", True)
B2 = FakeHop("b2", True)


def routed(ring: TraceRing, seq: int, source: FakeHop, *targets: FakeHop) -> None:
    """What the forwarder does for an undropped publication (forwarding.py, ``route``)."""
    key = (source, *targets)
    route = ring.routes.get(key)
    if route is None:
        route = ring.define_route(key, source, targets)
    ring.append(("pub", 1.0, "pub", seq, route, "pub", 3, False, None))


def test_a_routed_publication_is_traced_with_its_hops_and_verdict() -> None:
    ring = TraceRing()
    routed(ring, 1, PUB, B1, SUB)
    routed(ring, 2, B1)
    ring.append(("copy", 2.0, "pub", 3, "b1", "b1.0", 0))
    first = ring.publication("pub", 1)
    assert first["decisions"][0]["prev"] == "pub"
    assert first["decisions"][0]["from_client"] is True
    assert (first["decisions"][0]["next"], first["decisions"][0]["local"]) == (["b1"], ["sub"])
    assert first["verdict"]["what"] == "delivered"
    assert ring.publication("pub", 2)["verdict"]["what"] == "stopped"
    held = ring.publication("pub", 3)
    assert held["copies"] == [{"t": 2.0, "vn": "b1", "replica": "b1.0"}]
    assert held["verdict"]["what"] == "held"
    assert ring.publication("pub", 4)["verdict"]["what"] == "unseen"
    assert ring.publication("other", 1)["verdict"]["what"] == "unseen"


def test_a_dropped_delivery_is_traced_with_the_subscriber_it_missed() -> None:
    ring = TraceRing()
    ring.append(
        ring.dropped_pub(1.0, "pub", 7, B1, None, {SUB: ["s1"], B2: []}, [SUB], 3, False, 0)
    )
    trace = ring.publication("pub", 7)
    assert trace["decisions"][0]["dropped"] == ["sub"]
    assert trace["decisions"][0]["next"] == ["b2"]
    assert trace["verdict"]["what"] == "dropped"
    assert "sub" in trace["verdict"]["why"]


def test_the_ring_keeps_only_its_last_records() -> None:
    ring = TraceRing(size=100)
    for seq in range(1, 301):
        routed(ring, seq, PUB, SUB)
    assert len(ring.ring) == 100
    assert ring.publication("pub", 200)["verdict"]["what"] == "unseen"
    assert ring.publication("pub", 300)["verdict"]["what"] == "delivered"
    assert [r["seq"] for r in ring.recent(3)] == [300, 299, 298]


def test_routes_start_afresh_past_the_limit_and_older_ones_are_reported_unknown() -> None:
    ring = TraceRing(size=20_000)
    for seq in range(9000):
        routed(ring, seq, PUB, FakeHop(f"c{seq}", False))
    assert len(ring.routes) <= 4097
    # The previous generation of routes still resolves; the one before is gone.
    assert ring.publication("pub", 8999)["decisions"][0]["local"] == ["c8999"]
    assert ring.publication("pub", 5000)["decisions"][0]["local"] == ["c5000"]
    oldest = ring.publication("pub", 0)["decisions"][0]
    assert oldest["unknown_route"] is True
    assert oldest["local"] == []


async def test_the_ring_tees_into_the_traffic_log_and_answers_api_trace(tmp_path: Path) -> None:
    async with (
        serving(id="solo", traffic_log={"dir": str(tmp_path)}) as server,
        Client(endpoint(server), client_id="s") as sc,
        sc.subscribe("class = 'x'") as sub,
        Client(endpoint(server), client_id="p") as pc,
    ):
        ring = server.broker.forwarder.tlog
        assert isinstance(ring, TraceRing)
        assert isinstance(ring.log, TrafficLog)
        assert install(server.broker.forwarder) is ring  # installed once
        await pc.advertise("class = 'x'")
        for i in range(3):
            await pc.publish({"class": "x", "i": i}, b"p")
        for _ in range(3):
            await sub.get(5)
        assert ring.routes is ring.log.routes
        assert ring.log.routes
        status, body = await http_get(server.admin_port, "/api/trace?publisher=p&seq=2")
        assert status.endswith("200 OK")
        trace = json.loads(body)
        assert trace["id"] == "solo"
        assert trace["decisions"][0]["local"] == ["s"]
        assert trace["verdict"] == {"what": "delivered", "why": "delivered to s"}
        status, body = await http_get(server.admin_port, "/api/trace?publisher=p&seq=x")
        assert status.endswith("400 Bad Request")


async def test_api_documents_describe_the_broker_its_tables_and_subscriptions() -> None:
    async with (
        serving(id="solo") as server,
        Client(endpoint(server), client_id="s") as sc,
        sc.subscribe("class = 'x'"),
        Client(endpoint(server), client_id="p") as pc,
    ):
        await pc.advertise("class = 'x'")
        await until(lambda: server.broker.router.srt_size == 1)
        port = server.admin_port
        _, body = await http_get(port, "/api/topology")
        topology = json.loads(body)
        assert (topology["id"], topology["vn"], topology["links"]) == ("solo", "solo", [])
        assert topology["admin"] == f"http://127.0.0.1:{port}"
        _, body = await http_get(port, "/api/routing")
        routing = json.loads(body)
        assert [(r["filter"], r["local"]) for r in routing["srt"]] == [("class = 'x'", True)]
        assert [r["key"].split("/")[:2] for r in routing["prt"]] == [["solo", "s"]]
        _, body = await http_get(port, "/api/trace?subscription=solo/s/")
        assert json.loads(body)["verdict"] == "made here by a local client"
        _, body = await http_get(port, "/api/trace?subscription=nobody")
        assert json.loads(body)["held"] == []
        status, _ = await http_get(port, "/api/nothing")
        assert status.endswith("404 Not Found")
        status, page = await http_get(port, "/")
        assert status.endswith("200 OK")
        assert b'<svg id="overlay"' in page
        status, script = await http_get(port, "/static/app.js")
        assert status.endswith("200 OK")
        assert b"/api/topology" in script
        status, _ = await http_get(port, "/static/../admin.py")
        assert status.endswith("404 Not Found")
