"""A broker killed with SIGKILL loses at most its last unflushed batch of traffic records,
and what it wrote stays readable (SPEC §7)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from analytics.schema import read_records
from broker.client import Client
from broker.tools.launcher import BrokerProcess

pytestmark = pytest.mark.slow


def pub_seqs(logs: Path) -> list[int]:
    return sorted(r["s"] for r in read_records(logs) if r["k"] == "pub")


async def publish(endpoint: str, first: int, count: int) -> None:
    async with Client(endpoint, client_id="p", first_seq=first) as client:
        await client.advertise("class = 'c'")
        for i in range(count):
            await client.publish({"class": "c", "i": i}, b"x")


def test_a_killed_broker_keeps_every_flushed_record(
    run_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    logs = tmp_path / "traffic"
    broker = run_broker("b1", traffic_log={"dir": str(logs), "flush_interval": 0.2})
    asyncio.run(publish(broker.endpoint, 1, 100))
    deadline = time.monotonic() + 10
    while pub_seqs(logs) != list(range(1, 101)):
        assert time.monotonic() < deadline, f"flushed: {len(pub_seqs(logs))} of 100"
        time.sleep(0.05)
    asyncio.run(publish(broker.endpoint, 101, 100))
    broker.kill()
    seqs = pub_seqs(logs)
    # Everything flushed before is there, nothing twice, and the rest is a prefix of what
    # followed: a crash loses at most the batch it interrupted.
    assert seqs[:100] == list(range(1, 101))
    assert seqs == list(range(1, len(seqs) + 1))
