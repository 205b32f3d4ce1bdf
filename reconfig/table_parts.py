"""A VN's new routing tables in parts that each fit a frame (SPEC §5, live rounds).

A round's coordinator installs each member's tables on the new tree, and every replica of
the master VN vouches for its VN's tables to the other VNs' members (marker wave 3). Both
carried all of a VN's tables in one ``RECONF`` frame, whose size grows with every
advertisement and subscription beyond the neighbourhood: some thousands made it larger than
``max_frame``, and the receiver closed the link or control connection mid-round (until
2026-11-29). Now tables larger than a budget travel in parts, which the receiver puts back
together before it checks them against their digest (:func:`reconfig.live.tables_digest`),
so the parts change nothing of what is checked or agreed.

The first part carries the skeleton (every neighbour VN, with empty maps), so that a VN
whose tables are empty is named as it is in one piece; an entry belongs to exactly one
part. Pure functions over plain data: frames and timers are the caller's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

__all__ = ["MAX_PARTS", "PartsInProgress", "TablesError", "merge_tables", "split_tables"]

Held = dict[str, dict[str, dict[str, Any]]]
"""What a VN holds from each neighbour VN: ``{vn: {"adv": {key: filter}, "sub": {...}}}``."""
Sent = dict[str, dict[str, Any]]
"""The subscriptions a VN sent each neighbour VN: ``{vn: {key: filter}}``."""
Tables = tuple[Held, Sent]

MAX_PARTS = 1024
"""Parts one table may come in: at half a default frame each, half a gigabyte of tables,
far beyond any overlay's; a receiver refuses more (a Byzantine sender's flood)."""

_KINDS = ("adv", "sub")
_ENTRY_FRAMING = 8


class TablesError(ValueError):
    """Parts that are not parts of tables (wrong shapes, numbering, or too many)."""


def _entry_bytes(key: str, flt: Any) -> int:
    return len(key.encode()) + len(msgpack.packb(flt, use_bin_type=True)) + _ENTRY_FRAMING


def split_tables(held: Mapping[str, Any], sent: Mapping[str, Any], budget: int) -> list[Tables]:
    """``held`` and ``sent`` as parts of at most about ``budget`` bytes of entries each (one
    part when they fit; an entry larger than the budget has a part to itself)."""
    first: Tables = ({vn: {kind: {} for kind in _KINDS} for vn in held}, {vn: {} for vn in sent})
    parts: list[Tables] = [first]
    size = sum(len(vn.encode()) + 16 for vn in (*held, *sent))
    count = 0

    def room(cost: int) -> Tables:
        nonlocal size, count
        if count and size + cost > budget:
            parts.append(({}, {}))
            size = count = 0
        size += cost
        count += 1
        return parts[-1]

    for vn, maps in held.items():
        for kind in _KINDS:
            for key, flt in maps[kind].items():
                part_held = room(_entry_bytes(key, flt))[0]
                into = part_held.get(vn)
                if into is None:
                    into = part_held[vn] = {k: {} for k in _KINDS}
                into[kind][key] = flt
    for vn, subs in sent.items():
        for key, flt in subs.items():
            room(_entry_bytes(key, flt))[1].setdefault(vn, {})[key] = flt
    return parts


def merge_tables(parts: Sequence[tuple[Any, Any]]) -> Tables:
    """The tables ``parts`` (from :func:`split_tables`, in any order) were split from.

    Raises:
        TablesError: a part is not shaped as tables are.
    """
    held: Held = {}
    sent: Sent = {}
    for part_held, part_sent in parts:
        if not isinstance(part_held, dict) or not isinstance(part_sent, dict):
            raise TablesError("a part of tables must carry 'held' and 'sent' maps")
        for vn, maps in part_held.items():
            if not isinstance(maps, dict) or not all(
                isinstance(maps.get(kind), dict) for kind in _KINDS
            ):
                raise TablesError(f"part of 'held' for {vn!r} must be an {{adv, sub}} map")
            into = held.get(vn)
            if into is None:
                into = held[vn] = {kind: {} for kind in _KINDS}
            for kind in _KINDS:
                into[kind].update(maps[kind])
        for vn, subs in part_sent.items():
            if not isinstance(subs, dict):
                raise TablesError(f"part of 'sent' for {vn!r} must be a subscription map")
            sent.setdefault(vn, {}).update(subs)
    return held, sent


class PartsInProgress:
    """Parts of tables received so far, per (sender, round): one set in progress for each
    (a new ``tag`` — digest — or part count from the same sender starts over), let go
    when complete or when the round is forgotten."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, str], tuple[str, int, dict[int, tuple[Any, Any]]]] = {}

    def offer(
        self,
        sender: str,
        round_id: str,
        tag: str,
        part: object,
        parts: object,
        tables: tuple[Any, Any],
    ) -> Tables | None:
        """Keep part ``part`` of ``parts``; the merged tables once every part is in.

        Raises:
            TablesError: the numbering is not that of parts (or past :data:`MAX_PARTS`), or
                the tables are misshapen once merged.
        """
        if type(part) is not int or type(parts) is not int or not 0 <= part < parts <= MAX_PARTS:
            raise TablesError(f"part {part!r} of {parts!r} is not a part (at most {MAX_PARTS})")
        key = (sender, round_id)
        progress = self._by.get(key)
        if progress is None or progress[0] != tag or progress[1] != parts:
            progress = self._by[key] = (tag, parts, {})
        received = progress[2]
        received[part] = tables
        if len(received) < parts:
            return None
        del self._by[key]
        return merge_tables([received[i] for i in range(parts)])

    def forget(self, round_id: str) -> None:
        """The round ended: drop whatever of it is still in progress."""
        for key in [k for k in self._by if k[1] == round_id]:
            del self._by[key]

    def __len__(self) -> int:
        return len(self._by)
