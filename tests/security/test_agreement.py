"""Agreement on replicated streams: exact delivery whatever f Byzantine replicas per VN do.

The property test builds a two-VN path in memory (publisher -> VN1 -> VN2 -> subscriber),
runs the receiving logic of every honest replica and of the subscriber
(:class:`security.agreement.ReplicatedStream`), and lets an adversary choose what each
Byzantine replica sends on each of its links (altered, invented, replayed, reordered,
withheld or equivocated copies) and in what order every link's frames arrive. Honest links
keep their frames in order (TCP); nothing else is assumed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from security.agreement import CopyBudget, MarkRequests, ReplicatedStream, forget_idle_streams

Copy = tuple[int, bytes]  # (seq, payload)


def _faults(r: int) -> int:
    return (r - 1) // 2


@dataclass
class Link:
    sender: str
    receiver: str
    frames: deque[Copy] = field(default_factory=deque)


@dataclass
class Replica:
    name: str
    byzantine: bool
    stream: ReplicatedStream[str, bytes]
    out: list[Link] = field(default_factory=list)
    routed: list[Copy] = field(default_factory=list)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, object]:
    r1 = draw(st.sampled_from([1, 3, 4, 5]))
    r2 = draw(st.sampled_from([1, 3, 4, 5]))
    n = draw(st.integers(1, 12))
    published = [(seq, draw(st.binary(min_size=1, max_size=4))) for seq in range(1, n + 1)]
    matching = [draw(st.booleans()) for _ in published]
    bad1 = draw(st.sets(st.integers(0, r1 - 1), max_size=_faults(r1)))
    bad2 = draw(st.sets(st.integers(0, r2 - 1), max_size=_faults(r2)))
    # What a Byzantine replica sends on one link: any mix of genuine, altered, invented and
    # replayed copies, in any order (drop = leave out, delay = the schedule decides).
    action = st.tuples(
        st.sampled_from(["genuine", "altered", "invented"]),
        st.integers(0, n + 2),
        st.binary(min_size=0, max_size=4),
    )
    lies = draw(st.lists(st.lists(action, max_size=2 * n + 2), min_size=12, max_size=12))
    schedule = draw(st.lists(st.integers(0, 63), max_size=400))
    return {
        "r1": r1,
        "r2": r2,
        "published": published,
        "matching": matching,
        "bad1": bad1,
        "bad2": bad2,
        "lies": lies,
        "schedule": schedule,
    }


def _lie(plan: list[tuple[str, int, bytes]], published: dict[int, bytes]) -> list[Copy]:
    frames: list[Copy] = []
    for kind, seq, noise in plan:
        genuine = published.get(seq, b"")
        if kind == "genuine" and seq in published:
            frames.append((seq, genuine))
        elif kind == "altered":
            altered = genuine + noise if noise else genuine[:-1]
            if altered != genuine or seq not in published:
                frames.append((seq, altered))
        else:
            frames.append((seq, noise))
    return frames


def _run(sc: dict[str, object]) -> tuple[list[Copy], list[Copy], set[str], set[str]]:
    r1, r2 = int(sc["r1"]), int(sc["r2"])  # type: ignore[call-overload]
    published: list[Copy] = sc["published"]  # type: ignore[assignment]
    matching: list[bool] = sc["matching"]  # type: ignore[assignment]
    bad1: set[int] = sc["bad1"]  # type: ignore[assignment]
    bad2: set[int] = sc["bad2"]  # type: ignore[assignment]
    lies: list[list[tuple[str, int, bytes]]] = sc["lies"]  # type: ignore[assignment]
    schedule: list[int] = sc["schedule"]  # type: ignore[assignment]
    genuine = dict(published)
    wanted = [c for c, m in zip(published, matching, strict=True) if m]
    match = {seq for (seq, _), m in zip(published, matching, strict=True) if m}

    vn1 = [Replica(f"a{i}", i in bad1, ReplicatedStream[str, bytes](0)) for i in range(r1)]
    vn2 = [
        Replica(f"b{i}", i in bad2, ReplicatedStream[str, bytes](_faults(r1))) for i in range(r2)
    ]
    subscriber = ReplicatedStream[str, bytes](_faults(r2))
    links: list[Link] = []
    for a in vn1:
        for b in vn2:
            a.out.append(Link(a.name, b.name))
    for b in vn2:
        b.out.append(Link(b.name, "sub"))
    by_name = {x.name: x for x in (*vn1, *vn2)}
    lie_plans = iter(lies * 4)
    for replica in (*vn1, *vn2):
        links.extend(replica.out)
        if replica.byzantine:
            for link in replica.out:
                link.frames.extend(_lie(next(lie_plans), genuine))
    delivered: list[Copy] = []

    def route(replica: Replica, released: list[tuple[int, bytes]]) -> None:
        for seq, payload in released:
            replica.routed.append((seq, payload))
            if not replica.byzantine and seq in match:
                for link in replica.out:
                    link.frames.append((seq, payload))

    # The publisher is a client of every VN1 replica; it is honest, its links are in order.
    for a in vn1:
        for seq, payload in published:
            route(a, a.stream.offer("publisher", seq, payload, payload))

    def step(link: Link) -> None:
        seq, payload = link.frames.popleft()
        if link.receiver == "sub":
            delivered.extend(subscriber.offer(link.sender, seq, payload, payload))
        else:
            receiver = by_name[link.receiver]
            route(receiver, receiver.stream.offer(link.sender, seq, payload, payload))

    for pick in schedule:
        busy = [link for link in links if link.frames]
        if not busy:
            break
        step(busy[pick % len(busy)])
    while any(link.frames for link in links):
        for link in links:
            if link.frames:
                step(link)
    honest = {x.name for x in (*vn1, *vn2) if not x.byzantine}
    blamed = {b.source for x in (*vn1, *vn2) for b in x.stream.blames} | {
        b.source for b in subscriber.blames
    }
    return wanted, delivered, honest, blamed


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_subscriber_gets_exactly_the_published_stream_whatever_f_replicas_per_vn_send(
    sc: dict[str, object],
) -> None:
    wanted, delivered, _honest, _blamed = _run(sc)
    assert delivered == wanted


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_blame_never_names_an_honest_replica(sc: dict[str, object]) -> None:
    _wanted, _delivered, honest, blamed = _run(sc)
    assert not blamed & honest


def test_an_altered_copy_is_blamed_once_the_genuine_one_is_released() -> None:
    stream = ReplicatedStream[str, bytes](1)
    assert stream.offer("bad", 1, b"evil", b"evil") == []
    assert stream.offer("a", 1, b"good", b"good") == []
    assert stream.offer("b", 1, b"good", b"good") == [(1, b"good")]
    assert [(b.source, b.seq) for b in stream.blames] == [("bad", 1)]
    stream.offer("bad", 1, b"later evil", b"later evil")
    assert [(b.source, b.seq) for b in stream.blames] == [("bad", 1), ("bad", 1)]


def test_an_invented_sequence_does_not_hold_back_the_genuine_ones() -> None:
    stream = ReplicatedStream[str, bytes](1)
    assert stream.offer("bad", 2, b"invented", b"invented") == []
    assert stream.offer("a", 3, b"x", b"x") == []
    # b passes 2 too: two sources skipped it, more than f = 1, so it was never genuine.
    assert stream.offer("b", 3, b"x", b"x") == [(3, b"x")]
    assert stream.offer("bad", 2, b"invented", b"invented") == []


def test_a_later_sequence_waits_for_an_earlier_one_an_honest_replica_sent() -> None:
    stream = ReplicatedStream[str, bytes](1)
    assert stream.offer("a", 1, b"one", b"one") == []
    assert stream.offer("a", 2, b"two", b"two") == []
    assert stream.offer("bad", 2, b"two", b"two") == []  # 2 has f + 1, but 1 comes first
    assert stream.offer("b", 1, b"one", b"one") == [(1, b"one"), (2, b"two")]


def test_a_stuck_sequence_is_abandoned_after_patience_without_breaking_order() -> None:
    stream = ReplicatedStream[str, bytes](1)
    # a routed 1 before b had the subscription; the third replica is silent.
    stream.offer("a", 1, b"one", b"one", now=0.0)
    stream.offer("a", 2, b"two", b"two", now=0.1)
    stream.offer("b", 2, b"two", b"two", now=0.1)
    assert stream.expire(now=0.5, patience=1.0) == []
    assert stream.expire(now=1.5, patience=1.0) == [(2, b"two")]
    assert stream.offer("c", 1, b"one", b"one") == []


def test_a_source_flooding_undecided_copies_is_cut_off_and_blamed() -> None:
    stream = ReplicatedStream[str, bytes](1, limit=4)
    for seq in range(100, 110):
        stream.offer("bad", seq, b"x", b"x")
    assert stream.waiting == 4
    assert [b.source for b in stream.blames] == ["bad"]


def test_lone_copies_for_ever_new_publishers_are_refused_past_the_sources_budget() -> None:
    """``limit`` bounds one stream; a source sending lone copies for publishers nobody else
    sends (never decided, never let go) is bounded over all streams by a shared budget in
    bytes: refused and blamed once past it, while the other sources' copies still count."""
    budget: CopyBudget[str, bytes] = CopyBudget(1_000, len)
    streams = [ReplicatedStream[str, bytes](1, budget=budget) for _ in range(50)]
    for stream in streams:
        stream.offer("bad", 1, b"x" * 100, b"x" * 100)
    assert budget.charged == {"bad": 1_000}
    assert sum(stream.waiting for stream in streams) == 10
    blames = [b for stream in streams for b in stream.blames]
    assert [(b.source, b.fault) for b in blames] == [("bad", "flooding")]
    good = streams[-1]
    assert good.offer("a", 1, b"one", b"one") == []
    assert good.offer("b", 1, b"one", b"one") == [(1, b"one")]
    assert budget.charged == {"bad": 1_000}  # "a" brought "one", decided and given back


@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # stream
            st.sampled_from(["a", "b", "c"]),  # source
            st.integers(1, 6),  # seq
            st.binary(min_size=0, max_size=30),  # content
        ),
        max_size=120,
    )
)
def test_a_budget_charges_each_source_exactly_the_undecided_versions_it_brought(
    offers: list[tuple[int, str, int, bytes]],
) -> None:
    budget: CopyBudget[str, bytes] = CopyBudget(100, len)
    streams = [ReplicatedStream[str, bytes](1, budget=budget) for _ in range(4)]
    for index, source, seq, content in offers:
        streams[index].offer(source, seq, content, content)
        owed: dict[str, int] = {}
        for stream in streams:
            for pending in stream._pending.values():
                for version in pending.versions.values():
                    owed[version.owner] = owed.get(version.owner, 0) + version.cost
        assert budget.charged == {s: n for s, n in owed.items() if n}
        assert all(n <= 100 for n in budget.charged.values())


def test_faults_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="faults"):
        ReplicatedStream[str, bytes](-1)


def test_an_altered_copy_arriving_hundreds_of_publications_late_is_still_blamed() -> None:
    stream = ReplicatedStream[str, bytes](1)
    for seq in range(1, 3001):
        stream.offer("a", seq, b"good", b"good")
        stream.offer("b", seq, b"good", b"good")
    stream.offer("bad", 1, b"good", b"good")
    assert stream.blames == []
    stream.offer("bad", 2, b"evil", b"evil")
    assert [(b.source, b.seq, b.fault) for b in stream.blames] == [("bad", 2, "altered")]


@pytest.mark.parametrize("decided", [1, 8, 9, 64, 65, 512, 513, 4096, 4097])
def test_late_altered_copies_are_blamed_across_the_growth_of_the_decided_ring(
    decided: int,
) -> None:
    """The ring of decided sequences starts small (a short-lived publisher's stream costs
    little) and grows with the decisions: what it remembered is kept at every growth."""
    stream = ReplicatedStream[str, bytes](1)
    for seq in range(1, decided + 1):
        stream.offer("a", seq, b"good", b"good")
        stream.offer("b", seq, b"good", b"good")
    remembered = range(max(1, decided - 7), decided + 1)  # the last 8, at every size
    for seq in remembered:
        stream.offer("bad", seq, b"evil", b"evil")
    assert [b.seq for b in stream.blames] == list(remembered)


@settings(max_examples=300, deadline=None)
@given(
    f=st.integers(min_value=0, max_value=3),
    asks=st.lists(
        st.tuples(st.sampled_from(["r1", "r2", "r3"]), st.integers(min_value=0, max_value=6)),
        max_size=40,
    ),
)
def test_a_mark_is_placed_once_and_only_after_f_plus_one_distinct_replicas_asked(
    f: int, asks: list[tuple[str, int]]
) -> None:
    """Whatever order and repetition of requests: a round's mark is placed exactly once, at
    the request that makes f + 1 distinct askers, and never before (f askers, however often
    they ask, cannot place it)."""
    requests: MarkRequests[str, int] = MarkRequests()
    askers: dict[str, set[int]] = {}
    placed: dict[str, int] = {}
    for i, (round_id, replica) in enumerate(asks):
        before = len(askers.get(round_id, set()))
        askers.setdefault(round_id, set()).add(replica)
        if requests.ask(round_id, replica, f + 1):
            assert round_id not in placed
            assert before == f
            assert len(askers[round_id]) == f + 1
            placed[round_id] = i
    for round_id, who in askers.items():
        assert (round_id in placed) == (len(who) > f)


def test_mark_requests_forget_the_oldest_rounds_beyond_their_bound() -> None:
    requests: MarkRequests[str, int] = MarkRequests(keep=2)
    for round_id in ("a", "b", "c"):
        assert requests.ask(round_id, 0, 1)
    # "a" was forgotten: asked again, it is placed again (memory stays bounded)
    assert requests.ask("a", 1, 1)
    assert not requests.ask("c", 1, 1)


def test_forgetting_idle_streams_keeps_waiting_ones_and_drops_the_longest_idle_first() -> None:
    streams: dict[str, ReplicatedStream[str, str]] = {}
    for i in range(16):
        stream = streams[f"p{i}"] = ReplicatedStream(1)
        for source in ("a", "b"):
            stream.offer(source, 1, "x", "x", now=float(i))
    waiting = streams["p0"]
    waiting.offer("a", 2, "y", "y", now=100.0)  # one copy of seq 2: not decided
    assert forget_idle_streams(streams, 16) == 2  # down to 7/8 of 16
    assert set(streams) == {"p0", *(f"p{i}" for i in range(3, 16))}
    assert forget_idle_streams(streams, 16) == 0  # at 7/8 already
