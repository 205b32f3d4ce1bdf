"""The daemon run in the test's own event loop (uvicorn style): startup, serving, staged
shutdown, and two brokers linking, without a process boundary in between."""

from __future__ import annotations

import asyncio
import json
import logging
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import pytest

from broker.client import Client
from broker.daemon import dispatch
from broker.daemon.config import BrokerConfig
from broker.daemon.reconfig_agent import ControlChannel
from broker.daemon.server import Server
from broker.errors import ConnectionLost
from broker.tools.local import free_ports
from tests.support import until


@asynccontextmanager
async def serving(**settings: Any) -> AsyncIterator[Server]:
    """A started in-process broker on free ports, stopped (and awaited) on exit."""
    server = Server(BrokerConfig(port=0, admin_port=0, shutdown_timeout=1.0, **settings))
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            started = asyncio.create_task(server.started.wait())
            done, _ = await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                started.cancel()
                task.result()  # startup failed: raise its error here
        yield server
    finally:
        server.request_stop()
        async with asyncio.timeout(10):
            await task


def endpoint(server: Server) -> str:
    return f"127.0.0.1:{server.port}"


async def http_get(port: int | None, path: str) -> tuple[str, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    async with asyncio.timeout(5):
        data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode().split("\r\n")[0], body


async def test_in_process_broker_serves_pub_sub_and_admin_endpoints() -> None:
    async with (
        serving(id="solo") as server,
        Client(endpoint(server), client_id="s") as sc,
        sc.subscribe("class = 'quote' and price < 10") as sub,
        Client(endpoint(server), client_id="p") as pc,
    ):
        await pc.advertise("class = 'quote'")
        await pc.publish({"class": "quote", "price": 50}, b"dear")
        await pc.publish({"class": "quote", "price": 5}, b"cheap")
        got = await sub.get(5)
        assert (got.attrs["price"], got.payload) == (5, b"cheap")
        assert server.broker.stats.deliveries == 1
        status, body = await http_get(server.admin_port, "/healthz")
        assert status.endswith("200 OK")
        health = json.loads(body)
        assert (health["id"], health["clients"], health["prt"]) == ("solo", 2, 1)
        status, body = await http_get(server.admin_port, "/metrics")
        assert b'trellis_deliveries_total{broker="solo"} 1.0' in body


async def test_stop_request_tells_clients_and_closes_every_connection() -> None:
    async with serving(id="stopping") as server:
        client = Client(endpoint(server), client_id="c", max_backoff=5.0)
        await client.__aenter__()
        try:
            await until(lambda: len(server.broker.clients) == 1)
            server.request_stop()
            await asyncio.wait_for(client.disconnected(), 5)
            await until(lambda: not server.broker.connections)
        finally:
            with suppress(ConnectionLost):
                await client.close()


async def test_two_in_process_brokers_link_and_route_across_the_link() -> None:
    async with (
        serving(id="b2", neighbours=[{"id": "b1", "endpoint": "127.0.0.1:1"}]) as b2,
        serving(id="b1", neighbours=[{"id": "b2", "endpoint": endpoint(b2)}]) as b1,
    ):
        await until(lambda: "b1" in b2.broker.links and "b2" in b1.broker.links)
        async with (
            Client(endpoint(b2), client_id="s") as sc,
            sc.subscribe("class = 'x'") as sub,
            Client(endpoint(b1), client_id="p") as pc,
        ):
            await pc.advertise("class = 'x'")
            await until(lambda: b1.broker.router.prt_size == 1)
            await pc.publish({"class": "x", "n": 7})
            got = await sub.get(5)
            assert got.attrs == {"class": "x", "n": 7}
            assert b1.broker.stats.forwarded == {"b2": 1}


async def test_a_link_a_freeze_holds_unread_outlives_the_neighbours_heartbeat_timeout() -> None:
    """A reconfiguration freeze leaves links out of the neighbourhood unread for up to a
    lease, which may be more than three heartbeat intervals. The frozen broker pings them,
    so the neighbour does not close the link as silent. It did (heartbeat 1 s, a freeze
    of 3 s and more): the frozen broker withdrew the subscriptions it had learned over the
    link, and what it routed before they came back was lost
    (tests/system/test_byzantine_coordinator.py, intermittently)."""
    beat = 0.2
    async with (
        serving(
            id="b2", heartbeat_interval=beat, neighbours=[{"id": "b1", "endpoint": "127.0.0.1:1"}]
        ) as b2,
        serving(
            id="b1", heartbeat_interval=beat, neighbours=[{"id": "b2", "endpoint": endpoint(b2)}]
        ) as b1,
    ):
        await until(lambda: "b1" in b2.broker.links and "b2" in b1.broker.links)
        link = b1.broker.links["b2"]
        b2.broker.freeze(set())  # a round b1 is not in: its link is held unread
        try:
            await asyncio.sleep(6 * beat)  # b1 closes a peer silent for 3 beats
            assert b2.broker.paused, "the freeze held nothing"
            assert b1.broker.links.get("b2") is link, "b1 closed the frozen link as silent"
        finally:
            b2.broker.unfreeze()


async def test_a_stream_read_up_to_its_mark_before_the_freeze_counts_as_marked() -> None:
    """A replica whose siblings asked first reads an outside link up to the round's mark
    before its own freeze arrives; the freeze then counts that stream as read up to a mark
    (``/reconfig`` "marked"). It counted nothing: a replica marked early looked as if no
    stream from outside had ever been marked (tests/system/test_reconfig_byzantine_edge.py
    failed on that count in CI while delivery was exact)."""
    async with (
        serving(id="b2", neighbours=[{"id": "b1", "endpoint": "127.0.0.1:1"}]) as b2,
        serving(id="b1", neighbours=[{"id": "b2", "endpoint": endpoint(b2)}]) as b1,
    ):
        await until(lambda: "b1" in b2.broker.links and "b2" in b1.broker.links)
        broker = b2.broker
        broker.expect_marks("b3#1", {"b2", "b3"})  # a round b1 is outside of
        broker.marked(broker.links["b1"], "b3#1")  # its mark read before the freeze
        try:
            assert broker.freeze({"b2", "b3"}) == 1
            assert not broker.marks_owed()
        finally:
            broker.unfreeze()
            broker.expect_marks(None)


async def test_a_control_channel_idle_between_steps_is_not_closed_as_silent() -> None:
    """Between two steps a coordinator waits for its slowest member (a freeze that does not
    drain waits a whole step timeout), longer than three heartbeat intervals when those are
    short. The channel answers the member's PINGs meanwhile, so the member keeps it open and
    the next step (an ``abort``) reaches it: it was closed as silent, and the member stayed
    locked until its lease ended (tests/system/test_byzantine_coordinator.py)."""
    beat = 0.2
    # A peer m1 knows (it refuses strangers' HELLO); the smaller id dials, so m1 never does.
    coordinator = {"id": "c1", "endpoint": "127.0.0.1:1"}
    async with serving(id="m1", heartbeat_interval=beat, neighbours=[coordinator]) as server:
        channel = ControlChannel("c1", "m1", endpoint(server))
        await channel.open(5)
        try:
            await asyncio.sleep(6 * beat)  # the member closes a peer silent for 3 beats
            reply = await channel.request("neighbours", {}, 5)
        finally:
            await channel.close()
        assert reply.ok, reply


async def test_each_step_of_a_round_renews_the_members_lease() -> None:
    """A lease runs one length from the master's latest step, not from the lock: a round
    whose steps took longer than one lease in all had members go back on their own while
    the master VN's replicas switched (an install 7 s after the drain, leases of 5 s)."""
    coordinator = {"id": "c1", "endpoint": "127.0.0.1:1"}
    async with serving(id="m1", neighbours=[coordinator], reconfig={"enabled": True}) as server:
        member = server.broker.reconfig.member
        channel = ControlChannel("c1", "m1", endpoint(server))
        await channel.open(5)
        try:
            lock = await channel.request("lock", {"round": "c#1", "master": "c", "lease": 1.0}, 5)
            assert lock.ok, lock
            await asyncio.sleep(0.7)
            # Not prepared yet, so refused: but it came from the live master of the round.
            await channel.request("connect", {"round": "c#1"}, 5)
            await asyncio.sleep(0.6)  # 1.3 s after the lock, 0.6 s after the step
            assert member.lease is not None
            assert member.lease.round == "c#1"
            await until(lambda: member.lease is None, timeout=2)
        finally:
            await channel.close()


async def test_an_undialable_neighbour_warns_once_and_healthz_reports_it_missing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch, "_LINK_WARN_AFTER", 0.2)
    monkeypatch.setattr(dispatch, "_LINK_WARN_EVERY", 60.0)
    (dead,) = free_ports(1)
    caplog.set_level(logging.INFO)
    neighbour = {"id": "z9", "endpoint": f"127.0.0.1:{dead}"}
    async with serving(id="a1", neighbours=[neighbour], link_backoff_max=0.05) as server:
        await asyncio.sleep(1.0)  # some twenty attempts
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.getMessage().split(" at ")[0] for r in warned] == ["cannot link a1-z9"]
        assert f"at 127.0.0.1:{dead} for" in warned[0].getMessage()
        _, body = await http_get(server.admin_port, "/healthz")
        health = json.loads(body)
        assert (health["status"], health["links"], health["missing_links"]) == (
            "degraded",
            [],
            ["z9"],
        )


async def test_a_plain_broker_says_it_tolerates_no_byzantine_replica_at_info_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    async with serving(id="plain") as server:
        _, body = await http_get(server.admin_port, "/healthz")
        assert json.loads(body)["status"] == "ok"
    said = [r for r in caplog.records if "Byzantine" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]
    caplog.clear()
    async with serving(id="pair", vn="p", vn_size=2):
        pass
    said = [r for r in caplog.records if "Byzantine" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING]


async def test_closing_a_connection_whose_socket_uvloop_already_closed_costs_only_that_one() -> (
    None
):
    """Found by tests/hosts: on uvloop, a transport whose peer reset it may not say
    ``is_closing()`` yet its write raises RuntimeError; the heartbeat's close then flushed
    into it and the error ended the heartbeat task, and with it the broker."""
    async with (
        serving(id="solo") as server,
        Client(endpoint(server), client_id="s") as sc,
        sc.subscribe("class = 'quote'") as sub,
        Client(endpoint(server), client_id="p") as pc,
    ):
        await pc.advertise("class = 'quote'")
        conn = next(c for c in server.broker.connections if c.peer_id == "p")
        assert conn.transport is not None

        def closed_handle(_data: object) -> None:
            raise RuntimeError(
                "unable to perform operation on <TCPTransport>; the handler is closed"
            )

        conn.transport.write = closed_handle  # type: ignore[method-assign]
        conn.send_raw(b"queued")  # what the heartbeat's close would flush
        conn.close()
        async with Client(endpoint(server), client_id="p2") as other:
            await other.advertise("class = 'quote'")
            await other.publish({"class": "quote", "n": 1}, b"still served")
            assert (await sub.get(5)).payload == b"still served"


async def test_debug_memory_says_how_to_trace_when_tracing_is_off() -> None:
    async with serving(id="untraced") as server:
        status, body = await http_get(server.admin_port, "/debug/memory")
    doc = json.loads(body)
    assert status.endswith("200 OK")
    assert doc["tracing"] is False
    assert "PYTHONTRACEMALLOC" in doc["hint"]


async def test_debug_memory_reports_what_grew_between_two_requests() -> None:
    """With the tracer on, the second request names the allocation sites that grew since the
    first: here the advertisements a client added in between (the router's tables)."""
    tracemalloc.start()
    try:
        async with serving(id="traced") as server, Client(endpoint(server), client_id="c") as c:
            _, first = await http_get(server.admin_port, "/debug/memory")
            for i in range(300):
                await c.advertise(f"class = 'grow' and n = {i}")
            _, second = await http_get(server.admin_port, "/debug/memory")
    finally:
        tracemalloc.stop()
    before, after = json.loads(first), json.loads(second)
    assert before["tracing"]
    assert after["tracing"]
    assert before["top"]
    assert before["growth_since_last_request"] == []
    growth = after["growth_since_last_request"]
    assert sum(g["grew_bytes"] for g in growth) > 0
    assert any("/broker/" in where for g in growth for where in g["where"]), growth[:5]
