"""SDK behaviour against a real broker: timeouts, back-pressure, lifecycle."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.client import Client, Status
from broker.errors import TrellisTimeout
from broker.tools.launcher import BrokerProcess
from broker.tools.local import free_ports
from broker.wire.protocol import Deliver, MsgType, Notice
from tests.wire import RawPeer


async def test_connect_timeout_really_bounds_the_first_connect() -> None:
    (port,) = free_ports(1)
    client = Client(f"127.0.0.1:{port}", connect_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(TrellisTimeout, match="could not connect"):
        await client.connect()
    assert time.monotonic() - started < 2.0
    assert client.status is Status.DISCONNECTED


async def test_client_is_reusable_but_not_reentrant(broker: BrokerProcess) -> None:
    client = Client(broker.endpoint)
    async with client:
        assert client.status is Status.CONNECTED
        with pytest.raises(RuntimeError, match="not re-entrant"):
            async with client:
                pass
    assert client.status is Status.CLOSED
    async with client:
        await client.flush()


async def test_slow_subscriber_loses_messages_visibly_without_stalling_anyone(
    run_broker,
) -> None:
    broker = run_broker("slow", send_buffer_limit=65536)
    total = 1500
    payload = b"p" * 10_000
    slow = await RawPeer.connect(broker.endpoint)
    await slow.hello("slow")
    await slow.send(MsgType.SUBSCRIBE, 1, "s", [["class", "eq", "bulk"]])
    await slow.receive()  # ACK
    async with (
        Client(broker.endpoint, client_id="fast", queue_size=total + 1) as fast_client,
        fast_client.subscribe("class = 'bulk'") as fast,
        Client(broker.endpoint, client_id="producer") as producer,
    ):
        await producer.advertise("class = 'bulk'")
        started = time.monotonic()
        for i in range(total):
            await producer.publish({"class": "bulk", "i": i}, payload)
        await producer.drain()
        got = [(await fast.get(10)).attrs["i"] for _ in range(total)]
        assert got == list(range(total))
        assert time.monotonic() - started < 30
    # The slow peer now reads everything: some deliveries were dropped and reported.
    received, dropped = 0, 0
    while True:
        try:
            msg = await slow.receive(timeout=2)
        except TimeoutError:
            break
        if isinstance(msg, Deliver):
            received += 1
        elif isinstance(msg, Notice) and msg.kind == "dropped":
            dropped += msg.data["subscriptions"]["s"]
    await slow.close()
    assert dropped > 0
    assert received + dropped == total


async def test_subscription_queue_overflow_raises_slow_consumer_once(broker: BrokerProcess) -> None:
    from broker.errors import SlowConsumerError

    async with (
        Client(broker.endpoint, queue_size=5) as c,
        c.subscribe("class = 'q'") as sub,
        Client(broker.endpoint) as p,
    ):
        await p.advertise("class = 'q'")
        for i in range(20):
            await p.publish({"class": "q", "i": i})
        await c.flush()
        await asyncio.sleep(0.1)
        with pytest.raises(SlowConsumerError) as info:
            await sub.get(1)
        assert info.value.dropped == 15
        assert info.value.pending == 5
        assert [(await sub.get(1)).attrs["i"] for _ in range(5)] == [0, 1, 2, 3, 4]
