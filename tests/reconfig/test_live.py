"""A member's check of a reconfiguration plan, and what replicas compare (reconfig.live).

The rule (issue 11): a member takes a plan only when it is sound from where the member
stands (:func:`plan_problem`). The property that makes that enough: when every VN of the
neighbourhood accepts a plan, applying it to the overlay leaves a spanning tree over the same
VNs, whatever the plan was.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.tree import Link, Tree, broker_names, link, random_tree
from reconfig.live import (
    MARKED_ROUNDS,
    MAX_HOLD_LEASES,
    Install,
    Lock,
    MarkerBook,
    MemberRounds,
    Pending,
    Prepare,
    Reply,
    parse_step,
    plan_digest,
    plan_problem,
    tables_digest,
    vouch_quorum,
)


def _prepare(master: str, hood: list[str], links: list[Link], round_id: str = "m#1") -> Prepare:
    return Prepare("prepare", round_id, master, tuple(hood), tuple(links))


def _overlay(seed: int, n: int) -> tuple[Tree, str, list[str]]:
    """A random tree of ``n`` VNs, a master with at least two neighbours, its neighbourhood."""
    rng = random.Random(seed)
    tree = random_tree(broker_names(n), rng)
    masters = sorted(v for v in tree.brokers if len(tree.neighbours(v)) >= 2)
    master = rng.choice(masters)
    return tree, master, [master, *sorted(tree.neighbours(master))]


def _problems(tree: Tree, plan: Prepare) -> dict[str, str | None]:
    """What each VN of the overlay that the plan names would answer."""
    named = set(plan.hood) | {v for lk in plan.links for v in lk}
    return {
        vn: plan_problem(plan, vn, tree.neighbours(vn))
        for vn in sorted(named)
        if vn in tree.brokers
    }


def _applied(tree: Tree, plan: Prepare) -> Tree:
    """The overlay after the plan: links inside the neighbourhood replaced by the plan's."""
    hood = set(plan.hood)
    kept = [(a, b) for a, b in tree.links if not (a in hood and b in hood)]
    return Tree(tree.brokers, [*kept, *plan.links])


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(3, 10))
def test_every_spanning_tree_of_the_neighbourhood_is_accepted_by_every_member(
    seed: int, n: int
) -> None:
    tree, master, hood = _overlay(seed, n)
    links = sorted(random_tree(hood, random.Random(seed + 1)).links)
    plan = _prepare(master, hood, links)
    assert set(_problems(tree, plan).values()) == {None}
    assert len(_applied(tree, plan).links) == n - 1


@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(3, 9), data=st.data())
def test_a_plan_every_member_accepts_leaves_a_spanning_tree(
    seed: int, n: int, data: st.DataObject
) -> None:
    """Any plan at all (the true neighbourhood or random VNs from anywhere, a tree over it or
    random links): if every VN of the overlay it names accepts it, the overlay stays one tree
    over the same VNs."""
    tree, master, true_hood = _overlay(seed, n)
    vns = [*sorted(tree.brokers), "elsewhere"]
    if data.draw(st.booleans()):
        hood = [master, *data.draw(st.permutations(true_hood[1:]))]
    else:
        hood = [master, *data.draw(st.lists(st.sampled_from(vns), max_size=6))]
    pairs = st.tuples(st.sampled_from(vns), st.sampled_from(vns))
    links = data.draw(st.lists(pairs, max_size=8))
    if data.draw(st.booleans()):
        extra = data.draw(st.integers(0, 1))
        links = [*random_tree(sorted(set(hood)), random.Random(seed)).links, *links[:extra]]
    plan = _prepare(master, hood, links)
    if set(_problems(tree, plan).values()) == {None}:
        _applied(tree, plan)  # raises TopologyError unless the links form a tree


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(3, 10))
def test_a_plan_that_breaks_the_tree_is_refused_by_the_master_vn(seed: int, n: int) -> None:
    """Each wrong plan a Byzantine coordinator may send: the master VN's own replicas see
    what is wrong with it (and so would not vouch for it), naming why."""
    tree, master, hood = _overlay(seed, n)
    rng = random.Random(seed)
    good = sorted(random_tree(hood, rng).links)
    present = set(good)
    missing = [link(a, b) for a in hood for b in hood if a < b and link(a, b) not in present]
    neighbour = rng.choice(hood[1:])
    strangers = sorted(set(tree.brokers) - set(hood))
    wrong = {
        "closes a cycle": _prepare(master, hood, [*good, missing[0]]),
        "is cut off": _prepare(master, hood, good[1:]),
        "appears twice": _prepare(master, hood, [*good, good[0][::-1]]),
        "to itself": _prepare(master, hood, [*good[1:], (master, master)]),
        "drops neighbour VN": _prepare(
            master,
            [v for v in hood if v != neighbour],
            sorted(random_tree([v for v in hood if v != neighbour], rng).links),
        ),
        "leaves the neighbourhood": _prepare(master, hood, [*good[1:], (master, "elsewhere")]),
        "twice": _prepare(master, [*hood, neighbour], good),
    }
    if strangers:
        far = rng.choice(strangers)
        wrong["not a neighbour of master"] = _prepare(
            master, [*hood, far], [*good, link(neighbour, far)]
        )
    for reason, plan in wrong.items():
        problem = plan_problem(plan, master, tree.neighbours(master))
        assert problem is not None, reason
        assert reason in problem, (reason, problem)


def test_a_neighbour_refuses_a_plan_it_is_not_placed_in_soundly() -> None:
    tree = Tree(["a", "m", "b", "x"], [("a", "m"), ("m", "b"), ("b", "x")])
    hood = ["m", "a", "b"]
    star = [("a", "m"), ("b", "m")]
    # x is two hops from m: a plan naming it is not m's neighbourhood.
    plan = _prepare("m", [*hood, "x"], [*star, ("a", "x")])
    assert plan_problem(plan, "x", tree.neighbours("x")) == ("master m is not a neighbour of VN x")
    assert plan_problem(plan, "b", tree.neighbours("b")) == (
        "VN x is already a neighbour of b: the neighbourhood is not a star around m"
    )
    # b left out of m's neighbourhood is told it is not in it.
    plan = _prepare("m", ["m", "a"], [("a", "m")])
    assert plan_problem(plan, "b", tree.neighbours("b")) == (
        "VN b is not in the neighbourhood ['a', 'm']"
    )
    assert plan_problem(plan, "m", tree.neighbours("m")) == (
        "the plan drops neighbour VN b of master m"
    )


def test_a_member_takes_a_plan_only_from_the_master_it_locked_for() -> None:
    member = MemberRounds("a.1")
    assert member.lock(Lock("lock", "m.0#1", "m", 5.0), 0.0, enabled=True, coordinating=None).ok
    plan = _prepare("x", ["x", "a"], [("a", "x")], round_id="m.0#1")
    refused = member.prepare(plan, "a", ["m", "x"])
    assert refused == Reply(
        False, "a.1 refuses the plan: it names master x, the lock was granted to m"
    )
    assert member.pending is None
    plan = _prepare("m", ["m", "a", "b"], [("a", "b"), ("b", "m")], round_id="m.0#1")
    pending = member.prepare(plan, "a", ["m", "z"])
    assert isinstance(pending, Pending)
    assert (pending.added, pending.removed, pending.new_neighbours) == ({"b"}, {"m"}, {"b"})
    assert pending.digest == plan_digest(plan)


def test_a_refused_plan_names_the_member_and_the_reason() -> None:
    member = MemberRounds("a.1")
    member.lock(Lock("lock", "r", "m", 5.0), 0.0, enabled=True, coordinating=None)
    plan = _prepare("m", ["m", "a", "b"], [("a", "b"), ("b", "m"), ("a", "m")], round_id="r")
    assert member.prepare(plan, "a", ["m"]) == Reply(
        False, "a.1 refuses the plan: link a-m closes a cycle"
    )


def test_the_plan_digest_ignores_order_and_changes_with_the_plan() -> None:
    one = _prepare("m", ["m", "a", "b"], [("a", "b"), ("b", "m")])
    same = _prepare("m", ["b", "a", "m"], [("m", "b"), ("b", "a")])
    other = _prepare("m", ["m", "a", "b"], [("a", "m"), ("b", "m")])
    assert plan_digest(one) == plan_digest(same) != plan_digest(other)
    later = _prepare("m", ["m", "a", "b"], [("a", "b"), ("b", "m")], round_id="m#2")
    assert plan_digest(later) != plan_digest(one)


def test_the_tables_digest_survives_the_wire_and_sees_a_moved_subscription() -> None:
    sub = [["price", "<", 10]]
    held = {"a": {"adv": {}, "sub": {"k1": sub}}, "b": {"adv": {"k2": [["x", "=", 1]]}, "sub": {}}}
    sent = {"a": {}, "b": {"k1": sub}}
    decoded = parse_step("install", {"round": "r", "held": held, "sent": sent})
    assert isinstance(decoded, Install)
    assert tables_digest("r", held, sent) == tables_digest("r", decoded.held, decoded.sent)
    # Tuples where msgpack gives lists do not change it either.
    as_tuples = {"a": {"adv": {}, "sub": {"k1": [("price", "<", 10)]}}, "b": held["b"]}
    assert tables_digest("r", as_tuples, sent) == tables_digest("r", held, sent)
    away = {"a": {"adv": {}, "sub": {}}, "b": {"adv": held["b"]["adv"], "sub": {"k1": sub}}}
    assert tables_digest("r", away, sent) != tables_digest("r", held, sent)


@pytest.mark.parametrize(("size", "quorum"), [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (7, 4)])
def test_f_plus_one_replicas_vouch(size: int, quorum: int) -> None:
    assert vouch_quorum(size) == quorum


def test_markers_say_who_disagrees_and_who_vouched() -> None:
    book = MarkerBook()
    book.record("r", 1, "a.0", "P")
    book.record("r", 1, "a.1", "Q")
    book.record("r", 3, "m.0", "T")
    book.record("r", 3, "m.1", "T")
    book.record("r", 3, "m.2", "U")
    book.record("r", 3, "x.0", "T")
    assert book.disagreeing("r", 1, "P") == {"a.1"}
    assert book.missing("r", 1, ["a.0", "a.1", "a.2"], ["a.0", "a.1", "a.2"]) == {"a.2"}
    assert book.vouchers("r", 3, "T", ["m.0", "m.1", "m.2"]) == {"m.0", "m.1"}
    assert book.vouched_digests("r", 3) == {"T", "U"}
    book.forget("r")
    assert book.vouchers("r", 3, "T", ["m.0", "m.1", "m.2"]) == set()


def test_markers_of_rounds_that_never_come_stay_bounded_per_sender() -> None:
    """A faulty neighbour naming a new round in every marker, and late markers of rounds
    already forgotten, kept everything until 2026-11-29: now each sender's latest
    MARKED_ROUNDS rounds only, and one sender's flood evicts no other sender's marker."""
    book = MarkerBook()
    book.record("pending", 1, "a.0", "P")
    for i in range(10_000):
        book.record(f"bogus-{i}", 1, "x.0", "Z")
    book.record("pending", 2, "x.0", "P")
    assert book.missing("pending", 1, ["a.0"], ["a.0"]) == set()
    assert book.disagreeing("pending", 2, "P") == set()
    assert len(book.seen) <= MARKED_ROUNDS + 1
    for i in range(100):  # late markers of rounds ended here (forgotten before they came)
        book.forget(f"late-{i}")
        book.record(f"late-{i}", 2, "a.1", "L")
    assert len(book.seen) <= 2 * MARKED_ROUNDS + 1
    assert book.missing("pending", 1, ["a.0"], ["a.0"]) == set()


def test_asking_again_for_a_lock_does_not_extend_it() -> None:
    member = MemberRounds("a.1")
    lock = Lock("lock", "r", "m", 5.0)
    assert member.lock(lock, 0.0, enabled=True, coordinating=None).ok
    assert member.lock(lock, 4.0, enabled=True, coordinating=None).ok
    assert member.expired(5.5) is not None
    assert not member.lock(Lock("lock", "s", "m", 5.0), 1.0, enabled=True, coordinating=None).ok


def test_a_rounds_steps_renew_its_lease_up_to_the_cap() -> None:
    member = MemberRounds("a.1")
    assert member.lock(Lock("lock", "r", "m", 5.0), 0.0, enabled=True, coordinating=None).ok
    assert member.renew("other", 4.0) is None  # a step of another round renews nothing
    assert member.renew("r", 4.0) == 9.0
    assert member.expired(8.0) is None
    assert member.renew("r", 3.0) == 9.0  # never shortened
    assert member.renew("r", 12.0) == MAX_HOLD_LEASES * 5.0  # capped
    assert member.expired(MAX_HOLD_LEASES * 5.0 + 0.1) is not None
