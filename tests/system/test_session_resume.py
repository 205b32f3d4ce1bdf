"""A subscriber whose connections drop and come back loses nothing (broker ``session_linger``).

Each broker keeps a client session whose connection was lost without an EOF (reset, or
closed for heartbeat silence) for ``session_linger`` seconds: its subscriptions stay in the
routing tables, what it is sent meanwhile is buffered, and the plain deliveries it was sent
just before (possibly lost in flight) are kept; when the client reconnects with the same id
and session, it gets them all. Real broker processes; the client's sockets are reset from
its side with an RST, as a lost network path or a NAT would.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from broker.client import Client, Subscription
from broker.errors import ConnectionLost, TrellisTimeout
from broker.tools.local import LocalOverlay
from overlay.tree import broker_names, line_tree
from tests.support import until
from tests.system.test_overlay import metric

pytestmark = pytest.mark.slow

COUNT = 300
FLT = "class = 'resume'"


def reset(transport: asyncio.Transport) -> None:
    """Drop a connection with an RST, as a lost network path does (``abort()`` alone sends
    a FIN: a clean close, which ends the session)."""
    sock = transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def read(sub: Subscription, count: int, idle: float = 15) -> list[tuple[int, bytes]]:
    """(seq, payload) of what ``sub`` delivers, until ``count`` or ``idle`` s without one."""
    got: list[tuple[int, bytes]] = []
    while len(got) < count:
        try:
            msg = await sub.get(idle)
        except TrellisTimeout:
            break
        got.append((msg.seq, msg.payload))
    return got


async def stream_with_resets(
    overlay: LocalOverlay,
    resets: list[int],
    *,
    confidential_every: int = 0,
    publisher_side: bool = False,
    idle: float = 15,
    share_form: str = "pass",
) -> tuple[list[int], list[tuple[int, bytes]], dict[int, bytes]]:
    """Publish COUNT publications at ~300/s from the first VN; a third of the way in,
    reset the subscriber's connections to the last VN's replicas ``resets`` (the
    publisher's to the first VN's, ``publisher_side``). Returns the seqs sent, what the
    subscriber got, and the payload of every seq."""
    vns = sorted(overlay.tree.brokers)
    pub = Client(overlay.endpoints(vns[0]), client_id="resume-pub", share_form=share_form)
    sub_client = Client(
        overlay.endpoints(vns[-1]), client_id="resume-sub", manifest=overlay.manifest
    )
    sent: list[int] = []
    payloads: dict[int, bytes] = {}
    async with pub, sub_client, sub_client.subscribe(FLT) as sub:
        await pub.advertise(FLT)
        await asyncio.to_thread(overlay.wait_quiet)
        collector = asyncio.create_task(read(sub, COUNT, idle))
        for i in range(COUNT):
            if i == COUNT // 3:
                for index in resets:
                    link = (pub if publisher_side else sub_client)._links.get(index)
                    assert link is not None
                    assert link.transport is not None
                    reset(link.transport)
            confidential = confidential_every > 0 and i % confidential_every == 0
            payload = f"resume #{i}".encode()
            seq = await pub.publish(
                {"class": "resume", "i": i}, payload, ack=False, confidential=confidential
            )
            sent.append(seq)
            payloads[seq] = payload
            await asyncio.sleep(1 / 300)
        await pub.flush()
        got = await asyncio.wait_for(collector, 30)
    return sent, got, payloads


def assert_exact(sent: list[int], got: list[tuple[int, bytes]], payloads: dict[int, bytes]) -> None:
    seqs = [seq for seq, _ in got]
    missing = sorted(set(sent) - set(seqs))
    assert not missing, f"lost {len(missing)} publications: {missing[:20]}"
    assert seqs == sent, "duplicated or reordered"
    assert all(payloads[seq] == payload for seq, payload in got), "altered"


@pytest.mark.parametrize(
    ("confidential_every", "share_form"),
    [(3, "record"), (1, "record"), (1, "pass")],
    ids=["mixed", "confidential", "confidential-by-pass"],
)
async def test_a_subscriber_whose_links_to_two_of_three_replicas_reset_loses_nothing(
    run_overlay: Callable[..., LocalOverlay], confidential_every: int, share_form: str
) -> None:
    """With two of three edge links gone only one replica delivers, which is not f + 1:
    without the sessions the publications of the gap could never be agreed on (nor the
    keys of confidential ones recovered)."""
    names = broker_names(2)
    overlay = run_overlay(line_tree(names), replicas=dict.fromkeys(names, 3))
    sent, got, payloads = await stream_with_resets(
        overlay, [0, 1], confidential_every=confidential_every, share_form=share_form
    )
    assert_exact(sent, got, payloads)
    resumed = [metric(overlay.metrics(f"b1.{i}"), "trellis_sessions_resumed_total") for i in (0, 1)]
    assert resumed == [1.0, 1.0]


@pytest.mark.parametrize(
    ("confidential_every", "share_form"),
    [(3, "record"), (1, "record"), (1, "pass")],
    ids=["mixed", "confidential", "confidential-by-pass"],
)
async def test_a_publisher_whose_links_to_two_of_three_replicas_reset_loses_nothing(
    run_overlay: Callable[..., LocalOverlay], confidential_every: int, share_form: str
) -> None:
    """What the publisher wrote into the two lost connections died in their socket buffers:
    one replica's copies are not f + 1 downstream, so the publisher must send it again."""
    names = broker_names(2)
    overlay = run_overlay(line_tree(names), replicas=dict.fromkeys(names, 3))
    sent, got, payloads = await stream_with_resets(
        overlay,
        [0, 1],
        confidential_every=confidential_every,
        publisher_side=True,
        share_form=share_form,
    )
    assert_exact(sent, got, payloads)


@pytest.mark.parametrize("share_form", ["record", "pass"])
async def test_key_shares_lost_in_flight_to_a_subscriber_are_handed_again_when_it_resumes(
    run_overlay: Callable[..., LocalOverlay], share_form: str
) -> None:
    """The key shares two replicas of the subscriber's VN handed it die in flight (read
    and dropped here, as a connection that dies with them in its buffers loses them): one
    replica's shares are fewer than k, so no key can be rebuilt until the parked sessions
    hand their last shares again on resumption."""
    names = broker_names(2)
    overlay = run_overlay(line_tree(names), replicas=dict.fromkeys(names, 3))
    pub = Client(overlay.endpoints(names[0]), client_id="lost-pub", share_form=share_form)
    sub_client = Client(
        overlay.endpoints(names[-1]), client_id="lost-sub", manifest=overlay.manifest
    )
    dropping = {0, 1}
    dropped: list[int] = []
    kinds = {"record": ("_shares_arrived", "_share_arrived"), "pass": ("_leaves_arrived",)}

    def lossy(take: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def arrived(link: Any, msg: Any) -> None:
            if link.index in dropping:
                dropped.append(link.index)
                return
            take(link, msg)

        return arrived

    for kind in kinds[share_form]:
        setattr(sub_client, kind, lossy(getattr(sub_client, kind)))
    payloads = {}
    async with pub, sub_client, sub_client.subscribe(FLT) as sub:
        await pub.advertise(FLT)
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(5):
            payload = f"lost shares #{i}".encode()
            seq = await pub.publish({"class": "resume", "i": i}, payload, confidential=True)
            payloads[seq] = payload
        await until(lambda: set(dropped) == {0, 1}, timeout=10)
        with pytest.raises(TrellisTimeout):
            await sub.get(1.0)  # one replica's shares: no key
        dropping.clear()
        for index in (0, 1):
            link = sub_client._links.get(index)
            assert link is not None
            assert link.transport is not None
            reset(link.transport)
        got = await read(sub, len(payloads), idle=8)
    assert got == sorted(payloads.items())


@pytest.mark.parametrize("publisher_side", [False, True], ids=["subscriber", "publisher"])
async def test_a_client_of_a_single_broker_loses_nothing_over_a_reset(
    run_overlay: Callable[..., LocalOverlay], publisher_side: bool
) -> None:
    names = broker_names(2)
    overlay = run_overlay(line_tree(names))
    sent, got, payloads = await stream_with_resets(overlay, [0], publisher_side=publisher_side)
    assert_exact(sent, got, payloads)


async def test_without_a_linger_the_session_ends_with_its_connection(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """``session_linger = 0``: the old behaviour, publications of the gap are lost (which is
    what makes the two tests above able to fail)."""
    names = broker_names(2)
    overlay = run_overlay(line_tree(names), session_linger=0)
    sent, got, _ = await stream_with_resets(overlay, [0], idle=3)
    assert len(got) < len(sent)


async def test_a_subscriber_too_busy_to_answer_pings_is_closed_and_then_loses_nothing(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """The brokers close a subscriber silent for three heartbeat intervals (its loop is
    blocked here for longer than that) and drop what its sockets still held, while the
    publisher, on a loop of its own, goes on: once the subscriber reconnects and resumes,
    what was in flight and what was routed meanwhile still arrive."""
    names = broker_names(2)
    overlay = run_overlay(
        line_tree(names), replicas=dict.fromkeys(names, 3), heartbeat_interval=0.3
    )
    count = 400
    payloads = {i + 1: f"busy #{i}".encode() for i in range(count)}

    streaming = threading.Event()

    async def publish_all() -> None:
        async with Client(overlay.endpoints("b0"), client_id="busy-pub") as pub:
            await pub.advertise(FLT)
            await asyncio.to_thread(overlay.wait_quiet)
            streaming.set()
            for i in range(count):
                await pub.publish({"class": "resume", "i": i}, payloads[i + 1], ack=False)
                await asyncio.sleep(1 / 200)
            await pub.flush()

    sub_client = Client(overlay.endpoints("b1"), client_id="busy-sub", manifest=overlay.manifest)
    async with sub_client, sub_client.subscribe(FLT) as sub:
        publisher = asyncio.create_task(asyncio.to_thread(asyncio.run, publish_all()))
        assert await asyncio.to_thread(streaming.wait, 30)
        await asyncio.sleep(0.5)
        time.sleep(2.0)  # noqa: ASYNC251 (this loop, the subscriber's, stops answering)
        got = await read(sub, count)
        await publisher
    assert_exact(list(payloads), got, payloads)
    resumed = sum(
        metric(overlay.metrics(f"b1.{i}"), "trellis_sessions_resumed_total") for i in range(3)
    )
    assert resumed >= 2  # the brokers did close it (all three edge replicas, unless one was late)


async def test_a_session_not_resumed_within_the_linger_ends_and_its_subscription_goes(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    names = broker_names(1)
    overlay = run_overlay(line_tree(names), session_linger=0.5)
    (endpoint,) = overlay.endpoints("b0")
    client = Client([endpoint], client_id="gone", reconnect=False)

    async def prt() -> int:
        health = await asyncio.to_thread(overlay.health)
        return int(health["b0"]["prt"])

    async with client, client.subscribe(FLT):
        assert await prt() == 1
        link = client._links[0]
        assert link.transport is not None
        reset(link.transport)
        await asyncio.sleep(0.2)
        assert await prt() == 1  # parked: still routed
        await asyncio.sleep(1.0)
        assert await prt() == 0
    assert metric(overlay.metrics("b0"), "trellis_sessions_ended_total") == 1


async def tables(overlay: LocalOverlay, broker: str) -> tuple[int, int]:
    """(SRT, PRT) entries of one broker."""
    health = await asyncio.to_thread(overlay.health)
    return int(health[broker]["srt"]), int(health[broker]["prt"])


async def test_what_a_client_withdrew_while_its_connection_was_down_goes_when_it_resumes(
    run_overlay: Callable[..., LocalOverlay], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resumed session kept the subscription and advertisement the client withdrew
    while away (its frames died with the connection, or were never sent); the broker's
    WELCOME lists what the session holds and the client withdraws the rest. A withdrawal
    still waiting for the connection is sent once, not twice (a second would be refused)."""
    names = broker_names(1)
    overlay = run_overlay(line_tree(names))
    (endpoint,) = overlay.endpoints("b0")
    client = Client([endpoint], client_id="withdraws")
    monkeypatch.setattr(client, "_backoff", lambda attempt: 0.5)
    async with client, client.subscribe(FLT) as kept, client.subscribe("x > 1") as dropped:
        await client.advertise(FLT, "adv-kept")
        await client.advertise("x > 1", "adv-gone")
        await client.advertise("x > 2", "adv-waiting")
        assert await tables(overlay, "b0") == (3, 2)
        link = client._links[0]
        assert link.transport is not None
        reset(link.transport)
        # Frames written now die with the connection: the client no longer holds them.
        await dropped.unsubscribe()
        with pytest.raises(ConnectionLost):
            await client.unadvertise("adv-gone")
        await asyncio.wait_for(client.disconnected(), 5)
        # This one waits for the connection to come back (the reconnection is held off a
        # little so that it surely starts while the client is away).
        waiting = asyncio.create_task(client.unadvertise("adv-waiting"))
        await asyncio.wait_for(client.connected(), 10)
        await asyncio.wait_for(waiting, 10)
        assert await tables(overlay, "b0") == (1, 1)
        assert kept.active
    assert metric(overlay.metrics("b0"), "trellis_sessions_resumed_total") == 1


async def test_a_replica_that_missed_an_unsubscribe_drops_it_when_the_session_resumes(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """Three edge replicas, the link to one reset: the unsubscribe reaches the other two (a
    majority, so it succeeds at once) and the third drops it when the client resumes there."""
    names = broker_names(1)
    overlay = run_overlay(line_tree(names), replicas={"b0": 3})
    client = Client(overlay.endpoints("b0"), client_id="withdraws-3")
    async with client, client.subscribe(FLT), client.subscribe("x > 1") as dropped:
        assert [(await tables(overlay, f"b0.{i}"))[1] for i in range(3)] == [2, 2, 2]
        link = client._links[2]
        assert link.transport is not None
        reset(link.transport)
        await asyncio.sleep(0.05)
        await dropped.unsubscribe()
        deadline = time.monotonic() + 10
        while (prts := [(await tables(overlay, f"b0.{i}"))[1] for i in range(3)]) != [1, 1, 1]:
            assert time.monotonic() < deadline, f"PRT entries per replica: {prts}"
            await asyncio.sleep(0.1)
    assert metric(overlay.metrics("b0.2"), "trellis_sessions_resumed_total") == 1


async def test_a_client_that_closes_parks_no_session_at_any_replica(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """``Client.close()`` ends every connection with an EOF, which ends the session at once.
    It used to close its sockets with frames still unread now and then (the ACK of the
    replica that answered last: a majority settles a request), which sends a reset; the
    replica then took the close for a loss and kept the client's routing state for
    ``session_linger`` seconds (about one close in fifteen, here one in a few)."""
    names = broker_names(2)
    overlay = run_overlay(line_tree(names), replicas={"b0": 3, "b1": 1})
    for i in range(30):
        async with Client(overlay.endpoints("b0"), client_id=f"quick-{i}") as client:
            await client.advertise(FLT)
            await client.publish({"class": "resume", "i": i}, b"x")
    for replica in ("b0.0", "b0.1", "b0.2"):
        text = await asyncio.to_thread(overlay.metrics, replica)
        assert metric(text, "trellis_sessions_parked_total") == 0, replica
        assert metric(text, "trellis_sessions_ended_total") == 0, replica


async def test_a_subscriber_reset_with_thousands_of_small_deliveries_in_flight_loses_none(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """The broker keeps the newest megabyte of deliveries for a resume, not a number of
    frames: 128 frames were a fraction of what the socket buffers hold of small deliveries,
    and a reset lost the rest (here the subscriber reads nothing until its connection is
    reset with every delivery written to it)."""
    names = broker_names(2)
    overlay = run_overlay(line_tree(names))
    count = 1500
    payloads = {i + 1: f"in flight #{i}".encode() for i in range(count)}
    pub = Client(overlay.endpoints("b0"), client_id="inflight-pub")
    sub_client = Client(overlay.endpoints("b1"), client_id="inflight-sub")
    async with pub, sub_client, sub_client.subscribe(FLT) as sub:
        await pub.advertise(FLT)
        await asyncio.to_thread(overlay.wait_quiet)
        (link,) = sub_client._links.values()
        assert link.transport is not None
        link.transport.pause_reading()
        for i in range(count):
            await pub.publish({"class": "resume", "i": i}, payloads[i + 1], ack=False)
        await pub.flush()

        def delivered() -> float:
            return metric(overlay.metrics("b1"), "trellis_deliveries_total")

        await until(lambda: delivered() >= count, timeout=30)
        reset(link.transport)
        got = await read(sub, count, idle=5)
    assert_exact(list(payloads), got, payloads)
