"""The subscription filter grammar of PROTOCOL §8, as the SDK's users import it
(client/README.md); it is the protocol's (herald/protocol/filter.py), which the server
applies too."""

from herald.protocol.filter import (
    KEYWORDS,
    And,
    Condition,
    Filterable,
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
    parse,
    quote,
    to_text,
)
from herald.protocol.limits import MAX_FILTER_CHARS

__all__ = [
    "KEYWORDS",
    "MAX_FILTER_CHARS",
    "And",
    "Condition",
    "FilterSyntaxError",
    "Filterable",
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
    "compile_filter",
    "not_",
    "or_",
    "parse",
    "quote",
    "to_text",
]
