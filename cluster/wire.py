"""The replication connection's messages (cluster/replication.py has the protocol),
declared once as msgspec Structs: what goes on the wire is what they encode, and a
message is decoded into them in one typed pass.

A follower node holds one WebSocket to each leader node (``/v1/cluster/fetch``) and sends,
in turn, one request naming every partition it follows there; the leader answers each
in order. A request is a JSON text frame, a `RequestFrame`: the follower's node id and
incarnation, how long the leader may wait for news, an `EpochQueryFrame` for each
partition truncating and a `FetchFrame` for each fetching.

``incarnation`` is the follower node's (cluster/state.py): a leader counts a follower in
the ISR only as the incarnation it recorded there, so a restarted follower leaves the
ISR at its first fetch and rejoins as its new incarnation once it has caught up.
``topic_id`` is the id of the topic the follower's copy is of (cluster/topic_ids.py): a
leader whose copy is of another topic of that name answers ``inconsistent_topic_id``
and nothing else, so no record crosses from a deleted topic into one created again
(KIP-516). ``high_watermark`` is the mark the follower knows: the leader answers at once when its
own is newer, so followers (and the readers they serve) learn a commit one round trip
after it happens. The answer is a binary frame: a 4-byte big-endian length, a JSON
header (`AnswerHeader`: an `EpochAnswerFrame` for each epoch query, a `FetchAnswerFrame`
for each fetch), then each fetch answer's ``size`` bytes of stored batches, in order.
A member a peer of an older version leaves out takes its default; one it does not know
is ignored.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from cluster.follower import EpochAnswer, EpochQuery, FetchRequest, FetchResponse
from cluster.replication import FetchError

_LENGTH = struct.Struct(">I")
MAX_WAIT_MS = 500  # a follower's long poll: an idle pair of nodes costs 2 requests/s
_MAX_WAIT_MS_CAP = 30_000  # a leader holds a request no longer, whatever it asks
_MAX_BYTES_CAP = 64 << 20  # nor answers one fetch with more


class BadMessage(ValueError):
    """A replication message that does not parse (a peer of another version, a bug)."""


# ------------------------------------------------------------------ the frames


class EpochQueryFrame(msgspec.Struct, frozen=True, kw_only=True):
    """A partition truncating: the end of ``epoch`` in the leader's log, please."""

    topic: str
    topic_id: int = 0  # 0: none recorded
    partition: int
    leader_epoch: int
    epoch: int


class FetchFrame(msgspec.Struct, frozen=True, kw_only=True):
    """A partition fetching: the leader's batches from ``fetch_offset`` on."""

    topic: str
    topic_id: int = 0  # 0: none recorded
    partition: int
    epoch: int
    fetch_offset: int
    fsynced_offset: int
    max_bytes: int
    high_watermark: int = -1  # the mark the follower knows (-1: none)


class RequestFrame(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    incarnation: int = 0  # the follower node's (0: unknown)
    max_wait_ms: int = 0
    epochs: list[EpochQueryFrame] = msgspec.field(default_factory=list)
    fetch: list[FetchFrame] = msgspec.field(default_factory=list)


class EpochAnswerFrame(msgspec.Struct, frozen=True, kw_only=True):
    topic: str
    topic_id: int = 0
    partition: int
    error: FetchError | None
    epoch: int
    end_offset: int
    log_start: int


class FetchAnswerFrame(msgspec.Struct, frozen=True, kw_only=True):
    topic: str
    partition: int
    error: FetchError | None
    high_watermark: int
    log_start: int
    size: int  # bytes of stored batches after the header, in the order of the answers


class AnswerHeader(msgspec.Struct, frozen=True, kw_only=True):
    epochs: list[EpochAnswerFrame]
    fetch: list[FetchAnswerFrame]


_ENCODER = msgspec.json.Encoder()
_REQUEST = msgspec.json.Decoder(RequestFrame)
_ANSWER_HEADER = msgspec.json.Decoder(AnswerHeader)


# ------------------------------------------------------------------ requests


@dataclass(frozen=True, slots=True)
class FetchEntry:
    request: FetchRequest
    high_watermark: int  # what the follower knows


@dataclass(frozen=True, slots=True)
class Request:
    node: str
    max_wait_ms: int
    epochs: tuple[EpochQuery, ...]
    fetch: tuple[FetchEntry, ...]
    incarnation: int = 0  # the follower node's incarnation (0: unknown)


def encode_request(request: Request) -> bytes:
    return _ENCODER.encode(
        RequestFrame(
            node=request.node,
            incarnation=request.incarnation,
            max_wait_ms=request.max_wait_ms,
            epochs=[
                EpochQueryFrame(
                    topic=q.topic,
                    topic_id=q.topic_id,
                    partition=q.partition,
                    leader_epoch=q.leader_epoch,
                    epoch=q.epoch,
                )
                for q in request.epochs
            ],
            fetch=[
                FetchFrame(
                    topic=e.request.topic,
                    topic_id=e.request.topic_id,
                    partition=e.request.partition,
                    epoch=e.request.epoch,
                    fetch_offset=e.request.fetch_offset,
                    fsynced_offset=e.request.fsynced_offset,
                    max_bytes=e.request.max_bytes,
                    high_watermark=e.high_watermark,
                )
                for e in request.fetch
            ],
        )
    )


def decode_request(data: bytes | str) -> Request:
    try:
        frame = _REQUEST.decode(data)
    except msgspec.DecodeError as exc:  # its ValidationError included
        raise BadMessage(f"not a fetch request: {exc}") from exc
    return Request(
        node=frame.node,
        max_wait_ms=min(max(frame.max_wait_ms, 0), _MAX_WAIT_MS_CAP),
        epochs=tuple(
            EpochQuery(q.topic, q.partition, q.leader_epoch, q.epoch, q.topic_id)
            for q in frame.epochs
        ),
        fetch=tuple(
            FetchEntry(
                FetchRequest(
                    f.topic,
                    f.partition,
                    f.epoch,
                    f.fetch_offset,
                    f.fsynced_offset,
                    min(max(f.max_bytes, 1), _MAX_BYTES_CAP),
                    f.topic_id,
                ),
                f.high_watermark,
            )
            for f in frame.fetch
        ),
        incarnation=max(frame.incarnation, 0),
    )


# ------------------------------------------------------------------ answers


def encode_answer(
    epochs: Sequence[tuple[EpochQuery, EpochAnswer]],
    fetch: Sequence[tuple[FetchRequest, FetchResponse]],
) -> bytes:
    header = _ENCODER.encode(
        AnswerHeader(
            epochs=[
                EpochAnswerFrame(
                    topic=q.topic,
                    topic_id=q.topic_id,
                    partition=q.partition,
                    error=a.error,
                    epoch=a.epoch,
                    end_offset=a.end_offset,
                    log_start=a.log_start,
                )
                for q, a in epochs
            ],
            fetch=[
                FetchAnswerFrame(
                    topic=r.topic,
                    partition=r.partition,
                    error=a.error,
                    high_watermark=a.high_watermark,
                    log_start=a.log_start,
                    size=len(a.batches),
                )
                for r, a in fetch
            ],
        )
    )
    return b"".join([_LENGTH.pack(len(header)), header, *(a.batches for _, a in fetch)])


def decode_answer(
    data: bytes,
) -> tuple[list[tuple[str, int, EpochAnswer]], list[tuple[str, int, FetchResponse]]]:
    """(epoch answers, fetch responses), each with its (topic, partition)."""
    try:
        (length,) = _LENGTH.unpack_from(data, 0)
        header = _ANSWER_HEADER.decode(data[4 : 4 + length])
    except (struct.error, msgspec.DecodeError) as exc:
        raise BadMessage(f"not a fetch answer: {exc}") from exc
    epochs = [
        (e.topic, e.partition, EpochAnswer(e.error, e.epoch, e.end_offset, e.log_start))
        for e in header.epochs
    ]
    fetch = []
    at = 4 + length
    for f in header.fetch:
        batches = data[at : at + f.size]
        if f.size < 0 or len(batches) != f.size:
            raise BadMessage("a fetch answer shorter than its header says")
        at += f.size
        fetch.append(
            (f.topic, f.partition, FetchResponse(f.error, batches, f.high_watermark, f.log_start))
        )
    return epochs, fetch
