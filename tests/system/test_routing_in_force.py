"""Routing state is in force when ``advertise()`` and ``subscribe()`` return (issue 15).

A publication published after ``advertise()`` returned reaches every subscriber whose
``subscribe()`` returned before it, however far away: the acknowledgement comes back only
after the routing wave the request caused has been applied along the tree
(:mod:`broker.daemon.waves`). Before, ``trellis pub --count 5`` at one end of a 5-broker line
often lost its first publications: they overtook the subscription still travelling back.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

import pytest

from broker.client import Client
from broker.errors import InvalidRequest, TrellisTimeout
from broker.tools.local import LocalOverlay
from overlay.tree import broker_names, line_tree
from tests.support import drain, trellis

pytestmark = pytest.mark.slow

LINES = [(5, 1), (9, 1), (15, 1), (3, 3), (5, 3)]
"""(VNs in the line, replicas per VN): 5, 9, 15, 9 and 15 brokers."""


@pytest.fixture
def line(run_overlay: Callable[..., LocalOverlay]) -> Callable[[int, int], LocalOverlay]:
    def _run(vns: int, replicas: int) -> LocalOverlay:
        names = broker_names(vns)
        return run_overlay(line_tree(names), replicas=dict.fromkeys(names, replicas))

    return _run


@pytest.mark.parametrize(("vns", "replicas"), LINES, ids=[f"{v}x{r}" for v, r in LINES])
async def test_cli_pub_right_after_connecting_loses_none_of_its_first_publications(
    line: Callable[[int, int], LocalOverlay], vns: int, replicas: int
) -> None:
    overlay = line(vns, replicas)
    names = sorted(overlay.tree.brokers)
    first = ",".join(overlay.endpoints(names[0]))
    for round_ in range(3):
        flt = f"class = 'fresh' and round = {round_}"
        async with Client(overlay.endpoints(names[-1])) as sc, sc.subscribe(flt) as sub:
            done = await asyncio.to_thread(
                trellis,
                "pub",
                "--endpoint",
                first,
                "--count",
                "5",
                "--no-ack",
                "--attrs",
                f"class='fresh',round={round_}",
            )
            assert done.returncode == 0, done.stderr
            got = await drain(sub, idle=1.5)
        assert [m.seq for m in got] == [1, 2, 3, 4, 5], f"round {round_}"


@pytest.mark.parametrize(("vns", "replicas"), [(9, 1), (5, 3)], ids=["9x1", "5x3"])
async def test_a_publication_right_after_subscribe_returned_reaches_the_new_subscriber(
    line: Callable[[int, int], LocalOverlay], vns: int, replicas: int
) -> None:
    overlay = line(vns, replicas)
    names = sorted(overlay.tree.brokers)
    async with Client(overlay.endpoints(names[0]), client_id="early") as pub:
        await pub.advertise("class = 'late'")
        await asyncio.to_thread(overlay.wait_quiet)
        for round_ in range(3):
            async with (
                Client(overlay.endpoints(names[-1])) as sc,
                sc.subscribe(f"class = 'late' and round = {round_}") as sub,
            ):
                seqs = [
                    await pub.publish({"class": "late", "round": round_, "i": i}, ack=False)
                    for i in range(5)
                ]
                got = await drain(sub, idle=1.5)
            assert [m.seq for m in got] == seqs, f"round {round_}"


async def test_a_publisher_run_twice_under_one_client_id_reaches_a_subscriber_both_times(
    line: Callable[[int, int], LocalOverlay],
) -> None:
    """Brokers and subscribers deduplicate by (publisher, seq): a second ``trellis pub
    --client-id X`` numbering from 1 again had every publication dropped as a conflicting
    copy of the first run's (0 of 5 delivered through replicated VNs). The CLI now continues
    a fixed identity's numbering from the clock."""
    overlay = line(2, 3)
    names = sorted(overlay.tree.brokers)
    first = ",".join(overlay.endpoints(names[0]))
    async with Client(overlay.endpoints(names[-1])) as sc, sc.subscribe("class = 'x'") as sub:
        for run in ("one", "two"):
            done = await asyncio.to_thread(
                trellis,
                "pub",
                "--endpoint",
                first,
                "--count",
                "5",
                "--client-id",
                "sensor",
                "--attrs",
                "class='x'",
                "--payload",
                run,
            )
            assert done.returncode == 0, done.stderr
        got = await drain(sub, idle=1.5)
    assert [m.payload for m in got] == [b"one"] * 5 + [b"two"] * 5
    assert [m.publisher for m in got] == ["sensor"] * 10
    seqs = [m.seq for m in got]
    assert seqs == sorted(set(seqs))


async def test_a_restarted_publisher_numbering_from_one_again_is_told_not_dropped_silently(
    line: Callable[[int, int], LocalOverlay],
) -> None:
    """The edge replicas remember each publisher's last session (a nonce the SDK sends in
    HELLO and keeps across reconnects): a new session's publication numbered into the old
    one's seqs is refused with an error that says what to do, where before it was acked and
    then dropped downstream; continuing the numbering is delivered."""
    overlay = line(2, 3)
    names = sorted(overlay.tree.brokers)
    async with Client(overlay.endpoints(names[-1])) as sc, sc.subscribe("class = 'x'") as sub:
        async with Client(overlay.endpoints(names[0]), client_id="sensor") as first:
            await first.advertise("class = 'x'")
            for i in range(3):
                await first.publish({"class": "x"}, f"first {i}".encode())
        async with Client(overlay.endpoints(names[0]), client_id="sensor") as again:
            await again.advertise("class = 'x'")
            with pytest.raises(InvalidRequest, match=r"published up to seq 3 .*first_seq"):
                await again.publish({"class": "x"}, b"again 0")
        async with Client(overlay.endpoints(names[0]), client_id="sensor", first_seq=4) as on:
            await on.advertise("class = 'x'")
            await on.publish({"class": "x"}, b"continued")
        got = await drain(sub, idle=1.5)
    assert [(m.seq, m.payload) for m in got] == [
        (1, b"first 0"),
        (2, b"first 1"),
        (3, b"first 2"),
        (4, b"continued"),
    ]


@pytest.mark.parametrize(("vns", "replicas"), [(2, 3), (3, 3)], ids=["2x3", "3x3"])
async def test_publishers_that_come_one_after_another_each_reach_the_subscriber(
    line: Callable[[int, int], LocalOverlay], vns: int, replicas: int
) -> None:
    """Each publisher advertises, publishes once and leaves before the next one comes. The
    subscription leaves the publisher's edge VN with each advertisement withdrawn and is
    pulled back by the next one; a replica's routing wave used to complete before the next
    VN had a majority for the advertisement (and so before it sent the subscription back),
    so the publication could leave the edge VN from fewer than f + 1 replicas and be lost
    (one run in six or ten of 40 publishers)."""
    overlay = line(vns, replicas)
    names = sorted(overlay.tree.brokers)
    async with (
        Client(overlay.endpoints(names[-1]), client_id="sub") as sc,
        sc.subscribe("class = 'turns'") as sub,
    ):
        for i in range(60):
            async with Client(overlay.endpoints(names[0]), client_id=f"turn-{i}") as pub:
                await pub.advertise("class = 'turns'")
                await pub.publish({"class": "turns", "i": i})
            try:
                got = await sub.get(3)
            except TrellisTimeout:
                raise AssertionError(f"turn-{i}'s publication was lost") from None
            assert (got.publisher, got.attrs["i"]) == (f"turn-{i}", i)
        assert await drain(sub, idle=1.0) == []  # and nothing twice


async def test_a_publishers_removal_does_not_overtake_its_publications_past_a_replicated_vn(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """A publisher publishes and leaves while one honest edge replica is slow (frozen) and
    another never routes (``drop``, a Byzantine replica). The next VN gets the removal of
    the advertisement from a majority (the fast honest replica and the Byzantine one) while
    the publications still wait for their second copy; applied then, the removal travelled
    on ahead of them, the subscriber's edge withdrew its subscription, and the publications,
    agreed once the slow replica woke, found no route: all lost (seen as ``trellis pub``
    losing 4 of 5 behind a line of replicated VNs). The removal now waits for them."""
    names = ["b0", "b1", "b2"]
    overlay = run_overlay(
        line_tree(names),
        replicas={"b0": 3, "b1": 3, "b2": 1},
        overrides={"b0.2": {"byzantine": "drop"}},
        copy_patience=5.0,
    )
    slow = overlay.brokers["b0.1"].process
    async with (
        Client(overlay.endpoints("b2"), client_id="sub") as sc,
        sc.subscribe("class = 'ahead'") as sub,
    ):
        pub = Client(overlay.endpoints("b0"), client_id="leaver")
        async with pub:
            await pub.advertise("class = 'ahead'")
            await asyncio.to_thread(overlay.wait_quiet)
            slow.send_signal(signal.SIGSTOP)
            try:
                for i in range(5):
                    await pub.publish({"class": "ahead", "i": i}, ack=False)
                await asyncio.sleep(0.5)  # b0.0 routed them and (below) withdraws at once
            except BaseException:
                slow.send_signal(signal.SIGCONT)
                raise
        try:
            await asyncio.sleep(1.0)  # the removal reached b1's majority without b0.1
        finally:
            slow.send_signal(signal.SIGCONT)
        got = [await sub.get(10) for _ in range(5)]
        assert [m.attrs["i"] for m in got] == [0, 1, 2, 3, 4]
        assert await drain(sub, idle=1.0) == []
