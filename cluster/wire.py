"""The replication connection's messages (cluster/replication.py has the protocol).

A follower node holds one WebSocket to each leader node (``/v1/cluster/fetch``) and sends,
in turn, one request naming every partition it follows there; the leader answers each
in order. A request is a JSON text frame::

    {"node": "n2", "incarnation": 1234, "max_wait_ms": 500,
     "epochs": [{"topic", "topic_id", "partition", "leader_epoch", "epoch"}, ...],
     "fetch": [{"topic", "topic_id", "partition", "epoch", "fetch_offset",
                "fsynced_offset", "max_bytes", "high_watermark"}, ...]}

``incarnation`` is the follower node's (cluster/state.py): a leader counts a follower in
the ISR only as the incarnation it recorded there, so a restarted follower leaves the
ISR at its first fetch and rejoins as its new incarnation once it has caught up.
``topic_id`` is the id of the topic the follower's copy is of (cluster/topic_ids.py): a
leader whose copy is of another topic of that name answers ``inconsistent_topic_id``
and nothing else, so no record crosses from a deleted topic into one created again
(KIP-516). ``high_watermark`` is the mark the follower knows: the leader answers at once when its
own is newer, so followers (and the readers they serve) learn a commit one round trip
after it happens. The answer is a binary frame: a 4-byte big-endian length, a JSON
header ``{"epochs": [{"topic", "partition", "error", "epoch", "end_offset",
"log_start"}], "fetch": [{"topic", "partition", "error", "high_watermark", "log_start",
"size"}]}``, then each fetch entry's ``size`` bytes of stored batches, in order.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from cluster.follower import EpochAnswer, EpochQuery, FetchRequest, FetchResponse
from cluster.replication import FetchError

_LENGTH = struct.Struct(">I")
MAX_WAIT_MS = 500  # a follower's long poll: an idle pair of nodes costs 2 requests/s


class BadMessage(ValueError):
    """A replication message that does not parse (a peer of another version, a bug)."""


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
    return orjson.dumps(
        {
            "node": request.node,
            "incarnation": request.incarnation,
            "max_wait_ms": request.max_wait_ms,
            "epochs": [
                {
                    "topic": q.topic,
                    "topic_id": q.topic_id,
                    "partition": q.partition,
                    "leader_epoch": q.leader_epoch,
                    "epoch": q.epoch,
                }
                for q in request.epochs
            ],
            "fetch": [
                {
                    "topic": e.request.topic,
                    "topic_id": e.request.topic_id,
                    "partition": e.request.partition,
                    "epoch": e.request.epoch,
                    "fetch_offset": e.request.fetch_offset,
                    "fsynced_offset": e.request.fsynced_offset,
                    "max_bytes": e.request.max_bytes,
                    "high_watermark": e.high_watermark,
                }
                for e in request.fetch
            ],
        }
    )


def decode_request(data: bytes | str) -> Request:
    try:
        raw: Any = orjson.loads(data)
        return Request(
            node=_text(raw["node"]),
            max_wait_ms=min(max(_int(raw.get("max_wait_ms", 0)), 0), 30_000),
            epochs=tuple(
                EpochQuery(
                    _text(q["topic"]),
                    _int(q["partition"]),
                    _int(q["leader_epoch"]),
                    _int(q["epoch"]),
                    _int(q.get("topic_id", 0)),
                )
                for q in raw.get("epochs", ())
            ),
            fetch=tuple(
                FetchEntry(
                    FetchRequest(
                        _text(f["topic"]),
                        _int(f["partition"]),
                        _int(f["epoch"]),
                        _int(f["fetch_offset"]),
                        _int(f["fsynced_offset"]),
                        min(max(_int(f["max_bytes"]), 1), 64 << 20),
                        _int(f.get("topic_id", 0)),
                    ),
                    _int(f.get("high_watermark", -1)),
                )
                for f in raw.get("fetch", ())
            ),
            incarnation=max(_int(raw.get("incarnation", 0)), 0),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise BadMessage(f"not a fetch request: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Answer:
    epochs: tuple[tuple[EpochQuery, EpochAnswer], ...]
    fetch: tuple[tuple[FetchRequest, FetchResponse], ...]


def encode_answer(
    epochs: Sequence[tuple[EpochQuery, EpochAnswer]],
    fetch: Sequence[tuple[FetchRequest, FetchResponse]],
) -> bytes:
    header = orjson.dumps(
        {
            "epochs": [
                {
                    "topic": q.topic,
                    "topic_id": q.topic_id,
                    "partition": q.partition,
                    "error": a.error,
                    "epoch": a.epoch,
                    "end_offset": a.end_offset,
                    "log_start": a.log_start,
                }
                for q, a in epochs
            ],
            "fetch": [
                {
                    "topic": r.topic,
                    "partition": r.partition,
                    "error": a.error,
                    "high_watermark": a.high_watermark,
                    "log_start": a.log_start,
                    "size": len(a.batches),
                }
                for r, a in fetch
            ],
        }
    )
    return b"".join([_LENGTH.pack(len(header)), header, *(a.batches for _, a in fetch)])


def decode_answer(
    data: bytes,
) -> tuple[list[tuple[str, int, EpochAnswer]], list[tuple[str, int, FetchResponse]]]:
    """(epoch answers, fetch responses), each with its (topic, partition)."""
    try:
        (length,) = _LENGTH.unpack_from(data, 0)
        raw: Any = orjson.loads(data[4 : 4 + length])
        at = 4 + length
        epochs = [
            (
                _text(e["topic"]),
                _int(e["partition"]),
                EpochAnswer(
                    _error(e["error"]),
                    _int(e["epoch"]),
                    _int(e["end_offset"]),
                    _int(e["log_start"]),
                ),
            )
            for e in raw["epochs"]
        ]
        fetch = []
        for f in raw["fetch"]:
            size = _int(f["size"])
            batches = data[at : at + size]
            if len(batches) != size:
                raise BadMessage("a fetch answer shorter than its header says")
            at += size
            fetch.append(
                (
                    _text(f["topic"]),
                    _int(f["partition"]),
                    FetchResponse(
                        _error(f["error"]), batches, _int(f["high_watermark"]), _int(f["log_start"])
                    ),
                )
            )
        return epochs, fetch
    except (struct.error, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise BadMessage(f"not a fetch answer: {exc}") from exc


def _error(value: Any) -> FetchError | None:
    return None if value is None else FetchError(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, not {value!r}")
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, not {value!r}")
    return value
