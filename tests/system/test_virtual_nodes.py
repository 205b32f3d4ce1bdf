"""Virtual nodes: replica groups in the overlay, clients attached to every replica."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from broker.client import Client, Subscription, parse_endpoint
from broker.errors import TrellisTimeout
from broker.tools.launcher import BrokerProcess
from broker.tools.local import LocalOverlay, free_ports
from overlay.tree import broker_names, line_tree
from tests.support import GatedProxy
from tests.system.test_overlay import metric

pytestmark = pytest.mark.slow


@pytest.fixture
def run_vns(run_overlay: Callable[..., LocalOverlay]) -> Callable[..., LocalOverlay]:
    """A line of ``vns`` VNs of ``replicas`` brokers each."""

    def _run(vns: int, replicas: int, overrides: dict[str, Any] | None = None) -> LocalOverlay:
        tree = line_tree(broker_names(vns))
        return run_overlay(
            tree,
            replicas=dict.fromkeys(tree.brokers, replicas),
            overrides=overrides,
            heartbeat_interval=1.0,
        )

    return _run


async def exchange(overlay: LocalOverlay, count: int, kill: str | None = None) -> list[int]:
    """Publish ``count`` messages at the first VN; return the seqs the last VN's subscriber
    got, in delivery order."""
    first, last = sorted(overlay.tree.brokers)[0], sorted(overlay.tree.brokers)[-1]
    async with (
        Client(overlay.endpoints(first), client_id="pub") as pub,
        Client(overlay.endpoints(last), client_id="sub") as sc,
        sc.subscribe("class = 'v'") as sub,
    ):
        await pub.advertise("class = 'v'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(count):
            if kill is not None and i == count // 2:
                overlay.brokers[kill].kill()
            await pub.publish({"class": "v", "i": i}, b"payload", ack=(i % 10 == 0))
        await pub.drain()
        got = []
        while len(got) < count:
            try:
                got.append((await sub.get(5)).seq)
            except Exception:
                break
        # Nothing more may arrive: each publication exactly once.
        with pytest.raises(Exception, match="no delivery"):
            await sub.get(1.0)
    return got


async def test_replicated_overlay_delivers_each_publication_once_in_order(run_vns) -> None:
    overlay = run_vns(3, 3)
    assert set(overlay.brokers) == {f"b{v}.{r}" for v in range(3) for r in range(3)}
    assert await exchange(overlay, 150) == list(range(1, 151))


async def test_one_dropping_replica_per_vn_loses_nothing(run_vns) -> None:
    overlay = run_vns(3, 3, overrides={f"b{v}.1": {"byzantine": "drop"} for v in range(3)})
    assert await exchange(overlay, 150) == list(range(1, 151))


async def test_a_replica_crashing_mid_stream_loses_nothing(run_vns) -> None:
    overlay = run_vns(3, 3)
    assert await exchange(overlay, 200, kill="b1.2") == list(range(1, 201))


async def test_corrupting_minority_cannot_alter_what_subscribers_receive(run_vns) -> None:
    overlay = run_vns(2, 3, overrides={"b1.0": {"byzantine": "corrupt"}})
    first, last = "b0", "b1"
    async with (
        Client(overlay.endpoints(first), client_id="pub") as pub,
        Client(overlay.endpoints(last), client_id="sub") as sc,
        sc.subscribe("class = 'v'") as sub,
    ):
        await pub.advertise("class = 'v'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(20):
            await pub.publish({"class": "v", "i": i}, b"genuine")
        got = [await sub.get(5) for _ in range(20)]
    assert all(d.payload == b"genuine" for d in got)


async def test_clients_leaving_replicated_vns_withdraw_their_entries_everywhere(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """A publisher and a subscriber at the two ends of a line of replicated VNs leave: every
    broker drops their advertisement and subscription. Before, only their edge VNs did
    (every removal vote after the first was taken for a late copy), so the others kept
    routing state for clients long gone. ``session_linger = 0``: a client's entries go
    when its connection does, so the test does not wait out parked sessions."""
    tree = line_tree(broker_names(3))
    overlay = run_overlay(
        tree, replicas=dict.fromkeys(tree.brokers, 3), heartbeat_interval=1.0, session_linger=0
    )
    async with (
        Client(overlay.endpoints("b0"), client_id="pub") as pub,
        Client(overlay.endpoints("b2"), client_id="sub") as sc,
        sc.subscribe("class = 'v'") as sub,
    ):
        await pub.advertise("class = 'v'")
        held = await asyncio.to_thread(overlay.wait_quiet)
        assert all(h["srt"] == 1 for h in held.values()), held
        assert all(h["prt"] == 1 for b, h in held.items() if not b.startswith("b2")), held
        await pub.publish({"class": "v", "i": 1}, b"one")
        assert (await sub.get(5)).payload == b"one"
    left = await asyncio.to_thread(overlay.wait_quiet)
    assert {b: (h["srt"], h["prt"]) for b, h in left.items()} == dict.fromkeys(left, (0, 0))


async def short_lived_publishers(
    endpoints: list[str], sub: Subscription, count: int
) -> AsyncIterator[int]:
    """Publishers p0, p1, ... one after another: each advertises, publishes once and
    leaves; yields its number once ``sub`` got that publication."""
    for i in range(count):
        async with Client(endpoints, client_id=f"p{i}") as pub:
            await pub.advertise("class = 'v'")
            await pub.publish({"class": "v", "i": i}, b"once")
        try:
            got = await sub.get(5)
        except TrellisTimeout:
            raise AssertionError(f"p{i} lost") from None
        assert (got.publisher, got.attrs["i"]) == (f"p{i}", i)
        yield i


async def test_a_broker_forgets_idle_publishers_past_max_publishers_and_still_delivers(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """Every publisher a broker hears through a replicated VN leaves a stream of copy
    agreement; short-lived publishers (each ``trellis pub`` run with a random id) used to
    add 64 KiB each, forever. Past ``max_publishers`` the idle ones go, and a forgotten
    publisher that comes back is delivered as before."""
    tree = line_tree(broker_names(2))
    overlay = run_overlay(
        tree,
        replicas={"b0": 3, "b1": 1},
        overrides={"b1": {"max_publishers": 16}},
        heartbeat_interval=1.0,
    )
    async with (
        Client(overlay.endpoints("b1"), client_id="sub") as sc,
        sc.subscribe("class = 'v'") as sub,
    ):
        async for _ in short_lived_publishers(overlay.endpoints("b0"), sub, 40):
            pass
        await asyncio.sleep(1.0)  # a tick of the forwarder (every copy_patience / 2)
        text = await asyncio.to_thread(overlay.metrics, "b1")
        assert 0 < metric(text, "trellis_publisher_streams") <= 16
        async with Client(overlay.endpoints("b0"), client_id="p0", first_seq=7) as pub:
            await pub.advertise("class = 'v'")
            await pub.publish({"class": "v", "i": 100}, b"again")
        got = await sub.get(5)
        assert (got.publisher, got.seq, got.payload) == ("p0", 7, b"again")
        with pytest.raises(TrellisTimeout):
            await sub.get(1.0)


async def test_a_subscriber_forgets_idle_publishers_past_max_publishers_and_delivers_once(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """The SDK keeps copy agreement per publisher too: a long-lived subscriber of a
    replicated VN hearing many short-lived publishers keeps at most ``max_publishers`` of
    them; a forgotten publisher that comes back is delivered once, in order."""
    overlay = run_overlay(line_tree(["b0"]), replicas={"b0": 3}, heartbeat_interval=1.0)
    async with (
        Client(overlay.endpoints("b0"), client_id="sub", max_publishers=8) as sc,
        sc.subscribe("class = 'v'") as sub,
    ):
        async for _ in short_lived_publishers(overlay.endpoints("b0"), sub, 30):
            assert sub.publisher_streams <= 8
        async with Client(overlay.endpoints("b0"), client_id="p0", first_seq=2) as pub:
            await pub.advertise("class = 'v'")
            for n in (2, 3):
                await pub.publish({"class": "v", "i": 100 + n}, b"again %d" % n)
        got = [await sub.get(5) for _ in range(2)]
        assert [(d.publisher, d.seq, d.payload) for d in got] == [
            ("p0", 2, b"again 2"),
            ("p0", 3, b"again 3"),
        ]
        with pytest.raises(TrellisTimeout):
            await sub.get(1.0)


async def test_clients_given_one_replica_of_a_vn_find_the_others_and_deliver(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """A new user copies one broker's endpoint from ``trellis up``: held by one replica of
    three, its advertisement and subscription were never in force beyond its VN, and every
    publication was lost without a word. The WELCOME now lists the VN's replicas and such
    a client connects to all of them; given a majority already, it keeps what it was given.
    Given replicas of two VNs, it refuses the second VN's with a clear error."""
    overlay = run_overlay(line_tree(broker_names(2)), replicas={"b0": 3, "b1": 3})
    b0, b1 = overlay.endpoints("b0"), overlay.endpoints("b1")
    async with (
        Client(b1[2], client_id="sub", manifest=overlay.manifest_path) as sc,
        sc.subscribe("class = 'v'") as sub,
        Client(b0[1], client_id="pub") as pub,
        Client(b0[:2], client_id="two") as two,
    ):
        assert sorted(sc.replica_endpoints) == sorted(parse_endpoint(e) for e in b1)
        assert sorted(pub.replica_endpoints) == sorted(parse_endpoint(e) for e in b0)
        assert sorted(two.replica_endpoints) == sorted(parse_endpoint(e) for e in b0[:2])
        await pub.advertise("class = 'v'")
        await two.advertise("class = 'v'")
        for i in range(3):
            await pub.publish({"class": "v", "i": i}, b"plain %d" % i)
            await pub.publish({"class": "v", "i": i}, b"secret %d" % i, confidential=True)
            await two.publish({"class": "v", "i": i}, b"two %d" % i)
        got: dict[str, list[bytes]] = {}
        for _ in range(9):
            d = await sub.get(10)
            got.setdefault(d.publisher, []).append(d.payload)
        assert got == {
            "pub": [b"plain 0", b"secret 0", b"plain 1", b"secret 1", b"plain 2", b"secret 2"],
            "two": [b"two 0", b"two 1", b"two 2"],
        }
        with pytest.raises(TrellisTimeout):
            await sub.get(1.0)
    # Replicas of two VNs: neither would hold f + 1 copies; the client says so.
    with pytest.raises(TrellisTimeout, match=r"is a replica of VN b[01], the other endpoints"):
        async with Client([b0[0], b1[0]], client_id="mixed", connect_timeout=2):
            pass


async def test_clients_are_told_the_other_replicas_where_clients_dial_them(
    run_broker: Callable[..., BrokerProcess],
) -> None:
    """Containers: brokers reach each other at one address (the compose network), clients
    at another (ports published on the host). A client given one replica is told the
    others at their ``client_endpoints``, not at addresses only brokers can reach."""
    ports = free_ports(3)
    relays = [GatedProxy(port) for port in ports]  # "published ports": where clients dial
    dial = [await relay.start() for relay in relays]
    for relay in relays:
        relay.open()
    replicas = [
        {"id": f"r{i}", "endpoint": f"127.0.0.1:{port}", "vn": "v", "replica": i, "vn_size": 3}
        for i, port in enumerate(ports)
    ]
    brokers = [
        run_broker(
            f"r{i}",
            port=ports[i],
            vn="v",
            replica=i,
            vn_size=3,
            peers=[r for r in replicas if r["id"] != f"r{i}"],
            client_endpoints={f"r{j}": dial[j] for j in range(3)},
        )
        for i in range(3)
    ]
    try:
        async with (
            Client(brokers[0].endpoint, client_id="pub") as pub,
            Client(dial[2], client_id="sub") as sc,
            sc.subscribe("class = 'v'") as sub,
        ):
            told = [brokers[0].endpoint, dial[1], dial[2]]
            assert sorted(pub.replica_endpoints) == sorted(parse_endpoint(e) for e in told)
            assert sorted(sc.replica_endpoints) == sorted(parse_endpoint(e) for e in dial)
            await pub.advertise("class = 'v'")
            for i in range(3):
                await pub.publish({"class": "v", "i": i}, b"plain %d" % i)
            assert [(await sub.get(10)).payload for _ in range(3)] == [
                b"plain 0",
                b"plain 1",
                b"plain 2",
            ]
        # pub: r1 and r2 through their relays; sub: all three.
        assert [relay.connections for relay in relays] == [1, 2, 2]
    finally:
        for relay in relays:
            await relay.close()
