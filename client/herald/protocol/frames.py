"""The frames of a WebSocket consumer (PROTOCOL §3), declared once: what a client sends
(credit, ack, nack, extend) and what a server sends (ready, deliver, acked, error), each
a JSON object told apart by its `type` (a tagged union).

The server decodes client frames through them (subscribers/frames.py) and writes its
own with them, except `deliver`, whose records it splices in as stored
(subscribers/wire.py; its tests check the result against `DeliverFrame`). The SDK writes
client frames with them and reads server frames through them, with their constraints
taken off (herald/protocol/unchecked.py: a server's frames are not checked again). /openapi.json publishes their schemas under `x-websockets`.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

import msgspec
from msgspec import UNSET, Meta, Raw, UnsetType

from herald.protocol import limits
from herald.protocol.names import Name
from herald.protocol.records import (
    DeliveredRecord,
    NackDelayMs,
    NackReason,
    PackedDeliveredRecord,
    PackedTailRecord,
    TailRecord,
)

MessageIds = Annotated[list[str], Meta(description="message ids; unknown ids are ignored")]


class Frame(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """A frame's `type` is its tag; members it does not know are ignored (PROTOCOL §3)."""


# -- client → server --------------------------------------------------------------------


class CreditFrame(Frame, frozen=True, tag="credit"):
    """The server may send `n` more records (credit adds up; acks give none back)."""

    n: Annotated[int, Meta(ge=1, le=limits.MAX_CREDIT)]


class AckFrame(Frame, frozen=True, tag="ack"):
    """Done with these records; with `req`, answered by an `acked` frame."""

    ids: MessageIds
    req: Annotated[Raw, Meta(description="any JSON value, echoed as sent")] | UnsetType = UNSET


class NackFrame(Frame, frozen=True, tag="nack"):
    """Redeliver after `delay_ms`, else after the subscription's backoff."""

    ids: MessageIds
    delay_ms: NackDelayMs | None = None
    reason: NackReason | None = None


class ExtendFrame(Frame, frozen=True, tag="extend"):
    """The ack deadline of these records becomes now + `ms`."""

    ids: MessageIds
    ms: Annotated[int, Meta(ge=limits.EXTEND_MS.low, le=limits.EXTEND_MS.high)]


ClientFrame = CreditFrame | AckFrame | NackFrame | ExtendFrame
CLIENT_FRAME_TYPES: tuple[str, ...] = tuple(
    str(frame.__struct_config__.tag) for frame in get_args(ClientFrame)
)


# -- server → client --------------------------------------------------------------------


class ReadyFrame(Frame, frozen=True, tag="ready", omit_defaults=False):
    """The first frame of every connection; a tail's names no subscription."""

    subscription: Name | None
    consumer: str
    credit: Annotated[int, Meta(ge=0, le=limits.MAX_CREDIT)]
    positions: (
        Annotated[
            dict[int, int],
            Meta(
                description="a tail opened with ?positions=true: each partition's offset "
                "the tail starts at (docs/protocol.md §3)"
            ),
        ]
        | UnsetType
    ) = UNSET


class DeliverFrame(Frame, frozen=True, tag="deliver"):
    """1..k records, never more than the consumer's credit."""

    messages: list[DeliveredRecord]


class TailDeliverFrame(Frame, frozen=True, tag="deliver"):
    """A tail's `deliver`: records with `attempt` 1 and no `subscription`."""

    messages: list[TailRecord]


class AckedFrame(Frame, frozen=True, tag="acked"):
    """The answer to an ack that carried `req`. `unknown`: not in flight on this
    subscription (already acked, dead-lettered, dropped by a seek, never delivered)."""

    ok: list[str]
    unknown: list[str]
    req: Annotated[Raw, Meta(description="the ack's `req`, as sent")]


ErrorCode = Literal["unknown_type", "bad_frame"]


class ErrorFrame(Frame, frozen=True, tag="error"):
    """A bad client frame; the connection stays open and nothing else changes."""

    code: ErrorCode
    message: str


# GET /v1/subscriptions/{name}/ws; a tail's, GET /v1/topics/{topic}/ws, never answers acks.
ConsumerFrame = ReadyFrame | DeliverFrame | AckedFrame | ErrorFrame
TailFrame = ReadyFrame | TailDeliverFrame | ErrorFrame


# -- the msgpack encoding (docs/protocol.md "MessagePack") ------------------------------
# The same frames, each a msgpack map in a binary frame; only `deliver` differs, in its
# records (herald/protocol/records.py PackedRecord). `req` of an ack and its `acked`
# answer is any msgpack value there.


class PackedDeliverFrame(Frame, frozen=True, tag="deliver"):
    """`DeliverFrame` in msgpack."""

    messages: list[PackedDeliveredRecord]


class PackedTailDeliverFrame(Frame, frozen=True, tag="deliver"):
    """`TailDeliverFrame` in msgpack."""

    messages: list[PackedTailRecord]


PackedConsumerFrame = ReadyFrame | PackedDeliverFrame | AckedFrame | ErrorFrame
PackedTailFrame = ReadyFrame | PackedTailDeliverFrame | ErrorFrame
