"""Malformed, oversized and out-of-order input: a precise ERROR, one connection closed,
everyone else served throughout."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import AsyncIterator, Callable

import pytest

from broker.client import Client, Subscription
from broker.errors import FilterError, FilterSyntaxError, InvalidRequest, PayloadTooLarge
from broker.language.filters import Filter, Predicate
from broker.tools.launcher import BrokerProcess
from broker.wire.protocol import PROTOCOL_VERSION, Error, Message, MsgType, Pong, Welcome
from tests.wire import RawPeer


class Witness:
    """A publisher and a subscriber connected for the whole test; checks nothing is lost."""

    def __init__(self, endpoint: str) -> None:
        self.pub = Client(endpoint, client_id="witness-pub")
        self.sub_client = Client(endpoint, client_id="witness-sub")
        self.sub: Subscription | None = None
        self.sent = 0

    async def start(self) -> None:
        await self.pub.connect()
        await self.sub_client.connect()
        self.sub = self.sub_client.subscribe("class = 'witness'")
        await self.sub.__aenter__()
        await self.pub.advertise("class = 'witness'")

    async def check_still_served(self) -> None:
        assert self.sub is not None
        self.sent += 1
        await self.pub.publish({"class": "witness", "n": self.sent})
        got = await self.sub.get(5)
        assert got.attrs["n"] == self.sent

    async def stop(self) -> None:
        await self.pub.close()
        await self.sub_client.close()


@pytest.fixture
async def witness(broker: BrokerProcess) -> AsyncIterator[Witness]:
    w = Witness(broker.endpoint)
    await w.start()
    await w.check_still_served()
    yield w
    await w.stop()


async def expect_error_and_close(peer: RawPeer, code: str, fragment: str) -> Error:
    msg = await peer.receive()
    assert isinstance(msg, Error), msg
    assert msg.code == code, msg
    assert fragment in msg.message, msg.message
    assert await peer.closed_by_broker()
    await peer.close()
    return msg


async def test_garbage_bytes_get_a_protocol_error(broker: BrokerProcess, witness: Witness) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.send_bytes(b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1")
    await expect_error_and_close(peer, "protocol", "malformed frame")
    await witness.check_still_served()


async def test_random_garbage_header_is_rejected_as_too_large(
    broker: BrokerProcess, witness: Witness
) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.send_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await expect_error_and_close(peer, "too_large", "exceeds the limit of 1048576 bytes")
    await witness.check_still_served()


async def test_truncated_frame_is_reported_at_end_of_stream(
    broker: BrokerProcess, witness: Witness
) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.hello()
    await peer.send_bytes(struct.pack(">I", 100) + b"\x93\x01\x02")
    peer.writer.write_eof()
    await expect_error_and_close(peer, "protocol", "truncated frame: stream ended after 3 of 100")
    await witness.check_still_served()


async def test_frame_over_the_limit_is_refused_from_its_header(
    broker: BrokerProcess, witness: Witness
) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.hello()
    await peer.send_bytes(struct.pack(">I", 2 * 1024 * 1024) + b"\x00" * 1000)
    await expect_error_and_close(peer, "too_large", "frame of 2097152 bytes exceeds the limit")
    await witness.check_still_served()


async def test_unknown_message_type_is_refused(broker: BrokerProcess, witness: Witness) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.hello()
    await peer.send(99, "what")
    await expect_error_and_close(peer, "protocol", "unknown message type 99")
    await witness.check_still_served()


async def test_publish_before_hello_is_out_of_order(
    broker: BrokerProcess, witness: Witness
) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.send(MsgType.PUBLISH, 1, 1, {"class": "witness"}, b"", None)
    await expect_error_and_close(peer, "protocol", "PUBLISH before HELLO")
    await witness.check_still_served()


async def test_second_hello_is_out_of_order(broker: BrokerProcess, witness: Witness) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.hello()
    await peer.send(MsgType.HELLO, PROTOCOL_VERSION, "client", "again", {})
    await expect_error_and_close(peer, "protocol", "HELLO received twice")
    await witness.check_still_served()


async def test_wrong_protocol_version_is_refused(broker: BrokerProcess, witness: Witness) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.send(MsgType.HELLO, 42, "client", "future", {})
    await expect_error_and_close(peer, "protocol", "unsupported protocol version 42")
    await witness.check_still_served()


async def test_invalid_filter_on_the_wire_names_the_predicate(
    broker: BrokerProcess, witness: Witness
) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.hello()
    await peer.send(MsgType.SUBSCRIBE, 1, "s1", [["price", "between", 5]])
    msg = await expect_error_and_close(peer, "invalid_filter", "SUBSCRIBE field 'filter'")
    assert "between" in msg.message
    await witness.check_still_served()


@pytest.mark.parametrize("kind", [MsgType.SUBSCRIBE, MsgType.ADVERTISE])
async def test_a_client_key_longer_than_an_id_is_refused_though_brokers_forward_longer(
    broker: BrokerProcess, witness: Witness, kind: MsgType
) -> None:
    """Brokers forward a client's keys under ``broker/client/key`` (up to 770 characters
    decode); a client's own key is an id, at most 256."""
    peer = await RawPeer.connect(broker.endpoint)
    await peer.hello()
    await peer.send(kind, 1, "k" * 257, [["class", "eq", "x"]])
    await expect_error_and_close(peer, "invalid_request", "at most 256 characters")
    await witness.check_still_served()


async def test_an_unsatisfiable_filter_on_the_wire_is_refused_and_says_why(
    broker: BrokerProcess, witness: Witness
) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.hello()
    await peer.send(MsgType.ADVERTISE, 1, "a1", [["price", "gt", "abc"], ["price", "lt", 5]])
    msg = await expect_error_and_close(peer, "invalid_filter", "ADVERTISE field 'filter'")
    assert "unsatisfiable" in msg.message
    assert "price < 5 needs a number, price > 'abc' needs a string" in msg.message
    await witness.check_still_served()


async def test_sdk_refuses_an_unsatisfiable_filter_before_sending(
    broker: BrokerProcess, witness: Witness
) -> None:
    async with Client(broker.endpoint) as c:
        with pytest.raises(FilterError, match="unsatisfiable"):
            c.subscribe("price > 'abc' and price < 5")
        built = Filter((Predicate("x", "gt", 5), Predicate("x", "lt", 3)))
        with pytest.raises(FilterError, match=r"no value of x satisfies all of: x < 3, x > 5"):
            await c.advertise(built)
        with pytest.raises(FilterError, match="unsatisfiable"):
            c.subscribe(built)
        await c.flush()  # nothing was sent: the connection is fine
    await witness.check_still_served()


async def test_wrong_value_types_in_a_publication_are_refused(
    broker: BrokerProcess, witness: Witness
) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.hello()
    await peer.send(MsgType.PUBLISH, 1, 1, {"class": "witness", "price": [1, 2]}, b"", None)
    await expect_error_and_close(
        peer, "invalid_request", "attribute 'price' must be str, int, float or bool, got list"
    )
    await witness.check_still_served()


async def test_wrong_field_types_are_refused(broker: BrokerProcess, witness: Witness) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.hello()
    await peer.send(MsgType.PUBLISH, 1, "one", {"class": "witness"}, b"", None)
    await expect_error_and_close(
        peer, "invalid_request", "PUBLISH field 'seq' must be an unsigned integer"
    )
    await witness.check_still_served()


async def test_sdk_rejects_a_filter_syntax_error_before_sending(
    broker: BrokerProcess, witness: Witness
) -> None:
    async with Client(broker.endpoint) as c:
        with pytest.raises(FilterSyntaxError) as info:
            c.subscribe("class = 'stock' or price < 5")
        assert info.value.token == "or"
        assert info.value.position == 16
        await c.flush()
    await witness.check_still_served()


async def test_sdk_rejects_oversized_payload_and_wrong_types_locally(
    broker: BrokerProcess, witness: Witness
) -> None:
    async with Client(broker.endpoint) as c:
        await c.advertise("class = 'sdk'")
        with pytest.raises(PayloadTooLarge):
            await c.publish({"class": "sdk"}, b"x" * (2 * 1024 * 1024))
        with pytest.raises(InvalidRequest, match="must be str, int, float or bool"):
            await c.publish({"class": "sdk", "bad": None})  # type: ignore[dict-item]
        await c.publish({"class": "sdk", "n": 0})
    await witness.check_still_served()


async def test_silent_connection_is_closed_after_hello_timeout(run_broker) -> None:
    broker = run_broker("hello-timeout", hello_timeout=0.3, heartbeat_interval=0.2)
    peer = await RawPeer.connect(broker.endpoint)
    await expect_error_and_close(peer, "protocol", "no HELLO within 0.3 s")


async def test_many_bad_clients_at_once_do_not_disturb_the_witness(
    broker: BrokerProcess, witness: Witness
) -> None:
    async def bad(i: int) -> None:
        peer = await RawPeer.connect(broker.endpoint)
        await peer.send_bytes(bytes([i % 256]) * (i + 3))
        await peer.close()

    await asyncio.gather(*(bad(i) for i in range(50)))
    await witness.check_still_served()


async def test_key_shares_to_a_broker_without_confidential_forwarding_are_refused_not_fatal(
    broker: BrokerProcess, witness: Witness
) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.hello()
    await peer.send(MsgType.PASS, [], b"statement", b"signature", b"blob")
    msg = await peer.receive()
    assert isinstance(msg, Error), msg
    assert msg.code == "invalid_request", msg
    assert "confidential forwarding is disabled" in msg.message
    await peer.send(MsgType.PING, 3)
    assert await peer.receive() == Pong(3)
    await peer.close()
    await witness.check_still_served()


async def test_a_client_sending_reconf_is_closed(broker: BrokerProcess, witness: Witness) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.hello()
    await peer.send(MsgType.RECONF, "lock", {"round": "x"})
    await expect_error_and_close(peer, "protocol", "RECONF is not a message a client may send")
    await witness.check_still_served()


async def test_a_mark_without_a_round_name_is_refused_and_one_of_no_round_ignored(
    broker: BrokerProcess, witness: Witness
) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.hello()
    # A mark of a round this broker never prepared changes nothing: the client is served.
    await peer.send(MsgType.NOTICE, "mark", {"round": "b9.0#1"})
    await peer.send(MsgType.PING, 7)
    assert await peer.receive() == Pong(7)
    await peer.send(MsgType.NOTICE, "mark", {"round": 1})
    await expect_error_and_close(peer, "protocol", "NOTICE mark needs a string 'round'")
    await witness.check_still_served()


async def test_control_connection_from_an_unknown_broker_is_refused(
    broker: BrokerProcess, witness: Witness
) -> None:
    peer = await RawPeer.connect(broker.endpoint)
    await peer.send(MsgType.HELLO, PROTOCOL_VERSION, "broker", "intruder", {"control": True})
    await expect_error_and_close(peer, "not_authorized", "unknown broker 'intruder'")
    await witness.check_still_served()


async def test_bad_reconfiguration_requests_get_precise_answers(run_broker) -> None:
    broker = run_broker(
        "b1",
        peers=[{"id": "b9", "endpoint": "127.0.0.1:9", "vn": "b9"}],
        reconfig={"enabled": True, "interval": 1000},
    )
    witness = Witness(broker.endpoint)
    await witness.start()
    try:
        peer = await RawPeer.connect(broker.endpoint)
        await peer.send(MsgType.HELLO, PROTOCOL_VERSION, "broker", "b9", {"control": True})
        assert type(await peer.receive()).__name__ == "Welcome"
        # A step out of order is refused; the control connection stays open.
        await peer.send(MsgType.RECONF, "freeze", {"round": "r1"})
        reply = await peer.receive()
        assert reply.data == {"ok": False, "error": "b1 holds no lock for round r1"}
        await peer.send(MsgType.RECONF, "lock", {"round": "r1", "master": "b9", "lease": 2.0})
        assert (await peer.receive()).data == {"ok": True}
        await peer.send(MsgType.RECONF, "prepare", {"round": "r1", "hood": ["b1"], "links": 3})
        reply = await peer.receive()
        assert reply.data["ok"] is False
        assert "field 'links' must be a list of VN id pairs" in reply.data["error"]
        await peer.send(MsgType.RECONF, "abort", {"round": "r1"})
        assert (await peer.receive()).data == {"ok": True}
        await witness.check_still_served()
        # An unknown step is an invalid frame: that connection only is closed.
        await peer.send(MsgType.RECONF, "explode", {})
        await expect_error_and_close(peer, "invalid_request", "field 'op' must be one of")
        await witness.check_still_served()
    finally:
        await witness.stop()


async def test_a_frame_trickled_a_byte_at_a_time_is_cut_off_and_others_are_served(
    run_broker: Callable[..., BrokerProcess],
) -> None:
    """Each byte resets the silence timer, so a peer could hold a partial frame of up to
    max_frame bytes open forever: a frame must complete within three heartbeat intervals."""
    broker = run_broker(heartbeat_interval=0.3)
    peer = await RawPeer.connect(broker.endpoint)
    try:
        assert isinstance(await peer.hello("trickle"), Welcome)
        await peer.send_bytes(struct.pack(">I", 1000) + b"\x95")
        started = time.monotonic()
        error: Message | None = None
        while time.monotonic() - started < 5:
            await peer.send_bytes(b"\x00")
            with contextlib.suppress(TimeoutError):
                error = await peer.receive(timeout=0.2)
                break
        assert isinstance(error, Error)
        assert "still incomplete" in error.message
        assert time.monotonic() - started < 3
        assert await peer.closed_by_broker()
    finally:
        await peer.close()
    async with Client(broker.endpoint) as client:  # the broker still serves others
        await client.advertise("class = 'x'")


@pytest.mark.parametrize(
    ("marker", "fragment"),
    [
        ({"round": "b9#1", "wave": 7, "digest": ""}, "field 'wave' must be 1 to 5"),
        ({"round": "b9#1", "wave": 1, "digest": "d" * 100_000}, "at most 64 characters"),
        ({"round": ["b9#1"] * 10_000, "wave": 1}, "field 'round' must be a round name"),
        ({"round": "r" * 100_000, "wave": 2, "digest": ""}, "field 'round' must be a round name"),
    ],
    ids=["wave", "digest", "round-type", "round-length"],
)
async def test_a_drain_marker_out_of_shape_closes_that_link_only(
    run_broker: Callable[..., BrokerProcess], marker: dict[str, object], fragment: str
) -> None:
    """Markers are kept per (round, wave, sender) for a sender's latest rounds: any wave
    number or a digest of any length kept as much as the frame held, per marker."""
    broker = run_broker(
        "b1",
        neighbours=[{"id": "b9", "endpoint": "127.0.0.1:9", "vn": "b9"}],
        reconfig={"enabled": True, "interval": 1000},
    )
    witness = Witness(broker.endpoint)
    await witness.start()
    try:
        peer = await RawPeer.connect(broker.endpoint)
        await peer.send(MsgType.HELLO, PROTOCOL_VERSION, "broker", "b9", {})
        assert isinstance(await peer.receive(), Welcome)
        await peer.send(MsgType.RECONF, "marker", marker)
        msg = await peer.receive()
        while not isinstance(msg, Error):  # (routing waves and the like come first)
            msg = await peer.receive()
        assert msg.code == "protocol", msg
        assert fragment in msg.message, msg.message
        assert await peer.closed_by_broker()
        await peer.close()
        await witness.check_still_served()
    finally:
        await witness.stop()
