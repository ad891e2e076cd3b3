"""Client → server frames of a WebSocket consumer, parsed and validated (PROTOCOL §3).

Parsing is pure: a raw WebSocket message goes in, a frozen frame comes out, or
`BadFrame` carrying the `error` frame's code. The sessions decide what a frame does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from delivery.start import StartAt
from herald.protocol.limits import MAX_CREDIT, MAX_INT64, MAX_NACK_DELAY_MS, MAX_NACK_REASON

MIN_EXTEND_MS, MAX_EXTEND_MS = 100, 600_000
FRAME_TYPES = ("credit", "ack", "nack", "extend")

# A message id is "{partition}-{offset}" (PROTOCOL §1); only the canonical spelling names a record.
_MESSAGE_ID = re.compile(r"(?:0|[1-9][0-9]*)-(?:0|[1-9][0-9]*)")


class BadFrame(Exception):
    """A client frame the server answers with an `error` frame (PROTOCOL §3)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class CreditFrame:
    n: int


@dataclass(frozen=True, slots=True)
class AckFrame:
    ids: tuple[str, ...]
    has_req: bool
    req: Any = None  # any JSON value, echoed as sent in `acked`


@dataclass(frozen=True, slots=True)
class NackFrame:
    ids: tuple[str, ...]
    delay_ms: int | None
    reason: str | None = None  # PROTOCOL §8: what the dead letter says went wrong


@dataclass(frozen=True, slots=True)
class ExtendFrame:
    ids: tuple[str, ...]
    ms: int


ClientFrame = CreditFrame | AckFrame | NackFrame | ExtendFrame


def is_message_id(value: str) -> bool:
    return _MESSAGE_ID.fullmatch(value) is not None


def parse_frame(message: Mapping[str, Any]) -> ClientFrame:
    """Parse one ASGI `websocket.receive` message into a frame, or raise `BadFrame`."""
    text = message.get("text")
    if text is None:
        # PROTOCOL §3: every frame is one JSON object in a text frame.
        raise BadFrame("bad_frame", "frames must be text frames holding one JSON object")
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadFrame("bad_frame", f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadFrame("bad_frame", "a frame must be a JSON object")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise BadFrame("bad_frame", "a frame needs a string `type`")
    if kind == "credit":
        return CreditFrame(_integer(data, "n", 1, MAX_CREDIT))
    if kind == "ack":
        ids = _ids(data)
        if "req" not in data:
            return AckFrame(ids, has_req=False)
        return AckFrame(ids, has_req=True, req=_exact_req(text))
    if kind == "nack":
        delay = (
            None
            if data.get("delay_ms") is None
            else _integer(data, "delay_ms", 0, MAX_NACK_DELAY_MS)
        )
        return NackFrame(_ids(data), delay, _reason(data))
    if kind == "extend":
        return ExtendFrame(_ids(data), _integer(data, "ms", MIN_EXTEND_MS, MAX_EXTEND_MS))
    raise BadFrame(
        "unknown_type", f"unknown frame type {kind!r}; expected one of {', '.join(FRAME_TYPES)}"
    )


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


def _capped(digits: str, cap: int) -> int:
    """The decimal ``digits`` as an int, at most ``cap``, without converting thousands
    of digits (Python refuses past 4300, and it is slow well before)."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(cap)):
        return cap
    return min(int(significant), cap)


def _integer(data: Mapping[str, Any], name: str, low: int, high: int) -> int:
    value = data.get(name)
    # bool is an int subclass; a JSON true is not a number. An integral float (5.0) is
    # accepted as PROTOCOL §2 only refuses non-integral numbers where an integer is expected.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadFrame("bad_frame", f"`{name}` must be an integer {low}..{high}")
    if not low <= value <= high:
        raise BadFrame("bad_frame", f"`{name}` must be in {low}..{high}, got {value}")
    return value


def _reason(data: Mapping[str, Any]) -> str | None:
    """A nack's optional `reason`: a string of at most MAX_NACK_REASON characters."""
    reason = data.get("reason")
    if reason is None:
        return None
    if not isinstance(reason, str) or len(reason) > MAX_NACK_REASON:
        raise BadFrame(
            "bad_frame", f"`reason` must be a string of at most {MAX_NACK_REASON} characters"
        )
    return reason


def _ids(data: Mapping[str, Any]) -> tuple[str, ...]:
    ids = data.get("ids")
    if not isinstance(ids, list) or not all(isinstance(item, str) for item in ids):
        raise BadFrame("bad_frame", "`ids` must be an array of message id strings")
    return tuple(ids)


def _exact_req(text: str) -> Any:
    """`req` exactly as sent: orjson reads integers beyond 64 bits as floats, so the
    (rare) frames carrying `req` are read again by the standard library."""

    def refuse(constant: str) -> Any:
        raise BadFrame("bad_frame", f"not JSON: {constant}")

    try:
        return json.loads(text, parse_constant=refuse)["req"]
    except (ValueError, RecursionError):
        raise BadFrame("bad_frame", "not JSON") from None
