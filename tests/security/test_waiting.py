"""Shares that wait are bounded per sender, in bytes (``security.waiting.WaitingShares``).

At a broker they wait for their publication's content or for a path a majority vouches
for; at a subscriber, leaves wait for the statement they came under. Before the bound, each
key's list grew with every copy a sender sent: a client that sent its root splits again and
again for publications it never sent grew its edge replica's memory without limit (3,000
PASS frames: 59 → 219 MiB).
"""

from __future__ import annotations

from typing import NamedTuple

from hypothesis import given
from hypothesis import strategies as st

from security.waiting import WAITING_OVERHEAD, WaitingShares, Weight


class Item(NamedTuple):
    sender: str
    ref: bytes | None
    statement_bytes: int
    own: int


def weigh(item: Item) -> Weight:
    return item.sender, item.ref, item.statement_bytes, item.own


def expected_charge(kept: list[Item], sender: str) -> int:
    """What ``sender``'s kept items cost: each its own bytes, each statement once."""
    mine = [item for item in kept if item.sender == sender]
    statements = {item.ref: item.statement_bytes for item in mine if item.ref is not None}
    return sum(item.own + WAITING_OVERHEAD for item in mine) + sum(statements.values())


def test_a_flooding_sender_is_refused_past_its_budget_and_evicts_nobody() -> None:
    waiting: WaitingShares[tuple[str, int], Item] = WaitingShares(weigh, 10_000, keys=64)
    assert waiting.add(("honest", 1), Item("honest", b"h", 500, 48))
    flood = [waiting.add(("mallory", 7), Item("mallory", b"m", 1_000, 48)) for _ in range(100)]
    kept = flood.count(True)
    # the statement once, then 304 bytes a share: 29 fit in 10,000
    assert kept == (10_000 - 1_000) // (48 + WAITING_OVERHEAD)
    assert waiting.charged("mallory") <= 10_000
    assert waiting.get(("honest", 1)) == [Item("honest", b"h", 500, 48)]
    assert waiting.add(("honest", 2), Item("honest", b"h", 500, 48))  # its own allowance


def test_popping_an_epoch_frees_its_senders_allowance() -> None:
    waiting: WaitingShares[tuple[str, int], Item] = WaitingShares(weigh, 2_000, keys=64)
    item = Item("b0.1", b"s", 400, 48)
    while waiting.add(("p", 1), item):
        pass
    assert waiting.pop(("p", 1))
    assert waiting.charged("b0.1") == 0
    assert waiting.add(("p", 2), item)


def test_the_oldest_key_goes_past_the_key_limit_and_its_charges_with_it() -> None:
    waiting: WaitingShares[tuple[str, int], Item] = WaitingShares(weigh, budget=1 << 20, keys=3)
    for seq in range(5):
        waiting.add(("p", seq), Item(f"s{seq}", None, 0, 100))
    assert len(waiting) == 3
    assert waiting.get(("p", 0)) is None
    assert waiting.get(("p", 1)) is None
    assert waiting.charged("s0") == waiting.charged("s1") == 0
    assert waiting.charged("s4") == 100 + WAITING_OVERHEAD


items = st.builds(
    Item,
    st.sampled_from(["a", "b", "c"]),
    st.one_of(st.none(), st.sampled_from([b"x", b"y", b"z"])),
    st.sampled_from([0, 300, 5_000]),
    st.integers(0, 400),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 5), items),
        st.tuples(st.just("pop"), st.integers(0, 5), st.none()),
    ),
    max_size=80,
)


@given(steps, st.sampled_from([2, 3, 64]))
def test_each_senders_charge_is_what_its_kept_shares_cost_and_never_over_budget(
    script: list[tuple[str, int, Item | None]], keys: int
) -> None:
    """Whatever is added and popped, in any order, with at most ``keys`` keys kept (the
    oldest let go): a sender's charge is the cost of its kept shares (each statement once,
    however many shares came under it), an add is refused exactly when it would take that
    past the budget, and pop returns what was kept. (A statement's bytes are per
    reference: the strategy gives one size per ref by weighing each ref with the size of
    its first use.)"""
    budget = 6_000
    waiting: WaitingShares[tuple[str, int], Item] = WaitingShares(weigh, budget, keys=keys)
    model: dict[int, list[Item]] = {}  # in insertion order, like the keys kept
    sizes: dict[tuple[str, bytes], int] = {}
    for op, seq, drawn in script:
        key = ("p", seq)
        if op == "pop":
            assert waiting.pop(key) == model.pop(seq, [])
        else:
            assert drawn is not None
            item = drawn
            if drawn.ref is not None:
                size = sizes.setdefault((drawn.sender, drawn.ref), drawn.statement_bytes)
                item = drawn._replace(statement_bytes=size)
            kept = [i for items in model.values() for i in items]
            would = expected_charge([*kept, item], item.sender)
            added = waiting.add(key, item)
            assert added == (would <= budget)
            if added:
                if seq not in model and len(model) >= keys:
                    del model[next(iter(model))]
                model.setdefault(seq, []).append(item)
        kept = [i for items in model.values() for i in items]
        for sender in "abc":
            assert waiting.charged(sender) == expected_charge(kept, sender) <= budget
        assert len(waiting) == len(model) <= keys
