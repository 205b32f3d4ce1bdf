"""Routing across an overlay of real broker processes linked over loopback TCP."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.client import Client, Subscription
from broker.language.grammar import parse_filter
from broker.tools.local import LocalOverlay
from broker.wire.protocol import PROTOCOL_VERSION, Error, MsgType, Pong, Welcome
from overlay.tree import broker_names, line_tree, random_tree
from tests.support import drain
from tests.wire import RawPeer

pytestmark = pytest.mark.slow


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text output (0 when absent)."""
    for line in text.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    return 0.0


CLASSES = ["alpha", "beta", "gamma"]


def random_subscription(rng: random.Random) -> str:
    cls = rng.choice(CLASSES)
    low = rng.randint(0, 60)
    kind = rng.random()
    if kind < 0.3:
        return f"class = '{cls}'"
    if kind < 0.7:
        return f"class = '{cls}' and price >= {low} and price < {low + rng.randint(5, 40)}"
    return f"class = '{cls}' and tag in ('a', 'b') and price > {low}"


@pytest.mark.parametrize(("brokers", "seed"), [(5, 11), (9, 12), (15, 13)])
async def test_random_overlay_delivers_exactly_the_matching_publications(
    run_overlay: Callable[..., LocalOverlay], brokers: int, seed: int
) -> None:
    rng = random.Random(seed)
    names = broker_names(brokers)
    overlay = run_overlay(random_tree(names, rng))
    subscribers: list[tuple[Client, Subscription, str]] = []
    publishers: list[tuple[Client, str]] = []
    # Half the subscriptions come before any advertisement exists, half after.
    for i in range(8):
        c = Client(overlay.endpoint(rng.choice(names)), client_id=f"sub{i}")
        await c.connect()
        text = random_subscription(rng)
        sub = c.subscribe(text)
        await sub.__aenter__()
        subscribers.append((c, sub, text))
        if i == 3:
            for j, cls in enumerate([*CLASSES, "alpha"]):
                p = Client(overlay.endpoint(rng.choice(names)), client_id=f"pub{j}")
                await p.connect()
                await p.advertise(f"class = '{cls}'")
                publishers.append((p, cls))
    await asyncio.to_thread(overlay.wait_quiet)
    sent: list[tuple[str, int, dict[str, Any]]] = []
    for _ in range(300):
        p, cls = rng.choice(publishers)
        attrs = {"class": cls, "price": rng.randint(0, 100), "tag": rng.choice("abc")}
        seq = await p.publish(attrs, ack=False)
        sent.append((p.client_id, seq, attrs))
    for p, _ in publishers:
        await p.drain()
    results = await asyncio.gather(*(drain(s, idle=1.0) for _, s, _ in subscribers))
    for (_, _, text), got in zip(subscribers, results, strict=True):
        flt = parse_filter(text)
        expected = [(pub, seq) for pub, seq, attrs in sent if flt.matches(attrs)]
        received = [(d.publisher, d.seq) for d in got]
        assert sorted(received) == sorted(expected), text
        assert len(set(received)) == len(received), "duplicates"
        for pub in {p for p, _ in expected}:
            seqs = [s for p, s in received if p == pub]
            assert seqs == sorted(seqs), "per-publisher order"
    for c, *_ in subscribers:
        await c.close()
    for p, _ in publishers:
        await p.close()


async def test_publications_never_cross_a_link_with_no_interest_behind_it(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = run_overlay(line_tree(broker_names(5)))
    async with (
        Client(overlay.endpoint("b0"), client_id="pub") as pub,
        Client(overlay.endpoint("b2"), client_id="near") as near,
        Client(overlay.endpoint("b4"), client_id="far") as far,
        near.subscribe("class = 'x'") as sub,
        far.subscribe("class = 'y'"),
    ):
        await pub.advertise("class = 'x'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(20):
            await pub.publish({"class": "x", "i": i})
        got = [await sub.get(5) for _ in range(20)]
        assert [d.attrs["i"] for d in got] == list(range(20))
    forwarded = {b: await asyncio.to_thread(overlay.metrics, b) for b in ("b0", "b1", "b2", "b3")}
    assert metric(forwarded["b0"], "trellis_publications_forwarded_total", link="b1") == 20
    assert metric(forwarded["b1"], "trellis_publications_forwarded_total", link="b2") == 20
    assert metric(forwarded["b2"], "trellis_publications_forwarded_total", link="b3") == 0
    assert metric(forwarded["b3"], "trellis_publications_forwarded_total", link="b4") == 0
    assert metric(forwarded["b1"], "trellis_publications_forwarded_total", link="b0") == 0


async def prt_total(overlay: LocalOverlay) -> int:
    health = await asyncio.to_thread(overlay.wait_quiet)
    return sum(h["prt"] for h in health.values())


async def test_covering_shrinks_routing_tables_on_a_skewed_workload(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    totals = {}
    for covering in (True, False):
        overlay = run_overlay(
            line_tree(broker_names(5)), name=f"covering-{covering}", covering=covering
        )
        async with Client(overlay.endpoint("b0"), client_id="pub") as pub:
            await pub.advertise("class = 'stock'")
            clients = []
            for i in range(40):
                c = Client(overlay.endpoint("b4"), client_id=f"s{i}")
                await c.connect()
                # Skewed: a few broad subscriptions cover many narrow ones.
                text = "class = 'stock'" if i % 10 == 0 else f"class = 'stock' and price < {i}"
                await c.subscribe(text).__aenter__()
                clients.append(c)
            totals[covering] = await prt_total(overlay)
            for c in clients:
                await c.close()
    # 40 local entries at b4 either way; without covering every broker holds all 40.
    assert totals[False] == 40 * 5
    assert totals[True] <= 40 + 4 * 4
    print(f"PRT entries: covering {totals[True]}, no covering {totals[False]}")


async def test_restarted_middle_broker_restores_routing_without_stale_entries(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = run_overlay(line_tree(broker_names(5)), heartbeat_interval=0.5)
    pub = Client(overlay.endpoint("b0"), client_id="pub")
    subc = Client(overlay.endpoint("b4"), client_id="sub")
    await pub.connect()
    await subc.connect()
    sub = subc.subscribe("class = 'x'")
    await sub.__aenter__()
    await pub.advertise("class = 'x'")
    before = await asyncio.to_thread(overlay.wait_quiet)
    await pub.publish({"class": "x", "n": 0})
    assert (await sub.get(5)).attrs["n"] == 0

    overlay.brokers["b2"].kill()
    during = await asyncio.to_thread(overlay.wait_quiet)
    assert during["b1"]["prt"] == 0, "b1 still routes toward the dead broker's side"
    assert during["b3"]["srt"] == 0, "b3 still holds an advertisement from across b2"

    await asyncio.to_thread(overlay.start, "b2")
    await asyncio.to_thread(overlay.wait_linked)
    after = await asyncio.to_thread(overlay.wait_quiet)
    for b in before:
        assert (after[b]["srt"], after[b]["prt"]) == (before[b]["srt"], before[b]["prt"]), b
    await pub.publish({"class": "x", "n": 1})
    assert (await sub.get(5)).attrs["n"] == 1
    await pub.close()
    await subc.close()


async def test_bad_input_between_brokers_is_refused_and_the_overlay_keeps_routing(
    tmp_path: Path,
) -> None:
    tree = line_tree(broker_names(3))
    overlay = LocalOverlay(tmp_path / "bad", tree)
    overlay.workdir.mkdir()
    from broker.tools.local import free_ports

    overlay.ports = dict(zip(sorted(tree.brokers), free_ports(3), strict=True))
    # b2 also accepts b0 (which would close a cycle) and 'bz' (a leaf nobody else knows).
    overlay.extra_neighbours = {
        "b2": [
            {"id": "b0", "endpoint": overlay.endpoint("b0")},
            {"id": "bz", "endpoint": "127.0.0.1:9"},
        ]
    }
    overlay.write_keys()
    try:
        for b in sorted(tree.brokers):
            overlay.start(b)
        await asyncio.to_thread(overlay.wait_linked)
        async with (
            Client(overlay.endpoint("b0"), client_id="pub") as pub,
            Client(overlay.endpoint("b2"), client_id="sub") as subc,
            subc.subscribe("class = 'w'") as sub,
        ):
            await pub.advertise("class = 'w'")
            await asyncio.to_thread(overlay.wait_quiet)

            async def still_routing(n: int) -> None:
                await pub.publish({"class": "w", "n": n})
                assert (await sub.get(5)).attrs["n"] == n

            await still_routing(1)

            async def hello_as(broker_id: str) -> RawPeer:
                peer = await RawPeer.connect(overlay.endpoint("b2"))
                await peer.send(MsgType.HELLO, PROTOCOL_VERSION, "broker", broker_id, {})
                return peer

            peer = await hello_as("b9")
            err = await peer.receive()
            assert isinstance(err, Error)
            assert err.code == "not_authorized"
            assert "unknown broker 'b9'" in err.message
            assert await peer.closed_by_broker()
            await peer.close()
            await still_routing(2)

            peer = await hello_as("b0")
            err = await peer.receive()
            assert isinstance(err, Error)
            assert "would close a cycle in the overlay: b2 - b1 - b0" in err.message
            assert await peer.closed_by_broker()
            await peer.close()
            await still_routing(3)

            peer = await hello_as("bz")
            assert isinstance(await peer.receive(), Welcome)
            await peer.send(MsgType.UNSUBSCRIBE, 0, "bz/ghost/s1")
            while not isinstance(msg := await peer.receive(), Error):
                pass
            assert msg.code == "unknown_state"
            assert "unknown subscription 'bz/ghost/s1'" in msg.message
            await peer.send(MsgType.PING, 7)
            while not isinstance(msg := await peer.receive(), Pong):
                pass
            await still_routing(4)
            await peer.send(MsgType.FORWARD, "ghost", 1, {"class": ["not", "scalar"]}, b"", None)
            while not isinstance(msg := await peer.receive(), Error):
                pass
            assert "attribute 'class' must be str, int, float or bool" in msg.message
            assert await peer.closed_by_broker()
            await peer.close()
            await still_routing(5)
    finally:
        overlay.stop()
