"""A publication a broker accepts can be forwarded: its FORWARD names the publisher where the
PUBLISH had a request id, so a PUBLISH that just fits ``max_frame`` used to make a FORWARD
over it, and the next broker closed the link (with everything queued on it). Brokers and the
SDK now refuse such a publication with ``too_large``, keeping the connection; the largest
one accepted crosses the overlay."""

from __future__ import annotations

from collections.abc import Callable

import msgpack
import pytest

from broker.client import Client
from broker.errors import PayloadTooLarge
from broker.language.grammar import parse_filter
from broker.tools.local import LocalOverlay
from broker.wire.protocol import Error, MsgType, Pong, forward_growth, key_growth
from overlay.tree import line_tree
from tests.wire import RawPeer

pytestmark = pytest.mark.slow

FRAME = 64 * 1024
LONG_ID = "publisher-" + "x" * 190
ATTRS = {"class": "big"}


def two_brokers(run_overlay: Callable[..., LocalOverlay]) -> LocalOverlay:
    return run_overlay(line_tree(["b0", "b1"]), max_frame=FRAME, heartbeat_interval=1.0)


async def test_the_largest_publication_the_sdk_accepts_reaches_the_next_broker(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = two_brokers(run_overlay)
    limit = FRAME - forward_growth(LONG_ID)
    largest = limit - 64 - len(msgpack.packb(ATTRS))
    async with (
        Client(overlay.endpoint("b0"), client_id=LONG_ID) as pub,
        Client(overlay.endpoint("b1"), client_id="sub") as sub_client,
        sub_client.subscribe("class = 'big'") as sub,
    ):
        await pub.advertise("class = 'big'")
        await sub_client.flush()
        await pub.publish(ATTRS, b"a" * 10)
        assert (await sub.get(10)).payload == b"a" * 10  # routes are in place
        with pytest.raises(PayloadTooLarge, match="a broker can forward"):
            await pub.publish(ATTRS, b"x" * (largest + 1))
        # attributes count: a payload the old check (payload only) let through
        with pytest.raises(PayloadTooLarge):
            await pub.publish({"class": "big", "note": "n" * 4096}, b"x" * (largest - 1024))
        await pub.publish(ATTRS, b"y" * largest)
        got = await sub.get(10)
        assert got.payload == b"y" * largest
        await pub.publish(ATTRS, b"z")  # the link and the publisher's connection stayed up
        assert (await sub.get(10)).payload == b"z"


async def test_a_publish_frame_the_next_broker_could_not_take_is_refused_not_forwarded(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """A client speaking the protocol itself sends a PUBLISH within ``max_frame`` whose
    FORWARD would not be: ``ERROR too_large`` for that request, the connection kept, and
    the subscriber behind the next broker gets the publications after it."""
    overlay = two_brokers(run_overlay)
    async with (
        Client(overlay.endpoint("b1"), client_id="sub") as sub_client,
        sub_client.subscribe("class = 'big'") as sub,
    ):
        peer = await RawPeer.connect(overlay.endpoint("b0"))
        await peer.hello(LONG_ID)
        await peer.send(MsgType.ADVERTISE, 1, "a1", [["class", "eq", "big"]])
        assert not isinstance(await peer.receive(), Error)
        await sub_client.flush()
        await peer.send(MsgType.PUBLISH, 2, 1, ATTRS, b"a", None)
        assert not isinstance(await peer.receive(), Error)
        assert (await sub.get(10)).payload == b"a"
        # a frame within max_frame, but less than the publisher's id to spare
        fields = [MsgType.PUBLISH, 3, 2, ATTRS, b"", None]
        bare = len(msgpack.packb(fields))
        fields[4] = b"o" * (FRAME - len(LONG_ID) // 2 - bare - 2)
        assert FRAME - forward_growth(LONG_ID) < len(msgpack.packb(fields)) <= FRAME
        await peer.send(*fields)
        refused = await peer.receive()
        assert isinstance(refused, Error), refused
        assert (refused.rid, refused.code) == (3, "too_large")
        assert "a broker can forward" in refused.message
        await peer.send(MsgType.PUBLISH, 4, 3, ATTRS, b"c", None)
        assert not isinstance(await peer.receive(), Error)
        assert (await sub.get(10)).payload == b"c"
        await peer.send(MsgType.PING, 7)
        assert await peer.receive() == Pong(7)
        await peer.close()


async def test_a_client_with_the_longest_id_subscribes_across_brokers(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """A broker forwards a client's subscription under a global key (``broker/client/key``),
    longer than the 256 characters any one id may have: with a long client id the next
    broker refused the SUBSCRIBE as malformed and closed the link, again at every
    reconnect (until 2026-11-29). Keys between brokers may be as long as three ids."""
    overlay = run_overlay(line_tree(["b0", "b1"]), heartbeat_interval=1.0)
    longest = "s" * 256
    async with (
        Client(overlay.endpoint("b0"), client_id="pub") as pub,
        Client(overlay.endpoint("b1"), client_id=longest) as sub_client,
        sub_client.subscribe("class = 'far'") as sub,
    ):
        await pub.advertise("class = 'far'")
        await pub.advertise("class = 'other'")
        await sub_client.flush()
        for i in range(1, 4):
            await pub.publish({"class": "far", "i": i}, b"p")
            assert (await sub.get(10)).attrs["i"] == i
    for name in overlay.brokers:
        log = (overlay.workdir / f"{name}.log").read_text(encoding="utf-8")
        assert "must be a non-empty string" not in log, name


def tags_filter(count: int) -> str:
    """A filter naming ``count`` tags: its frame grows with ``count``."""
    tags = ", ".join(f"'tag value {i:05d}'" for i in range(count))
    return f"class = 'far' and tag in ({tags})"


async def test_a_filter_too_large_to_forward_is_refused_and_the_largest_accepted_routes(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """An ADVERTISE or SUBSCRIBE is forwarded under ``broker/client/key``: one that fits
    ``max_frame`` with less to spare is refused with ``too_large`` (the SDK refuses it
    before sending; a client speaking the protocol gets the error for that request and
    keeps its connection). The largest filter the SDK accepts routes publications across
    the link."""
    overlay = run_overlay(line_tree(["b0", "b1"]), max_frame=8192, heartbeat_interval=1.0)
    async with (
        Client(overlay.endpoint("b0"), client_id="pub") as pub,
        Client(overlay.endpoint("b1"), client_id=LONG_ID) as sub_client,
    ):
        await pub.advertise("class = 'far'")
        count = 1000
        with pytest.raises(PayloadTooLarge, match="a broker can forward"):
            sub_client.subscribe(tags_filter(count))
        # The largest the SDK accepts, by bisection: counting down from 1,000 held the
        # client's loop (no heartbeat answered) for seconds on a loaded machine.
        low, high = 1, count  # accepted, refused
        while high - low > 1:
            middle = (low + high) // 2
            try:
                sub_client.subscribe(tags_filter(middle))
            except PayloadTooLarge:
                high = middle
            else:
                low = middle
        count = low
        largest = sub_client.subscribe(tags_filter(count))
        async with largest as sub:
            await sub_client.flush()
            await pub.publish({"class": "far", "tag": f"tag value {count - 1:05d}"}, b"last tag")
            assert (await sub.get(10)).payload == b"last tag"

        peer = await RawPeer.connect(overlay.endpoint("b1"))
        await peer.hello(LONG_ID + "-raw")
        # a frame within max_frame, but with less to spare than the key it would go under
        room = 8192 - key_growth("b1", LONG_ID + "-raw")
        fields: list[object] = [MsgType.SUBSCRIBE, 5, "s1", []]
        while len(msgpack.packb(fields)) <= room:
            count += 1
            fields[3] = parse_filter(tags_filter(count)).to_wire()
        assert len(msgpack.packb(fields)) <= 8192
        await peer.send(*fields)
        refused = await peer.receive()
        assert isinstance(refused, Error), refused
        assert (refused.rid, refused.code) == (5, "too_large")
        await peer.send(MsgType.PING, 8)
        assert await peer.receive() == Pong(8)
        await peer.close()
    for name in overlay.brokers:
        log = (overlay.workdir / f"{name}.log").read_text(encoding="utf-8")
        assert "exceeds the limit" not in log, name
