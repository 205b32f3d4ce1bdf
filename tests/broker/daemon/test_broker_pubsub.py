"""Publish/subscribe through a real broker process over real sockets."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from broker.client import Client
from broker.errors import InvalidRequest, TrellisError
from broker.language.filters import Filter
from broker.language.grammar import parse_filter
from broker.tools.launcher import BrokerProcess
from broker.wire.protocol import (
    Ack,
    Advertise,
    Deliver,
    Error,
    Message,
    Publish,
    Subscribe,
    Welcome,
    encode,
)
from tests.support import drain
from tests.wire import RawPeer

PUBLICATIONS = [
    {"class": "stock", "symbol": "ACME", "price": 10, "venue": "NYSE", "open": True},
    {"class": "stock", "symbol": "ACME", "price": 99.5, "venue": "LSE", "open": False},
    {"class": "stock", "symbol": "ABCO", "price": 50},
    {"class": "stock", "symbol": "ZETA", "price": 150.25, "venue": "NASDAQ"},
    {"class": "bond", "symbol": "ACME-2030", "price": 101, "venue": "NYSE"},
    {"class": "stock", "symbol": "TECH", "price": 20, "note": "split-adjusted"},
]

OPERATOR_FILTERS = [
    "class = 'stock' and symbol = 'ACME'",
    "class = 'stock' and symbol != 'ACME'",
    "price < 50",
    "price <= 50",
    "price > 99.5",
    "price >= 99.5",
    "price > 10 and price <= 100",
    "symbol prefix 'AC'",
    "symbol suffix '2030'",
    "note contains 'adjusted'",
    "venue exists",
    "symbol in ('ZETA', 'TECH')",
    "open = true",
    "*",
]


async def test_each_operator_delivers_exactly_the_matching_publications(
    broker: BrokerProcess,
) -> None:
    async with (
        Client(broker.endpoint, client_id="subscriber") as sc,
        Client(broker.endpoint, client_id="publisher") as pc,
    ):
        subs = [sc.subscribe(text) for text in OPERATOR_FILTERS]
        for sub in subs:
            await sub.__aenter__()
        await pc.advertise("*")
        for attrs in PUBLICATIONS:
            await pc.publish(attrs, b"x")
        await sc.flush()
        for text, sub in zip(OPERATOR_FILTERS, subs, strict=True):
            expected = [p for p in PUBLICATIONS if parse_filter(text).matches(p)]
            got = await drain(sub, idle=0.3)
            assert [d.attrs for d in got] == expected, text
            assert all(d.publisher == "publisher" for d in got)


async def test_subscriber_gets_matching_publications_in_order_per_publisher(
    broker: BrokerProcess,
) -> None:
    rng = random.Random(3)
    flt = "class = 'quote' and price >= 30 and price < 70"
    async with Client(broker.endpoint, client_id="sub") as sc, sc.subscribe(flt) as sub:
        publishers = [Client(broker.endpoint, client_id=f"pub{i}") for i in range(3)]
        sent: dict[str, list[dict]] = {}
        for p in publishers:
            await p.connect()
            await p.advertise("class = 'quote'")
            sent[p.client_id] = []
        for _ in range(600):
            p = rng.choice(publishers)
            attrs = {"class": "quote", "price": rng.randint(0, 100)}
            seq = await p.publish(attrs, ack=False)
            sent[p.client_id].append({"seq": seq, **attrs})
        for p in publishers:
            await p.drain()
            await p.close()
        got = await drain(sub)
    matcher = parse_filter(flt)
    for name, msgs in sent.items():
        expected = [(m["seq"], m["price"]) for m in msgs if matcher.matches(m)]
        received = [(d.seq, d.attrs["price"]) for d in got if d.publisher == name]
        assert received == expected
    assert sub.dropped == 0


async def test_unsubscribe_stops_delivery(broker: BrokerProcess) -> None:
    async with Client(broker.endpoint) as sc, Client(broker.endpoint) as pc:
        await pc.advertise("class = 'news'")
        sub = sc.subscribe("class = 'news'")
        await sub.__aenter__()
        await pc.publish({"class": "news", "n": 1})
        assert (await sub.get(5)).attrs["n"] == 1
        await sub.unsubscribe()
        await pc.publish({"class": "news", "n": 2})
        await sc.flush()
        await asyncio.sleep(0.2)
        assert [d async for d in sub] == []


async def test_publication_outside_every_advertisement_is_rejected_and_connection_kept(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.endpoint) as pc:
        await pc.advertise("class = 'stock'")
        with pytest.raises(InvalidRequest, match="matches none of this client's advertisements"):
            await pc.publish({"class": "bond"})
        await pc.publish({"class": "stock"})


async def test_unadvertise_stops_publishing_rights(broker: BrokerProcess) -> None:
    async with Client(broker.endpoint) as pc:
        adv = await pc.advertise("class = 'stock'")
        await pc.publish({"class": "stock"})
        await pc.unadvertise(adv)
        with pytest.raises(InvalidRequest):
            await pc.publish({"class": "stock"})


async def test_client_restores_subscriptions_after_broker_restart(run_broker) -> None:
    first = await asyncio.to_thread(run_broker, "restart")
    port = first.port
    async with (
        Client(first.endpoint, client_id="s", max_backoff=0.2) as sc,
        sc.subscribe("class = 'x'") as sub,
    ):
        first.kill()
        await asyncio.wait_for(sc.disconnected(), 5)
        again = await asyncio.to_thread(run_broker, "restart", port=port)
        await asyncio.wait_for(sc.connected(), 10)
        # The restore is sent right after the reconnect; a flush is acknowledged after it.
        await sc.flush()
        async with Client(again.endpoint, client_id="p") as pc:
            await pc.advertise("class = 'x'")
            await pc.publish({"class": "x", "n": 1})
            got = await sub.get(5)
        assert got.attrs == {"class": "x", "n": 1}


async def raw_publisher(
    broker: BrokerProcess, client_id: str, flt: Filter, session: str | None = None
) -> RawPeer:
    """A raw client connection that advertised ``flt`` (in ``session``, if given)."""
    peer = await RawPeer.connect(broker.endpoint)
    options = {} if session is None else {"session": session}
    assert isinstance(await peer.hello(client_id, options), Welcome)
    await peer.send_bytes(encode(Advertise(1, "a", flt)))
    assert await peer.receive() == Ack(1)
    return peer


async def publish_raw(peer: RawPeer, rid: int, seq: int, klass: str) -> Message:
    """Publish seq ``seq`` of class ``klass`` on a raw connection; the broker's answer."""
    await peer.send_bytes(encode(Publish(rid, seq, {"class": klass}, b"x")))
    return await peer.receive()


async def refusal(peer: RawPeer, rid: int, seq: int, klass: str) -> str:
    """The message of the error a raw publication is answered with."""
    refused = await publish_raw(peer, rid, seq, klass)
    assert isinstance(refused, Error)
    return refused.message


async def test_a_publication_sent_again_in_its_session_is_acknowledged_and_routed_once(
    broker: BrokerProcess,
) -> None:
    """A client whose session resumed sends its last publications again (they may have died
    with the lost connection): the broker acknowledges them but routes each seq of the
    session once."""
    flt = parse_filter("class = 'again'")
    subscriber = await RawPeer.connect(broker.endpoint)
    publisher = await raw_publisher(broker, "again-pub", flt, session="one")
    try:
        assert isinstance(await subscriber.hello("again-sub"), Welcome)
        await subscriber.send_bytes(encode(Subscribe(1, "s", flt)))
        assert await subscriber.receive() == Ack(1)
        for rid, seq in [(2, 1), (3, 1), (4, 2), (5, 1), (6, 2), (7, 3)]:
            await publisher.send_bytes(encode(Publish(rid, seq, {"class": "again"}, b"x")))
        assert [await publisher.receive() for _ in range(6)] == [Ack(r) for r in range(2, 8)]
        seqs = []
        while len(seqs) < 3:
            msg = await subscriber.receive()
            assert isinstance(msg, Deliver)
            seqs.append(msg.seq)
        with pytest.raises(TimeoutError):
            await subscriber.receive(timeout=0.3)
        assert seqs == [1, 2, 3]
    finally:
        await subscriber.close()
        await publisher.close()


async def test_a_seq_that_does_not_increase_in_its_session_is_refused_not_lost(
    broker: BrokerProcess,
) -> None:
    """Seq 0, or a seq at or below one the session published and never routed here, was
    acknowledged and then dropped by every subscriber (they deliver in seq order): refused
    now, naming the seq; the connection and the stream go on."""
    flt = parse_filter("class = 'order'")
    publisher = await raw_publisher(broker, "order-pub", flt, session="one")
    try:
        assert "seq 0" in await refusal(publisher, 2, 0, "order")
        assert await publish_raw(publisher, 3, 5, "order") == Ack(3)
        # 3 was never published: it is not a copy sent again, and it comes after 5
        message = await refusal(publisher, 4, 3, "order")
        assert "seq 3: this session already published seq 5" in message
        assert await publish_raw(publisher, 5, 6, "order") == Ack(5)
    finally:
        await publisher.close()
    sessionless = await raw_publisher(broker, "order-raw", flt)  # the same, per connection
    try:
        assert await publish_raw(sessionless, 2, 4, "order") == Ack(2)
        message = await refusal(sessionless, 3, 4, "order")
        assert "seq 4: this connection already published seq 4" in message
    finally:
        await sessionless.close()


async def test_a_second_client_with_a_live_clients_id_is_refused_and_the_first_keeps_going(
    broker: BrokerProcess,
) -> None:
    """Someone else's id (or two clients given one id) used to close the live connection
    and take its subscriptions; only the same session (a reconnection) may take over."""
    async with Client(broker.endpoint, client_id="owner") as sc, Client(broker.endpoint) as pc:
        await pc.advertise("class = 'mine'")
        sub = sc.subscribe("class = 'mine'")
        await sub.__aenter__()
        intruder = await RawPeer.connect(broker.endpoint)
        try:
            refused = await intruder.hello("owner", {"session": "other"})
            assert isinstance(refused, Error)
            assert refused.code == "not_authorized"
            assert "client id 'owner' is in use" in refused.message
            assert await intruder.closed_by_broker()
        finally:
            await intruder.close()
        async with Client(broker.endpoint, client_id="twin"):
            # Its retries go on past the grace a live connection has to answer the probe.
            with pytest.raises(TrellisError, match="client id 'twin' is in use"):
                await Client(broker.endpoint, client_id="twin", connect_timeout=4).connect()
        await pc.publish({"class": "mine", "n": 1})
        assert (await sub.get(5)).attrs["n"] == 1


async def test_a_restarted_client_takes_its_id_from_a_half_open_connection_within_seconds(
    run_broker: Callable[..., BrokerProcess],
) -> None:
    """A client whose old connection was left half-open (it crashed, or the network cut it)
    used to be refused its own id until the heartbeat gave up on the old one: two intervals,
    20 s by default, past the SDK's 5 s connect timeout. The broker now asks the old
    connection with a PING and frees the id once it goes unanswered (``PROBE_GRACE``)."""
    broker = run_broker(heartbeat_interval=10.0)  # the heartbeat alone takes 20 s
    stale = await RawPeer.connect(broker.endpoint)
    try:
        welcome = await stale.hello("restarted", {"session": "before-the-crash"})
        assert isinstance(welcome, Welcome)
        # From now on the old connection reads and answers nothing: a half-open socket.
        started = asyncio.get_running_loop().time()
        async with (
            Client(broker.endpoint, client_id="restarted", connect_timeout=8) as sc,
            Client(broker.endpoint) as pc,
        ):
            took = asyncio.get_running_loop().time() - started
            async with sc.subscribe("class = 'fresh'") as sub:
                await pc.advertise("class = 'fresh'")
                await pc.publish({"class": "fresh", "n": 1})
                assert (await sub.get(5)).attrs["n"] == 1
        assert took < 8
    finally:
        await stale.close()
