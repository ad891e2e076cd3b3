"""The publish parser (server/validation.py: decode_publish from bytes, parse_publish
for what a type cannot say) and the declared model of a publish body
(herald/protocol/publish.py, whose schema /openapi.json publishes) give the same
verdicts: a body the parser takes, the model takes; a body the model refuses, the
parser refuses with the same problem (PROTOCOL §2: malformed -> bad_request, out of
range -> validation_error). The parser also refuses what a type cannot say (both or
neither of value and value_b64, non-canonical base64, a message over
max_message_bytes, a partition the topic lacks, integers orjson cannot store, nesting
past MAX_VALUE_DEPTH). The one-pass decode from bytes and the read of a parsed body
(what a body the decode refuses gets) answer alike, the index of the first bad
message included."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from herald.protocol.errors import HeraldError
from herald.protocol.limits import MAX_BATCH, MAX_DELAY_MS, MAX_ID_CHARS, MAX_PARTITIONS
from herald.protocol.publish import PublishRequest
from server.validation import decode_publish, from_model, parse_publish
from storage.topic import PublishItem

FIELD_VALUES: dict[str, list[Any]] = {
    "value": [None, 1, "s", [1, {"a": None}], {"k": 2.5}, True, 2**63, -(2**63)],
    "value_b64": [None, "", "AAEC", "AAE=", "AAF=", "not base64", 5, ["AA=="]],
    "key": [None, "", "k", 5, True, ["k"], {}],
    "headers": [None, {}, {"h": "v"}, {"h": 1}, {"h": None}, [], "h"],
    "partition": [None, 0, 3, 3.0, 3.5, -1, MAX_PARTITIONS - 1, MAX_PARTITIONS, "1", True],
    "id": [None, "", "i", "x" * MAX_ID_CHARS, "x" * (MAX_ID_CHARS + 1), 5, ["i"]],
    "delay_ms": [None, 0, 1000, 1000.0, 0.5, -1, MAX_DELAY_MS, MAX_DELAY_MS + 1, "1", False],
    "colour": [None, 1],
}


def _bodies() -> list[Any]:
    bodies: list[Any] = [
        None,
        [],
        "x",
        1,
        {},
        {"messages": None},
        {"messages": {}},
        {"messages": []},
        {"messages": [1]},
        {"messages": [None]},
        {"messages": [{}]},
        {"messages": [{"value": 1}], "colour": 1},
        {"messages": [{"value": 1}] * (MAX_BATCH + 1)},
        {"messages": [{"value": 1}] * MAX_BATCH},
    ]
    for field, values in FIELD_VALUES.items():
        for value in values:
            base = {} if field in ("value", "value_b64") else {"value": 1}
            bodies.append({"messages": [{"value": 0}, {**base, field: value}]})
    return bodies


def _verdict(parse: Any, body: Any) -> str:
    try:
        parse(body)
    except HeraldError as exc:
        return exc.code
    return "ok"


def _by_parser(body: Any) -> Any:
    return parse_publish(body, 1_048_576, PublishItem, partitions=MAX_PARTITIONS)


def _from_bytes(body: Any) -> Any:
    """As server/publish.py reads a request: the one-pass decode, else the parsed body."""
    decoded = decode_publish(orjson.dumps(body))
    return _by_parser(body if decoded is None else decoded)


def _answer(parse: Any, body: Any) -> tuple[str, Any]:
    try:
        batch = parse(body)
    except HeraldError as exc:
        return exc.code, exc.extra.get("index")
    return "ok", [(item.record, item.partition) for item in batch.items]


def _by_model(body: Any) -> Any:
    return from_model(body, PublishRequest, "the publish request")


@pytest.mark.parametrize("body", _bodies(), ids=lambda body: repr(body)[:60])
def test_the_parser_and_the_model_agree(body: Any) -> None:
    parser, model = _verdict(_by_parser, body), _verdict(_by_model, body)
    if parser == "ok":
        assert model == "ok"
    if model != "ok":
        assert parser == model


@pytest.mark.parametrize("body", _bodies(), ids=lambda body: repr(body)[:60])
def test_the_decode_from_bytes_and_the_parsed_body_answer_alike(body: Any) -> None:
    assert _answer(_from_bytes, body) == _answer(_by_parser, body)


def test_the_first_bad_message_is_the_index_whatever_kind_of_fault_it_has() -> None:
    # Message 1 lacks a value (a rule no type states), message 2 is malformed: the
    # index is 1 by either path (PROTOCOL §2: the position of the first bad message).
    body = {"messages": [{"value": 0}, {"key": "k"}, {"value": 1, "partition": "x"}]}
    assert _answer(_from_bytes, body) == _answer(_by_parser, body) == ("bad_request", 1)
