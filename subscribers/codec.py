"""The encoding a consumer socket speaks, chosen once per connection in its handshake:
JSON (PROTOCOL §3, every client's default) or msgpack, when the client offers the
subprotocol `herald.msgpack` (docs/protocol.md "MessagePack").

A codec is the set of functions the connection and its sessions call: how records are
encoded for a `deliver` frame, how such a frame is spliced around them, the other frames
the server writes, and how a client frame is read. JSON's are subscribers/wire.py's and
subscribers/frames.py's own functions, called as before (the hot path gains no layer);
msgpack's are subscribers/packed.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from msgspec import Raw, UnsetType

from herald.protocol.encodings import MSGPACK_SUBPROTOCOL
from herald.protocol.frames import ClientFrame, ErrorCode
from storage.record import Record
from subscribers import packed, wire
from subscribers.frames import parse_frame, parse_packed_frame

if TYPE_CHECKING:
    from delivery.events import Delivery


@dataclass(frozen=True, slots=True, eq=False)
class Codec:
    """One encoding of a consumer socket's frames; two exist, shared by every connection."""

    name: str  # what a cache of encoded records is kept per (subscribers/tail.py)
    subprotocol: str | None  # what the handshake selects (None: none)
    binary: bool  # frames are written as binary frames, else as text
    # Records of a subscription's `deliver` (topic, deliveries, subscription).
    deliveries: Callable[[str, Sequence[Delivery], str | None], list[bytes]]
    tail_record: Callable[[str, Record], bytes]  # a tail's record: attempt 1, no subscription
    deliver_frame: Callable[[list[bytes]], bytes]  # around records encoded as above
    ready_frame: Callable[[str | None, str, int, dict[int, int] | UnsetType], bytes]
    error_frame: Callable[[ErrorCode, str], bytes]
    acked_frame: Callable[[Raw, list[str], list[str]], bytes]
    parse: Callable[[Mapping[str, Any]], ClientFrame]  # an ASGI `websocket.receive`


def _json_tail_record(topic: str, record: Record) -> bytes:
    return wire.record_json(topic, record, None, 1)


JSON = Codec(
    name="json",
    subprotocol=None,
    binary=False,
    deliveries=wire.deliveries_json,
    tail_record=_json_tail_record,
    deliver_frame=wire.deliver_frame,
    ready_frame=wire.ready_frame,
    error_frame=wire.error_frame,
    acked_frame=wire.acked_frame,
    parse=parse_frame,
)

MSGPACK = Codec(
    name="msgpack",
    subprotocol=MSGPACK_SUBPROTOCOL,
    binary=True,
    deliveries=packed.packed_deliveries,
    tail_record=packed.packed_tail_record,
    deliver_frame=packed.packed_deliver_frame,
    ready_frame=packed.packed_ready_frame,
    error_frame=packed.packed_error_frame,
    acked_frame=packed.packed_acked_frame,
    parse=parse_packed_frame,
)


def negotiated(offered: Collection[str]) -> Codec:
    """The codec of a connection whose client offered these subprotocols: msgpack when
    it offered `herald.msgpack` (beside `herald.v1` too), else JSON."""
    return MSGPACK if MSGPACK_SUBPROTOCOL in offered else JSON
