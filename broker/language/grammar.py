r"""The text form of filters: ``parse_filter``, and ``parse_attrs`` for the CLI.

The grammar read by ``parse_filter`` (and written by ``str(filter)``)::

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
deliberate choice. The model's limits and value rules (:mod:`broker.language.filters`) apply, and
every error is a ``FilterSyntaxError`` naming the offending token and its 0-based position.

Writing the text form stays with the model: ``str()`` is a method of ``Filter`` and
``Predicate``, and this module imports the model, so a formatter here would need ``filters`` to
import ``grammar`` back, a cycle. Both sides share ``OP_SYMBOLS``, and the round trip
``parse_filter(str(f)) == f`` is tested.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from broker.errors import FilterSyntaxError
from broker.language.filters import (
    MAX_PREDICATES,
    OP_SYMBOLS,
    Filter,
    Op,
    Predicate,
    Value,
    in_set,
    name_problem,
    scalar_problem,
    value_problem,
)

__all__ = ["parse_attrs", "parse_filter"]

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
_OPS_BY_SYMBOL: Final = {"==": Op.EQ, **{symbol: op for op, symbol in OP_SYMBOLS.items()}}
_OPERATOR_WORDS: Final = {"prefix": Op.PREFIX, "suffix": Op.SUFFIX, "contains": Op.CONTAINS}
_EXPECTED_OPERATOR: Final = "an operator (= != < <= > >= prefix suffix contains in exists)"


class _Token(NamedTuple):
    kind: str
    text: str
    pos: int
    value: str | int | float = ""  # the decoded string, quoted name or number


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
        problem = name_problem(name)
        if problem:
            raise FilterSyntaxError(
                f"invalid name at position {token.pos}: {problem}", self.text, token.pos, token.text
            )
        assert isinstance(name, str)  # the tokenizer decodes a quoted name to a str
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
        problem = value_problem(op, value, label)
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
            members, problem = in_set(values)
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
        return Filter(tuple(predicates)).require_satisfiable()

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
                problem = scalar_problem(value)
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
        FilterError: the filter parses but no publication can ever match it, e.g.
            ``price > 'abc' and price < 5`` (a value cannot be a string and a number).
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
