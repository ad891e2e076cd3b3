"""One record as the SDK hands it over: from a Consumer, or from webhooks.verify.

A Message wraps the record's JSON object as the server sent it (PROTOCOL §1 record +
`subscription`, `attempt`) and reads its fields on access: a consumer builds one per
record delivered, so building it is one small object and nothing else (the bytes of a
`value_b64` record are decoded once, when `value` is first read).
"""

from __future__ import annotations

import base64
from typing import Any, Protocol


class Answerer(Protocol):
    """What a message answers through: a Consumer (WebSocket) or a Puller (HTTP pull)."""

    def queue_ack(self, message_id: str) -> None: ...

    def queue_frame(self, frame: dict[str, Any]) -> None: ...


REQUIRED = ("topic", "id", "partition", "offset", "timestamp")
_UNDECODED: Any = object()


class Message:
    """One delivered record. `value` is the JSON value, or the decoded bytes when the
    record was published as `value_b64` (then `is_bytes` is true)."""

    __slots__ = ("_consumer", "_data", "_value")

    def __init__(self, data: dict[str, Any], consumer: Answerer | None = None) -> None:
        self._data = data
        self._consumer = consumer
        self._value: Any = _UNDECODED

    @classmethod
    def from_json(cls, data: dict[str, Any], consumer: Answerer | None = None) -> Message:
        """A record received from anywhere but a Herald connection: its fields checked
        (KeyError or TypeError when it is not a record)."""
        missing = [name for name in REQUIRED if name not in data]
        if missing:
            raise KeyError(f"not a record: no {', '.join(missing)}")
        if "value_b64" in data and not isinstance(data["value_b64"], str):
            raise TypeError("value_b64 is not a string")
        return cls(data, consumer)

    # -- the record ---------------------------------------------------------------------

    @property
    def topic(self) -> str:
        topic: str = self._data["topic"]
        return topic

    @property
    def id(self) -> str:
        id_: str = self._data["id"]
        return id_

    @property
    def partition(self) -> int:
        partition: int = self._data["partition"]
        return partition

    @property
    def offset(self) -> int:
        offset: int = self._data["offset"]
        return offset

    @property
    def timestamp(self) -> int:
        timestamp: int = self._data["timestamp"]
        return timestamp

    @property
    def deliver_at(self) -> int | None:
        """ms since the epoch before which the record was not sent to subscriptions: its
        timestamp + the `delay_ms` it was published with; None without a delay
        (PROTOCOL §8 delayed delivery)."""
        deliver_at: int | None = self._data.get("deliver_at")
        return deliver_at

    @property
    def key(self) -> str | None:
        key: str | None = self._data.get("key")
        return key

    @property
    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = self._data.get("headers") or {}
        return headers

    @property
    def is_bytes(self) -> bool:
        return "value_b64" in self._data

    @property
    def value(self) -> Any:
        value = self._value
        if value is _UNDECODED:
            data = self._data
            value = self._value = (
                base64.b64decode(data["value_b64"]) if "value_b64" in data else data.get("value")
            )
        return value

    @property
    def attempt(self) -> int:
        attempt: int = self._data.get("attempt", 1)
        return attempt

    @property
    def subscription(self) -> str | None:
        subscription: str | None = self._data.get("subscription")
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
            data["value_b64"] = self._data["value_b64"]
        else:
            data["value"] = self.value
        return data

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
        self._owner().queue_ack(self._data["id"])

    async def nack(self, delay_ms: int | None = None, reason: str | None = None) -> None:
        """Redeliver after `delay_ms`, else after the subscription's backoff. `reason`
        (≤ 256 characters) is what a dead letter of it will say went wrong (PROTOCOL §8)."""
        frame: dict[str, Any] = {"type": "nack", "ids": [self.id]}
        if delay_ms is not None:
            frame["delay_ms"] = delay_ms
        if reason is not None:
            frame["reason"] = reason
        self._owner().queue_frame(frame)

    async def extend(self, ms: int) -> None:
        """Move the ack deadline to now + `ms`."""
        self._owner().queue_frame({"type": "extend", "ids": [self.id], "ms": ms})

    def _owner(self) -> Answerer:
        if self._consumer is None:
            raise RuntimeError("this message has no consumer to answer through")
        return self._consumer
