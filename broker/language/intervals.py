r"""The set of values one attribute may take under a conjunction of predicates.

Reasoning between filters is per attribute, because a publication's attributes are independent:
each attribute's predicates describe a set of values (absent, bools, unions of numeric or string
intervals, plus suffix/contains patterns), and set emptiness and inclusion are decided on those.
Numbers are treated as reals, so an intersection may look non-empty for a gap no float fits in;
it never looks empty when a value fits.

An interval is ``(low, low_inclusive, high, high_inclusive)`` with None for an open end. Sets of
numbers or strings are tuples of disjoint intervals in ascending order. Numbers are reals;
strings are discrete (the successor of ``s`` is ``s + "\0"``), which the emptiness test accounts
for.

This module works on plain values and knows nothing of predicates: :mod:`broker.language.filters`
builds one :class:`Space` per predicate with the constructors below, meets the spaces of the
predicates on one attribute, and asks :meth:`Space.is_empty` and :meth:`Space.within`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Final, TypeVar

__all__ = [
    "ANY_PRESENT",
    "Space",
    "comparison",
    "containing",
    "one_of",
    "with_prefix",
    "with_suffix",
]

_Scalar = str | int | float | bool
_T = TypeVar("_T", str, float)
_Interval = tuple[_T | None, bool, _T | None, bool]
_ALL_NUMBERS: Final[_Interval[float]] = (None, False, None, False)
_ALL_STRINGS: Final[_Interval[str]] = (None, False, None, False)
_NO_STRINGS: Final[frozenset[str]] = frozenset()
_BOTH_BOOLS: Final = frozenset((True, False))
_MAX_CHAR: Final = chr(0x10FFFF)


def _number_nonempty(interval: _Interval[float]) -> bool:
    low, low_in, high, high_in = interval
    if low is None or high is None:
        return True
    return low < high or (low == high and low_in and high_in)


def _string_floor(interval: _Interval[str]) -> str:
    low, low_in = interval[0], interval[1]
    return "" if low is None else low if low_in else low + "\0"


def _string_nonempty(interval: _Interval[str]) -> bool:
    high = interval[2]
    if high is None:
        return True
    floor = _string_floor(interval)
    return floor < high or (floor == high and interval[3])


def _intersect_one(a: _Interval[_T], b: _Interval[_T]) -> _Interval[_T]:
    a_low, a_low_in, a_high, a_high_in = a
    b_low, b_low_in, b_high, b_high_in = b
    if a_low is None or (b_low is not None and b_low > a_low):
        low, low_in = b_low, b_low_in
    elif b_low is None or a_low > b_low:
        low, low_in = a_low, a_low_in
    else:
        low, low_in = a_low, a_low_in and b_low_in
    if a_high is None or (b_high is not None and b_high < a_high):
        high, high_in = b_high, b_high_in
    elif b_high is None or a_high < b_high:
        high, high_in = a_high, a_high_in
    else:
        high, high_in = a_high, a_high_in and b_high_in
    return (low, low_in, high, high_in)


def _intersect(
    a: tuple[_Interval[_T], ...],
    b: tuple[_Interval[_T], ...],
    nonempty: Callable[[_Interval[_T]], bool],
) -> tuple[_Interval[_T], ...]:
    pieces = (_intersect_one(x, y) for x in a for y in b)
    return tuple(piece for piece in pieces if nonempty(piece))


def _complement(intervals: tuple[_Interval[_T], ...]) -> tuple[_Interval[_T], ...]:
    gaps: list[_Interval[_T]] = []
    low: _T | None = None
    low_in = False
    for start, start_in, end, end_in in intervals:
        if start is not None:
            gaps.append((low, low_in, start, not start_in))
        if end is None:
            return tuple(gaps)
        low, low_in = end, not end_in
    gaps.append((low, low_in, None, False))
    return tuple(gaps)


def _holds(interval: _Interval[_T], value: _T) -> bool:
    low, low_in, high, high_in = interval
    above = low is None or low < value or (low_in and low == value)
    return above and (high is None or value < high or (high_in and value == high))


def _prefix_interval(prefix: str) -> _Interval[str]:
    stem = prefix.rstrip(_MAX_CHAR)
    if not stem:
        return (prefix, True, None, False)
    return (prefix, True, stem[:-1] + chr(ord(stem[-1]) + 1), False)


def _finite_strings(interval: _Interval[str]) -> list[str] | None:
    """List a string interval's members when there are finitely many (``s``, ``s+"\\0"``, ...)."""
    high = interval[2]
    floor = _string_floor(interval)
    if high is None or not high.startswith(floor) or high[len(floor) :].strip("\0"):
        return None
    members = [floor + "\0" * n for n in range(len(high) - len(floor) + 1)]
    return members if interval[3] else members[:-1]


def _cone(interval: _Interval[str]) -> str:
    """Return a prefix all of whose extensions lie in an infinite string interval."""
    floor, high = _string_floor(interval), interval[2]
    if high is None or not high.startswith(floor):
        return floor
    rest = high[len(floor) :]
    first_nonzero = len(rest) - len(rest.lstrip("\0"))
    return floor + "\0" * (first_nonzero + 1)


def _fixed_prefix(interval: _Interval[str]) -> str:
    """Return the longest prefix every member of a string interval starts with."""
    floor = _string_floor(interval)
    for size in range(len(floor), 0, -1):
        cone = _prefix_interval(floor[:size])
        if not _intersect((interval,), _complement((cone,)), _string_nonempty):
            return floor[:size]
    return ""


def _longest_suffix(suffixes: frozenset[str]) -> str | None:
    """Return the suffix implying all others, or None if no string ends with all of them."""
    longest = max(suffixes, key=len, default="")
    return longest if all(longest.endswith(s) for s in suffixes) else None


@dataclass(frozen=True, slots=True)
class Space:
    """The values one attribute may take: absent, bools, numbers (and NaN), strings.

    Strings are those in ``strings`` that also end with every one of ``suffixes`` and contain
    every one of ``contains``. Spaces compare equal when built the same way, which is a cheap
    sufficient test of equality as sets.
    """

    missing: bool
    bools: frozenset[bool]
    numbers: tuple[_Interval[float], ...]
    nan: bool
    strings: tuple[_Interval[str], ...]
    suffixes: frozenset[str]
    contains: frozenset[str]

    def meet(self, other: Space) -> Space:
        """Return the values in both spaces (two predicates on one attribute)."""
        return Space(
            self.missing and other.missing,
            self.bools & other.bools,
            _intersect(self.numbers, other.numbers, _number_nonempty),
            self.nan and other.nan,
            _intersect(self.strings, other.strings, _string_nonempty),
            self.suffixes | other.suffixes,
            self.contains | other.contains,
        )

    def is_empty(self) -> bool:
        """Tell whether no value at all is in the space."""
        if self.missing or self.bools or self.nan:
            return False
        if any(_number_nonempty(interval) for interval in self.numbers):
            return False
        return self._string_witness() is None

    def within(self, other: Space) -> bool:
        """Tell whether every value in this space is in ``other``.

        Exact for ranges, finite sets and prefixes; sound (False when unsure) once suffix or
        contains patterns interact.
        """
        points = self._points()
        if points is not None:
            return all(other._has_value(value) for value in points)
        if self.is_empty():
            return True
        if (self.missing and not other.missing) or not self.bools <= other.bools:
            return False
        if self.nan and not other.nan:
            return False
        if _intersect(self.numbers, _complement(other.numbers), _number_nonempty):
            return False
        return self._strings_within(other)

    def _string_witness(self) -> str | None:
        suffix = _longest_suffix(self.suffixes)
        if suffix is None:
            return None
        for interval in self.strings:
            if not _string_nonempty(interval):
                continue
            members = _finite_strings(interval)
            if members is None:
                return _cone(interval) + "".join(sorted(self.contains)) + suffix
            for member in members:
                if self._has_pattern(member):
                    return member
        return None

    def _has_pattern(self, text: str) -> bool:
        return all(text.endswith(s) for s in self.suffixes) and all(
            c in text for c in self.contains
        )

    def _has_string(self, text: str) -> bool:
        return any(_holds(i, text) for i in self.strings) and self._has_pattern(text)

    def single_value(self) -> _Scalar | None:
        """The one value of a space that holds exactly one (from ``=``, a one-value ``in``,
        or a closed range of width 0), else None."""
        points = self._points()
        return points[0] if points is not None and len(points) == 1 else None

    def _points(self) -> list[_Scalar] | None:
        """List the values when the space is a plain finite set (from =, in), else None."""
        if self.missing or self.nan or self.suffixes or self.contains:
            return None
        values: list[_Scalar] = [*self.bools]
        for low, low_in, high, high_in in (*self.numbers, *self.strings):
            if low is None or high is None or not (low_in and high_in and low == high):
                return None
            values.append(low)
        return values

    def _has_value(self, value: _Scalar) -> bool:
        # Spaces hold values of exactly these types (predicates reject subclasses).
        if isinstance(value, bool):
            return value in self.bools
        if isinstance(value, str):
            return self._has_string(value)
        return any(_holds(interval, value) for interval in self.numbers)

    def _strings_within(self, other: Space) -> bool:
        suffix = _longest_suffix(self.suffixes)
        if suffix is None:
            return True
        outside = _complement(other.strings)
        for interval in self.strings:
            if not _string_nonempty(interval):
                continue
            members = _finite_strings(interval)
            if members is not None:
                if any(self._has_pattern(m) and not other._has_string(m) for m in members):
                    return False
                continue
            escaped = replace(self, strings=_intersect((interval,), outside, _string_nonempty))
            if escaped._string_witness() is not None:
                return False
            if not all(suffix.endswith(s) for s in other.suffixes):
                return False
            known = (_fixed_prefix(interval), *self.contains, *self.suffixes)
            if not all(any(c in k for k in known) for c in other.contains):
                return False
        return True


_NOTHING: Final = Space(False, frozenset(), (), False, (), _NO_STRINGS, _NO_STRINGS)

ANY_PRESENT: Final = Space(
    False, _BOTH_BOOLS, (_ALL_NUMBERS,), True, (_ALL_STRINGS,), _NO_STRINGS, _NO_STRINGS
)
"""Every value of every type, NaN included, but not absence (``exists``)."""


def one_of(values: Collection[_Scalar]) -> Space:
    """Return the space holding exactly ``values`` (``=`` on one value, ``in`` on several).

    Args:
        values: values of exactly the types str, int, float, bool; bools never equal numbers.
    """
    numbers = sorted(v for v in values if isinstance(v, int | float) and not isinstance(v, bool))
    strings = sorted(v for v in values if isinstance(v, str))
    return replace(
        _NOTHING,
        bools=frozenset(v for v in values if isinstance(v, bool)),
        numbers=tuple((v, True, v, True) for v in numbers),
        strings=tuple((v, True, v, True) for v in strings),
    )


def comparison(relation: str, value: _Scalar) -> Space:
    """Return the values ``x`` of the type of ``value`` with ``x <relation> value``.

    Args:
        relation: one of ``eq ne lt le gt ge``; a bool only takes ``eq`` and ``ne``.
        value: the value compared with. ``ne`` on a number also admits NaN, as ``!=`` does.
    """
    if isinstance(value, bool):
        return replace(_NOTHING, bools=frozenset((value if relation == "eq" else not value,)))
    if isinstance(value, str):
        return replace(_NOTHING, strings=_ordered(relation, value))
    return replace(_NOTHING, numbers=_ordered(relation, value), nan=relation == "ne")


def with_prefix(prefix: str) -> Space:
    """Return the strings starting with ``prefix``."""
    return replace(_NOTHING, strings=(_prefix_interval(prefix),))


def with_suffix(suffix: str) -> Space:
    """Return the strings ending with ``suffix``."""
    return replace(_NOTHING, strings=(_ALL_STRINGS,), suffixes=frozenset((suffix,)))


def containing(text: str) -> Space:
    """Return the strings containing ``text``."""
    return replace(_NOTHING, strings=(_ALL_STRINGS,), contains=frozenset((text,)))


def _ordered(relation: str, value: _T) -> tuple[_Interval[_T], ...]:
    intervals: dict[str, tuple[_Interval[_T], ...]] = {
        "eq": ((value, True, value, True),),
        "ne": ((None, False, value, False), (value, False, None, False)),
        "lt": ((None, False, value, False),),
        "le": ((None, False, value, True),),
        "gt": ((value, False, None, False),),
        "ge": ((value, True, None, False),),
    }
    return intervals[relation]
