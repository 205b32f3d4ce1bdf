"""The filter model of content-based routing: predicates, filters, their wire and text forms.

A filter is a conjunction of predicates ``[attr, op, value]`` (SPEC §2). It serves both as a
subscription ("deliver what matches") and as an advertisement ("I only publish what matches"),
so besides ``matches`` it answers the routing questions: ``intersects`` (could one publication
match both filters?) and ``covers`` (does everything matching the other filter match this one?).

Semantics. Values are typed and types never mix: bool is not a number (``true`` is not ``1``),
int and float compare numerically, strings compare by code point. A predicate on an attribute the
publication lacks is false, and so is a predicate whose value has another type than the
attribute, ``!=`` included: ``x != 5`` means "x is a number other than 5" (a NaN attribute
satisfies it, and no other numeric predicate). Matching therefore never raises.

Limits, enforced by the parser and ``Filter.from_wire`` (the trust boundary): at most
``MAX_PREDICATES`` predicates, names and strings of at most ``MAX_STRING_LENGTH`` characters, at
most ``MAX_IN_VALUES`` values in an ``in`` set, integers within 64 bits, finite floats. An ``in``
set cannot hold both ``true`` and ``1`` (or ``false`` and ``0``): a Python set cannot keep them
apart, so such a set is rejected rather than silently merged.

Imports flow one way: this module uses :mod:`broker.language.intervals` (value sets over plain
data) and is used by :mod:`broker.language.grammar` (the parser of the text form), never the
reverse. ``str(filter)`` writes the text form here, because ``str()`` belongs to the model;
``parse_filter`` reads it back. The validation helpers (``name_problem``, ``scalar_problem``,
``value_problem``, ``in_set``) and ``OP_SYMBOLS`` are shared with the parser, so its errors say
the same; they stay out of ``__all__``. ``intersects`` and ``covers`` reason per attribute over
value sets (see :mod:`broker.language.intervals`): numbers are treated as reals, so
``intersects`` may say True for a gap no float fits in; it never says False when a publication
could match both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Final, Self, cast

from broker.errors import FilterError
from broker.language.intervals import (
    ANY_PRESENT,
    Space,
    comparison,
    containing,
    one_of,
    with_prefix,
    with_suffix,
)

__all__ = [
    "MAX_IN_VALUES",
    "MAX_PREDICATES",
    "MAX_STRING_LENGTH",
    "Filter",
    "Op",
    "Predicate",
    "Value",
    "value_key",
]

Value = str | int | float | bool

MAX_PREDICATES: Final = 64
MAX_STRING_LENGTH: Final = 1024
MAX_IN_VALUES: Final = 1024
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1


class Op(StrEnum):
    """Predicate operators; the values are the wire names."""

    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    PREFIX = "prefix"
    SUFFIX = "suffix"
    CONTAINS = "contains"
    EXISTS = "exists"
    IN = "in"


OP_SYMBOLS: Final = {Op.EQ: "=", Op.NE: "!=", Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">="}
"""The text form's symbol for each comparison; the parser also reads ``==`` as ``=``."""
_OP_RANK: Final = {op: rank for rank, op in enumerate(Op)}
_STRING_OPS: Final = frozenset({Op.PREFIX, Op.SUFFIX, Op.CONTAINS})
_ORDER_OPS: Final = frozenset({Op.LT, Op.LE, Op.GT, Op.GE})
_NUMBER_TYPES: Final = frozenset({int, float})


class _BoolKey:
    """Stands in for a bool in hash tables, where ``True`` would otherwise collide with ``1``."""

    __slots__ = ("value",)

    def __init__(self, value: bool) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"<bool {self.value}>"


_BOOL_KEYS: Final = {True: _BoolKey(True), False: _BoolKey(False)}


def value_key(value: Value) -> object:
    """Return the hash key under which values equal by filter semantics coincide.

    ``1`` and ``1.0`` share a key (they compare equal); ``True`` and ``1`` do not, because bool is
    not a number here. The matching index uses this for its hash tables.

    Args:
        value: an attribute or predicate value.

    Returns:
        The value itself, or a private stand-in for a bool.
    """
    return _BOOL_KEYS[value] if value.__class__ is bool else value


def _show(value: object) -> str:
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def scalar_problem(value: object) -> str | None:
    """Say what keeps ``value`` from being a predicate or attribute value, or None if nothing."""
    if type(value) is str:
        if len(value) > MAX_STRING_LENGTH:
            return f"string of {len(value)} characters is longer than {MAX_STRING_LENGTH}"
        return None
    if type(value) is bool:
        return None
    if type(value) is int:
        if _INT_MIN <= value <= _INT_MAX:
            return None
        return f"integer {value} does not fit in 64 bits"
    if type(value) is float:
        return None if math.isfinite(value) else f"{value!r} is not a finite number"
    return f"{_show(value)} is not a str, int, float or bool"


def name_problem(attr: object) -> str | None:
    """Say what keeps ``attr`` from being an attribute name, or None if nothing."""
    if type(attr) is not str:
        return f"attribute name must be a string, got {_show(attr)}"
    if not attr:
        return "attribute name is empty"
    if len(attr) > MAX_STRING_LENGTH:
        return f"attribute name is longer than {MAX_STRING_LENGTH} characters"
    return None


def value_problem(op: Op, value: object, label: str = "") -> str | None:
    """Say what keeps ``value`` from being the value of ``op`` (written ``label``), or None."""
    label = label or op.value
    if op is Op.EXISTS:
        return None if value is None else f"'exists' takes no value, got {_show(value)}"
    if op is Op.IN:
        if not isinstance(value, frozenset):
            return f"'in' needs a set of values, got {_show(value)}"
        if not value:
            return "'in' needs at least one value"
        if len(value) > MAX_IN_VALUES:
            return f"'in' takes at most {MAX_IN_VALUES} values, got {len(value)}"
        for item in value:
            problem = scalar_problem(item)
            if problem:
                return f"'in' value {problem}"
        return None
    problem = scalar_problem(value)
    if problem:
        return problem
    if op in _STRING_OPS and type(value) is not str:
        return f"'{label}' needs a string, got {_show(value)}"
    if op in _ORDER_OPS and type(value) is bool:
        return f"'{label}' needs a number or a string, got {_show(value)}"
    return None


def in_set(items: Iterable[object]) -> tuple[frozenset[Value], str | None]:
    """Build an ``in`` set from a sequence, refusing the bool/number merges a set would do."""
    values = list(items)
    if len(values) > MAX_IN_VALUES:
        return frozenset(), f"'in' takes at most {MAX_IN_VALUES} values, got {len(values)}"
    for item in values:
        problem = scalar_problem(item)
        if problem:
            return frozenset(), f"'in' value {problem}"
    bools = {item for item in values if type(item) is bool}
    if any(type(item) is not bool and item in bools for item in values):
        return frozenset(), "'in' cannot mix true/false with the numbers 1/0"
    # Every item passed scalar_problem above.
    return frozenset(cast("list[Value]", values)), None


def _compile(op: Op, value: Any) -> Callable[[Any], bool]:
    """Build the value test of a predicate once, so matching does no dispatch on ``op``."""
    nums = _NUMBER_TYPES
    if op is Op.EXISTS:
        return lambda x: True
    if op is Op.IN:
        keys = frozenset(value_key(item) for item in value)
        bool_keys = _BOOL_KEYS
        return lambda x: (bool_keys[x] if x.__class__ is bool else x) in keys
    if op is Op.PREFIX:
        return lambda x: x.__class__ is str and x.startswith(value)
    if op is Op.SUFFIX:
        return lambda x: x.__class__ is str and x.endswith(value)
    if op is Op.CONTAINS:
        return lambda x: x.__class__ is str and value in x
    if type(value) is bool:
        if op is Op.EQ:
            return lambda x: x is value
        return lambda x: x.__class__ is bool and x is not value
    if type(value) is str:
        tests: dict[Op, Callable[[Any], bool]] = {
            Op.EQ: lambda x: x == value,
            Op.NE: lambda x: x.__class__ is str and x != value,
            Op.LT: lambda x: x.__class__ is str and x < value,
            Op.LE: lambda x: x.__class__ is str and x <= value,
            Op.GT: lambda x: x.__class__ is str and x > value,
            Op.GE: lambda x: x.__class__ is str and x >= value,
        }
    else:
        tests = {
            Op.EQ: lambda x: x == value and x.__class__ is not bool,
            Op.NE: lambda x: x.__class__ in nums and x != value,
            Op.LT: lambda x: x.__class__ in nums and x < value,
            Op.LE: lambda x: x.__class__ in nums and x <= value,
            Op.GT: lambda x: x.__class__ in nums and x > value,
            Op.GE: lambda x: x.__class__ in nums and x >= value,
        }
    return tests[op]


def _identity(op: Op, value: Any) -> object:
    if op is Op.IN:
        return frozenset(value_key(item) for item in value)
    return None if value is None else value_key(value)


def _scalar_order(value: Value) -> tuple[int, Any]:
    kind = type(value)
    return (0, int(value)) if kind is bool else (2, value) if kind is str else (1, value)


@dataclass(frozen=True, slots=True)
class Predicate:
    """One test ``attr op value`` on a publication's attributes.

    ``value`` is None only for ``Op.EXISTS`` and a non-empty frozenset only for ``Op.IN``.
    Construction validates the value against the operator and raises ``FilterError``; ``op`` may
    be given as its wire name and an ``in`` value as any iterable.

    Attributes:
        test: the predicate applied to one attribute value (present, any type); what ``matches``
            calls after looking the attribute up. The matching index calls it directly.
    """

    attr: str
    op: Op
    value: Value | frozenset[Value] | None
    test: Callable[[Value], bool] = field(init=False, repr=False, compare=False)
    # Keeps `x = true` and `x = 1` apart: dataclass equality alone says True == 1.
    _identity: object = field(init=False, repr=False)

    def __post_init__(self) -> None:
        op = self.op
        if not isinstance(op, Op):
            try:
                op = Op(op)
            except ValueError:
                raise FilterError(f"unknown operator {_show(op)}") from None
            object.__setattr__(self, "op", op)
        value = self.value
        problem = name_problem(self.attr)
        if problem is None and op is Op.IN and isinstance(value, list | tuple | set):
            value, problem = in_set(value)
            object.__setattr__(self, "value", value)
        problem = problem or value_problem(op, value)
        if problem:
            raise FilterError(problem)
        object.__setattr__(self, "test", _compile(op, value))
        object.__setattr__(self, "_identity", _identity(op, value))

    def __reduce__(self) -> tuple[Any, ...]:
        # The compiled test is a closure, which pickle cannot carry; rebuild it instead.
        return (Predicate, (self.attr, self.op, self.value))

    def matches(self, attrs: Mapping[str, Value]) -> bool:
        """Tell whether a publication's attributes satisfy this predicate.

        Args:
            attrs: the publication's attributes.

        Returns:
            False when the attribute is missing or of another type; never raises.
        """
        value = attrs.get(self.attr, _MISSING)
        return value is not _MISSING and self.test(value)

    def sort_key(self) -> tuple[Any, ...]:
        """Return the key of the canonical predicate order inside a ``Filter``."""
        value = self.value
        if value is None:
            order: Any = ()
        elif isinstance(value, frozenset):
            order = tuple(sorted(_scalar_order(item) for item in value))
        else:
            order = _scalar_order(value)
        return (self.attr, _OP_RANK[self.op], order)

    def to_wire(self) -> list[Any]:
        """Return the wire form ``[attr, op, value]`` (an ``in`` set as a sorted list)."""
        value = self.value
        if isinstance(value, frozenset):
            return [self.attr, self.op.value, sorted(value, key=_scalar_order)]
        return [self.attr, self.op.value, value]

    def __str__(self) -> str:
        name = _format_name(self.attr)
        op, value = self.op, self.value
        if op is Op.EXISTS:
            return f"{name} exists"
        if isinstance(value, frozenset):
            items = ", ".join(_format_value(item) for item in sorted(value, key=_scalar_order))
            return f"{name} in ({items})"
        assert value is not None
        return f"{name} {OP_SYMBOLS.get(op, op.value)} {_format_value(value)}"


class _Missing(Enum):
    MISSING = "missing"


# What ``attrs.get`` returns for an absent attribute; an enum member, so the type checker
# narrows ``value is _MISSING`` away.
_MISSING: Final = _Missing.MISSING


@dataclass(frozen=True, slots=True)
class Filter:
    """A conjunction of predicates; the empty conjunction matches every publication.

    The predicates are kept sorted and free of duplicates, so filters that mean the same
    conjunction written in another order compare and hash equal. Several predicates may test one
    attribute (``price > 10 and price <= 20``).
    """

    predicates: tuple[Predicate, ...] = ()
    _spaces: dict[str, Space] | None = field(default=None, init=False, repr=False, compare=False)
    _satisfiable: bool | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        predicates = tuple(self.predicates)
        for index, predicate in enumerate(predicates):
            if not isinstance(predicate, Predicate):
                raise FilterError(
                    f"predicate {index}: expected a Predicate, got {_show(predicate)}"
                )
        canonical = tuple(dict.fromkeys(sorted(predicates, key=Predicate.sort_key)))
        object.__setattr__(self, "predicates", canonical)

    def matches(self, attrs: Mapping[str, Value]) -> bool:
        """Tell whether a publication's attributes satisfy every predicate.

        Args:
            attrs: the publication's attributes.

        Returns:
            True when all predicates hold (always for the empty filter); never raises.
        """
        get = attrs.get
        for predicate in self.predicates:
            value = get(predicate.attr, _MISSING)
            if value is _MISSING or not predicate.test(value):
                return False
        return True

    def is_satisfiable(self) -> bool:
        """Tell whether some publication could match, e.g. False for ``x > 5 and x < 3``.

        Returns:
            False only when no publication can match (reasoning over real numbers).
        """
        satisfiable = self._satisfiable
        if satisfiable is None:
            spaces = self._attribute_spaces().values()
            satisfiable = not any(space.is_empty() for space in spaces)
            object.__setattr__(self, "_satisfiable", satisfiable)
        return satisfiable

    def unsatisfiable_reason(self) -> str | None:
        """Say why no publication can match this filter, or None when one can.

        Names the attribute and its predicates; when they want values of different types
        (``price > 'abc' and price < 5``), names the two predicates and their types.
        """
        if self.is_satisfiable():
            return None
        for attr, space in sorted(self._attribute_spaces().items()):
            if not space.is_empty():
                continue
            tests = [p for p in self.predicates if p.attr == attr]
            for i, a in enumerate(tests):
                for b in tests[i + 1 :]:
                    if not _kinds_of(a) & _kinds_of(b):
                        return (
                            f"{a} needs {_describe(_kinds_of(a))}, {b} needs "
                            f"{_describe(_kinds_of(b))}; no value of {_format_name(attr)} is both"
                        )
            shown = ", ".join(str(p) for p in tests)
            return f"no value of {_format_name(attr)} satisfies all of: {shown}"
        return "no publication can match"  # pragma: no cover - an empty space was found above

    def require_satisfiable(self) -> Self:
        """Return this filter, or refuse one that no publication can ever match.

        Raises:
            FilterError: saying which attribute's predicates contradict each other and why.
        """
        reason = self.unsatisfiable_reason()
        if reason is not None:
            raise FilterError(f"unsatisfiable filter, it can never match: {reason}")
        return self

    def intersects(self, other: Filter) -> bool:
        """Tell whether some publication could match both filters (advertisement vs subscription).

        Args:
            other: the other filter.

        Returns:
            False only when no publication can match both; exact except for number gaps no
            float fits in.
        """
        mine, theirs = self._attribute_spaces(), other._attribute_spaces()
        for attr in mine.keys() | theirs.keys():
            a, b = mine.get(attr), theirs.get(attr)
            space = b if a is None else a if b is None else a.meet(b)
            assert space is not None
            if space.is_empty():
                return False
        return True

    def covers(self, other: Filter) -> bool:
        """Tell whether every publication matching ``other`` also matches this filter.

        Args:
            other: the filter that may be covered.

        Returns:
            True only when the covering is certain; exact for ranges, eq, ne, in, exists and
            prefixes, and sound (possibly False when unsure) when suffix/contains interact.
        """
        mine, theirs = self._attribute_spaces(), other._attribute_spaces()
        if not mine.keys() <= theirs.keys() or not other.is_satisfiable():
            # Every predicate rejects a missing attribute, so other must test all of ours.
            return not other.is_satisfiable()
        return all(theirs[a] == space or theirs[a].within(space) for a, space in mine.items())

    def pins(self) -> frozenset[tuple[str, str, Value]]:
        """The attributes this filter pins to a single value, as (attribute, kind, value);
        kind (``b``, ``n`` or ``s``) keeps ``True``, ``1`` and ``'1'`` apart."""
        found: list[tuple[str, str, Value]] = []
        for attr, space in self._attribute_spaces().items():
            value = space.single_value()
            if value is not None:
                kind = "b" if isinstance(value, bool) else "s" if isinstance(value, str) else "n"
                found.append((attr, kind, value))
        return frozenset(found)

    def to_wire(self) -> list[list[Any]]:
        """Return the wire form: a list of ``[attr, op, value]`` in canonical order."""
        return [predicate.to_wire() for predicate in self.predicates]

    @classmethod
    def from_wire(cls, data: object) -> Filter:
        """Validate and build a filter from its decoded wire form.

        Args:
            data: a list (or tuple) of ``[attr, op, value]`` lists, as msgpack decodes them.

        Returns:
            The filter.

        Raises:
            FilterError: naming the offending predicate by its 0-based index, or saying why
                the filter can never match (see ``require_satisfiable``).
        """
        if not isinstance(data, list | tuple):
            raise FilterError(f"a filter must be a list of predicates, got {_show(data)}")
        if len(data) > MAX_PREDICATES:
            raise FilterError(f"a filter has at most {MAX_PREDICATES} predicates, got {len(data)}")
        predicates = []
        for index, item in enumerate(data):
            if not isinstance(item, list | tuple) or len(item) != 3:
                raise FilterError(
                    f"predicate {index}: must be a list [attr, op, value], got {_show(item)}"
                )
            attr, name, value = item
            problem = name_problem(attr)
            if problem is None:
                if type(name) is not str or name not in _OP_NAMES:
                    problem = f"unknown operator {_show(name)}; expected one of {', '.join(Op)}"
                else:
                    op = Op(name)
                    if op is Op.IN:
                        if isinstance(value, list | tuple):
                            value, problem = in_set(value)
                        else:
                            problem = f"'in' needs a list of values, got {_show(value)}"
                    problem = problem or value_problem(op, value)
            if problem:
                raise FilterError(f"predicate {index}: {problem}")
            predicates.append(Predicate(attr, op, value))
        return cls(tuple(predicates)).require_satisfiable()

    def __str__(self) -> str:
        if not self.predicates:
            return "*"
        return " and ".join(str(predicate) for predicate in self.predicates)

    def _attribute_spaces(self) -> dict[str, Space]:
        spaces = self._spaces
        if spaces is None:
            spaces = {}
            for predicate in self.predicates:
                space = _space_of(predicate)
                known = spaces.get(predicate.attr)
                spaces[predicate.attr] = space if known is None else known.meet(space)
            object.__setattr__(self, "_spaces", spaces)
        return spaces


_OP_NAMES: Final = frozenset(op.value for op in Op)

# ---------------------------------------------------------------------------------------------
# Text form, written by str(); broker.language.grammar reads it back.

# The grammar's name token: names it matches are written bare, others in backticks.
_NAME_RE: Final = re.compile(r"[^\W\d][\w.\-/]*")
_FORMAT_ESCAPES: Final = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}


def _quote(text: str, quote: str) -> str:
    out = []
    for char in text:
        if char == quote:
            out.append("\\" + char)
        elif char in _FORMAT_ESCAPES:
            out.append(_FORMAT_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        else:
            point = ord(char)
            if point < 0x100:
                out.append(f"\\x{point:02x}")
            elif point < 0x10000:
                out.append(f"\\u{point:04x}")
            else:
                out.append(f"\\U{point:08x}")
    return quote + "".join(out) + quote


def _format_name(name: str) -> str:
    return name if _NAME_RE.fullmatch(name) else _quote(name, "`")


def _format_value(value: Value) -> str:
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is str:
        return _quote(value, "'")
    return repr(value)


# ---------------------------------------------------------------------------------------------
# Reasoning: the value set of each predicate, met per attribute by Filter._attribute_spaces.


_KIND_NAMES: Final = {bool: "a boolean", str: "a string", float: "a number"}
_ALL_KINDS: Final = frozenset(_KIND_NAMES)


def _kind(value: Value) -> type:
    return bool if isinstance(value, bool) else str if isinstance(value, str) else float


def _kinds_of(predicate: Predicate) -> frozenset[type]:
    """The value types a predicate admits (``exists`` admits all of them)."""
    value = predicate.value
    if value is None:
        return _ALL_KINDS
    if isinstance(value, frozenset):
        return frozenset(_kind(v) for v in value)
    return frozenset((_kind(value),))


def _describe(kinds: frozenset[type]) -> str:
    return " or ".join(name for kind, name in _KIND_NAMES.items() if kind in kinds)


def _space_of(predicate: Predicate) -> Space:
    op, value = predicate.op, predicate.value
    if value is None:  # exists
        return ANY_PRESENT
    if isinstance(value, frozenset):
        return one_of(value)
    if isinstance(value, str):
        if op is Op.PREFIX:
            return with_prefix(value)
        if op is Op.SUFFIX:
            return with_suffix(value)
        if op is Op.CONTAINS:
            return containing(value)
    return comparison(op.value, value)
