"""A Byzantine coordinator of live reconfiguration, with real broker processes (issue 11).

The overlay is a line b0 - b1 - b2 - b3 (b0, b1, b2 of three replicas each); a publisher at b0
streams to subscribers at b2 and b3, so b1 only relays and its coordinator, b1.0 (its lowest
replica), has a cheaper tree to propose every turn. b1.0 is Byzantine:

* ``misplan``: it proposes a tree with a cycle, one that drops a neighbour VN, one with a link
  to a VN outside the neighbourhood, and a sound plan to all but its sibling b1.2, which gets
  another sound one. Honest members refuse the first three at prepare and the equivocation
  at the freeze (the drain markers carry the plan digests), naming why; each round aborts,
  and no link or routing table changes.
* ``mistable``: it proposes the honest plan but sends (and vouches for) wrong tables at
  install, never sends b2.2 ``install`` or ``resume``, and never sends b2.1 ``resume``. The
  plan is applied with the tables the members computed or that f + 1 replicas of b1 vouched
  for, b2.2 included: it installs those when its lease ends instead of going back alone;
  b2.1 goes forward when its lease ends. Each saves the links it switched to.

Either way every subscriber gets every publication exactly once, in order, byte for byte,
including those published while the rounds ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from broker.client import Client
from broker.tools.local import LocalOverlay, fetch_json
from overlay.tree import line_tree
from tests.support import until

pytestmark = pytest.mark.slow

RECONFIG = {"enabled": True, "interval": 0.3, "jitter": 0.3, "min_traffic": 15}
# b2 has two neighbour VNs too: it takes part in b1's rounds but takes no turn of its own.
MEMBER_ONLY = {**RECONFIG, "interval": 1000.0}


def start(run_overlay: Callable[..., LocalOverlay], mode: str, **settings: Any) -> LocalOverlay:
    return run_overlay(
        line_tree(["b0", "b1", "b2", "b3"]),
        replicas={"b0": 3, "b1": 3, "b2": 3},
        overrides={
            "b1.0": {"byzantine": mode},
            **{b: {"reconfig": MEMBER_ONLY} for b in ("b2.0", "b2.1", "b2.2")},
        },
        heartbeat_interval=1.0,
        reconfig=RECONFIG,
        **settings,
    )


def saved_vns(overlay: LocalOverlay, broker: str) -> frozenset[str] | None:
    """The neighbour VNs ``broker`` saved for a restart (None: it never saved any)."""
    path = overlay.workdir / f"{broker}.links.json"
    if not path.exists():
        return None
    return frozenset(overlay.vn_of(p) for p in json.loads(path.read_text())["neighbours"])


def rounds_of(overlay: LocalOverlay, broker: str) -> list[dict[str, Any]]:
    rounds: list[dict[str, Any]] = fetch_json(overlay.brokers[broker].admin_url + "/reconfig")[
        "rounds"
    ]
    return rounds


def coordinator_idle(overlay: LocalOverlay) -> bool:
    """Whether b1.0 runs no round and starts none while no traffic flows: it holds no lock
    (its own round locks it first, before the plan restarts its traffic window) and has
    counted too little traffic since its last plan to take another turn."""
    info = fetch_json(overlay.brokers["b1.0"].admin_url + "/reconfig")
    counted = sum(c["demand"] for c in info["window"]["classes"])
    return info["locked_by"] is None and counted < RECONFIG["min_traffic"]


async def until_idle(overlay: LocalOverlay, timeout: float) -> bool:
    """Wait for :func:`coordinator_idle` (False if ``timeout`` passes first)."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(coordinator_idle, overlay):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)  # polls the coordinator's /reconfig
    return True


def routing_state(overlay: LocalOverlay) -> dict[str, tuple[int, int, list[str]]]:
    """Per broker: SRT size, PRT size, live links."""
    return {b: (h["srt"], h["prt"], h["links"]) for b, h in overlay.wait_quiet().items()}


@dataclass
class Stream:
    """A publisher at b0 and subscribers at b2 and b3, publishing until told to stop."""

    published: int = 0
    received: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)


async def stream_until(
    overlay: LocalOverlay, stream: Stream, done: Callable[[], bool], timeout: float
) -> None:
    """Publish without pause until ``done()`` (checked off the loop) or ``timeout``; then
    publish 100 more and wait until every subscriber has everything."""
    async with (
        Client(overlay.endpoints("b0"), client_id="pub") as pub,
        Client(overlay.endpoints("b2"), client_id="sub2") as c2,
        Client(overlay.endpoints("b3"), client_id="sub3") as c3,
        c2.subscribe("class = 'q'") as s2,
        c3.subscribe("class = 'q'") as s3,
    ):
        await pub.advertise("class = 'q'")
        await asyncio.to_thread(overlay.wait_quiet)

        async def collect(name: str, sub: Any) -> None:
            got = stream.received.setdefault(name, [])
            async for msg in sub:
                got.append((msg.seq, msg.payload))

        readers = [
            asyncio.create_task(collect("sub2", s2)),
            asyncio.create_task(collect("sub3", s3)),
        ]

        async def publish(n: int) -> None:
            for _ in range(n):
                stream.published += 1
                i = stream.published
                await pub.publish({"class": "q", "i": i}, f"quote {i}".encode(), ack=i % 25 == 0)
                await asyncio.sleep(0.005)

        started = time.monotonic()
        while time.monotonic() - started < timeout and not await asyncio.to_thread(done):
            await publish(40)
        await publish(100)
        await pub.drain()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(  # noqa: ASYNC110 - polls the readers
            len(got) < stream.published for got in stream.received.values()
        ):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a late duplicate would show up now
        for task in readers:
            task.cancel()


async def stream_until_padded(
    overlay: LocalOverlay,
    stream: Stream,
    done: Callable[[], bool],
    timeout: float,
    padding: int,
) -> None:
    """:func:`stream_until` with ``padding`` further subscriptions at b3 (routed toward an
    advertiser at b0), so that a round's tables outgrow a small ``max_frame``."""
    async with (
        Client(overlay.endpoints("b0"), client_id="pad-pub") as pad_pub,
        Client(overlay.endpoints("b3"), client_id="padding") as padder,
        contextlib.AsyncExitStack() as stack,
    ):
        if padding:
            await pad_pub.advertise("class = 'pad'")
        for i in range(padding):
            filter_text = f"class = 'pad' and tag = 'subscription number {i:05d}'"
            await stack.enter_async_context(padder.subscribe(filter_text))
        await stream_until(overlay, stream, done, timeout)


def assert_exactly_once_in_order(overlay: LocalOverlay, stream: Stream) -> None:
    expected = [(i, f"quote {i}".encode()) for i in range(1, stream.published + 1)]
    assert set(stream.received) == {"sub2", "sub3"}
    for name, got in stream.received.items():
        pairs = enumerate(zip(got, expected, strict=False))
        first = next((k for k, (a, b) in pairs if a != b), None)
        assert got == expected, f"{name}: {len(got)} of {stream.published}, differs at {first}"
    # No replica delivered a copy twice (the SDK would hide it).
    health = overlay.health()
    delivered = sum(health[b]["deliveries"] for b in ("b2.0", "b2.1", "b2.2", "b3"))
    assert delivered == 4 * stream.published


async def test_a_coordinator_proposing_wrong_plans_is_refused_and_traffic_continues(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = start(run_overlay, "misplan")
    tree_before = await asyncio.to_thread(overlay.live_tree)
    stream = Stream()

    def refused_each_kind() -> bool:
        return len(rounds_of(overlay, "b1.0")) >= 4

    await stream_until(overlay, stream, refused_each_kind, timeout=40)
    # b1.0 takes a turn every 0.3 s while traffic flows: a round it began as the stream
    # ended may still hold the neighbourhood (an equivocation, a whole step timeout). The
    # checks below are on the neighbourhood once it is still.
    assert await until_idle(overlay, timeout=30), "b1.0 still takes turns"
    rounds = await asyncio.to_thread(rounds_of, overlay, "b1.0")
    assert len(rounds) >= 4, rounds
    # Every round got as far as its plan: none was refused for a lock an earlier round left
    # behind (a member its abort did not reach stays locked until its lease ends).
    every = [r["outcome"] for r in rounds]
    assert all(o.startswith("aborted: ") for o in every), every
    outcomes = every[:4]
    assert all(o.startswith("aborted: plan refused: ") for o in outcomes[:3]), outcomes
    assert outcomes[3] == "aborted: the neighbourhood did not drain", outcomes
    refusals = [e for r in rounds[:3] for e in r["refusals"]]
    # Honest members of every VN of the neighbourhood refused, each naming why.
    for reason in ("closes a cycle", "drops neighbour VN b", "leaves the neighbourhood"):
        assert any(reason in e for e in refusals), (reason, refusals)
    refusers = {e.split(" ", 1)[0] for e in refusals}
    assert {"b0.0", "b1.1", "b1.2", "b2.2"} <= refusers
    assert "b1.0" not in refusers  # it does not check its own plans
    # The equivocation: b1.2 saw every neighbour replica drain for another plan.
    assert any(
        e.startswith("b1.2: b0.0, b0.1, b0.2, b2.0, b2.1, b2.2 prepared another plan")
        for e in rounds[3]["refusals"]
    ), rounds[3]["refusals"]

    # Nothing moved: the same tree, links and routing tables as before; no lock left.
    assert await asyncio.to_thread(overlay.live_tree) == tree_before
    state = await asyncio.to_thread(fetch_json, overlay.brokers["b1.0"].admin_url + "/reconfig")
    assert state["applied"] == 0
    for broker in overlay.broker_ids:
        info = await asyncio.to_thread(fetch_json, overlay.brokers[broker].admin_url + "/reconfig")
        assert info["locked_by"] is None, broker
    assert_exactly_once_in_order(overlay, stream)


@pytest.mark.parametrize("padding", [0, 150], ids=["small-tables", "tables-in-parts"])
async def test_wrong_or_withheld_tables_from_the_coordinator_are_not_what_members_install(
    run_overlay: Callable[..., LocalOverlay], padding: int
) -> None:
    """With ``padding`` further subscriptions at b3 and a small ``max_frame``, the wrong
    tables travel in parts (and are withheld from b2.2 all the same)."""
    overlay = start(run_overlay, "mistable", **({"max_frame": 8 * 1024} if padding else {}))
    stream = Stream()

    def applied_everywhere() -> bool:
        applied = any(r["outcome"] == "applied" for r in rounds_of(overlay, "b1.0"))
        info = fetch_json(overlay.brokers["b2.2"].admin_url + "/reconfig")
        return applied and info["locked_by"] is None  # b2.2's lease has ended

    await stream_until_padded(overlay, stream, applied_everywhere, timeout=40, padding=padding)
    # b2.2 never heard install: it took the tables b1's replicas vouched for when its lease
    # ended, or (drained too late, or the vouches in parts not all in) went back and took
    # its siblings' links and tables
    b22 = (overlay.workdir / "b2.2.log").read_text(encoding="utf-8")
    assert "no install from master b1" in b22 or "this replica missed a round" in b22, b22[-3000:]
    assert await asyncio.to_thread(applied_everywhere)
    moved = await asyncio.to_thread(overlay.live_tree)
    assert ("b0", "b2") in moved.links
    assert_exactly_once_in_order(overlay, stream)
    # Every replica of a VN has the same neighbours and tables (b2.2 too, which never heard
    # install; what the coordinator sent was wrong).
    health = overlay.health()
    for vn in ("b0", "b1", "b2"):
        replicas = overlay.replicas_of(vn)
        assert len({(health[b]["srt"], health[b]["prt"]) for b in replicas}) == 1, health
        neighbours = {
            tuple(fetch_json(overlay.brokers[b].admin_url + "/reconfig")["neighbours"])
            for b in replicas
        }
        assert len(neighbours) == 1, (vn, neighbours)
    # Each member saved the neighbours it switched to, for a restart: b2.1 too, which never
    # heard resume and went forward when its lease ended.
    members = [b for vn in ("b0", "b1", "b2") for b in overlay.replicas_of(vn)]
    live = {
        b: set(fetch_json(overlay.brokers[b].admin_url + "/reconfig")["neighbours"])
        for b in members
    }

    try:
        await until(lambda: all(saved_vns(overlay, b) == live[b] for b in live), timeout=10.0)
    except TimeoutError:
        saved = {b: saved_vns(overlay, b) for b in live}
        pytest.fail(f"saved links differ from live ones: {saved}, {live}")
