"""Match a publication against many filters without looking at most of them (SPEC §2, §10).

Each filter is filed under one *access path* chosen from its own predicates, and only filters
reached through the publication's attribute values are ever verified:

1. all its ``=`` predicates together: a hash table per attribute-name signature, keyed by the
   tuple of values, e.g. ``("stock7", "ACME")`` for ``(class, symbol)``;
2. otherwise its smallest ``in`` set, filed under every member;
3. otherwise its longest ``prefix`` (or ``suffix``): a hash table probed with the publication
   value cut at each length in use;
4. otherwise its range predicates (``<``, ``<=``, ``>``, ``>=``): filters with the same shape of
   ranges (e.g. ``price >= a and volume > b``) share one group holding a sorted array per
   predicate, in which the satisfied bounds form one slice found by bisection; the group's
   matches are the intersection of those slices, computed by set operations in C;
5. otherwise the attribute it tests (``exists``, ``!=``, ``contains``): checked when present;
6. the empty filter (``*``) matches every publication.

Behind an ``=`` or ``in`` key sits a nested node indexing the remaining predicates the same way,
so the ``class = 'x' and price < 10`` subscriptions sharing a class are split by price rather
than scanned. Whatever the access path leaves is verified per candidate with the predicates'
precompiled value tests. A publication costs a few hash probes and bisections plus work
proportional to its candidates, not to the number of filters.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterable, KeysView, Mapping
from enum import Enum
from math import isnan
from typing import Any, Final, Generic, TypeVar

from broker.language.filters import Filter, Op, Predicate, Value, value_key

__all__ = ["MatchIndex"]

K = TypeVar("K", bound=Hashable)

_Checks = tuple[tuple[str, Callable[[Any], bool]], ...]
_Getter = Callable[[str, object], Any]


class _Missing(Enum):
    MISSING = "missing"


# What a getter returns for an absent attribute; an enum member, so ``is`` narrows it away.
_MISSING: Final = _Missing.MISSING
_AFFIX_OPS: Final = frozenset({Op.PREFIX, Op.SUFFIX})
_RANGE_OPS: Final = frozenset({Op.LT, Op.LE, Op.GT, Op.GE})
_UPPER_OPS: Final = frozenset({Op.LT, Op.LE})
# Satisfied bounds must form one slice, so at equal bounds the strict upper bound sorts first
# (at 5, x < 5 fails and x <= 5 holds) and the inclusive lower bound does (x >= 5 holds, x > 5
# fails); a probe (value, 1) then splits each array exactly.
_TIE: Final = {Op.LT: 0, Op.LE: 1, Op.GE: 0, Op.GT: 1}
_sequence = itertools.count()


def _checks(predicates: Iterable[Predicate]) -> _Checks:
    return tuple((p.attr, p.test) for p in predicates)


def _scalar(p: Predicate) -> Value:
    """Return the value of a predicate that compares with one value (not exists, not in)."""
    value = p.value
    assert value is not None
    assert not isinstance(value, frozenset)
    return value


def _members(p: Predicate) -> frozenset[Value]:
    """Return the set of an ``in`` predicate."""
    value = p.value
    assert isinstance(value, frozenset)
    return value


def _text(p: Predicate) -> str:
    """Return the string of a prefix or suffix predicate."""
    value = p.value
    assert isinstance(value, str)
    return value


def _verify_into(
    keys: Iterable[Any], checks: Mapping[Any, _Checks], get: _Getter, out: set[Any]
) -> None:
    """Add the keys whose remaining checks (if any) hold."""
    add = out.add
    for key in keys:
        for attr, test in checks.get(key, ()):
            value = get(attr, _MISSING)
            if value is _MISSING or not test(value):
                break
        else:
            add(key)


def _collect_bucket(bucket: dict[Any, _Checks], get: _Getter, out: set[Any]) -> None:
    add = out.add
    for key, checks in bucket.items():
        for attr, test in checks:
            value = get(attr, _MISSING)
            if value is _MISSING or not test(value):
                break
        else:
            add(key)


class _RangePart:
    """One range predicate of a group: bounds sorted as (bound, tie, seq), keys in step."""

    __slots__ = ("attr", "bounds", "is_str", "keys", "upper")

    def __init__(self, attr: str, is_str: bool, upper: bool) -> None:
        self.attr = attr
        self.is_str = is_str
        self.upper = upper
        self.bounds: list[tuple[Any, int, int]] = []
        self.keys: list[Any] = []

    def insert(self, bound: tuple[Any, int, int], key: Any) -> None:
        index = bisect_left(self.bounds, bound)
        self.bounds.insert(index, bound)
        self.keys.insert(index, key)

    def delete(self, bound: tuple[Any, int, int]) -> None:
        index = bisect_left(self.bounds, bound)
        del self.bounds[index]
        del self.keys[index]

    def satisfied(self, value: Any) -> list[Any]:
        """Return the keys whose bound the value satisfies (empty for a value of another type)."""
        kind = value.__class__
        if self.is_str:
            if kind is not str:
                return []
        elif kind is not int and (kind is not float or isnan(value)):
            return []
        split = bisect_left(self.bounds, (value, 1))
        return self.keys[split:] if self.upper else self.keys[:split]


class _RangeGroup:
    """Filters whose range predicates have one shape, e.g. ``(price, lower), (volume, lower)``."""

    __slots__ = ("checks", "parts")

    def __init__(self, shape: tuple[tuple[str, bool, bool], ...]) -> None:
        self.parts = [_RangePart(*part) for part in shape]
        self.checks: dict[Any, _Checks] = {}

    def collect(self, get: _Getter, out: set[Any]) -> None:
        slices = []
        for part in self.parts:
            value = get(part.attr, _MISSING)
            if value is _MISSING:
                return
            keys = part.satisfied(value)
            if not keys:
                return
            slices.append(keys)
        if len(slices) == 1:
            found: Iterable[Any] = slices[0]
        else:
            slices.sort(key=len)
            found = set(slices[0]).intersection(*slices[1:])
        if self.checks:
            _verify_into(found, self.checks, get, out)
        else:
            out.update(found)


class _Affixes:
    """Prefixes (or suffixes) of one attribute: text -> {key: checks}, and the lengths in use."""

    __slots__ = ("lengths", "table")

    def __init__(self) -> None:
        self.lengths: dict[int, int] = {}
        self.table: dict[str, dict[Any, _Checks]] = {}

    def collect(self, value: str, suffix: bool, get: _Getter, out: set[Any]) -> None:
        size = len(value)
        for length in self.lengths:
            if length <= size:
                bucket = self.table.get(value[size - length :] if suffix else value[:length])
                if bucket:
                    _collect_bucket(bucket, get, out)


class _Node(Generic[K]):
    """One level of the index: the access structures for a set of (key, predicates) entries."""

    __slots__ = ("always", "eq", "eq_multi", "placed", "prefixes", "present", "ranges", "suffixes")

    def __init__(self) -> None:
        self.placed: dict[K, tuple[Any, ...]] = {}
        self.always: dict[K, None] = {}
        self.eq: dict[str, dict[object, _Node[K]]] = {}
        self.eq_multi: dict[tuple[str, ...], dict[tuple[object, ...], _Node[K]]] = {}
        self.ranges: dict[tuple[tuple[str, bool, bool], ...], _RangeGroup] = {}
        self.prefixes: dict[str, _Affixes] = {}
        self.suffixes: dict[str, _Affixes] = {}
        self.present: dict[str, dict[K, _Checks]] = {}

    def add(self, key: K, predicates: tuple[Predicate, ...]) -> None:
        equal: dict[str, Predicate] = {}
        for p in predicates:
            if p.op is Op.EQ:
                equal.setdefault(p.attr, p)
        if equal:
            rest = tuple(p for p in predicates if equal.get(p.attr) is not p)
            names = tuple(sorted(equal))
            if len(names) == 1:
                self._add_child(key, "eq", names[0], [value_key(_scalar(equal[names[0]]))], rest)
            else:
                values = tuple(value_key(_scalar(equal[name])) for name in names)
                self._add_child(key, "eq_multi", names, [values], rest)
            return
        sets = [p for p in predicates if p.op is Op.IN]
        if sets:
            chosen = min(sets, key=lambda p: len(_members(p)))
            rest = tuple(p for p in predicates if p is not chosen)
            members = [value_key(v) for v in _members(chosen)]
            self._add_child(key, "eq", chosen.attr, members, rest)
            return
        affixes = [p for p in predicates if p.op in _AFFIX_OPS]
        if affixes:
            chosen = max(affixes, key=lambda p: len(_text(p)))
            table = self.prefixes if chosen.op is Op.PREFIX else self.suffixes
            affix = table.get(chosen.attr) or table.setdefault(chosen.attr, _Affixes())
            text = _text(chosen)
            affix.lengths[len(text)] = affix.lengths.get(len(text), 0) + 1
            checks = _checks(p for p in predicates if p is not chosen)
            affix.table.setdefault(text, {})[key] = checks
            self.placed[key] = ("affix", table, chosen.attr, text)
            return
        bounds = [p for p in predicates if p.op in _RANGE_OPS]
        if bounds:
            shape = tuple((p.attr, type(p.value) is str, p.op in _UPPER_OPS) for p in bounds)
            group = self.ranges.get(shape) or self.ranges.setdefault(shape, _RangeGroup(shape))
            entries = []
            for part, p in zip(group.parts, bounds, strict=True):
                entry = (p.value, _TIE[p.op], next(_sequence))
                part.insert(entry, key)
                entries.append(entry)
            checks = _checks(p for p in predicates if p.op not in _RANGE_OPS)
            if checks:
                group.checks[key] = checks
            self.placed[key] = ("range", shape, entries)
            return
        if predicates:
            chosen = next((p for p in predicates if p.op is Op.EXISTS), predicates[0])
            others = (p for p in predicates if p is not chosen or p.op is not Op.EXISTS)
            self.present.setdefault(chosen.attr, {})[key] = _checks(others)
            self.placed[key] = ("present", chosen.attr)
            return
        self.always[key] = None
        self.placed[key] = ("always",)

    def _add_child(
        self, key: K, kind: str, name: Any, values: list[Any], rest: tuple[Predicate, ...]
    ) -> None:
        tables: dict[Any, dict[Any, _Node[K]]] = getattr(self, kind)
        table = tables.get(name)
        if table is None:
            table = tables[name] = {}
        for value in values:
            child = table.get(value)
            if child is None:
                child = table[value] = _Node()
            child.add(key, rest)
        self.placed[key] = (kind, name, values)

    def remove(self, key: K) -> None:
        placed = self.placed.pop(key)
        kind = placed[0]
        if kind in ("eq", "eq_multi"):
            _, name, values = placed
            tables = getattr(self, kind)
            table = tables[name]
            for value in values:
                child = table[value]
                child.remove(key)
                if not child.placed:
                    del table[value]
            if not table:
                del tables[name]
        elif kind == "affix":
            _, affixes, attr, text = placed
            affix = affixes[attr]
            bucket = affix.table[text]
            del bucket[key]
            if not bucket:
                del affix.table[text]
            affix.lengths[len(text)] -= 1
            if not affix.lengths[len(text)]:
                del affix.lengths[len(text)]
            if not affix.table:
                del affixes[attr]
        elif kind == "range":
            _, shape, entries = placed
            group = self.ranges[shape]
            for part, entry in zip(group.parts, entries, strict=True):
                part.delete(entry)
            group.checks.pop(key, None)
            if not group.parts[0].keys:
                del self.ranges[shape]
        elif kind == "present":
            bucket = self.present[placed[1]]
            del bucket[key]
            if not bucket:
                del self.present[placed[1]]
        else:
            del self.always[key]

    def collect(self, attrs: Mapping[str, Value], out: set[K]) -> None:
        get = attrs.get
        if self.always:
            out.update(self.always)
        if self.eq:
            for attr, table in self.eq.items():
                value = get(attr, _MISSING)
                if value is not _MISSING:
                    child = table.get(value_key(value))
                    if child is not None:
                        child.collect(attrs, out)
        if self.eq_multi:
            for names, multi in self.eq_multi.items():
                try:
                    probe = tuple([value_key(attrs[name]) for name in names])
                except KeyError:
                    continue
                child = multi.get(probe)
                if child is not None:
                    child.collect(attrs, out)
        if self.ranges:
            for group in self.ranges.values():
                group.collect(get, out)
        if self.prefixes:
            for attr, affix in self.prefixes.items():
                value = get(attr, _MISSING)
                if value.__class__ is str:
                    affix.collect(value, False, get, out)
        if self.suffixes:
            for attr, affix in self.suffixes.items():
                value = get(attr, _MISSING)
                if value.__class__ is str:
                    affix.collect(value, True, get, out)
        if self.present:
            for attr, bucket in self.present.items():
                if attr in attrs:
                    _collect_bucket(bucket, get, out)


class MatchIndex(Generic[K]):
    """An index of filters by key that finds the filters a publication matches.

    ``match(attrs)`` returns exactly ``{k for k, f in items if f.matches(attrs)}`` without
    visiting filters that cannot match; see the module docstring for how.
    """

    def __init__(self) -> None:
        self._filters: dict[K, Filter] = {}
        self._root: _Node[K] = _Node()

    def add(self, key: K, flt: Filter) -> None:
        """Index a filter under a key, replacing the key's previous filter if any.

        Args:
            key: any hashable key, e.g. ``(hop, subscription_id)``.
            flt: the filter.
        """
        if key in self._filters:
            self._root.remove(key)
        self._filters[key] = flt
        self._root.add(key, flt.predicates)

    def remove(self, key: K) -> None:
        """Drop a key's filter; a key that is not indexed is ignored.

        Args:
            key: the key given to ``add``.
        """
        if self._filters.pop(key, None) is not None:
            self._root.remove(key)

    def match(self, attrs: Mapping[str, Value]) -> set[K]:
        """Return the keys of every filter the publication's attributes match.

        Args:
            attrs: the publication's attributes.

        Returns:
            A new set of keys.
        """
        out: set[K] = set()
        self._root.collect(attrs, out)
        return out

    def get(self, key: K) -> Filter | None:
        """Return the filter indexed under a key, or None."""
        return self._filters.get(key)

    def keys(self) -> KeysView[K]:
        """Return a live view of the indexed keys."""
        return self._filters.keys()

    def __len__(self) -> int:
        return len(self._filters)

    def __contains__(self, key: object) -> bool:
        return key in self._filters
