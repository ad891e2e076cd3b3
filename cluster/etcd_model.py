"""etcd v3's data model as its gRPC gateway speaks it: keys, revisions, transactions.

The gateway's JSON conventions: keys and values are base64, 64-bit integers travel as
JSON strings, fields at their zero value are omitted (``"PUT"`` event type, ``"TTL": 0``,
``"succeeded": false``). Plain data and pure functions; the I/O is in
:mod:`cluster.etcd`.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# ---------------------------------------------------------------------------- types


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class RangeResult:
    kvs: tuple[KeyValue, ...]
    revision: int  # the store's revision when read: watch from revision + 1
    count: int
    more: bool


@dataclass(frozen=True, slots=True)
class Lease:
    id: int
    ttl: int  # seconds, as etcd granted it (it rounds small TTLs up)


CompareOp = Literal["=", "!=", "<", ">"]
_COMPARE_RESULTS = {"=": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}


@dataclass(frozen=True, slots=True)
class Compare:
    """One guard of a transaction: ``Compare.mod_revision(key, "=", 42)``.

    A missing key has version, create and mod revision 0: ``Compare.version(key, "=", 0)``
    is "the key does not exist".
    """

    key: bytes
    target: Literal["VERSION", "CREATE", "MOD", "VALUE", "LEASE"]
    op: CompareOp
    operand: int | bytes

    @classmethod
    def version(cls, key: str | bytes, op: CompareOp, version: int) -> Compare:
        return cls(to_bytes(key), "VERSION", op, version)

    @classmethod
    def create_revision(cls, key: str | bytes, op: CompareOp, revision: int) -> Compare:
        return cls(to_bytes(key), "CREATE", op, revision)

    @classmethod
    def mod_revision(cls, key: str | bytes, op: CompareOp, revision: int) -> Compare:
        return cls(to_bytes(key), "MOD", op, revision)

    @classmethod
    def value(cls, key: str | bytes, op: CompareOp, value: str | bytes) -> Compare:
        return cls(to_bytes(key), "VALUE", op, to_bytes(value))

    @classmethod
    def lease(cls, key: str | bytes, op: CompareOp, lease_id: int) -> Compare:
        return cls(to_bytes(key), "LEASE", op, lease_id)

    def to_json(self) -> dict[str, Any]:
        field = {
            "VERSION": "version",
            "CREATE": "create_revision",
            "MOD": "mod_revision",
            "VALUE": "value",
            "LEASE": "lease",
        }[self.target]
        operand = b64(self.operand) if isinstance(self.operand, bytes) else str(self.operand)
        return {
            "key": b64(self.key),
            "target": self.target,
            "result": _COMPARE_RESULTS[self.op],
            field: operand,
        }


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0

    @classmethod
    def of(cls, key: str | bytes, value: str | bytes, *, lease: int = 0) -> Put:
        return cls(to_bytes(key), to_bytes(value), lease)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"key": b64(self.key), "value": b64(self.value)}
        if self.lease:
            body["lease"] = str(self.lease)
        return {"request_put": body}


@dataclass(frozen=True, slots=True)
class Get:
    key: bytes
    range_end: bytes = b""

    @classmethod
    def of(cls, key: str | bytes, *, prefix: bool = False) -> Get:
        raw = to_bytes(key)
        return cls(raw, prefix_end(raw) if prefix else b"")

    def to_json(self) -> dict[str, Any]:
        return {"request_range": range_body(self.key, self.range_end)}


@dataclass(frozen=True, slots=True)
class Delete:
    key: bytes
    range_end: bytes = b""

    @classmethod
    def of(cls, key: str | bytes, *, prefix: bool = False) -> Delete:
        raw = to_bytes(key)
        return cls(raw, prefix_end(raw) if prefix else b"")

    def to_json(self) -> dict[str, Any]:
        return {"request_delete_range": range_body(self.key, self.range_end)}


Op = Put | Get | Delete


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the transaction
    # One entry per op of the branch that ran: a RangeResult for a Get, the number of
    # keys deleted for a Delete, the put's revision for a Put.
    results: tuple[RangeResult | int, ...]


# -------------------------------------------------------------------------- helpers


def to_bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The range_end that selects every key starting with ``prefix`` (etcd's GetPrefixRangeEnd)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"  # every byte is 0xff: no upper bound


def range_body(key: bytes, range_end: bytes, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(key), **extra}
    if range_end:
        body["range_end"] = b64(range_end)
    return body


def parse_kv(kv: Mapping[str, Any]) -> KeyValue:
    return KeyValue(
        key=unb64(kv.get("key")),
        value=unb64(kv.get("value")),
        create_revision=int(kv.get("create_revision", 0)),
        mod_revision=int(kv.get("mod_revision", 0)),
        version=int(kv.get("version", 0)),
        lease=int(kv.get("lease", 0)),
    )


def header_revision(body: Mapping[str, Any]) -> int:
    return int(body.get("header", {}).get("revision", 0))


def parse_range(body: Mapping[str, Any]) -> RangeResult:
    return RangeResult(
        kvs=tuple(parse_kv(kv) for kv in body.get("kvs", ())),
        revision=header_revision(body),
        count=int(body.get("count", 0)),
        more=bool(body.get("more", False)),
    )
