"""Routing entries from a replicated neighbour VN take effect at its majority, both ways.

A neighbouring VN's replicas each announce the routing entries their clients make and
withdraw (``ADVERTISE`` / ``UNADVERTISE``, ``SUBSCRIBE`` / ``UNSUBSCRIBE``); a broker applies
an addition once a majority of them sent it and a removal once a majority withdrew it, so a
Byzantine minority can neither inject nor withdraw routing state. Removals were never
applied past a replicated VN (every vote after the first was taken for a late copy of an
applied removal), so a client that left kept its advertisements and subscriptions in every
broker beyond its edge VN. And a replica's routing wave is answered only once what it
announced has its VN's majority (:mod:`broker.daemon.waves`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.daemon.hops import VNHop, entry_cost
from broker.daemon.waves import RoutingWaves
from broker.errors import LimitExceeded
from broker.language.grammar import parse_filter
from broker.wire.protocol import Sync

FLT = parse_filter("class = 'x'")
OTHER = parse_filter("class = 'y'")
ADD = ("adv", "b0/p/a1", FLT)
REMOVE = ("unadv", "b0/p/a1")


def test_an_addition_and_a_removal_each_take_effect_at_the_majority() -> None:
    hop = VNHop("b0", 3)
    assert not hop.vote("b0.0", ADD)
    assert hop.vote("b0.1", ADD)
    assert not hop.vote("b0.2", ADD)  # a late copy: already in force
    assert not hop.vote("b0.0", REMOVE)
    assert hop.vote("b0.1", REMOVE)
    assert not hop.vote("b0.2", REMOVE)
    assert not hop.has_votes("adv", "b0/p/a1")
    assert not hop.has_votes("unadv", "b0/p/a1")  # every replica withdrew: nothing kept


def test_a_minority_can_neither_add_nor_withdraw() -> None:
    hop = VNHop("b0", 3)
    assert not hop.vote("b0.2", ("adv", "b0/evil/a1", FLT))
    assert not hop.vote("b0.0", ADD)
    assert hop.vote("b0.1", ADD)
    assert not hop.vote("b0.2", REMOVE)
    assert not hop.vote("b0.2", REMOVE)  # saying it twice is one vote
    assert hop.has_votes("adv", "b0/p/a1")


def test_a_replica_that_added_and_removed_before_the_majority_added_still_counts() -> None:
    """A client that advertises and leaves at once: one replica's advertisement and
    withdrawal both arrive before the second replica's advertisement."""
    hop = VNHop("b0", 3)
    assert not hop.vote("b0.0", ADD)
    assert not hop.vote("b0.0", REMOVE)
    assert not hop.vote("b0.1", ADD)  # b0.0 no longer says it: not a majority
    assert hop.vote("b0.2", ADD)  # b0.1 and b0.2 do
    assert hop.vote("b0.1", REMOVE)  # b0.0's withdrawal counts with b0.1's
    assert not hop.vote("b0.2", REMOVE)
    assert not hop.has_votes("adv", "b0/p/a1")


def test_a_new_filter_under_the_same_key_replaces_the_replicas_old_word() -> None:
    hop = VNHop("b0", 3)
    hop.vote("b0.0", ADD)
    assert hop.vote("b0.1", ADD)
    changed = ("adv", "b0/p/a1", OTHER)
    assert not hop.vote("b0.0", changed)
    assert hop.vote("b0.1", changed)


def _in_force(hop: VNHop, events: list[tuple[str, tuple[object, ...]]]) -> bool:
    """Apply ``events`` as the dispatcher does; whether the entry ends in force."""
    in_force = False
    for member, entry in events:
        fired = hop.vote(member, entry)
        if fired and entry[0] == "adv":
            in_force = True
        elif fired and in_force:
            in_force = False
    return in_force


@settings(max_examples=300, deadline=None)
@given(
    size=st.sampled_from([1, 2, 3, 4, 5, 7]),
    data=st.data(),
)
def test_every_honest_replica_withdrawing_leaves_nothing_whatever_the_interleaving(
    size: int, data: st.DataObject
) -> None:
    """Honest replicas each add then remove (their own links are FIFO); f Byzantine ones
    say anything at any time. Interleaved arbitrarily, the entry is in force at the end
    only if the Byzantine ones alone could keep it there, which they cannot."""
    faulty = (size - 1) // 2
    honest = [f"b0.{i}" for i in range(size - faulty)]
    byzantine = [f"b0.{i}" for i in range(size - faulty, size)]
    queues = {m: [ADD, REMOVE] for m in honest}
    events: list[tuple[str, tuple[object, ...]]] = []
    while any(queues.values()):
        choices = [m for m, q in queues.items() if q] + byzantine
        member = data.draw(st.sampled_from(choices))
        if member in queues:
            events.append((member, queues[member].pop(0)))
        else:
            events.append((member, data.draw(st.sampled_from([ADD, REMOVE]))))
    assert not _in_force(VNHop("b0", size), events)


class Link:
    """A replica's link as the wave machinery sees it: records what it is sent."""

    is_broker = True
    closing = False
    congested = False
    opened = 0.0

    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id
        self.sent: list[object] = []

    def send(self, msg: object) -> None:
        self.sent.append(msg)

    def send_raw(self, data: bytes) -> None:
        self.sent.append(data)

    def deliver_raw(self, data: bytes) -> None:
        raise AssertionError

    def note_dropped(self, keys: list[str]) -> None:
        raise AssertionError

    def close(self) -> None:
        self.closing = True


async def test_a_replicas_wave_is_answered_only_once_its_vn_agreed_on_what_it_announced() -> None:
    """b0.0 announces an advertisement and asks to settle before b0.1 announced it: the
    answer waits for the majority (and follows what the advertisement pulls back on the
    link, FIFO), or for the timeout."""
    hop = VNHop("b0", 3)
    links = {name: Link(name) for name in ("b0.0", "b0.1", "b0.2")}
    waves = RoutingWaves({}, lambda: None, timeout=0.2)

    def settled(member: str) -> Callable[[], bool]:
        waits = hop.wave_entries(member)
        return lambda: not hop.unsettled(member, waits)

    assert not hop.vote("b0.0", ADD)
    waves.asked(links["b0.0"], "b0", 7, settled=settled("b0.0"))
    assert links["b0.0"].sent == []  # b0.0's entry has one vote of the two it needs
    assert hop.vote("b0.1", ADD)
    links["b0.0"].send("SUBSCRIBE pulled back")  # what applying it sends, before the answer
    waves.recheck()
    assert links["b0.0"].sent == ["SUBSCRIBE pulled back", Sync(7, True)]

    assert not hop.vote("b0.2", ("adv", "b0/q/a1", FLT))  # only b0.2 says it
    waves.asked(links["b0.2"], "b0", 8, settled=settled("b0.2"))
    assert links["b0.2"].sent == []
    await asyncio.sleep(0.3)  # the timeout: answered all the same
    assert links["b0.2"].sent == [Sync(8, True)]
    # ... and only that wave waits for it: the next one from b0.2 is answered at once
    waves.asked(links["b0.2"], "b0", 9, settled=settled("b0.2"))
    assert links["b0.2"].sent == [Sync(8, True), Sync(9, True)]


async def test_no_wave_crosses_a_standby_link_and_one_arriving_over_it_is_answered_at_once() -> (
    None
):
    """During a live round b1's new link to b2 is in standby, which closes a cycle of VNs
    (b0 - b1 - b2 - b0): a wave passed on over it went round that cycle until it timed out,
    thousands of waves a second per broker. It goes to b0 only; one that b2 (installed
    first) sends over that link is answered at once, not passed on to b0."""
    links = {name: Link(name) for name in ("b0.0", "b0.1", "b2.0")}
    hops = {"b0": VNHop("b0", 2), "b2": VNHop("b2", 1)}
    for name, link in links.items():
        hops[name[:2]].members[name] = link
    standby = {"b2"}
    waves = RoutingWaves(hops, lambda: None, timeout=5.0, standby=standby)
    finished: list[str] = []

    waves.start(lambda: finished.append("client's wave"))
    assert [links[b].sent for b in ("b0.0", "b0.1", "b2.0")] == [[Sync(1, False)]] * 2 + [[]]
    waves.answered(links["b0.0"], 1)
    waves.answered(links["b0.1"], 1)
    assert finished == ["client's wave"]

    waves.asked(links["b2.0"], "b2", 9)
    assert links["b2.0"].sent == [Sync(9, True)]
    assert links["b0.0"].sent == [Sync(1, False)]  # not passed on

    standby.discard("b2")  # the round installed the link: waves cross it from now on
    waves.start(lambda: None)
    assert links["b2.0"].sent == [Sync(9, True), Sync(2, False)]


def test_replicas_that_left_the_vn_cannot_make_up_a_majority_of_the_smaller_one() -> None:
    """b0 shrinks 5 -> 4 -> 3 while its publisher's advertisement stands: each replica that
    leaves withdraws it (its client left it). Counted, b0.4's and b0.3's withdrawals were
    a majority of the three left and removed what b0.0 - b0.2 still hold (every later
    publication lost, tests/system/test_replica_attach.py in CI)."""
    hop = VNHop("b0", 5)
    for member in ("b0.0", "b0.1", "b0.2", "b0.3", "b0.4"):
        hop.vote(member, ADD)
    assert not hop.vote("b0.4", REMOVE)
    hop.resize(["b0.0", "b0.1", "b0.2", "b0.3"])
    assert not hop.vote("b0.3", REMOVE)
    hop.resize(["b0.0", "b0.1", "b0.2"])
    assert not hop.vote("b0.4", REMOVE)  # its link may still be open: ignored
    assert not hop.vote("b0.0", REMOVE)  # one of the three left: not a majority
    assert hop.vote("b0.1", REMOVE)


def test_entries_no_majority_sends_are_bounded_per_replica_and_freed_when_taken_up() -> None:
    """A replica announcing entries its siblings never send (a Byzantine one, without end)
    is refused past its allowance; the others' votes still count, an entry the majority
    takes up frees the bytes it was charged, and so does a withdrawal."""
    budget = 20 * entry_cost(("sub", "b0/c/s00000", FLT))
    hop = VNHop("b0", 3, vote_budget=budget)
    keys = [f"b0/c/s{i:05d}" for i in range(40)]
    for key in keys[:20]:
        hop.vote("b0.2", ("sub", key, FLT))
    for key in keys[20:30]:
        with pytest.raises(LimitExceeded, match="max_vote_bytes_per_source"):
            hop.vote("b0.2", ("sub", key, FLT))
        assert not hop.has_votes("sub", key)  # nothing recorded
    assert hop.pending_bytes("b0.2") <= budget
    # the other replicas are not charged for b0.2's words
    assert not hop.vote("b0.0", ADD)
    assert hop.vote("b0.1", ADD)
    # the majority takes one of b0.2's entries up: its bytes are free again
    assert hop.vote("b0.0", ("sub", keys[0], FLT))
    hop.vote("b0.2", ("sub", keys[30], FLT))
    with pytest.raises(LimitExceeded):
        hop.vote("b0.2", ("sub", keys[31], FLT))
    # at its allowance, a withdrawal still counts: it replaces the addition it withdraws
    full = hop.pending_bytes("b0.2")
    assert not hop.vote("b0.2", ("unsub", keys[1]))
    assert not hop.has_votes("sub", keys[1])
    assert hop.pending_bytes("b0.2") < full


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["b0.0", "b0.1", "b0.2"]),
            st.sampled_from(["sub", "unsub"]),
            st.integers(0, 6),
        ),
        max_size=60,
    )
)
def test_the_bytes_charged_are_those_of_the_words_that_lack_the_majority(
    words: list[tuple[str, str, int]],
) -> None:
    hop = VNHop("b0", 3, vote_budget=8 * entry_cost(("sub", "b0/c/s0", FLT)), withdrawn_memory=2)
    for member, kind, n in words:
        entry: tuple[object, ...] = (
            (kind, f"b0/c/s{n}", FLT) if kind == "sub" else (kind, f"b0/c/s{n}")
        )
        with contextlib.suppress(LimitExceeded):
            hop.vote(member, entry)
        for voter in ("b0.0", "b0.1", "b0.2"):
            waiting = hop._unsettled.get(voter, set())
            assert hop.pending_bytes(voter) == sum(entry_cost(e) for e in waiting)
            additions = sum(entry_cost(e) for e in waiting if e[0] == "sub")
            assert additions <= hop.vote_budget  # (withdrawals are never refused)


def test_entries_a_majority_withdrew_while_a_replica_is_down_are_not_kept_for_good() -> None:
    """b0.2 is down: each entry b0's clients make and withdraw is announced and withdrawn by
    b0.0 and b0.1 only, so its words were kept for b0.2's late removal that never comes
    (one per subscription a client ever made). The latest withdrawals are kept; an entry
    announced again after its withdrawal is a live one, never let go."""
    hop = VNHop("b0", 3, withdrawn_memory=16)
    again = ("sub", "b0/c/again", FLT)
    for member in ("b0.0", "b0.1"):
        hop.vote(member, again)
        hop.vote(member, ("unsub", "b0/c/again"))
    assert hop.vote("b0.0", again) is False
    assert hop.vote("b0.1", again) is True  # announced again: in force
    for n in range(1000):
        key = f"b0/c/s{n}"
        for member in ("b0.0", "b0.1"):
            hop.vote(member, ("sub", key, FLT))
        for member in ("b0.0", "b0.1"):
            hop.vote(member, ("unsub", key))
    assert len(hop._said) <= 16 + 1, len(hop._said)
    assert len(hop._votes) <= 16 + 1, len(hop._votes)
    assert hop.has_quorum(again)
    # a late removal of a withdrawal still kept is recognised
    assert hop.has_votes("unsub", "b0/c/s999")
    assert not hop.vote("b0.2", ("unsub", "b0/c/s999"))
    assert not hop.has_votes("unsub", "b0/c/s999")  # every replica withdrew it
    assert not hop.has_votes("unsub", "b0/c/s0")  # let go long ago


def test_a_replica_announcing_a_withdrawn_entry_again_cannot_keep_it_for_good() -> None:
    """Five replicas, e never withdraws: once a, b, c withdrew an entry, d announcing it
    again (alone, so it is not in force) and withdrawing it once more left its words kept
    for good; a minority's announcement does not take it out of the bounded memory."""
    hop = VNHop("b0", 5, withdrawn_memory=4)
    for n in range(200):
        key = f"b0/c/s{n}"
        for member in ("b0.a", "b0.b", "b0.c", "b0.e"):
            hop.vote(member, ("sub", key, FLT))
        for member in ("b0.a", "b0.b", "b0.c"):
            hop.vote(member, ("unsub", key))
        hop.vote("b0.d", ("sub", key, FLT))
        hop.vote("b0.d", ("unsub", key))
    assert len(hop._said) <= 4 + 1, len(hop._said)


def test_a_replica_at_its_allowance_can_still_withdraw_an_entry_in_force() -> None:
    """b0.2 is down; b0.0's allowance is taken by entries its siblings have not sent yet.
    Its withdrawal of an entry in force (nothing of it charged: the majority took it up)
    is taken all the same, or the entry would stay in force after its client left."""
    hop = VNHop("b0", 3, vote_budget=4 * entry_cost(("sub", "b0/c/s00", FLT)))
    assert not hop.vote("b0.0", ADD)
    assert hop.vote("b0.1", ADD)
    for n in range(4):
        hop.vote("b0.0", ("sub", f"b0/c/s{n:02d}", FLT))
    with pytest.raises(LimitExceeded):
        hop.vote("b0.0", ("sub", "b0/c/s99", FLT))
    assert not hop.vote("b0.0", REMOVE)  # taken, not refused
    assert hop.vote("b0.1", REMOVE)  # the majority withdrew it
