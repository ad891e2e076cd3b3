"""herald.filter, the PROTOCOL §8 filter grammar as the SDK's users import it (the
protocol's, herald/protocol/filter.py, which the server applies too): a filter applied to records as clients receive them."""

from __future__ import annotations

import pytest

from herald.consumer import Message
from herald.filter import FilterSyntaxError, compile_filter, parse


def message(key: str | None, **headers: str) -> Message:
    return Message.from_json(
        {
            "topic": "t",
            "id": "0-0",
            "partition": 0,
            "offset": 0,
            "timestamp": 0,
            "key": key,
            "headers": headers,
            "value": 1,
        }
    )


def test_a_filter_matches_messages_by_key_and_headers_in_place() -> None:
    matches = compile_filter(parse('hasPrefix(key, "eu-") AND NOT headers.tier = "free"'))
    assert matches(message("eu-1"))
    assert matches(message("eu-1", tier="gold"))
    assert not matches(message("eu-1", tier="free"))
    assert not matches(message("us-1"))
    assert not matches(message(None))  # hasPrefix(key, …) never matches a null key


def test_a_malformed_filter_is_a_value_error_with_its_position() -> None:
    with pytest.raises(FilterSyntaxError) as raised:
        parse('key = "a" AND')
    assert isinstance(raised.value, ValueError)
    assert raised.value.position == 13
    assert str(raised.value) == "filter: expected a condition at position 13"
