"""Parked client sessions (broker.daemon.sessions), in memory: what is kept, for how long,
and who may claim it. The broker processes' side is tests/system/test_session_resume.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from broker.daemon.sessions import (
    MAX_PARKED,
    RECENT_DELIVERY_BYTES,
    Sessions,
    recent_deliveries,
)


@dataclass(eq=False)
class FakeHop:
    peer_id: str | None
    session: str | None


def sessions(linger: float = 10.0, limit: int = 1000) -> tuple[Sessions[FakeHop], list[FakeHop]]:
    ended: list[FakeHop] = []
    return Sessions(linger, limit, ended.append), ended


def test_recent_deliveries_keep_the_newest_megabyte_however_many_frames() -> None:
    recent = recent_deliveries()
    frames = [b"%09d" % i for i in range(RECENT_DELIVERY_BYTES // 9 + 500)]  # 9 bytes each
    for frame in frames:
        recent.keep(frame)
    kept = recent.take()
    assert kept == frames[-len(kept) :]
    assert len(kept) * 9 > RECENT_DELIVERY_BYTES * 7 // 8  # over 100,000 small deliveries
    assert recent.take() == []


async def test_a_resumed_session_gets_what_was_in_flight_then_what_was_sent_parked() -> None:
    table, ended = sessions()
    hop = FakeHop("sub", "s1")
    assert table.can_park(hop)
    table.park(hop, [b"in-flight"])
    table.buffer(hop, b"later")
    assert table.resume("sub", "s1") == (hop, [b"in-flight", b"later"])
    assert table.resume("sub", "s1") is None
    assert not ended
    assert len(table) == 0


async def test_a_session_not_claimed_within_the_linger_ends() -> None:
    table, ended = sessions(linger=0.05)
    hop = FakeHop("sub", "s1")
    table.park(hop, [])
    await asyncio.sleep(0.15)
    assert ended == [hop]
    assert table.resume("sub", "s1") is None


async def test_another_session_of_the_same_client_id_ends_the_parked_one() -> None:
    table, ended = sessions()
    hop = FakeHop("sub", "s1")
    table.park(hop, [b"a"])
    assert table.resume("sub", "s2") is None
    assert ended == [hop]
    hop2 = FakeHop("other", "s1")
    table.park(hop2, [])
    assert table.resume("other", None) is None
    assert ended == [hop, hop2]


async def test_a_session_whose_buffer_overflows_ends_from_the_loop_not_from_the_send() -> None:
    table, ended = sessions(limit=10)
    hop = FakeHop("sub", "s1")
    table.park(hop, [])
    table.buffer(hop, b"12345")
    table.buffer(hop, b"123456")  # over 10 bytes
    assert not ended  # a send is inside routing: the routing state is withdrawn later
    table.buffer(hop, b"more")
    await asyncio.sleep(0)
    assert ended == [hop]
    assert table.resume("sub", "s1") is None


def test_sessions_without_a_linger_or_an_identity_are_not_parked() -> None:
    table, _ = sessions(linger=0)
    assert not table.can_park(FakeHop("sub", "s1"))
    table, _ = sessions()
    assert not table.can_park(FakeHop("sub", None))
    assert not table.can_park(FakeHop(None, "s1"))


async def test_an_overflowed_session_claimed_before_its_end_is_not_resumed() -> None:
    table, ended = sessions(limit=3)
    hop = FakeHop("sub", "s1")
    table.park(hop, [])
    table.buffer(hop, b"1234")
    assert table.resume("sub", "s1") is None
    assert ended == [hop]
    await asyncio.sleep(0)
    assert ended == [hop]  # the scheduled end finds it gone


async def test_no_more_than_max_parked_sessions_are_kept_at_once() -> None:
    table, _ = sessions()
    for i in range(MAX_PARKED):
        hop = FakeHop(f"c{i}", "s")
        assert table.can_park(hop)
        table.park(hop, [])
    assert not table.can_park(FakeHop("one-more", "s"))
    table.close()
