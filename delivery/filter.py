"""Subscription filters (PROTOCOL §8 Filter) on the server: a filter is checked when a
subscription is created or changed, and compiled once per subscription into the predicate
the delivery core calls per record (delivery/core.py).

The grammar itself — tree, parser, canonical text, compiler — is the SDK's
(client/herald/filter.py), so that clients which must know what a filter lets through
(the Spark bridge re-reading a filtered range from the log) apply the very same rules.
Here its syntax errors become FilterError, a 400 bad_request with the fault's position.
"""

from __future__ import annotations

from herald.filter import (
    KEYWORDS,
    MAX_FILTER_CHARS,
    And,
    Condition,
    FilterSyntaxError,
    HeaderEquals,
    HeaderPrefix,
    HeaderPresent,
    KeyEquals,
    KeyPrefix,
    Matcher,
    Node,
    Not,
    Or,
    and_,
    compile_filter,
    not_,
    or_,
    quote,
    to_text,
)
from herald.filter import parse as parse_syntax
from storage.errors import BadRequest, ValidationError

__all__ = [
    "KEYWORDS",
    "MAX_FILTER_CHARS",
    "And",
    "Condition",
    "FilterError",
    "HeaderEquals",
    "HeaderPrefix",
    "HeaderPresent",
    "KeyEquals",
    "KeyPrefix",
    "Matcher",
    "Node",
    "Not",
    "Or",
    "and_",
    "check_filter",
    "compile_filter",
    "not_",
    "or_",
    "parse",
    "quote",
    "to_text",
]


class FilterError(BadRequest):
    """A malformed filter; ``position`` is where (0-based) the fault is."""

    def __init__(self, message: str, position: int) -> None:
        # The position is also a problem member (docs/protocol.md "Filter"): the console
        # points at it without parsing the detail.
        super().__init__(f"filter: {message} at position {position}", position=position)
        self.position = position


def parse(text: str) -> Node:
    """The tree of a filter expression, or FilterError (malformed, empty included)."""
    try:
        return parse_syntax(text)
    except FilterSyntaxError as exc:
        raise FilterError(exc.reason, exc.position) from None


def check_filter(text: str) -> str:
    """PROTOCOL §8: malformed → FilterError (bad_request); over MAX_FILTER_CHARS →
    ValidationError. Returns the text as given (kept as the user wrote it)."""
    parse(text)
    if len(text) > MAX_FILTER_CHARS:
        raise ValidationError(f"filter is over {MAX_FILTER_CHARS} characters")
    return text
