r"""The filter language of content-based routing: predicates, their text and wire forms.

A filter is a conjunction of predicates ``[attr, op, value]`` (SPEC §2). It serves both as a
subscription ("deliver what matches") and as an advertisement ("I only publish what matches"),
so besides ``matches`` it answers the routing questions: ``intersects`` (could one publication
match both filters?) and ``covers`` (does everything matching the other filter match this one?).

Text form, read by ``parse_filter`` and written by ``str(filter)``::

    filter     := '*' | predicate ('and' predicate)*
    predicate  := name ('=' | '==' | '!=' | '<' | '<=' | '>' | '>=') value
                | name ('prefix' | 'suffix' | 'contains') string
                | name 'in' '(' value (',' value)* ')'
                | name 'exists'
    name       := letter-or-_ (letter | digit | _ . - /)*   or   `any text in backticks`
    value      := string | number | 'true' | 'false'

Keywords are case-insensitive. Strings take single or double quotes and the escapes
``\\ \' \" \` \n \r \t \0 \xHH \uHHHH \UHHHHHHHH``. ``*`` is the empty conjunction, which
matches every publication; empty text is rejected, so subscribing to everything is always a
deliberate choice.

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

Reasoning between filters is per attribute, because a publication's attributes are independent:
each attribute's predicates describe a set of values (absent, bools, unions of numeric or string
intervals, plus suffix/contains patterns), and set emptiness and inclusion are decided on those.
Numbers are treated as reals, so ``intersects`` may say True for a gap no float fits in; it
never says False when a publication could match both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Final, NamedTuple

from broker.errors import FilterError, FilterSyntaxError

__all__ = [
    "MAX_IN_VALUES",
    "MAX_PREDICATES",
    "MAX_STRING_LENGTH",
    "Filter",
    "Op",
    "Predicate",
    "Value",
    "parse_attrs",
    "parse_filter",
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


_SYMBOLS: Final = {Op.EQ: "=", Op.NE: "!=", Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">="}
_OPS_BY_SYMBOL: Final = {"==": Op.EQ, **{symbol: op for op, symbol in _SYMBOLS.items()}}
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


def _scalar_problem(value: object) -> str | None:
    kind = type(value)
    if kind is str:
        if len(value) > MAX_STRING_LENGTH:  # type: ignore[arg-type]
            return f"string of {len(value)} characters is longer than {MAX_STRING_LENGTH}"  # type: ignore[arg-type]
        return None
    if kind is bool:
        return None
    if kind is int:
        if _INT_MIN <= value <= _INT_MAX:  # type: ignore[operator]
            return None
        return f"integer {value} does not fit in 64 bits"
    if kind is float:
        return None if math.isfinite(value) else f"{value!r} is not a finite number"  # type: ignore[arg-type]
    return f"{_show(value)} is not a str, int, float or bool"


def _name_problem(attr: object) -> str | None:
    if type(attr) is not str:
        return f"attribute name must be a string, got {_show(attr)}"
    if not attr:
        return "attribute name is empty"
    if len(attr) > MAX_STRING_LENGTH:
        return f"attribute name is longer than {MAX_STRING_LENGTH} characters"
    return None


def _value_problem(op: Op, value: object, label: str = "") -> str | None:
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
            problem = _scalar_problem(item)
            if problem:
                return f"'in' value {problem}"
        return None
    problem = _scalar_problem(value)
    if problem:
        return problem
    if op in _STRING_OPS and type(value) is not str:
        return f"'{label}' needs a string, got {_show(value)}"
    if op in _ORDER_OPS and type(value) is bool:
        return f"'{label}' needs a number or a string, got {_show(value)}"
    return None


def _in_set(items: Iterable[object]) -> tuple[frozenset[Value], str | None]:
    """Build an ``in`` set from a sequence, refusing the bool/number merges a set would do."""
    values = list(items)
    if len(values) > MAX_IN_VALUES:
        return frozenset(), f"'in' takes at most {MAX_IN_VALUES} values, got {len(values)}"
    for item in values:
        problem = _scalar_problem(item)
        if problem:
            return frozenset(), f"'in' value {problem}"
    bools = {item for item in values if type(item) is bool}
    if any(type(item) is not bool and item in bools for item in values):
        return frozenset(), "'in' cannot mix true/false with the numbers 1/0"
    return frozenset(values), None  # type: ignore[arg-type]


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
        problem = _name_problem(self.attr)
        if problem is None and op is Op.IN and isinstance(value, list | tuple | set):
            value, problem = _in_set(value)
            object.__setattr__(self, "value", value)
        problem = problem or _value_problem(op, value)
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
        return f"{name} {_SYMBOLS.get(op, op.value)} {_format_value(value)}"


_MISSING: Final = object()


@dataclass(frozen=True, slots=True)
class Filter:
    """A conjunction of predicates; the empty conjunction matches every publication.

    The predicates are kept sorted and free of duplicates, so filters that mean the same
    conjunction written in another order compare and hash equal. Several predicates may test one
    attribute (``price > 10 and price <= 20``).
    """

    predicates: tuple[Predicate, ...] = ()
    _spaces: dict[str, _Space] | None = field(default=None, init=False, repr=False, compare=False)
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
            FilterError: naming the offending predicate by its 0-based index.
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
            problem = _name_problem(attr)
            if problem is None:
                if type(name) is not str or name not in _OP_NAMES:
                    problem = f"unknown operator {_show(name)}; expected one of {', '.join(Op)}"
                else:
                    op = Op(name)
                    if op is Op.IN:
                        if isinstance(value, list | tuple):
                            value, problem = _in_set(value)
                        else:
                            problem = f"'in' needs a list of values, got {_show(value)}"
                    problem = problem or _value_problem(op, value)
            if problem:
                raise FilterError(f"predicate {index}: {problem}")
            predicates.append(Predicate(attr, op, value))
        return cls(tuple(predicates))

    def __str__(self) -> str:
        if not self.predicates:
            return "*"
        return " and ".join(str(predicate) for predicate in self.predicates)

    def _attribute_spaces(self) -> dict[str, _Space]:
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
# Text form: lexer, parser, formatter.

_NAME_RE: Final = re.compile(r"[^\W\d][\w.\-/]*")
_TOKEN_RE: Final = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<number>-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![\w.]))
  | (?P<name>[^\W\d][\w.\-/]*)
  | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<quoted>`(?:[^`\\]|\\.)*`)
  | (?P<symbol>==|!=|<=|>=|[=<>(),*])
  | (?P<unclosed>['"`])
  | (?P<bad>[^\s'"`(),=<>!*]+|.)
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPES: Final = {
    "\\": "\\",
    "'": "'",
    '"': '"',
    "`": "`",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "0": "\0",
}
_HEX_ESCAPES: Final = {"x": 2, "u": 4, "U": 8}
_FORMAT_ESCAPES: Final = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}
_OPERATOR_WORDS: Final = {"prefix": Op.PREFIX, "suffix": Op.SUFFIX, "contains": Op.CONTAINS}
_EXPECTED_OPERATOR: Final = "an operator (= != < <= > >= prefix suffix contains in exists)"


class _Token(NamedTuple):
    kind: str
    text: str
    pos: int
    value: Any = None


def _unescape(text: str, start: int, end: int) -> str:
    """Decode the body ``text[start:end]`` of a quoted token, reporting bad escapes in place."""
    body = text[start:end]
    if "\\" not in body:
        return body
    out: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        code = body[i + 1]
        if code in _ESCAPES:
            out.append(_ESCAPES[code])
            i += 2
            continue
        width = _HEX_ESCAPES.get(code, 0)
        digits = body[i + 2 : i + 2 + width]
        if width and len(digits) == width and all(c in "0123456789abcdefABCDEF" for c in digits):
            point = int(digits, 16)
            if point <= 0x10FFFF:
                out.append(chr(point))
                i += 2 + width
                continue
        escape = body[i : i + 2 + width] if width else body[i : i + 2]
        pos = start + i
        raise FilterSyntaxError(f"invalid escape {escape!r} at position {pos}", text, pos, escape)
    return "".join(out)


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        assert match is not None
        kind = match.lastgroup
        assert kind is not None
        lexeme = match.group()
        if kind == "unclosed":
            raise FilterSyntaxError(
                f"unterminated string starting at position {pos}", text, pos, text[pos:]
            )
        if kind in {"string", "quoted"}:
            tokens.append(_Token(kind, lexeme, pos, _unescape(text, pos + 1, match.end() - 1)))
        elif kind == "number":
            is_float = any(c in lexeme for c in ".eE")
            tokens.append(_Token(kind, lexeme, pos, float(lexeme) if is_float else int(lexeme)))
        elif kind != "space":
            tokens.append(_Token(kind, lexeme, pos))
        pos = match.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


class _Parser:
    """Recursive descent over the token list; every error names the token and its position."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.index = 0

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def advance(self) -> _Token:
        token = self.tokens[self.index]
        if token.kind != "end":
            self.index += 1
        return token

    def error(self, token: _Token, expected: str) -> FilterSyntaxError:
        if token.kind == "end":
            message = f"unexpected end of input at position {token.pos}: expected {expected}"
        else:
            message = (
                f"unexpected token {token.text!r} at position {token.pos}: expected {expected}"
            )
        return FilterSyntaxError(message, self.text, token.pos, token.text)

    def invalid(self, token: _Token, problem: str) -> FilterSyntaxError:
        return FilterSyntaxError(
            f"invalid value at position {token.pos}: {problem}", self.text, token.pos, token.text
        )

    def expect_symbol(self, symbol: str) -> _Token:
        token = self.advance()
        if token.kind != "symbol" or token.text != symbol:
            raise self.error(token, repr(symbol))
        return token

    def name(self) -> str:
        token = self.advance()
        if token.kind not in ("name", "quoted"):
            raise self.error(token, "an attribute name")
        name = token.value if token.kind == "quoted" else token.text
        problem = _name_problem(name)
        if problem:
            raise FilterSyntaxError(
                f"invalid name at position {token.pos}: {problem}", self.text, token.pos, token.text
            )
        return name

    def literal(self) -> tuple[Value, _Token]:
        token = self.advance()
        if token.kind in ("string", "number"):
            return token.value, token
        if token.kind == "name":
            word = token.text.lower()
            if word in ("true", "false"):
                return word == "true", token
            raise self.error(token, "a value (strings need quotes)")
        raise self.error(token, "a value")

    def value(self, op: Op, label: str) -> Value:
        value, token = self.literal()
        problem = _value_problem(op, value, label)
        if problem:
            raise self.invalid(token, problem)
        return value

    def predicate(self) -> Predicate:
        attr = self.name()
        token = self.advance()
        word = token.text.lower() if token.kind == "name" else ""
        if token.kind == "symbol" and token.text in _OPS_BY_SYMBOL:
            op = _OPS_BY_SYMBOL[token.text]
            return Predicate(attr, op, self.value(op, token.text))
        if word in _OPERATOR_WORDS:
            op = _OPERATOR_WORDS[word]
            return Predicate(attr, op, self.value(op, word))
        if word == "exists":
            return Predicate(attr, Op.EXISTS, None)
        if word == "in":
            opening = self.expect_symbol("(")
            values = [self.value(Op.EQ, "in")]
            while True:
                token = self.advance()
                if token.kind == "symbol" and token.text == ")":
                    break
                if token.kind != "symbol" or token.text != ",":
                    raise self.error(token, "',' or ')'")
                values.append(self.value(Op.EQ, "in"))
            members, problem = _in_set(values)
            if problem:
                raise self.invalid(opening, problem)
            return Predicate(attr, Op.IN, members)
        raise self.error(token, _EXPECTED_OPERATOR)

    def filter(self) -> Filter:
        first = self.peek()
        if first.kind == "end":
            raise FilterSyntaxError(
                "empty filter at position 0: write '*' to match every publication", self.text, 0, ""
            )
        if first.kind == "symbol" and first.text == "*":
            self.advance()
            end = self.advance()
            if end.kind != "end":
                raise self.error(end, "end of input after '*'")
            return Filter(())
        predicates = [self.predicate()]
        while (token := self.advance()).kind != "end":
            if token.kind != "name" or token.text.lower() != "and":
                raise self.error(token, "'and'")
            if len(predicates) == MAX_PREDICATES:
                raise FilterSyntaxError(
                    f"too many predicates at position {token.pos}: at most {MAX_PREDICATES}",
                    self.text,
                    token.pos,
                    token.text,
                )
            predicates.append(self.predicate())
        return Filter(tuple(predicates))

    def attrs(self) -> dict[str, Value]:
        result: dict[str, Value] = {}
        if self.peek().kind == "end":
            return result
        while True:
            start = self.peek()
            name = self.name()
            token = self.advance()
            if token.kind != "symbol" or token.text not in ("=", "=="):
                raise self.error(token, "'='")
            value, token = self.literal()
            if type(value) is not str:
                problem = _scalar_problem(value)
                if problem:
                    raise self.invalid(token, problem)
            if name in result:
                raise FilterSyntaxError(
                    f"duplicate attribute {name!r} at position {start.pos}",
                    self.text,
                    start.pos,
                    start.text,
                )
            result[name] = value
            token = self.advance()
            if token.kind == "end":
                return result
            if token.kind != "symbol" or token.text != ",":
                raise self.error(token, "',' or end of input")


def parse_filter(text: str) -> Filter:
    """Parse the text form of a filter, e.g. ``class = 'stock' and price < 100``.

    Args:
        text: the filter text; ``*`` means the filter that matches every publication.

    Returns:
        The filter; ``parse_filter(str(f)) == f`` for every filter ``f``.

    Raises:
        FilterSyntaxError: naming the offending token and its 0-based position, e.g.
            ``unexpected token 'or' at position 17: expected 'and'``.
    """
    return _Parser(text).filter()


def parse_attrs(text: str) -> dict[str, Value]:
    """Parse publication attributes written as ``class='x',price=5,ok=true`` (for the CLI).

    Args:
        text: comma-separated ``name=value`` pairs with the filter language's literals; empty
            text gives no attributes.

    Returns:
        The attributes in the order written.

    Raises:
        FilterSyntaxError: naming the offending token and its 0-based position.
    """
    return _Parser(text).attrs()


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
    kind = type(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is str:
        return _quote(value, "'")  # type: ignore[arg-type]
    return repr(value)


# ---------------------------------------------------------------------------------------------
# Reasoning: the set of values one attribute may take under a conjunction of predicates.
#
# An interval is (low, low_inclusive, high, high_inclusive) with None for an open end. Sets of
# numbers or strings are tuples of disjoint intervals in ascending order. Numbers are reals;
# strings are discrete (the successor of s is s + "\0"), which the emptiness test accounts for.

_Interval = tuple[Any, bool, Any, bool]
_FULL: Final[_Interval] = (None, False, None, False)
_NO_STRINGS: Final[frozenset[str]] = frozenset()
_BOTH_BOOLS: Final = frozenset((True, False))
_MAX_CHAR: Final = chr(0x10FFFF)


def _number_nonempty(interval: _Interval) -> bool:
    low, low_in, high, high_in = interval
    if low is None or high is None:
        return True
    return low < high or (low == high and low_in and high_in)


def _string_floor(interval: _Interval) -> str:
    low, low_in = interval[0], interval[1]
    return "" if low is None else low if low_in else low + "\0"


def _string_nonempty(interval: _Interval) -> bool:
    high = interval[2]
    if high is None:
        return True
    floor = _string_floor(interval)
    return floor < high or (floor == high and interval[3])


def _intersect_one(a: _Interval, b: _Interval) -> _Interval:
    if a[0] is None or (b[0] is not None and b[0] > a[0]):
        low, low_in = b[0], b[1]
    elif b[0] is None or a[0] > b[0]:
        low, low_in = a[0], a[1]
    else:
        low, low_in = a[0], a[1] and b[1]
    if a[2] is None or (b[2] is not None and b[2] < a[2]):
        high, high_in = b[2], b[3]
    elif b[2] is None or a[2] < b[2]:
        high, high_in = a[2], a[3]
    else:
        high, high_in = a[2], a[3] and b[3]
    return (low, low_in, high, high_in)


def _intersect(
    a: tuple[_Interval, ...], b: tuple[_Interval, ...], nonempty: Callable[[_Interval], bool]
) -> tuple[_Interval, ...]:
    pieces = (_intersect_one(x, y) for x in a for y in b)
    return tuple(piece for piece in pieces if nonempty(piece))


def _complement(intervals: tuple[_Interval, ...]) -> tuple[_Interval, ...]:
    gaps: list[_Interval] = []
    low, low_in = None, False
    for start, start_in, end, end_in in intervals:
        if start is not None:
            gaps.append((low, low_in, start, not start_in))
        if end is None:
            return tuple(gaps)
        low, low_in = end, not end_in
    gaps.append((low, low_in, None, False))
    return tuple(gaps)


def _holds(interval: _Interval, value: Any) -> bool:
    low, low_in, high, high_in = interval
    above = low is None or low < value or (low_in and low == value)
    return above and (high is None or value < high or (high_in and value == high))


def _prefix_interval(prefix: str) -> _Interval:
    stem = prefix.rstrip(_MAX_CHAR)
    if not stem:
        return (prefix, True, None, False)
    return (prefix, True, stem[:-1] + chr(ord(stem[-1]) + 1), False)


def _finite_strings(interval: _Interval) -> list[str] | None:
    """List a string interval's members when there are finitely many (``s``, ``s+"\\0"``, ...)."""
    high = interval[2]
    floor = _string_floor(interval)
    if high is None or not high.startswith(floor) or high[len(floor) :].strip("\0"):
        return None
    members = [floor + "\0" * n for n in range(len(high) - len(floor) + 1)]
    return members if interval[3] else members[:-1]


def _cone(interval: _Interval) -> str:
    """Return a prefix all of whose extensions lie in an infinite string interval."""
    floor, high = _string_floor(interval), interval[2]
    if high is None or not high.startswith(floor):
        return floor
    rest = high[len(floor) :]
    first_nonzero = len(rest) - len(rest.lstrip("\0"))
    return floor + "\0" * (first_nonzero + 1)


def _fixed_prefix(interval: _Interval) -> str:
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
class _Space:
    """The values one attribute may take: absent, bools, numbers (and NaN), strings."""

    missing: bool
    bools: frozenset[bool]
    numbers: tuple[_Interval, ...]
    nan: bool
    strings: tuple[_Interval, ...]
    suffixes: frozenset[str]
    contains: frozenset[str]

    def meet(self, other: _Space) -> _Space:
        return _Space(
            self.missing and other.missing,
            self.bools & other.bools,
            _intersect(self.numbers, other.numbers, _number_nonempty),
            self.nan and other.nan,
            _intersect(self.strings, other.strings, _string_nonempty),
            self.suffixes | other.suffixes,
            self.contains | other.contains,
        )

    def string_witness(self) -> str | None:
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
                if self.has_pattern(member):
                    return member
        return None

    def has_pattern(self, text: str) -> bool:
        return all(text.endswith(s) for s in self.suffixes) and all(
            c in text for c in self.contains
        )

    def has_string(self, text: str) -> bool:
        return any(_holds(i, text) for i in self.strings) and self.has_pattern(text)

    def is_empty(self) -> bool:
        if self.missing or self.bools or self.nan:
            return False
        if any(_number_nonempty(interval) for interval in self.numbers):
            return False
        return self.string_witness() is None

    def points(self) -> list[Any] | None:
        """List the values when the space is a plain finite set (from =, in), else None."""
        if self.missing or self.nan or self.suffixes or self.contains:
            return None
        values: list[Any] = [*self.bools]
        for low, low_in, high, high_in in (*self.numbers, *self.strings):
            if low is None or high is None or not (low_in and high_in and low == high):
                return None
            values.append(low)
        return values

    def has_value(self, value: Any) -> bool:
        kind = type(value)
        if kind is bool:
            return value in self.bools
        if kind is str:
            return self.has_string(value)
        return any(_holds(interval, value) for interval in self.numbers)

    def within(self, other: _Space) -> bool:
        points = self.points()
        if points is not None:
            return all(other.has_value(value) for value in points)
        if self.is_empty():
            return True
        if (self.missing and not other.missing) or not self.bools <= other.bools:
            return False
        if self.nan and not other.nan:
            return False
        if _intersect(self.numbers, _complement(other.numbers), _number_nonempty):
            return False
        return self.strings_within(other)

    def strings_within(self, other: _Space) -> bool:
        suffix = _longest_suffix(self.suffixes)
        if suffix is None:
            return True
        outside = _complement(other.strings)
        for interval in self.strings:
            if not _string_nonempty(interval):
                continue
            members = _finite_strings(interval)
            if members is not None:
                if any(self.has_pattern(m) and not other.has_string(m) for m in members):
                    return False
                continue
            escaped = replace(self, strings=_intersect((interval,), outside, _string_nonempty))
            if escaped.string_witness() is not None:
                return False
            if not all(suffix.endswith(s) for s in other.suffixes):
                return False
            known = (_fixed_prefix(interval), *self.contains, *self.suffixes)
            if not all(any(c in k for k in known) for c in other.contains):
                return False
        return True


_NOTHING: Final = _Space(False, frozenset(), (), False, (), _NO_STRINGS, _NO_STRINGS)
_ANYTHING_PRESENT: Final = _Space(
    False, _BOTH_BOOLS, (_FULL,), True, (_FULL,), _NO_STRINGS, _NO_STRINGS
)


def _ordered_intervals(op: Op, value: Any) -> tuple[_Interval, ...]:
    return {
        Op.EQ: ((value, True, value, True),),
        Op.NE: ((None, False, value, False), (value, False, None, False)),
        Op.LT: ((None, False, value, False),),
        Op.LE: ((None, False, value, True),),
        Op.GT: ((value, False, None, False),),
        Op.GE: ((value, True, None, False),),
    }[op]


def _space_of(predicate: Predicate) -> _Space:
    op, value = predicate.op, predicate.value
    if op is Op.EXISTS:
        return _ANYTHING_PRESENT
    if isinstance(value, frozenset):
        numbers = sorted(v for v in value if type(v) in _NUMBER_TYPES)
        strings = sorted(v for v in value if type(v) is str)
        return replace(
            _NOTHING,
            bools=frozenset(v for v in value if type(v) is bool),
            numbers=tuple((v, True, v, True) for v in numbers),
            strings=tuple((v, True, v, True) for v in strings),
        )
    if op is Op.PREFIX:
        return replace(_NOTHING, strings=(_prefix_interval(value),))  # type: ignore[arg-type]
    if op is Op.SUFFIX:
        return replace(_NOTHING, strings=(_FULL,), suffixes=frozenset((value,)))  # type: ignore[arg-type]
    if op is Op.CONTAINS:
        return replace(_NOTHING, strings=(_FULL,), contains=frozenset((value,)))  # type: ignore[arg-type]
    if type(value) is bool:
        return replace(_NOTHING, bools=frozenset((value if op is Op.EQ else not value,)))
    if type(value) is str:
        return replace(_NOTHING, strings=_ordered_intervals(op, value))
    return replace(_NOTHING, numbers=_ordered_intervals(op, value), nan=op is Op.NE)
