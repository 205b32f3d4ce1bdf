"""SDK behaviour against a real broker: timeouts, back-pressure, lifecycle, errors."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import DELIVERED_MEMORY, LAGGING_LINK_BYTES, Client, Status
from broker.errors import ConnectionLost, InvalidRequest, TrellisError, TrellisTimeout
from broker.tools.launcher import BrokerProcess
from broker.tools.local import LocalOverlay, fetch_json, free_ports
from broker.wire.protocol import (
    PROTOCOL_VERSION,
    RESUMED_OPTION,
    Ack,
    Deliver,
    FrameDecoder,
    Hello,
    MsgType,
    Notice,
    Ping,
    Pong,
    Share,
    Subscribe,
    Unsubscribe,
    Welcome,
    encode,
    encode_deliver,
)
from overlay.tree import broker_names, line_tree
from tests.support import GatedProxy, all_closed, until
from tests.wire import RawPeer


@contextlib.contextmanager
def frozen(broker: BrokerProcess) -> Iterator[None]:
    """The broker process stopped (SIGSTOP): its connections stay open, but it reads and
    answers nothing until the block ends."""
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(broker.pid, signal.SIGCONT)


def publications_in(brokers: list[BrokerProcess]) -> list[int]:
    """How many publications each broker took from its clients (its admin port's health)."""
    return [fetch_json(b.admin_url + "/healthz")["publications_in"] for b in brokers]


@contextlib.asynccontextmanager
async def fake_broker(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[str]:
    """A stand-in broker on a free loopback port running ``handler`` per connection; its
    endpoint, for a client to connect to. Every connection it took is closed at the end."""
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await handler(reader, writer)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await all_closed(writers)
        await server.wait_closed()


async def test_connect_timeout_really_bounds_the_first_connect() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # accepts, never answers HELLO

    async with fake_broker(silent) as endpoint:
        client = Client(endpoint, connect_timeout=0.5)
        started = time.monotonic()
        try:
            with pytest.raises(
                TrellisTimeout, match=r"could not connect .*sent no WELCOME.*within 0.5 s"
            ):
                await client.connect()
        finally:
            for writer in accepted:
                writer.close()
    assert time.monotonic() - started < 2.0
    assert client.status is Status.DISCONNECTED


async def assert_welcome_refused(options: dict[str, object], match: str) -> None:
    """A fake broker answers the HELLO with one WELCOME carrying ``options``; the client
    must refuse it with an error matching ``match``."""

    async def welcome(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4096)  # the HELLO
        writer.write(encode(Welcome(PROTOCOL_VERSION, "b0", options)))
        await writer.drain()
        await reader.read()
        writer.close()

    async with fake_broker(welcome) as endpoint:
        client = Client(endpoint, connect_timeout=1)
        try:
            with pytest.raises(TrellisError, match=match):
                await client.connect()
        finally:
            await client.close()


async def test_a_broker_that_pings_and_never_reads_gets_no_pongs_past_the_write_buffer() -> None:
    """A broker (a Byzantine edge replica, say) that sent PINGs and never read had a PONG
    queued in the client for each, without bound. While the link's write buffer is full
    (the transport paused writing) a PING gets no PONG: the broker reads nothing anyway."""
    pings = encode(Ping(1)) * 100_000
    flooded = asyncio.Event()
    done = asyncio.Event()

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            await reader.read(4096)  # the HELLO; nothing is read after it
            writer.write(encode(Welcome(PROTOCOL_VERSION, "b0", {})))
            for _ in range(20):  # 2,000,000 PINGs, 14 MB
                writer.write(pings)
                await writer.drain()
            flooded.set()
            await done.wait()
        finally:
            writer.transport.abort()

    async with fake_broker(flood) as endpoint:
        try:
            async with Client(endpoint, connect_timeout=5) as client:
                await asyncio.wait_for(flooded.wait(), 60)
                await asyncio.sleep(0.2)
                (link,) = client._links.values()
                assert link.transport is not None
                queued = link.out_bytes + link.transport.get_write_buffer_size()
                assert queued < 1 << 20, queued  # bytes: not the 14 MB of PONGs
        finally:
            done.set()


async def test_a_broker_sending_endless_record_shares_for_one_epoch_fills_only_its_allowance() -> (
    None
):
    """An edge replica (a Byzantine one) sending forged record-form shares for one epoch,
    again and again, grew the client's key assembly without bound (until 2026-12-02): past
    its allowance the rest are refused, and a record sent twice is held once."""
    from security.envelope import Signer
    from security.paths import record_cost
    from security.propagation import pack_record, publisher_split
    from security.publication import publication_id

    budget = 64 * 1024
    (genuine, *_) = publisher_split(
        os.urandom(32), 2, 3, Signer.generate("pub"), publication_id("pub", 1)
    )
    budget_set = asyncio.Event()
    answered = asyncio.Event()

    async def forge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        try:
            await reader.read(4096)  # the HELLO
            writer.write(encode(Welcome(PROTOCOL_VERSION, "b0", {})))
            await budget_set.wait()
            again = encode(Share("pub", 1, pack_record(genuine)))
            for _ in range(3000):
                forged = dataclasses.replace(genuine, data=os.urandom(len(genuine.data)))
                writer.write(encode(Share("pub", 1, pack_record(forged))) + again)
            writer.write(encode(Ping(7)))
            await writer.drain()
            while not answered.is_set():  # the PONG: every share before it was read
                data = await reader.read(65536)
                if not data:
                    return
                if any(isinstance(msg, Pong) for msg in decoder.feed(data)):
                    answered.set()
        finally:
            writer.transport.abort()

    async with fake_broker(forge) as endpoint, Client(endpoint, connect_timeout=5) as client:
        client._records.budget = budget
        budget_set.set()
        await asyncio.wait_for(answered.wait(), 60)
        held = client._records.charged("b0")
        assert 0 < held <= budget
        assert client._records.refused["b0"] > 2000
        assembly = client._assembly("pub", 1)
        assert len(assembly.shares) * record_cost(genuine) == held  # not 6,000 of them
        assert sum(1 for _, record in assembly.shares if record == genuine) == 1


@pytest.mark.parametrize(
    "resumed",
    ["junk", {"subscriptions": "s1"}, {"advertisements": [1, 2]}],
    ids=["not-a-map", "not-a-list", "not-ids"],
)
async def test_a_welcome_with_a_malformed_resumed_session_is_refused_and_says_why(
    resumed: object,
) -> None:
    await assert_welcome_refused({RESUMED_OPTION: resumed}, r"invalid WELCOME .*'resumed")


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"vn": "v", "replica": 0, "vn_size": 1_000_000}, "replica 0 of 1000000"),
        ({"vn": "v", "replica": -1, "vn_size": 3}, "replica -1 of 3"),
        ({"vn": "v", "replica": 0, "vn_size": 0}, "replica 0 of 0"),
        ({"vn": "v", "replica": 0, "vn_size": 3, "max_frame": 0}, "max_frame 0"),
    ],
    ids=["huge-vn", "negative-replica", "empty-vn", "no-frame"],
)
async def test_a_welcome_announcing_an_impossible_vn_is_refused_and_says_why(
    options: dict[str, object], reason: str
) -> None:
    """A WELCOME's ``vn_size`` sizes what the client sets up for the edge VN (the replicas
    it dials, from the same WELCOME): a million was taken as it came."""
    await assert_welcome_refused(options, rf"invalid WELCOME .*{reason}")


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [("127.0.0.1:{free}", "connection refused"), ("no-such-host.invalid:7700", "unknown host")],
)
async def test_a_refused_port_or_an_unknown_host_fails_at_once_and_says_so(
    endpoint: str, reason: str
) -> None:
    (free,) = free_ports(1)
    client = Client(endpoint.format(free=free), connect_timeout=5)
    started = time.monotonic()
    with pytest.raises(ConnectionLost, match=f"could not connect to .*{reason}"):
        await client.connect()
    assert time.monotonic() - started < 1.0
    assert client.status is Status.DISCONNECTED


async def test_endpoints_of_plain_brokers_are_alternatives_and_the_live_one_is_used(
    broker: BrokerProcess,
) -> None:
    (dead,) = free_ports(1)
    async with Client([broker.endpoint, f"127.0.0.1:{dead}"], connect_timeout=3) as client:
        assert client.alternatives
        async with client.subscribe("class = 'x'") as sub:
            await client.advertise("class = 'x'")
            await client.publish({"class": "x"})
            assert (await sub.get(timeout=5)).attrs == {"class": "x"}
    async with Client([f"127.0.0.1:{dead}", broker.endpoint], connect_timeout=3) as client:
        await client.flush()


@pytest.mark.slow
async def test_a_client_fails_over_to_the_other_plain_broker_and_restores_its_state(
    run_broker: Callable[..., BrokerProcess],
) -> None:
    first, second = run_broker("alt1"), run_broker("alt2")
    async with (
        Client([first.endpoint, second.endpoint], client_id="alt", max_backoff=0.2) as client,
        client.subscribe("class = 'x'") as sub,
    ):
        await client.advertise("class = 'x'")
        used, other = (first, second) if client.broker_id == first.id else (second, first)
        await asyncio.to_thread(used.stop)
        async with asyncio.timeout(10):
            while client.broker_id != other.id:  # noqa: ASYNC110 - polls the client
                await asyncio.sleep(0.02)
            await client.connected()
        await client.publish({"class": "x", "n": 2})
        assert (await sub.get(timeout=5)).attrs == {"class": "x", "n": 2}


async def test_client_is_reusable_but_not_reentrant(broker: BrokerProcess) -> None:
    client = Client(broker.endpoint)
    async with client:
        assert client.status is Status.CONNECTED
        with pytest.raises(InvalidRequest, match="not re-entrant"):
            async with client:
                pass
    assert client.status is Status.CLOSED
    async with client:
        await client.flush()


async def test_slow_subscriber_loses_messages_visibly_without_stalling_anyone(
    run_broker: Callable[..., BrokerProcess],
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


async def test_publish_without_ack_raises_trellis_timeout_when_the_broker_stops_reading(
    broker: BrokerProcess,
) -> None:
    async def flood(client: Client) -> None:
        # Kernel buffers take a few MB; then flow control must stop the publisher.
        async with asyncio.timeout(30):
            while True:
                await client.publish({"class": "bulk"}, b"x" * 500_000, ack=False)

    async with Client(broker.endpoint, request_timeout=0.5) as client:
        await client.advertise("class = 'bulk'")
        with frozen(broker), pytest.raises(TrellisTimeout, match="no more data") as info:
            await flood(client)
    assert isinstance(info.value, TimeoutError)


async def test_a_held_back_publisher_goes_on_once_any_majority_of_replicas_drains(
    run_broker: Callable[..., BrokerProcess],
) -> None:
    # The CI flake of the flood-into-a-partition scenario: with two of three replicas' links
    # full, publish() waited for the first of them only, and timed out while the second had
    # drained long before (a majority was writable again).
    brokers = [run_broker(f"r{i}", vn="v", replica=i, vn_size=3) for i in range(3)]
    published = 0

    async def flood(client: Client) -> None:
        nonlocal published
        async with asyncio.timeout(60):
            while True:
                await client.publish({"class": "bulk"}, b"x" * 200_000, ack=False)
                published += 1

    async def stall(for_s: float) -> None:
        """Return once no publish() returned for ``for_s`` s (TimeoutError: never in 30 s)."""
        seen, since = published, time.monotonic()
        async with asyncio.timeout(30):
            while time.monotonic() - since < for_s:
                await asyncio.sleep(0.1)
                if published != seen:
                    seen, since = published, time.monotonic()

    request_timeout = 3.0
    endpoints = [b.endpoint for b in brokers]
    async with Client(endpoints, request_timeout=request_timeout) as client:
        await client.advertise("class = 'bulk'")
        with frozen(brokers[0]):
            task = asyncio.create_task(flood(client))
            try:
                with frozen(brokers[1]):
                    await stall(1.0)  # both full: the publisher is held back
                    held_at = published
                # r1 drains; r0 stays full for longer than request_timeout.
                await asyncio.sleep(2 * request_timeout)
                assert not task.done(), task.exception()
                assert published > held_at
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


async def test_a_replica_that_stopped_reading_misses_publications_instead_of_filling_memory(
    run_broker: Callable[..., BrokerProcess],
) -> None:
    """While a majority takes a publisher's publications, the link of a replica that stopped
    reading used to buffer every one of them in the client for as long as it did not read
    (200 KB publications at full speed: hundreds of MB). It now holds at most
    ``LAGGING_LINK_BYTES``; that replica misses the rest and gets new ones once it reads."""
    brokers = [run_broker(f"r{i}", vn="v", replica=i, vn_size=3, admin_port=0) for i in range(3)]
    payload = b"x" * 200_000
    count = 5 * LAGGING_LINK_BYTES // len(payload)  # past what r0's socket buffers take too
    async with Client([b.endpoint for b in brokers]) as client:
        await client.advertise("class = 'bulk'")
        await until(lambda: len(client._links) == 3)  # connect() returns at a majority
        links = sorted(client._links.values(), key=lambda link: link.index)
        with frozen(brokers[0]):
            for _ in range(count):
                await client.publish({"class": "bulk"}, payload, ack=False)
            for link in links:
                # (a loaded machine may leave r1 or r2 behind for a while too: whichever
                # lags past the bound while a majority has room misses publications)
                assert link.transport is not None
                waiting = link.out_bytes + link.transport.get_write_buffer_size()
                assert waiting < LAGGING_LINK_BYTES + 2 * len(payload), link.index
            assert links[0].skipped > 0
        await until(
            lambda: publications_in(brokers) == [count - link.skipped for link in links],
            timeout=30,
        )
        await client.publish({"class": "bulk"}, b"after", ack=False)
        await until(
            lambda: publications_in(brokers) == [count - link.skipped + 1 for link in links]
        )


async def test_a_replica_still_joining_gets_the_publications_made_meanwhile(
    run_broker: Callable[..., BrokerProcess],
) -> None:
    """``trellis pub`` publishes right after ``connect()`` (a majority) and ``advertise()``
    returned; a replica reached later joins by restoring the advertisements and waits for
    their acknowledgement. Publications without ``ack`` used to go to the joined links only,
    so that replica never had them, and its VN forwarded them from one replica fewer (one
    Byzantine replica among the two left could then stop them)."""
    brokers = [run_broker(f"r{i}", vn="v", replica=i, vn_size=3, admin_port=0) for i in range(3)]
    late = GatedProxy(brokers[2].port)  # r2's answers (WELCOME first) wait at a gate
    endpoints = [brokers[0].endpoint, brokers[1].endpoint, await late.start()]
    try:
        async with Client(endpoints) as client:
            await client.advertise("class = 'early'")
            late.release(1)  # WELCOME: r2 joins; the acknowledgement of its restore waits
            await late.wait_client_chunks(2)  # HELLO, then the restored ADVERTISE
            for i in range(5):
                await client.publish({"class": "early", "i": i}, ack=False)
            await client.flush()  # r0 and r1 answer; r2 reads its own pace
            with contextlib.suppress(TimeoutError):
                await until(lambda: publications_in(brokers) == [5, 5, 5])
            assert publications_in(brokers) == [5, 5, 5]
            late.open()
    finally:
        await late.close()


async def test_drain_and_flush_raise_trellis_timeout_and_leave_requests_in_flight(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.endpoint) as client:
        await client.advertise("class = 'd'")
        with frozen(broker):
            publishing = asyncio.create_task(client.publish({"class": "d"}))
            await asyncio.sleep(0.1)
            with pytest.raises(TrellisTimeout, match="unacknowledged") as info:
                await client.drain(timeout=0.3)
            assert isinstance(info.value, TimeoutError)
            with pytest.raises(TrellisTimeout, match=r"within 0.3 s"):
                await client.flush(timeout=0.3)
            assert not publishing.done()
        # The timed-out drain must not have cancelled the publication it waited for.
        assert await asyncio.wait_for(publishing, 10) == 1
        await client.drain(timeout=5)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "No such file"),
        (b"{not json", "cannot read the manifest"),
        (b"\xff\xfe\x00", "cannot read the manifest"),
        (b"[1, 2]", "malformed manifest"),
        (b'{"tree": 1, "members": {}, "keys": {}}', "malformed manifest"),
    ],
)
def test_a_bad_manifest_file_raises_invalid_request(
    tmp_path: Path, content: bytes | None, reason: str
) -> None:
    path = tmp_path / "manifest.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InvalidRequest, match=reason):
        Client("127.0.0.1:9", manifest=path)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"endpoints": []},
        {"endpoints": "no-port"},
        {"endpoints": "127.0.0.1:99999"},
        {"endpoints": ["127.0.0.1:9", "127.0.0.1"]},
        {"endpoints": "127.0.0.1:9", "key_refresh": 0},
        {"endpoints": "127.0.0.1:9", "first_seq": 0},
    ],
)
def test_bad_client_arguments_raise_invalid_request(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as info:
        Client(**kwargs)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("attrs", "payload"),
    [
        ({"class": "x"}, "text, not bytes"),
        ("class = 'x'", b""),
        ({"class": ["x"]}, b""),
        ({1: "x"}, b""),
    ],
)
async def test_publish_checks_its_arguments_before_any_io(attrs: Any, payload: Any) -> None:
    client = Client("127.0.0.1:9", reconnect=False)  # never connected: no I/O may happen
    with pytest.raises(InvalidRequest):
        await client.publish(attrs, payload)


async def test_requests_on_a_closed_client_raise_trellis_errors(broker: BrokerProcess) -> None:
    client = Client(broker.endpoint)
    async with client:
        pass
    for request in (
        client.publish({"class": "x"}),
        client.publish({"class": "x"}, ack=False),
        client.advertise("class = 'x'"),
        client.flush(),
    ):
        with pytest.raises(TrellisError):
            await request


@pytest.mark.slow
async def test_an_advertisement_made_while_a_replica_link_restores_reaches_that_replica(
    run_broker: Callable[..., BrokerProcess],
) -> None:
    # The demo flake: the third replica's link came up (WELCOME) while the publisher was
    # advertising; its restore re-sent the advertisements it had snapshotted, the new one
    # went only to the links already up, and the replica then refused every publication
    # under it ("advertise first").
    brokers = [run_broker(f"r{i}", vn="v", replica=i, vn_size=3) for i in range(3)]
    proxy = GatedProxy(brokers[2].port)
    late = await proxy.start()
    publisher = Client([brokers[0].endpoint, brokers[1].endpoint, late], client_id="pub")
    try:
        await publisher.connect()  # a majority: the two direct links
        await publisher.advertise("class = 'quote'")
        await proxy.wait_client_chunks(1)  # the late link's HELLO
        proxy.release(1)  # its WELCOME: the restore starts and re-sends 'quote'
        await proxy.wait_client_chunks(2)
        await publisher.advertise("class = 'order'")  # while the restore waits for its ACK
        proxy.open()
        async with asyncio.timeout(5):
            while len(publisher._links) < 3:  # noqa: ASYNC110 - polls the client
                await asyncio.sleep(0.01)
        async with (
            Client(brokers[2].endpoint) as watcher,
            watcher.subscribe("class = 'order'") as sub,
        ):
            await publisher.publish({"class": "order", "n": 1}, ack=False)
            await publisher.drain()
            got = await sub.get(timeout=5)
            assert got.attrs == {"class": "order", "n": 1}
    finally:
        await publisher.close()
        await proxy.close()


async def test_a_refused_publication_without_ack_is_reported_as_refused_and_the_link_stays(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    async with Client(broker.endpoint) as client:
        await client.publish({"class": "never-advertised"}, ack=False)
        await client.flush()  # the connection is still open
        assert client.status is Status.CONNECTED
    refusals = [r.getMessage() for r in caplog.records if r.name == "trellis.client"]
    assert any("refused" in m and "advertise first" in m for m in refusals), refusals
    assert not any("closed the connection" in m for m in refusals)


@pytest.mark.slow
async def test_an_equivocator_behind_a_corrupting_vn_is_still_attributed(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    # The demo's case: b1.2 corrupts, so the next VN rejects its shares and the subscriber
    # never holds every share of an epoch; b2.0's two versions must still be found.
    names = broker_names(4)
    overlay = run_overlay(
        line_tree(names),
        replicas=dict.fromkeys(names, 3),
        overrides={"b1.2": {"byzantine": "corrupt"}, "b2.0": {"byzantine": "equivocate"}},
        heartbeat_interval=1.0,
    )
    async with (
        Client(overlay.endpoints("b0"), client_id="pub", key_refresh=5) as pub,
        Client(overlay.endpoints("b3"), client_id="sub", manifest=overlay.manifest) as sc,
        sc.subscribe("class = 'secret'") as sub,
    ):
        await pub.advertise("class = 'secret'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(10):
            await pub.publish({"class": "secret", "i": i}, b"x", confidential=True)
        for _ in range(10):
            assert (await sub.get(timeout=10)).payload == b"x"
        # Bounded wait for the shares that trail the deliveries: the count stops growing.
        counts: tuple[int, ...] = ()
        async with asyncio.timeout(20):
            while counts != (counts := (sc.key_shares("pub", 1), sc.key_shares("pub", 6))):  # noqa: ASYNC110
                await asyncio.sleep(0.5)
        assert sc.share_culprits() == {"b2.0"}


async def test_a_subscription_remembers_the_last_seq_of_recent_publishers_only() -> None:
    """A subscriber outlives many short-lived publishers (each a new ``client-<uuid>``):
    one int per publisher ever heard from was kept for good. It keeps the latest
    ``DELIVERED_MEMORY`` x ``max_publishers``, and every publication is delivered."""
    publishers = 1000

    async def broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        while data := await reader.read(65536):
            for msg in decoder.feed(data):
                if isinstance(msg, Hello):
                    options = {"vn": "b0", "replica": 0, "vn_size": 1}
                    writer.write(encode(Welcome(PROTOCOL_VERSION, "b0", options)))
                elif isinstance(msg, Subscribe):
                    writer.write(encode(Ack(msg.rid)))
                    for n in range(publishers):
                        writer.write(encode_deliver([msg.sub_id], f"p{n}", 1, {"n": n}, b""))
                elif isinstance(msg, Unsubscribe):
                    writer.write(encode(Ack(msg.rid)))
        writer.close()

    async with (
        fake_broker(broker) as endpoint,
        Client(endpoint, connect_timeout=2, max_publishers=16) as client,
        client.subscribe("n >= 0") as sub,
    ):
        got = [(await sub.get(5)).attrs["n"] for _ in range(publishers)]
        assert got == list(range(publishers))
        assert len(sub._delivered) <= DELIVERED_MEMORY * 16
