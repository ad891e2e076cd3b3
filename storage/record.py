"""The record types every layer shares (PROTOCOL §1)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

_T = TypeVar("_T")


class ValueKind(enum.IntEnum):
    """How a record's value was published; it comes back in the same form."""

    JSON = 0  # `value`: the bytes are compact JSON text
    BYTES = 1  # `value_b64`: the bytes are the decoded payload


class Acks(enum.Enum):
    """Durability a publisher waits for (PROTOCOL §2 Publish)."""

    NONE = "0"  # answered before the write
    LEADER = "1"  # written to the log file: survives a crash of the process
    ALL = "all"  # fsynced: survives power loss


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A record handed to an append, before it has an offset and timestamp."""

    value: bytes
    kind: ValueKind = ValueKind.JSON
    key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    producer_id: str | None = None
    # PROTOCOL §8 delayed delivery: first sent to subscriptions no earlier than the
    # append timestamp + delay_ms (0: no delay, no deliver_at).
    delay_ms: int = 0


@dataclass(frozen=True, slots=True)
class Record:
    """A record as stored in a partition log."""

    partition: int
    offset: int
    timestamp: int  # broker append time, ms since the epoch
    value: bytes
    kind: ValueKind = ValueKind.JSON
    key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    producer_id: str | None = None
    # PROTOCOL §8: timestamp + delay_ms of a delayed record; None for one published
    # without delay_ms (or with 0).
    deliver_at: int | None = None

    @property
    def delay_ms(self) -> int:
        """The delay it was published with (0 when none), as NewRecord carries it."""
        return 0 if self.deliver_at is None else self.deliver_at - self.timestamp

    @property
    def id(self) -> str:
        """The message id of PROTOCOL §1: ``"{partition}-{offset}"``."""
        return f"{self.partition}-{self.offset}"


def message_size(value: bytes, key: str | None, headers: Mapping[str, str]) -> int:
    """A message's size as PROTOCOL §2 counts it against max_message_bytes."""
    size = len(value)
    if key is not None:
        size += len(key.encode())
    for name, header in headers.items():
        size += len(name.encode()) + len(header.encode())
    return size


def slot_constructor(cls: type[_T]) -> Callable[..., _T]:
    """A positional constructor for a frozen, slotted dataclass without ``__post_init__``.

    It sets the slots directly instead of going through the frozen ``__init__`` (one
    ``object.__setattr__`` per field): the same object, about 2.5x faster. For the
    per-record objects of the hot paths; every field must be passed.
    """
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = [f"def make({', '.join(names)}):", "    obj = _new(_cls)"]
    for name in names:
        namespace[f"_set_{name}"] = vars(cls)[name].__set__
        lines.append(f"    _set_{name}(obj, {name})")
    lines.append("    return obj")
    exec("\n".join(lines), namespace)  # source built from the field names only
    make: Callable[..., _T] = namespace["make"]
    return make


new_record = slot_constructor(NewRecord)
