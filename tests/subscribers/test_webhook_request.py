"""The webhook request of each body form (PROTOCOL §4, §8), no network."""

from __future__ import annotations

import re
from urllib.parse import unquote

import orjson
from hypothesis import given
from hypothesis import strategies as st

from delivery.events import Delivery
from delivery.push import BodyForm, Post
from storage.record import Record, ValueKind
from subscribers.webhook_request import build_request, header_name, header_value

# An HTTP token (RFC 9110 tchar) in lower case, with %XX escapes.
NAME_TAIL = re.compile(r"(?:[a-z0-9!#$&'*+\-.^_`|~]|%[0-9A-F]{2})*")


def record(offset: int, **fields: object) -> Record:
    return Record(0, offset, 1_795_000_000_000 + offset, b'{"n":%d}' % offset, **fields)  # type: ignore[arg-type]


def test_an_envelope_is_the_json_of_m_with_the_record_id_as_webhook_id() -> None:
    request = build_request(Post((Delivery(record(4), 2),)), "orders", "billing")
    assert request.webhook_id == "billing:0-4"
    assert request.content_type == "application/json" and request.headers == {}
    m = orjson.loads(request.body)
    assert (m["id"], m["subscription"], m["attempt"], m["value"]) == ("0-4", "billing", 2, {"n": 4})


def test_a_batch_is_a_messages_array_named_by_its_first_id_and_count() -> None:
    post = Post((Delivery(record(7), 1), Delivery(record(9), 3)), BodyForm.BATCH)
    request = build_request(post, "orders", "billing")
    assert request.webhook_id == "billing:0-7:2"
    body = orjson.loads(request.body)
    assert list(body) == ["messages"]
    assert [(m["id"], m["attempt"]) for m in body["messages"]] == [("0-7", 1), ("0-9", 3)]


def test_raw_json_is_the_value_text_and_the_rest_of_m_in_headers() -> None:
    r = record(5, key="eu-1", headers={"Trace-Id": "a b", "x": "100%"})
    request = build_request(Post((Delivery(r, 3),), BodyForm.RAW), "orders", "billing")
    assert request.webhook_id == "billing:0-5"
    assert (request.body, request.content_type) == (b'{"n":5}', "application/json")
    assert request.headers == {
        "herald-topic": "orders",
        "herald-subscription": "billing",
        "herald-id": "0-5",
        "herald-timestamp": str(r.timestamp),
        "herald-attempt": "3",
        "herald-key": "eu-1",
        "herald-header-%54race-%49d": "a b",
        "herald-header-x": "100%25",
    }


def test_raw_bytes_are_octets_and_a_null_key_sends_no_key_header() -> None:
    r = Record(1, 0, 0, b"\x00\xff binary", ValueKind.BYTES)
    request = build_request(Post((Delivery(r, 1),), BodyForm.RAW), "t", "s")
    assert (request.body, request.content_type) == (b"\x00\xff binary", "application/octet-stream")
    assert "herald-key" not in request.headers
    assert request.headers["herald-id"] == "1-0"


@given(st.text())
def test_header_names_are_tokens_that_decode_to_the_exact_name(name: str) -> None:
    encoded = header_name(name)
    assert NAME_TAIL.fullmatch(encoded)
    assert unquote(encoded, errors="strict") == name


@given(st.text())
def test_header_values_are_visible_ascii_that_decode_to_the_exact_value(value: str) -> None:
    encoded = header_value(value)
    assert all(0x20 <= ord(c) < 0x7F for c in encoded)
    assert encoded == encoded.strip()  # HTTP would strip spaces at either end
    assert unquote(encoded, errors="strict") == value
