"""Live replica attach and detach (SPEC §4) with real broker processes: publications keep
flowing, subscribers get each exactly once, in order, byte for byte, and no forwarder
splits a key share with a stale threshold scheme after it switched."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import Client
from broker.errors import TrellisTimeout
from broker.tools.local import LocalOverlay, fetch_json, stop_overlay
from broker.tools.placement_apply import LocalReplicas
from overlay.tree import line_tree

pytestmark = pytest.mark.slow

MAX_PUBLICATIONS = 3000


@pytest.fixture
def line_of_vns(
    run_overlay: Callable[..., LocalOverlay],
) -> Iterator[Callable[[list[int]], LocalOverlay]]:
    """A line b0 - b1 - ... of VNs; every broker listed in overlay.json (attached ones
    too) is stopped afterwards."""
    started: list[Path] = []

    def _run(replicas: list[int]) -> LocalOverlay:
        names = [f"b{i}" for i in range(len(replicas))]
        overlay = run_overlay(
            line_tree(names),
            replicas=dict(zip(names, replicas, strict=True)),
            heartbeat_interval=1.0,
        )
        started.append(overlay.workdir)
        return overlay

    yield _run
    for workdir in started:
        with contextlib.suppress(Exception):
            stop_overlay(workdir)


def splits_toward(workdir: Path, forwarders: list[str], vn: str) -> dict[int, int]:
    """Key shares the ``forwarders`` split toward ``vn``, by the replica count used."""
    info = {b["id"]: b for b in LocalReplicas(workdir).info["brokers"]}
    counts: dict[int, int] = {}
    for broker in forwarders:
        health = fetch_json(info[broker]["admin"] + "/healthz")
        for scheme, n in health["splits_by_scheme"].items():
            name, _, r = scheme.rpartition("/")
            if name == vn:
                counts[int(r)] = counts.get(int(r), 0) + n
    return counts


async def test_replicas_attach_and_detach_live_with_exact_delivery(line_of_vns) -> None:
    overlay = line_of_vns([3, 3, 1])
    workdir = overlay.workdir
    forwarders = overlay.replicas_of("b0")
    pub = Client(overlay.endpoints("b0"), client_id="pub")
    sub = Client(overlay.endpoints("b2"), client_id="sub", manifest=overlay.manifest_path)
    published: dict[str, list[tuple[int, bytes]]] = {"secret": [], "plain": []}
    stop = asyncio.Event()

    async def publish() -> None:
        for i in range(MAX_PUBLICATIONS):
            if stop.is_set():
                return
            kind = "secret" if i % 2 == 0 else "plain"
            payload = f"{kind} {i} ".encode() * 4
            seq = await pub.publish({"class": kind, "i": i}, payload, confidential=kind == "secret")
            published[kind].append((seq, payload))
            await asyncio.sleep(0.005)

    async def collect(subscription: Any, into: list[tuple[int, bytes]]) -> None:
        while True:
            try:
                msg = await subscription.get(3.0)
            except TrellisTimeout:
                if stop.is_set():
                    return
                continue
            into.append((msg.seq, msg.payload))

    got: dict[str, list[tuple[int, bytes]]] = {"secret": [], "plain": []}
    # (r in force, splits toward b1 by r when that phase began, when it ended)
    phases: list[tuple[int, dict[int, int], dict[int, int]]] = []
    took: list[float] = []

    replicas = LocalReplicas(workdir)

    def run_steps() -> None:
        plan: list[tuple[int, Callable[[], Any]]] = [
            (4, lambda: replicas.attach("b1")),
            # Byzantine from the moment it joins: alters what it forwards and its splits.
            (5, lambda: replicas.attach("b1", {"byzantine": "corrupt"})),
            (4, lambda: replicas.detach("b1")),
            (3, lambda: replicas.detach("b1")),
        ]
        r, began = 3, splits_toward(workdir, forwarders, "b1")
        for after, action in plan:
            time.sleep(0.8)  # publications flow under the scheme in force
            phases.append((r, began, splits_toward(workdir, forwarders, "b1")))
            took.append(action().seconds)
            r, began = after, splits_toward(workdir, forwarders, "b1")
        time.sleep(0.8)
        phases.append((r, began, splits_toward(workdir, forwarders, "b1")))

    async with (
        pub,
        sub,
        sub.subscribe("class = 'secret'") as secret,
        sub.subscribe("class = 'plain'") as plain,
    ):
        await pub.advertise("class = 'secret'")
        await pub.advertise("class = 'plain'")
        await asyncio.to_thread(overlay.wait_quiet)
        collectors = [
            asyncio.create_task(collect(secret, got["secret"])),
            asyncio.create_task(collect(plain, got["plain"])),
        ]
        publisher = asyncio.create_task(publish())
        try:
            await asyncio.to_thread(run_steps)
        finally:
            stop.set()
            await publisher
            await asyncio.gather(*collectors)
            stop_overlay(workdir)
            for proc in replicas.started.values():
                proc.stop()

    assert len(published["secret"]) > 100
    assert got["secret"] == published["secret"]
    assert got["plain"] == published["plain"]
    assert all(seconds < 15 for seconds in took), took
    # Between a switch that every broker acknowledged and the next one, b0's replicas split
    # toward b1 only with the r in force (b1: 3 -> 4 -> 5 -> 4 -> 3), and they did split.
    assert [r for r, _, _ in phases] == [3, 4, 5, 4, 3]
    for r, began, ended in phases:
        for scheme in {*began, *ended}:
            grew = ended.get(scheme, 0) - began.get(scheme, 0)
            if scheme == r:
                assert grew > 0, f"no split with r = {r} while b1 had {r} replicas"
            else:
                assert grew == 0, f"{grew} splits with stale r = {scheme} while b1 had {r}"
