"""The subscriptions forwarded on one link, indexed so covering checks need not scan them all.

Forwarding a subscription asks two questions of what the link already carries: does some
forwarded filter cover the new one (then it need not travel), and which forwarded filters
does the new one cover (they can be withdrawn). Scanning every forwarded filter makes a burst
of n subscriptions cost n² covering tests (seconds at a few thousand). Most subscriptions pin
some attribute to one value (``symbol = 'ACME'``), and pinning prunes soundly: if ``f`` covers
a satisfiable ``g`` and ``f`` pins ``a`` to ``v``, then ``g``'s values of ``a`` lie within
``{v}`` and are not empty, so ``g`` pins ``a`` to ``v`` too. Hence a coverer's pins are a
subset of the covered filter's pins, which a lookup by pin set finds directly.

The index only narrows the candidates; each is still checked with :meth:`Filter.covers`.
A pin it cannot see (a single value written with suffix or contains patterns) can only hide
a covering pair, and a covering pair missed means a redundant subscription on the link, never
a missing one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from itertools import combinations

from broker.language.filters import Filter, Value

__all__ = ["ForwardedFilters"]

Pin = tuple[str, str, Value]
"""(attribute, kind, value), as :meth:`Filter.pins` gives them."""

MAX_SUBSETS_PINS = 8
"""Past this many pins a coverer lookup scans instead of trying 2^pins pin sets."""


class ForwardedFilters(MutableMapping[str, Filter]):
    """Filters by global key, with lookups of possible coverers and possibly covered ones."""

    __slots__ = ("_added", "_by_pin", "_by_pins", "_filters", "_order", "_pins", "_unsatisfiable")

    def __init__(self, items: Mapping[str, Filter] | None = None) -> None:
        self._filters: dict[str, Filter] = {}
        # Insertion numbers: lookups answer in insertion order, the same at every replica.
        self._order: dict[str, int] = {}
        self._added = 0
        self._pins: dict[str, frozenset[Pin]] = {}
        self._by_pins: dict[frozenset[Pin], dict[str, Filter]] = {}
        self._by_pin: dict[Pin, set[str]] = {}
        self._unsatisfiable: set[str] = set()
        for key, flt in (items or {}).items():
            self[key] = flt

    def __getitem__(self, key: str) -> Filter:
        return self._filters[key]

    def __setitem__(self, key: str, flt: Filter) -> None:
        if key in self._filters:
            del self[key]
        self._filters[key] = flt
        self._order[key] = self._added
        self._added += 1
        if not flt.is_satisfiable():
            self._unsatisfiable.add(key)
        mine = flt.pins()
        self._pins[key] = mine
        self._by_pins.setdefault(mine, {})[key] = flt
        for pin in mine:
            self._by_pin.setdefault(pin, set()).add(key)

    def __delitem__(self, key: str) -> None:
        del self._filters[key]
        del self._order[key]
        self._unsatisfiable.discard(key)
        mine = self._pins.pop(key)
        bucket = self._by_pins[mine]
        del bucket[key]
        if not bucket:
            del self._by_pins[mine]
        for pin in mine:
            keys = self._by_pin[pin]
            keys.discard(key)
            if not keys:
                del self._by_pin[pin]

    def __iter__(self) -> Iterator[str]:
        return iter(self._filters)

    def __len__(self) -> int:
        return len(self._filters)

    def __contains__(self, key: object) -> bool:
        return key in self._filters

    def coverers(self, flt: Filter) -> Iterator[Filter]:
        """Every forwarded filter that may cover ``flt`` (a superset of those that do)."""
        mine = flt.pins()
        if not flt.is_satisfiable() or len(mine) > MAX_SUBSETS_PINS:
            yield from self._filters.values()
            return
        for size in range(len(mine) + 1):
            for subset in combinations(mine, size):
                bucket = self._by_pins.get(frozenset(subset))
                if bucket:
                    yield from bucket.values()

    def covered(self, flt: Filter) -> list[tuple[str, Filter]]:
        """Every (key, filter) forwarded that ``flt`` may cover (a superset of those it does).

        A list, so the caller may delete what it finds while going through it."""
        mine = flt.pins()
        if not mine:
            return list(self._filters.items())
        postings = sorted((self._by_pin.get(pin, set()) for pin in mine), key=len)
        smallest, rest = postings[0], postings[1:]
        keys = [k for k in smallest if all(k in other for other in rest)]
        keys += [k for k in self._unsatisfiable if k not in smallest]
        keys.sort(key=self._order.__getitem__)
        return [(k, self._filters[k]) for k in keys]
