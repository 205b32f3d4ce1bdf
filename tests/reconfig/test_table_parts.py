"""Routing tables split into parts that each fit a frame, and put back together (property
tests over random tables, budgets and arrival orders)."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconfig.live import tables_digest
from reconfig.table_parts import (
    MAX_PARTS,
    PartsInProgress,
    TablesError,
    merge_tables,
    split_tables,
)

keys = st.text(min_size=1, max_size=30)
filters = st.lists(
    st.tuples(st.sampled_from(["class", "price", "tag"]), st.sampled_from(["eq", "lt"]), keys),
    min_size=1,
    max_size=4,
).map(lambda preds: [list(p) for p in preds])
entry_maps = st.dictionaries(keys, filters, max_size=25)
vns = st.sampled_from(["b0", "b1", "b2", "b3", "b4"])
held_tables = st.dictionaries(vns, st.fixed_dictionaries({"adv": entry_maps, "sub": entry_maps}))
sent_tables = st.dictionaries(vns, entry_maps)


def wire_bytes(part: tuple[Any, Any]) -> int:
    return len(msgpack.packb({"held": part[0], "sent": part[1]}, use_bin_type=True))


@settings(max_examples=200, deadline=None)
@given(held_tables, sent_tables, st.integers(64, 4096), st.randoms(use_true_random=False))
def test_tables_split_into_parts_come_back_whole_in_any_order(
    held: dict[str, Any], sent: dict[str, Any], budget: int, rng: random.Random
) -> None:
    parts = split_tables(held, sent, budget)
    assert merge_tables(parts) == (held, sent)
    digest = tables_digest("r1", held, sent)
    order = list(range(len(parts)))
    rng.shuffle(order)
    progress = PartsInProgress()
    outcome = None
    for i in order:
        assert outcome is None  # nothing before the last part
        outcome = progress.offer("b1.0", "r1", digest, i, len(parts), parts[i])
    assert outcome is not None
    assert tables_digest("r1", *outcome) == digest
    assert len(progress) == 0


@settings(max_examples=100, deadline=None)
@given(held_tables, sent_tables, st.integers(256, 4096))
def test_every_part_with_more_than_one_entry_fits_its_budget(
    held: dict[str, Any], sent: dict[str, Any], budget: int
) -> None:
    """On the wire (msgpack, skeleton included) a part stays within the budget plus the
    skeleton's framing, unless it holds a single entry larger than the budget."""
    parts = split_tables(held, sent, budget)
    for part in parts[1:]:
        entries = sum(len(m["adv"]) + len(m["sub"]) for m in part[0].values())
        entries += sum(len(m) for m in part[1].values())
        assert entries >= 1
        if entries > 1:
            assert wire_bytes(part) <= budget + 64


def test_tables_that_fit_are_one_part() -> None:
    held = {"b0": {"adv": {"a": [["class", "eq", "x"]]}, "sub": {}}, "b2": {"adv": {}, "sub": {}}}
    sent = {"b0": {}}
    assert split_tables(held, sent, 1 << 20) == [(held, sent)]


def test_a_new_digest_from_the_same_sender_starts_over_and_bad_numbering_is_refused() -> None:
    held = {"b0": {"adv": {str(i): [["class", "eq", "x" * 40]] for i in range(20)}, "sub": {}}}
    parts = split_tables(held, {}, 200)
    assert len(parts) > 2
    progress = PartsInProgress()
    assert progress.offer("b1.0", "r1", "d1", 0, len(parts), parts[0]) is None
    # the same sender under another digest: the first set is dropped, not mixed in
    for i in range(len(parts) - 1):
        assert progress.offer("b1.0", "r1", "d2", i, len(parts), parts[i]) is None
    assert progress.offer("b1.0", "r1", "d2", len(parts) - 1, len(parts), parts[-1]) == (held, {})
    for part, count in [(-1, 3), (3, 3), (0, MAX_PARTS + 1), ("0", 3), (0, True)]:
        with pytest.raises(TablesError):
            progress.offer("b1.0", "r2", "d", part, count, parts[0])
    with pytest.raises(TablesError):
        merge_tables([({"b0": {"adv": []}}, {})])
    progress.offer("b1.0", "r3", "d", 0, 2, parts[0])
    progress.forget("r3")
    assert len(progress) == 0
