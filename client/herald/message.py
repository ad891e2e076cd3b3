"""One record as the SDK hands it over: from a Consumer, a Tail, a Puller, or from
webhooks.verify.

A Message wraps the record as the protocol's model decoded it (herald/protocol/
records.py: PROTOCOL §1 record, + `subscription` and `attempt` when delivered): a
consumer builds one per record delivered, so building it is one small object and
nothing else (the bytes of a `value_b64` record are decoded once, when `value` is
first read).
"""

from __future__ import annotations

import binascii
from typing import Any, Protocol, cast

import msgspec
import orjson
from msgspec import UNSET

from herald.protocol.frames import ExtendFrame, NackFrame
from herald.protocol.records import (
    DeliveredRecord,
    PackedRecord,
    Record,
    RecordFields,
    TailRecord,
)
from herald.protocol.unchecked import unchecked_struct


class Answerer(Protocol):
    """What a message answers through: a Consumer (WebSocket) or a Puller (HTTP pull)."""

    def queue_ack(self, message_id: str) -> None: ...

    def queue_frame(self, frame: NackFrame | ExtendFrame) -> None: ...


REQUIRED = ("topic", "id", "partition", "offset", "timestamp")
_UNDECODED: Any = object()
# What a record received from elsewhere is read as (its fields' types checked, not
# their ranges): with a subscription, as a tail's (an attempt only), or as read.
_FORMS: tuple[type[Record], ...] = (
    unchecked_struct(DeliveredRecord),
    unchecked_struct(TailRecord),
    unchecked_struct(Record),
)


class Message:
    """One delivered record. `value` is the JSON value, or the decoded bytes when the
    record was published as `value_b64` (then `is_bytes` is true)."""

    __slots__ = ("_consumer", "_record", "_value")

    def __init__(self, record: Record | PackedRecord, consumer: Answerer | None = None) -> None:
        self._record: RecordFields = record  # a PackedRecord in a PackedMessage
        self._consumer = consumer
        self._value: Any = _UNDECODED

    @classmethod
    def from_json(cls, data: dict[str, Any], consumer: Answerer | None = None) -> Message:
        """A record received from anywhere but a Herald connection: its fields checked
        (KeyError, or ValueError when it is not a record). `key` and `headers` may be
        left out (none)."""
        missing = [name for name in REQUIRED if name not in data]
        if missing:
            raise KeyError(f"not a record: no {', '.join(missing)}")
        data = {"key": None, "headers": {}, **data}
        form = _FORMS[0] if data.get("subscription") is not None else _FORMS[1]
        if "attempt" not in data:
            form = _FORMS[2]
        elif data.get("subscription") is None:
            data.pop("subscription", None)
        return cls(msgspec.convert(data, form), consumer)

    # -- the record ---------------------------------------------------------------------

    @property
    def topic(self) -> str:
        return self._record.topic

    @property
    def id(self) -> str:
        return self._record.id

    @property
    def partition(self) -> int:
        return self._record.partition

    @property
    def offset(self) -> int:
        return self._record.offset

    @property
    def timestamp(self) -> int:
        return self._record.timestamp

    @property
    def deliver_at(self) -> int | None:
        """ms since the epoch before which the record was not sent to subscriptions: its
        timestamp + the `delay_ms` it was published with; None without a delay
        (PROTOCOL §8 delayed delivery)."""
        deliver_at = self._record.deliver_at
        return None if deliver_at is UNSET else deliver_at

    @property
    def key(self) -> str | None:
        return self._record.key

    @property
    def headers(self) -> dict[str, str]:
        return self._record.headers

    @property
    def is_bytes(self) -> bool:
        return cast(Record, self._record).value_b64 is not UNSET

    @property
    def value(self) -> Any:
        value = self._value
        if value is _UNDECODED:
            record = cast(Record, self._record)
            encoded = record.value_b64
            value = self._value = record.value if encoded is UNSET else _bytes_of(encoded)
        return value

    @property
    def attempt(self) -> int:
        attempt: int = getattr(self._record, "attempt", 1)
        return attempt

    @property
    def subscription(self) -> str | None:
        subscription: str | None = getattr(self._record, "subscription", None)
        return subscription

    def to_json(self) -> dict[str, Any]:
        """The record as the server sent it."""
        data: dict[str, Any] = {
            "topic": self.topic,
            "id": self.id,
            "partition": self.partition,
            "offset": self.offset,
            "timestamp": self.timestamp,
        }
        if self.deliver_at is not None:
            data["deliver_at"] = self.deliver_at
        data |= {
            "key": self.key,
            "headers": self.headers,
            "subscription": self.subscription,
            "attempt": self.attempt,
        }
        if self.is_bytes:
            data["value_b64"] = self._value_b64()
        else:
            data["value"] = self.value
        return data

    def _value_b64(self) -> str:
        b64 = cast(Record, self._record).value_b64
        assert b64 is not UNSET  # is_bytes
        return b64

    def __repr__(self) -> str:
        return (
            f"Message(topic={self.topic!r}, id={self.id!r}, partition={self.partition}, "
            f"offset={self.offset}, key={self.key!r}, attempt={self.attempt}, value={self.value!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]  # mutable payload, as the dataclass was

    # -- answering through the consumer that received it ----------------------------------

    async def ack(self) -> None:
        """Done with this record; acks are batched (see Consumer.ack_interval_ms)."""
        self._owner().queue_ack(self._record.id)

    async def nack(self, delay_ms: int | None = None, reason: str | None = None) -> None:
        """Redeliver after `delay_ms`, else after the subscription's backoff. `reason`
        (≤ 256 characters) is what a dead letter of it will say went wrong (PROTOCOL §8)."""
        self._owner().queue_frame(NackFrame(ids=[self.id], delay_ms=delay_ms, reason=reason))

    async def extend(self, ms: int) -> None:
        """Move the ack deadline to now + `ms`."""
        self._owner().queue_frame(ExtendFrame(ids=[self.id], ms=ms))

    def _owner(self) -> Answerer:
        if self._consumer is None:
            raise RuntimeError("this message has no consumer to answer through")
        return self._consumer


class PackedMessage(Message):
    """A Message delivered in msgpack (docs/protocol.md "MessagePack"): the same record,
    its value carried as `value` (bin, a bytes record's bytes) or `value_json` (a JSON
    value's text, parsed when `value` is first read)."""

    __slots__ = ()

    @property
    def is_bytes(self) -> bool:
        return cast(PackedRecord, self._record).value_json is UNSET

    @property
    def value(self) -> Any:
        value = self._value
        if value is _UNDECODED:
            record = cast(PackedRecord, self._record)
            text = record.value_json
            value = self._value = record.value if text is UNSET else orjson.loads(text)
        return value

    def _value_b64(self) -> str:
        value = cast(PackedRecord, self._record).value
        assert value is not UNSET  # is_bytes
        return binascii.b2a_base64(value, newline=False).decode("ascii")


def _bytes_of(value_b64: str) -> bytes:
    """A record's `value_b64`, decoded by msgspec's base64 (in C, half the CPU of
    ``base64.b64decode``'s: the server sends canonical base64, nothing to escape)."""
    try:
        return _BASE64.decode(b'"%b"' % value_b64.encode("ascii"))
    except (msgspec.DecodeError, UnicodeEncodeError):
        raise ValueError(f"value_b64 is not base64: {value_b64[:40]!r}") from None


_BASE64 = msgspec.json.Decoder(bytes)
