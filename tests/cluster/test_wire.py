"""The replication connection's messages (cluster/wire.py): what a follower sends is what
the leader reads, a peer of an older version is understood, and anything else is a
BadMessage, never a crash of the connection's handler."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from cluster.follower import EpochAnswer, EpochQuery, FetchRequest, FetchResponse
from cluster.replication import FetchError
from cluster.wire import (
    BadMessage,
    FetchEntry,
    Request,
    decode_answer,
    decode_request,
    encode_answer,
    encode_request,
)

QUERY = EpochQuery("t", 0, leader_epoch=3, epoch=2, topic_id=41)
FETCH = FetchRequest("t", 1, 4, 10, 9, 1 << 20, topic_id=41)


def test_a_request_reads_as_it_was_sent() -> None:
    request = Request("n2", 500, (QUERY,), (FetchEntry(FETCH, 8),), incarnation=7)
    assert decode_request(encode_request(request)) == request
    assert decode_request(encode_request(request).decode()) == request  # a text frame


def test_a_request_of_an_older_peer_takes_the_defaults() -> None:
    """No topic id, high watermark or incarnation: none recorded, none known, unknown."""
    old = {
        "node": "n2",
        "max_wait_ms": 500,
        "epochs": [{"topic": "t", "partition": 0, "leader_epoch": 3, "epoch": 2}],
        "fetch": [
            {
                "topic": "t",
                "partition": 1,
                "epoch": 4,
                "fetch_offset": 10,
                "fsynced_offset": 9,
                "max_bytes": 1 << 20,
            }
        ],
        "a_member_of_a_newer_peer": True,
    }
    decoded = decode_request(orjson.dumps(old))
    assert decoded.epochs == (EpochQuery("t", 0, 3, 2, topic_id=0),)
    assert decoded.fetch == (FetchEntry(FetchRequest("t", 1, 4, 10, 9, 1 << 20), -1),)
    assert decoded.incarnation == 0


def test_a_requests_wait_and_size_are_capped() -> None:
    asked = Request("n2", 10**9, (), (FetchEntry(FETCH, 8),), incarnation=-5)
    huge = decode_request(encode_request(asked).replace(b'"max_bytes":1048576', b'"max_bytes":0'))
    assert huge.max_wait_ms == 30_000 and huge.incarnation == 0
    assert huge.fetch[0].request.max_bytes == 1


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[",
        b"[]",
        b"{}",
        b'{"node": 2}',
        b'{"node": "n2", "max_wait_ms": true}',
        b'{"node": "n2", "fetch": [{"topic": "t"}]}',
        b'{"node": "n2", "epochs": {}}',
    ],
)
def test_a_request_that_does_not_parse_is_a_bad_message(data: bytes) -> None:
    with pytest.raises(BadMessage):
        decode_request(data)


def test_an_answer_reads_as_it_was_sent() -> None:
    epoch_answer = EpochAnswer(FetchError.FENCED_LEADER_EPOCH, 1, 2, 0)
    fetched = FetchResponse(None, b"batches", 5, 0)
    empty = FetchResponse(FetchError.NOT_REPLICA, b"", -1, 0)
    data = encode_answer([(QUERY, epoch_answer)], [(FETCH, fetched), (FETCH, empty)])
    epochs, fetches = decode_answer(data)
    assert epochs == [("t", 0, epoch_answer)]
    assert fetches == [("t", 1, fetched), ("t", 1, empty)]


@pytest.mark.parametrize(
    "cut",
    [
        lambda data: data[:3],  # no length
        lambda data: data[:-1],  # batches shorter than the header says
        lambda data: data.replace(b'"fenced_leader_epoch"', b'"a_new_error"'),
        lambda data: data.replace(b'"size":7', b'"size":-1'),
        lambda data: data.replace(b'"epochs"', b'"epochz"'),
    ],
)
def test_an_answer_that_does_not_parse_is_a_bad_message(cut: Callable[[bytes], bytes]) -> None:
    data = encode_answer(
        [(QUERY, EpochAnswer(FetchError.FENCED_LEADER_EPOCH, 1, 2, 0))],
        [(FETCH, FetchResponse(None, b"batches", 5, 0))],
    )
    with pytest.raises(BadMessage):
        decode_answer(cut(data))
