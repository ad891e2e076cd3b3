"""The strict parsing rules of PROTOCOL §2, without a network (server/validation.py)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest

from delivery.config import Backoff, DeliveryMode
from delivery.engine import config_matches
from delivery.start import StartAt
from herald.protocol.errors import (
    BadRequest,
    HeraldError,
    InvalidName,
    MessageTooLarge,
    PayloadTooLarge,
    ValidationError,
)
from herald.protocol.names import check_name
from server.http import read_body
from server.validation import (
    b64decode_strict,
    parse_acks,
    parse_publish,
    parse_read_query,
    parse_seek,
    parse_subscription_config,
    parse_topic_config,
    topic_config_matches,
)
from storage.config import TopicConfig
from storage.record import Acks, ValueKind


class Item:
    def __init__(self, record: Any, partition: int | None) -> None:
        self.record, self.partition = record, partition


def publish(messages: Any, max_bytes: int = 1024) -> Any:
    return parse_publish({"messages": messages}, max_bytes, Item)


def raises(kind: type[HeraldError], fn: Any, *args: Any) -> HeraldError:
    with pytest.raises(kind) as info:
        fn(*args)
    assert type(info.value) is kind
    return info.value


# ------------------------------------------------------------------ names


@pytest.mark.parametrize("name", ["a", "A.b_c-9", "0" * 249, "x" + "y" * 248])
def test_valid_names_are_accepted(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", ".a", "-a", "_a", "a b", "a/b", "é", "a" * 250, "a\n"])
def test_bad_names_are_invalid_name(name: str) -> None:
    raises(InvalidName, check_name, name)


# ------------------------------------------------------------------ topics


def test_topic_config_defaults_when_no_body() -> None:
    assert parse_topic_config({}) == (TopicConfig(), frozenset())


def test_topic_config_null_body_is_not_an_object() -> None:
    raises(BadRequest, parse_topic_config, None)


def test_topic_config_null_retention_means_unlimited_and_is_given() -> None:
    config, given = parse_topic_config({"retention_ms": None, "retention_bytes": None})
    assert config.retention_ms is None and config.retention_bytes is None
    assert given == {"retention_ms", "retention_bytes"}


def test_topic_config_null_partitions_is_absent() -> None:
    config, given = parse_topic_config({"partitions": None})
    assert config.partitions == 1 and given == frozenset()


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ([], BadRequest),
        ("x", BadRequest),
        ({"partitions": "2"}, BadRequest),
        ({"partitions": True}, BadRequest),
        ({"partitions": 1.5}, BadRequest),
        ({"partitions": 0}, ValidationError),
        ({"partitions": 1025}, ValidationError),
        ({"retention_ms": 999}, ValidationError),
        ({"retention_bytes": 1048575}, ValidationError),
        ({"dedup_window_ms": 999}, ValidationError),
        ({"dedup_window_ms": 604800001}, ValidationError),
        ({"colour": 1}, BadRequest),
    ],
)
def test_bad_topic_configs(body: Any, kind: type[HeraldError]) -> None:
    raises(kind, parse_topic_config, body)


def test_integral_float_is_an_integer() -> None:
    assert parse_topic_config({"partitions": 2.0})[0].partitions == 2


def test_topic_config_compares_only_given_fields() -> None:
    existing = TopicConfig(partitions=3, retention_ms=None)
    assert topic_config_matches(existing, *parse_topic_config({"partitions": 3}))
    assert topic_config_matches(existing, *parse_topic_config({}))
    assert not topic_config_matches(existing, *parse_topic_config({"partitions": 2}))
    assert not topic_config_matches(existing, *parse_topic_config({"retention_ms": 5000}))


# ------------------------------------------------------------------ publish


def test_publish_builds_records_in_one_pass() -> None:
    batch = publish(
        [
            {"value": {"a": [1, 2]}, "key": "k", "headers": {"h": "v"}, "id": "p1"},
            {"value_b64": base64.b64encode(b"\x00\xff").decode(), "partition": 3},
            {"value": None},
        ]
    )
    first, second, third = (item.record for item in batch.items)
    assert first.value == b'{"a":[1,2]}' and first.kind is ValueKind.JSON
    assert (first.key, dict(first.headers), first.producer_id) == ("k", {"h": "v"}, "p1")
    assert second.value == b"\x00\xff" and second.kind is ValueKind.BYTES
    assert batch.items[1].partition == 3
    assert (batch.max_partition, batch.max_partition_index) == (3, 1)
    assert third.value == b"null"


@pytest.mark.parametrize("size", range(7))
def test_canonical_base64_of_every_length_decodes(size: int) -> None:
    for data in (bytes(size), bytes(range(256 - size, 256)), b"\xff" * size):
        assert b64decode_strict(base64.b64encode(data).decode("ascii"), "v") == data


@pytest.mark.parametrize(
    "text",
    [
        "AB==",  # pad bits not zero (one byte: the low 4 bits of B)
        "AAB=",  # pad bits not zero (two bytes: the low 2 bits of B)
        "AA=",  # short of padding
        "AA",
        "AA===",
        "=AAA",
        "AA==AA==",  # data after padding
        "AA AA=",  # whitespace
        "AAAA\n",
        "QUJ\\u0044",  # a JSON escape, which must not be read as "QUJD"
        'AA"A',
        "AAÄA",  # not ASCII
        "AA-_",  # the URL-safe alphabet
    ],
)
def test_base64_that_is_not_canonical_is_refused(text: str) -> None:
    with pytest.raises(BadRequest, match="base64"):
        b64decode_strict(text, "value_b64")


def test_empty_value_b64_is_empty_bytes() -> None:
    assert publish([{"value_b64": ""}]).items[0].record.value == b""


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ({}, BadRequest),  # neither value nor value_b64
        ({"value": 1, "value_b64": "AA=="}, BadRequest),
        ({"value_b64": "not base64!"}, BadRequest),
        ({"value_b64": "AA="}, BadRequest),  # bad padding
        ({"value_b64": 5}, BadRequest),
        ({"value": 1, "key": 5}, BadRequest),
        ({"value": 1, "headers": {"a": 1}}, BadRequest),
        ({"value": 1, "headers": ["a"]}, BadRequest),
        ({"value": 1, "partition": "0"}, BadRequest),
        ({"value": 1, "partition": 0.5}, BadRequest),
        ({"value": 1, "partition": True}, BadRequest),
        ({"value": 1, "partition": -1}, ValidationError),
        ({"value": 1, "id": ""}, ValidationError),
        ({"value": 1, "id": "x" * 129}, ValidationError),
        ({"value": 1, "id": 7}, BadRequest),
        ({"value": 1, "extra": 1}, BadRequest),
        ({"value": "x" * 2000}, MessageTooLarge),
        ({"value": 1, "headers": {"h": "x" * 2000}}, MessageTooLarge),
        ("just a string", BadRequest),
    ],
)
def test_first_bad_message_is_reported_with_its_index(
    message: Any, kind: type[HeraldError]
) -> None:
    error = raises(kind, publish, [{"value": 1}, message, {"value": {}}])
    assert error.extra["index"] == 1


def test_message_size_counts_key_and_headers() -> None:
    # value `1` is 1 byte, key 3, header 1+1: exactly 6 passes a 6-byte limit, 7 does not.
    assert publish([{"value": 1, "key": "abc", "headers": {"h": "v"}}], max_bytes=6)
    raises(MessageTooLarge, publish, [{"value": 1, "key": "abcd", "headers": {"h": "v"}}], 6)


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({"messages": []}, ValidationError),
        ({"messages": [{"value": 1}] * 10001}, ValidationError),
        ({"messages": {}}, BadRequest),
        ({}, BadRequest),
        ({"messages": [{"value": 1}], "more": 1}, BadRequest),
        ([], BadRequest),
    ],
)
def test_bad_batches(body: Any, kind: type[HeraldError]) -> None:
    raises(kind, parse_publish, body, 1024, Item)


def test_acks_levels() -> None:
    assert parse_acks(None) is Acks.ALL
    assert [parse_acks(a) for a in ("0", "1", "all")] == [Acks.NONE, Acks.LEADER, Acks.ALL]
    for bad in ("2", "ALL", ""):
        raises(BadRequest, parse_acks, bad)


# ------------------------------------------------------------------ read


def test_read_query_defaults() -> None:
    query = parse_read_query({})
    assert (query.offset, query.timestamp, query.limit, query.wait_ms) == (None, None, 100, 0)


@pytest.mark.parametrize(
    ("params", "kind"),
    [
        ({"offset": "abc"}, BadRequest),
        ({"offset": "1.5"}, BadRequest),
        ({"offset": "-1"}, ValidationError),
        ({"offset": "1", "timestamp": "1"}, BadRequest),
        ({"limit": "0"}, ValidationError),
        ({"limit": "10001"}, ValidationError),
        ({"wait_ms": "30001"}, ValidationError),
        ({"wait_ms": "x"}, BadRequest),
    ],
)
def test_bad_read_queries(params: dict[str, str], kind: type[HeraldError]) -> None:
    raises(kind, parse_read_query, params)


# ------------------------------------------------------------------ subscriptions


def test_subscription_defaults_are_filled_and_given_fields_tracked() -> None:
    config, given = parse_subscription_config({"topic": "t", "dead_letter_topic": None})
    assert config.delivery is DeliveryMode.AT_LEAST_ONCE and config.max_in_flight == 1000
    assert config.dead_letter_topic is None
    assert given == {"topic"}


def test_subscription_full_config() -> None:
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef").decode()
    config, _ = parse_subscription_config(
        {
            "topic": "t",
            "start": {"timestamp": 5},
            "delivery": "at_most_once",
            "retry_backoff": {"min_ms": 10},
            "push": {
                "url": "http://127.0.0.1:1/hook",
                "secret": secret,
                "breaker": {"failures": 2},
            },
        }
    )
    assert config.start == StartAt.at_timestamp(5)
    assert config.retry_backoff == Backoff(10, 60_000)
    assert config.push is not None and config.push.breaker.failures == 2


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({}, BadRequest),
        ({"topic": 1}, BadRequest),
        ({"topic": "bad name"}, InvalidName),
        ({"topic": "t", "start": "middle"}, BadRequest),
        ({"topic": "t", "start": {"timestamp": "1"}}, BadRequest),
        ({"topic": "t", "start": {"ts": 1}}, BadRequest),
        ({"topic": "t", "delivery": "exactly_once"}, BadRequest),
        ({"topic": "t", "ack_deadline_ms": 99}, ValidationError),
        ({"topic": "t", "max_in_flight": 100001}, ValidationError),
        ({"topic": "t", "max_deliveries": -1}, ValidationError),
        ({"topic": "t", "retry_backoff": {"min_ms": 0}}, ValidationError),
        ({"topic": "t", "retry_backoff": {"min_ms": 500, "max_ms": 100}}, ValidationError),
        ({"topic": "t", "retry_backoff": {"min": 5}}, BadRequest),
        ({"topic": "t", "dead_letter_topic": "a b"}, InvalidName),
        ({"topic": "t", "ordered_by_key": 1}, BadRequest),
        ({"topic": "t", "push": {"url": "http://x"}}, BadRequest),
        ({"topic": "t", "push": {"url": "ftp://x", "secret": "whsec_AA=="}}, BadRequest),
        ({"topic": "t", "push": {"url": "http://x", "secret": "AA=="}}, BadRequest),
        ({"topic": "t", "push": {"url": "http://x", "secret": "whsec_!!"}}, BadRequest),
        ({"topic": "t", "push": {"url": "http://x", "secret": "whsec_AA==", "timeout_ms": 50}}, ValidationError),
        (
            {"topic": "t", "push": {"url": "http://x", "secret": "whsec_AA==", "breaker": {"open_ms": 5000, "max_open_ms": 1000}}},
            ValidationError,
        ),
        ({"topic": "t", "unknown": True}, BadRequest),
    ],
)  # fmt: skip
def test_bad_subscription_configs(body: Any, kind: type[HeraldError]) -> None:
    raises(kind, parse_subscription_config, body)


def test_start_is_never_compared() -> None:
    existing, _ = parse_subscription_config({"topic": "t", "start": "earliest"})
    assert config_matches(existing, *parse_subscription_config({"topic": "t", "start": "latest"}))
    assert not config_matches(existing, *parse_subscription_config({"topic": "u"}))


# ------------------------------------------------------------------ seek


def test_seek_forms() -> None:
    assert parse_seek({"to": "earliest"}) == StartAt.earliest()
    assert parse_seek({"to": "latest"}) == StartAt.latest()
    assert parse_seek({"timestamp": 5}) == StartAt.at_timestamp(5)
    assert parse_seek({"offsets": {"3": 0, "0": 12}}) == StartAt.at_offsets({0: 12, 3: 0})


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({}, BadRequest),
        ({"to": "earliest", "timestamp": 1}, BadRequest),
        ({"to": "middle"}, BadRequest),
        ({"offsets": {"a": 1}}, BadRequest),
        ({"offsets": {"0": -1}}, ValidationError),
        ({"offsets": {"0": "1"}}, BadRequest),
        ({"timestamp": -5}, ValidationError),
        ({"where": 1}, BadRequest),
    ],
)
def test_bad_seeks(body: Any, kind: type[HeraldError]) -> None:
    raises(kind, parse_seek, body)


# ------------------------------------------------------------------ body limit


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_body_over_the_cap_is_refused_while_streaming() -> None:
    assert await read_body(_chunks(b"ab", b"cd"), None, 4) == b"abcd"
    with pytest.raises(PayloadTooLarge):
        await read_body(_chunks(b"ab", b"cd", b"e"), None, 4)
    with pytest.raises(PayloadTooLarge):  # refused on the declared length, before reading
        await read_body(_chunks(), "5", 4)
