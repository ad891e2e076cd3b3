"""Durable subscription cursors: ack floor, acked ranges above it, attempt counts.

PROTOCOL §3: acks are persisted with the cursor, and attempt counts survive a graceful
restart. One small file per subscription, ``<subscription>.cursor``, written
temp file -> fsync -> rename -> fsync dir. Before the rename the current file is kept
as ``.cursor.prev``, so a file that turns out torn or corrupt after a crash (a
filesystem that reorders the rename before the data, a partial copy) falls back to
the last good snapshot instead of losing the cursor or crashing the server.

Sync API: the delivery engine calls :meth:`CursorStore.save` via ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import orjson

from storage.durable import fsync_dir, make_dirs, write_synced

Range = tuple[int, int]  # half-open [start, end)

_MAGIC = b"HCUR"
_VERSION = 1
_HEADER = struct.Struct(">4sBII")  # magic, version, payload length, crc32c(payload)


@dataclass(frozen=True, slots=True)
class PartitionCursor:
    """Everything below ``ack_floor`` is acked; ``acked`` lists the sorted, disjoint,
    non-adjacent half-open ranges acked above it (gaps are in flight or not yet sent)."""

    ack_floor: int
    acked: tuple[Range, ...] = ()


@dataclass(frozen=True, slots=True)
class CursorSnapshot:
    partitions: dict[int, PartitionCursor]
    attempts: dict[tuple[int, int], int]  # (partition, offset) -> deliveries so far


# --- helpers for the delivery engine: acked offsets <-> ranges -------------------------


def offsets_to_ranges(offsets: Iterable[int]) -> tuple[Range, ...]:
    """Sorted offsets (duplicates allowed) -> minimal half-open ranges."""
    ranges: list[Range] = []
    start = end = -1
    for offset in offsets:
        if offset == end - 1:
            continue  # duplicate of the last offset
        if offset < end:
            raise ValueError("offsets must be sorted")
        if offset == end:
            end += 1
            continue
        if end != -1:
            ranges.append((start, end))
        start, end = offset, offset + 1
    if end != -1:
        ranges.append((start, end))
    return tuple(ranges)


def ranges_to_offsets(ranges: Iterable[Range]) -> Iterator[int]:
    for start, end in ranges:
        yield from range(start, end)


def compact_cursor(ack_floor: int, acked_offsets: Iterable[int]) -> PartitionCursor:
    """Build a cursor from a floor and sorted acked offsets, raising the floor over any
    acked run that starts at it and dropping offsets already below it."""
    ranges = offsets_to_ranges(o for o in acked_offsets if o >= ack_floor)
    if ranges and ranges[0][0] == ack_floor:
        ack_floor = ranges[0][1]
        ranges = ranges[1:]
    return PartitionCursor(ack_floor, ranges)


# --- encoding --------------------------------------------------------------------------


class _Invalid(Exception):
    """A cursor file failed its checks; the caller falls back to the previous one."""


def encode_snapshot(snapshot: CursorSnapshot) -> bytes:
    body = {
        # orjson wants string keys; ranges are flattened to [a0, b0, a1, b1, ...].
        "p": {
            str(p): [c.ack_floor, [x for r in c.acked for x in r]]
            for p, c in snapshot.partitions.items()
        },
        "a": [[p, o, n] for (p, o), n in snapshot.attempts.items()],
    }
    payload = orjson.dumps(body)
    return _HEADER.pack(_MAGIC, _VERSION, len(payload), crc32c.crc32c(payload)) + payload


def decode_snapshot(data: bytes) -> CursorSnapshot:
    """Parse and validate a cursor file; raises ``_Invalid`` on any defect."""
    if len(data) < _HEADER.size:
        raise _Invalid("short header")
    magic, version, length, crc = _HEADER.unpack_from(data)
    payload = data[_HEADER.size :]
    if magic != _MAGIC or version != _VERSION or len(payload) != length:
        raise _Invalid("bad header or length")
    if crc32c.crc32c(payload) != crc:
        raise _Invalid("checksum mismatch")
    try:
        body = orjson.loads(payload)
        partitions = {_nat(int(p)): _decode_partition(v) for p, v in body["p"].items()}
        attempts = {(_nat(p), _nat(o)): _nat(n) for p, o, n in body["a"]}
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _Invalid(f"bad body: {exc}") from exc
    return CursorSnapshot(partitions, attempts)


def _nat(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ValueError("expected a non-negative integer")
    return value


def _decode_partition(value: Any) -> PartitionCursor:
    floor, flat = value
    floor = _nat(floor)
    if len(flat) % 2:
        raise ValueError("odd range list")
    ranges = tuple((_nat(flat[i]), _nat(flat[i + 1])) for i in range(0, len(flat), 2))
    previous_end = floor
    for start, end in ranges:
        if start < previous_end or end <= start:
            raise ValueError("ranges must be sorted, disjoint and above the floor")
        previous_end = end
    return PartitionCursor(floor, ranges)


# --- the store ---------------------------------------------------------------------------


class CursorStore:
    """One crash-safe cursor file per subscription under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        make_dirs(self.directory)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # Subscriptions whose main file this process wrote itself: known good, so a save
        # need not re-read and re-check it before keeping it as .prev.
        self._known_good: set[str] = set()

    def _lock(self, subscription: str) -> threading.Lock:
        # Saves of one subscription share its temp file, so they must not interleave;
        # different subscriptions fsync in parallel.
        with self._locks_guard:
            return self._locks.setdefault(subscription, threading.Lock())

    def _paths(self, subscription: str) -> tuple[Path, Path, Path]:
        if (
            not subscription
            or subscription[0] == "."
            or "/" in subscription
            or "\0" in subscription
        ):
            raise ValueError(f"invalid subscription name {subscription!r}")
        main = self.directory / f"{subscription}.cursor"
        return main, main.with_name(main.name + ".prev"), main.with_name(main.name + ".tmp")

    def load(self, subscription: str) -> CursorSnapshot | None:
        """The newest valid snapshot, or None if the subscription has none."""
        main, prev, _ = self._paths(subscription)
        for path in (main, prev):
            try:
                return decode_snapshot(path.read_bytes())
            except (FileNotFoundError, _Invalid):
                continue
        return None

    def save(self, subscription: str, snapshot: CursorSnapshot) -> None:
        """Durably replace the subscription's cursor. On return the snapshot survives power
        loss; at every instant before, a load sees the previous snapshot or this one."""
        main, prev, tmp = self._paths(subscription)
        data = encode_snapshot(snapshot)
        with self._lock(subscription):
            write_synced(tmp, data)
            # Keep the current file only if it is good: a corrupt main must never push the
            # last good snapshot out of .prev.
            if subscription in self._known_good or self._is_valid(main):
                os.replace(main, prev)
            os.replace(tmp, main)
            fsync_dir(self.directory)
            self._known_good.add(subscription)

    def delete(self, subscription: str) -> None:
        paths = self._paths(subscription)
        with self._lock(subscription):
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            fsync_dir(self.directory)
            self._known_good.discard(subscription)
        with self._locks_guard:
            self._locks.pop(subscription, None)

    @staticmethod
    def _is_valid(path: Path) -> bool:
        try:
            decode_snapshot(path.read_bytes())
        except (FileNotFoundError, _Invalid):
            return False
        return True
