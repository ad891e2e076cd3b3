"""Client → server frames of a WebSocket consumer, parsed and validated (PROTOCOL §3).

Parsing is pure: a raw WebSocket message goes in, a frozen frame comes out, or
`BadFrame` carrying the `error` frame's code. The sessions decide what a frame does.
A connection that selected msgpack (docs/protocol.md "MessagePack") reads binary frames
as msgpack maps and text frames as JSON, with the same refusals.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from typing import Any

import msgspec
import orjson
from msgspec import UNSET

from delivery.start import StartAt
from herald.protocol.frames import CLIENT_FRAME_TYPES, AckFrame, ClientFrame, ErrorCode
from herald.protocol.limits import MAX_CREDIT, MAX_INT64

# A message id is "{partition}-{offset}" (PROTOCOL §1); only the canonical spelling names a record.
_MESSAGE_ID = re.compile(r"(?:0|[1-9][0-9]*)-(?:0|[1-9][0-9]*)")

_decode = msgspec.json.Decoder(ClientFrame).decode
_decode_packed = msgspec.msgpack.Decoder(ClientFrame).decode
_encode_packed = msgspec.msgpack.Encoder().encode
_NOT_AN_OBJECT = "Expected `object`"
_WHERE = " - at `$"


class BadFrame(Exception):
    """A client frame the server answers with an `error` frame (PROTOCOL §3)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def is_message_id(value: str) -> bool:
    return _MESSAGE_ID.fullmatch(value) is not None


def parse_frame(message: Mapping[str, Any]) -> ClientFrame:
    """Parse one ASGI `websocket.receive` message into a frame (herald/protocol/frames.py),
    or raise `BadFrame`."""
    text = message.get("text")
    if text is None:
        # PROTOCOL §3: every frame is one JSON object in a text frame.
        raise BadFrame("bad_frame", "frames must be text frames holding one JSON object")
    try:
        return _decode(text)
    except msgspec.ValidationError as exc:
        return _integral_or_refused(text, exc)
    except msgspec.DecodeError as exc:
        raise BadFrame("bad_frame", f"not JSON: {exc}") from None
    except RecursionError:
        raise BadFrame("bad_frame", "not JSON: nested too deeply") from None


def _integral_or_refused(text: str, exc: msgspec.ValidationError) -> ClientFrame:
    """PROTOCOL §2: an integral number (5.0) is an integer where one is expected, so a
    frame refused for one is read again with it as an integer; any other refusal is
    answered with the field it names."""
    problem, _, where = str(exc).partition(_WHERE)
    field = where.rstrip("`").lstrip(".")
    if problem.endswith("got `float`") and field.isidentifier():
        data = orjson.loads(text)  # msgspec read it: orjson reads it too
        value = data.get(field)
        if isinstance(value, float) and value.is_integer():
            data[field] = int(value)
            with contextlib.suppress(msgspec.ValidationError):  # refused as it was first
                frame: ClientFrame = msgspec.convert(data, ClientFrame, strict=True)
                return frame
    raise _refusal(problem, field) from None


def parse_packed_frame(message: Mapping[str, Any]) -> ClientFrame:
    """`parse_frame` of a connection that selected msgpack: a binary frame is one msgpack
    map (integers as msgpack integers: no float is taken for one), a text frame JSON, whose
    ack's `req` is made msgpack here, as its `acked` answer will carry it."""
    data = message.get("bytes")
    if data is None:
        frame = parse_frame(message)
        if isinstance(frame, AckFrame) and frame.req is not UNSET:
            frame = msgspec.structs.replace(frame, req=_packed_req(frame.req))
        return frame
    try:
        return _decode_packed(data)
    except msgspec.ValidationError as exc:
        problem, _, where = str(exc).partition(_WHERE)
        raise _refusal(problem, where.rstrip("`").lstrip("."), "msgpack map") from None
    except msgspec.DecodeError as exc:
        raise BadFrame("bad_frame", f"not msgpack: {exc}") from None
    except RecursionError:
        raise BadFrame("bad_frame", "not msgpack: nested too deeply") from None


def _packed_req(req: msgspec.Raw) -> msgspec.Raw:
    """A JSON `req` as msgpack; one msgpack cannot hold (an integer past 64 bits, a number
    out of a double's range) makes the frame bad, which changes nothing."""
    try:
        return msgspec.Raw(_encode_packed(msgspec.json.decode(req)))
    except (msgspec.ValidationError, OverflowError) as exc:
        raise BadFrame("bad_frame", f"`req`: not representable in msgpack: {exc}") from None
    except RecursionError:
        raise BadFrame("bad_frame", "`req`: nested too deeply") from None


def _refusal(problem: str, field: str, a_frame: str = "JSON object") -> BadFrame:
    if field == "type":
        if problem.startswith("Invalid value"):
            return BadFrame(
                "unknown_type",
                f"unknown frame type {problem.removeprefix('Invalid value ')}; "
                f"expected one of {', '.join(CLIENT_FRAME_TYPES)}",
            )
        return BadFrame("bad_frame", "a frame needs a string `type`")
    if not field:
        if problem.startswith(_NOT_AN_OBJECT):
            return BadFrame("bad_frame", f"a frame must be a {a_frame}")
        if problem == "Object missing required field `type`":
            return BadFrame("bad_frame", "a frame needs a string `type`")
        return BadFrame("bad_frame", problem)  # "Object missing required field `n`"
    return BadFrame("bad_frame", f"`{field}`: {problem}")


def parse_credit_param(raw: str | None) -> int:
    """`?credit=N`: a non-negative decimal integer, capped at MAX_CREDIT (PROTOCOL §3).

    Raises ValueError for anything else; the caller closes with 4400.
    """
    if raw is None:
        return 0
    if not raw.isascii() or not raw.isdigit():
        raise ValueError(f"credit must be a non-negative integer, got {raw!r}")
    return _capped(raw, MAX_CREDIT)  # a larger credit is capped, not refused


def parse_from_param(raw: str | None) -> StartAt:
    """A tail's `?from=` (PROTOCOL §3): latest (the default) | earliest | <offset> | ts:<ms>.

    Raises ValueError for anything else; the caller closes with 4400.
    """
    if raw is None or raw == "latest":
        return StartAt.latest()
    if raw == "earliest":
        return StartAt.earliest()
    if raw.isascii() and raw.isdigit():
        return StartAt.at_offset(_capped(raw, MAX_INT64))  # past the end means the end
    number = raw.removeprefix("ts:")
    if number != raw and number.isascii() and number.isdigit():
        return StartAt.at_timestamp(_capped(number, MAX_INT64))
    raise ValueError(f"from must be latest, earliest, an offset or ts:<ms>, got {raw!r}")


def parse_positions_param(raw: str | None) -> bool:
    """A tail's `?positions=true|false` (docs/protocol.md §3, an extension): whether its
    `ready` frame says where the tail starts in each partition. Default false.

    Raises ValueError for anything else; the caller closes with 4400.
    """
    if raw is None or raw == "false":
        return False
    if raw == "true":
        return True
    raise ValueError(f"positions must be true or false, got {raw!r}")


def _capped(digits: str, cap: int) -> int:
    """The decimal ``digits`` as an int, at most ``cap``, without converting thousands
    of digits (Python refuses past 4300, and it is slow well before)."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(cap)):
        return cap
    return min(int(significant), cap)
