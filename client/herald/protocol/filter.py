"""Subscription filters (PROTOCOL §8 Filter): the grammar, shared by the server (which
checks a subscription's filter with `check_filter` and applies it on its delivery path,
delivery/core.py) and by clients that need to know which records a filter lets through (the Spark bridge,
when it re-reads a range of a filtered subscription from the log).

    key = "v" | key != "v" | hasPrefix(key, "p")
    headers.NAME = "v" | headers.NAME != "v" | hasPrefix(headers.NAME, "p") | headers:NAME
    joined with AND, OR, NOT and parentheses; NOT binds tightest, then AND, then OR.

    from herald.protocol.filter import compile_filter, parse
    matches = compile_filter(parse('hasPrefix(key, "eu-") AND headers:priority'))
    matches(message)   # anything with `key` and `headers`: a Message, a server Record

The parser is a shunting-yard over tokens, without recursion: nesting depth is bounded
only by the expression's length, and any string either parses or raises
FilterSyntaxError with the position (0-based character offset) of the fault: a ValueError
to the SDK's users, and to the server a 400 bad_request whose problem carries the
position as a member (docs/protocol.md "Filter").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from herald.protocol.errors import BadRequest, ValidationError
from herald.protocol.limits import MAX_FILTER_CHARS

KEYWORDS = ("AND", "OR", "NOT")
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_WORD = re.compile(r"[A-Za-z0-9_.-]+")
_SPACE = re.compile(r"\s+")


class FilterSyntaxError(BadRequest, ValueError):
    """A malformed filter: ``reason`` says what is wrong, ``position`` (0-based) where."""

    def __init__(self, reason: str, position: int) -> None:
        super().__init__(f"filter: {reason} at position {position}", position=position)
        self.reason = reason
        self.position = position


class Filterable(Protocol):
    """What a filter reads of a record: its key and headers, in place."""

    @property
    def key(self) -> str | None: ...

    @property
    def headers(self) -> Mapping[str, str]: ...


# ---------------------------------------------------------------- the tree


@dataclass(frozen=True, slots=True)
class KeyEquals:
    value: str


@dataclass(frozen=True, slots=True)
class KeyPrefix:
    prefix: str


@dataclass(frozen=True, slots=True)
class HeaderEquals:
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class HeaderPrefix:
    name: str
    prefix: str


@dataclass(frozen=True, slots=True)
class HeaderPresent:
    name: str


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Node, ...]


Condition = KeyEquals | KeyPrefix | HeaderEquals | HeaderPrefix | HeaderPresent
Node = Condition | Not | And | Or


def not_(node: Node) -> Node:
    """NOT, normalised: NOT NOT x is x (so deep NOT chains make no deep tree)."""
    return node.operand if isinstance(node, Not) else Not(node)


def and_(left: Node, right: Node) -> Node:
    """AND, flattened: (a AND b) AND c is one node of three operands."""
    return And(_operands(left, And) + _operands(right, And))


def or_(left: Node, right: Node) -> Node:
    return Or(_operands(left, Or) + _operands(right, Or))


def _operands(node: Node, kind: type[And] | type[Or]) -> tuple[Node, ...]:
    return node.operands if isinstance(node, kind) else (node,)


# ---------------------------------------------------------------- text


def quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_text(node: Node) -> str:
    """The canonical spelling of a tree (parse(to_text(t)) == t for a normalised t)."""
    if isinstance(node, KeyEquals):
        return f"key = {quote(node.value)}"
    if isinstance(node, KeyPrefix):
        return f"hasPrefix(key, {quote(node.prefix)})"
    if isinstance(node, HeaderEquals):
        return f"headers.{node.name} = {quote(node.value)}"
    if isinstance(node, HeaderPrefix):
        return f"hasPrefix(headers.{node.name}, {quote(node.prefix)})"
    if isinstance(node, HeaderPresent):
        return f"headers:{node.name}"
    if isinstance(node, Not):
        inner = to_text(node.operand)
        return f"NOT {inner}" if _is_condition(node.operand) else f"NOT ({inner})"
    joiner = " AND " if isinstance(node, And) else " OR "
    parts = []
    for operand in node.operands:
        text = to_text(operand)
        # AND binds tighter than OR: an OR inside an AND needs parentheses.
        if isinstance(node, And) and isinstance(operand, Or):
            text = f"({text})"
        parts.append(text)
    return joiner.join(parts)


def _is_condition(node: Node) -> bool:
    return not isinstance(node, Not | And | Or)


# ---------------------------------------------------------------- tokens


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "(", ")", ",", "=", "!=", ":", "string", "word"
    text: str
    position: int


def _tokens(text: str) -> Iterator[_Token]:
    i, n = 0, len(text)
    while i < n:
        space = _SPACE.match(text, i)
        if space:
            i = space.end()
            continue
        c = text[i]
        if c in "(),=:":
            yield _Token(c, c, i)
            i += 1
        elif text.startswith("!=", i):
            yield _Token("!=", "!=", i)
            i += 2
        elif c == '"':
            token, i = _string(text, i)
            yield token
        else:
            word = _WORD.match(text, i)
            if word is None:
                raise FilterSyntaxError(f"unexpected character {c!r}", i)
            yield _Token("word", word.group(), i)
            i = word.end()


def _string(text: str, start: int) -> tuple[_Token, int]:
    """A string literal from its opening quote; the token and the index after it."""
    chars: list[str] = []
    i, n = start + 1, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return _Token("string", "".join(chars), start), i + 1
        if c == "\\":
            if i + 1 < n and text[i + 1] in '"\\':
                chars.append(text[i + 1])
                i += 2
                continue
            raise FilterSyntaxError('only \\" and \\\\ are escapes in a string', i)
        chars.append(c)
        i += 1
    raise FilterSyntaxError("unterminated string", start)


# ---------------------------------------------------------------- parsing

_PRECEDENCE = {"OR": 1, "AND": 2, "NOT": 3}


def parse(text: str) -> Node:
    """The tree of a filter expression, or FilterSyntaxError (malformed, empty included)."""
    tokens = list(_tokens(text))
    operands: list[Node] = []
    operators: list[_Token] = []  # "(", AND, OR, NOT
    expect_operand = True
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if expect_operand:
            if token.kind == "(" or (token.kind == "word" and token.text == "NOT"):
                operators.append(token)
            else:
                node, i = _condition(tokens, i)
                operands.append(node)
                expect_operand = False
                continue
            i += 1
            continue
        if token.kind == "word" and token.text in ("AND", "OR"):
            while (
                operators
                and operators[-1].kind == "word"
                and (_PRECEDENCE[operators[-1].text] >= _PRECEDENCE[token.text])
            ):
                _apply(operators.pop(), operands)
            operators.append(token)
            expect_operand = True
        elif token.kind == ")":
            while operators and operators[-1].kind != "(":
                _apply(operators.pop(), operands)
            if not operators:
                raise FilterSyntaxError("unmatched ')'", token.position)
            operators.pop()
        else:
            raise FilterSyntaxError(f"expected AND, OR or ')', not {token.text!r}", token.position)
        i += 1
    if expect_operand:
        raise FilterSyntaxError("expected a condition", len(text))
    return _apply_remaining(operators, operands)


def _apply_remaining(operators: list[_Token], operands: list[Node]) -> Node:
    """The end of the expression: every operator still stacked applied, the one tree."""
    while operators:
        operator = operators.pop()
        if operator.kind == "(":
            raise FilterSyntaxError("unclosed '('", operator.position)
        _apply(operator, operands)
    assert len(operands) == 1
    return operands[0]


def _apply(operator: _Token, operands: list[Node]) -> None:
    if operator.text == "NOT":
        operands.append(not_(operands.pop()))
        return
    right, left = operands.pop(), operands.pop()
    operands.append(and_(left, right) if operator.text == "AND" else or_(left, right))


def _condition(tokens: list[_Token], i: int) -> tuple[Node, int]:
    """One condition from tokens[i]; returns it and the index after it."""
    token = tokens[i]
    if token.kind != "word" or token.text in KEYWORDS:
        raise FilterSyntaxError(f"expected a condition, not {token.text!r}", token.position)
    if token.text == "hasPrefix":
        _expect(tokens, i + 1, "(")
        field = _field(tokens, i + 2)
        _expect(tokens, i + 3, ",")
        prefix = _expect(tokens, i + 4, "string").text
        _expect(tokens, i + 5, ")")
        node: Node = KeyPrefix(prefix) if field is None else HeaderPrefix(field, prefix)
        return node, i + 6
    if token.text == "headers" and i + 1 < len(tokens) and tokens[i + 1].kind == ":":
        name = _expect(tokens, i + 2, "word")
        if tokens[i + 1].position + 1 != name.position:
            raise FilterSyntaxError("no space after 'headers:'", tokens[i + 1].position + 1)
        return HeaderPresent(_header_name(name.text, name.position)), i + 3
    field = _field(tokens, i)
    operator = _expect(tokens, i + 1, "=", "!=")
    value = _expect(tokens, i + 2, "string").text
    node = KeyEquals(value) if field is None else HeaderEquals(field, value)
    return (node if operator.kind == "=" else Not(node)), i + 3


def _field(tokens: list[_Token], i: int) -> str | None:
    """`key` (None) or `headers.NAME` (NAME)."""
    token = _expect(tokens, i, "word")
    if token.text == "key":
        return None
    if token.text.startswith("headers."):
        return _header_name(token.text[len("headers.") :], token.position + len("headers."))
    raise FilterSyntaxError(f"expected key or headers.NAME, not {token.text!r}", token.position)


def _header_name(name: str, position: int) -> str:
    if not _NAME.fullmatch(name):
        raise FilterSyntaxError("a header name matches [A-Za-z0-9_.-]+", position)
    return name


def _expect(tokens: list[_Token], i: int, *kinds: str) -> _Token:
    if i >= len(tokens):
        end = tokens[-1].position + len(tokens[-1].text) if tokens else 0
        raise FilterSyntaxError(f"expected {' or '.join(kinds)}", end)
    token = tokens[i]
    if token.kind not in kinds:
        raise FilterSyntaxError(
            f"expected {' or '.join(kinds)}, not {token.text!r}", token.position
        )
    return token


# ---------------------------------------------------------------- matching

Matcher = Callable[[Filterable], bool]


def compile_filter(node: Node) -> Matcher:
    """A predicate over records (compile once, call per record): reads key and headers
    in place, copies nothing."""
    if isinstance(node, KeyEquals):
        value = node.value
        return lambda r: r.key == value  # a null key never equals a string
    if isinstance(node, KeyPrefix):
        prefix = node.prefix
        return lambda r: r.key is not None and r.key.startswith(prefix)
    if isinstance(node, HeaderEquals):
        name, value = node.name, node.value
        return lambda r: r.headers.get(name) == value
    if isinstance(node, HeaderPrefix):
        name, prefix = node.name, node.prefix
        return lambda r: (h := r.headers.get(name)) is not None and h.startswith(prefix)
    if isinstance(node, HeaderPresent):
        name = node.name
        return lambda r: name in r.headers
    if isinstance(node, Not):
        inner = compile_filter(node.operand)
        return lambda r: not inner(r)
    parts = tuple(compile_filter(operand) for operand in node.operands)
    if isinstance(node, And):
        return lambda r: all(part(r) for part in parts)
    return lambda r: any(part(r) for part in parts)


def check_filter(text: str) -> str:
    """PROTOCOL §8: malformed → FilterSyntaxError (bad_request); over MAX_FILTER_CHARS →
    ValidationError. Returns the text as given (kept as the user wrote it)."""
    parse(text)
    if len(text) > MAX_FILTER_CHARS:
        raise ValidationError(f"filter is over {MAX_FILTER_CHARS} characters")
    return text
