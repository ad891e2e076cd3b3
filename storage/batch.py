"""Batch framing: the unit written to a segment file.

One write and one CRC32C cover a batch of many records (as Kafka's record batch v2).
All integers are little-endian. Layout::

    batch header (44 bytes; 40 in version 1, which has no leader_epoch)
      u32  length        whole batch in bytes, header included
      u32  crc           CRC32C of everything after this field
      u8   magic         0x49 ("I"): version 2; 0x48 ("H"): version 1
      u8   attributes    bit flags; ATTR_ENCRYPTED is reserved for payload encryption
      u16  key_id        encryption key id when ATTR_ENCRYPTED, else 0
      i64  base_offset
      u32  record_count
      i64  first_timestamp
      i64  last_timestamp
      i32  leader_epoch  the epoch of the leader that appended the batch (version 2 only;
                         a version 1 batch reads as epoch 0)
    records, each:
      u32  offset_delta
      i64  timestamp
      u8   kind          ValueKind
      u8   flags         record flags: REC_DELAYED; 0 for a plain record
      u16  header_count
      i32  key_len       -1: null key
      i32  producer_len  -1: no producer id
      u32  value_len
      u32  delay_ms      only when flags has REC_DELAYED
      key, producer id, headers (u32 name_len, u32 value_len, name, value)*, value

Everything a reader needs to find offsets and timestamps stays in the header, so a later
encryption of the record section leaves scanning, indexing and retention untouched.
A delayed record (PROTOCOL §8 delayed delivery) sets REC_DELAYED in its flags byte —
written 0 by every earlier version, so old segments read as records without a delay —
and carries its delay_ms right after the fixed fields; deliver_at is the record's
timestamp + delay_ms. A record without a delay is laid out byte for byte as before.
The leader epoch (Kafka's partition leader epoch, KIP-101) lets a returning replica find
where its log diverged from the current leader's; every field of version 1 keeps its
position in version 2, which only appends the epoch to the header.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

from herald.protocol.limits import MAX_DELAY_MS
from storage import encryption
from storage.errors import CorruptLog
from storage.record import NewRecord, Record, ValueKind

MAGIC = 0x49  # version 2, written by this code
MAGIC_V1 = 0x48  # version 1: no leader epoch (read as epoch 0)
ATTR_ENCRYPTED = encryption.ATTR_ENCRYPTED  # record section encrypted with key ``key_id``

HEADER = struct.Struct("<IIBBHqIqqi")
HEADER_V1 = struct.Struct("<IIBBHqIqq")
HEADER_SIZE = HEADER.size  # 44: the most a header can take (version 2)
HEADER_V1_SIZE = HEADER_V1.size  # 40
_HEADER_SIZES = {MAGIC: HEADER_SIZE, MAGIC_V1: HEADER_V1_SIZE}
_MAGIC_AT = 8
_CRC_START = 8  # the CRC covers the batch from the magic byte on
_RECORD = struct.Struct("<IqBBHiiI")
_DELAY = struct.Struct("<I")
REC_DELAYED = 0x01  # record flag: a u32 delay_ms follows the fixed fields
_HEADER_PAIR = struct.Struct("<II")
_KINDS = (ValueKind.JSON, ValueKind.BYTES)
_MAX_EPOCH = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The readable part of a batch: what scanning, indexes and retention need."""

    length: int
    crc: int
    attributes: int
    key_id: int
    base_offset: int
    record_count: int
    first_timestamp: int
    last_timestamp: int
    leader_epoch: int = 0
    size: int = HEADER_SIZE  # bytes of the header itself: 40 in version 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """An encoded batch ready to be written, with the header fields the log indexes."""

    data: bytes
    base_offset: int
    record_count: int
    first_timestamp: int
    last_timestamp: int
    leader_epoch: int = 0


def encode_batch(
    base_offset: int,
    records: Sequence[NewRecord],
    timestamps: Sequence[int] | int,
    leader_epoch: int = 0,
) -> EncodedBatch:
    """Frame ``records`` as one batch starting at ``base_offset``, appended under
    ``leader_epoch`` (0 on a single node).

    ``timestamps`` is one timestamp for the whole batch (an append) or one per record
    (a replicated append).
    """
    if not 0 <= leader_epoch <= _MAX_EPOCH:
        raise ValueError(f"leader_epoch must be in 0..{_MAX_EPOCH}")
    if not records:
        raise ValueError("a batch holds at least one record")
    if isinstance(timestamps, int):
        first_ts = last_ts = timestamps
        each: Iterable[int] = itertools.repeat(timestamps)
    else:
        if len(timestamps) != len(records):
            raise ValueError("one timestamp per record")
        first_ts, last_ts, each = timestamps[0], timestamps[-1], timestamps
    parts: list[bytes] = [b""]  # slot 0: the header, packed once the body is known
    append = parts.append
    pack = _RECORD.pack
    for delta, (record, ts) in enumerate(zip(records, each, strict=False)):
        key = None if record.key is None else record.key.encode()
        producer = None if record.producer_id is None else record.producer_id.encode()
        headers = record.headers
        delay = record.delay_ms
        append(
            pack(
                delta,
                ts,
                record.kind,
                REC_DELAYED if delay else 0,
                len(headers),
                -1 if key is None else len(key),
                -1 if producer is None else len(producer),
                len(record.value),
            )
        )
        if delay:
            if not 0 < delay <= MAX_DELAY_MS:
                raise ValueError(f"delay_ms must be in 0..{MAX_DELAY_MS}")
            append(_DELAY.pack(delay))
        if key:
            append(key)
        if producer:
            append(producer)
        if headers:
            append(_encode_headers(headers))
        append(record.value)
    parts[0] = HEADER.pack(
        0, 0, MAGIC, 0, 0, base_offset, len(records), first_ts, last_ts, leader_epoch
    )
    buf = bytearray().join(parts)
    struct.pack_into("<I", buf, 0, len(buf))
    struct.pack_into("<I", buf, 4, crc32c.crc32c(memoryview(buf)[_CRC_START:]))
    data = bytes(buf)
    if encryption.active():  # storage/encryption.py: the record section, AES-GCM
        data = encryption.seal(data, HEADER_SIZE)
    return EncodedBatch(data, base_offset, len(records), first_ts, last_ts, leader_epoch)


def as_encoded(data: bytes, header: BatchHeader) -> EncodedBatch:
    """A batch read or received as stored bytes (a follower copying its leader: the
    bytes, CRC included, go to disk as they came)."""
    return EncodedBatch(
        data,
        header.base_offset,
        header.record_count,
        header.first_timestamp,
        header.last_timestamp,
        header.leader_epoch,
    )


def _encode_headers(headers: Mapping[str, str]) -> bytes:
    out: list[bytes] = []
    for name, value in headers.items():
        n, v = name.encode(), value.encode()
        out += (_HEADER_PAIR.pack(len(n), len(v)), n, v)
    return b"".join(out)


# Record is a frozen slotted dataclass: its generated __init__ sets each field through
# object.__setattr__, which costs more than the rest of decoding. These slot setters
# build the very same objects, about twice as fast, for the hot paths below.
_new_record = object.__new__
_slots: Any = vars(Record)  # field name -> slot descriptor
_set_partition = _slots["partition"].__set__
_set_offset = _slots["offset"].__set__
_set_timestamp = _slots["timestamp"].__set__
_set_value = _slots["value"].__set__
_set_kind = _slots["kind"].__set__
_set_key = _slots["key"].__set__
_set_headers = _slots["headers"].__set__
_set_producer = _slots["producer_id"].__set__
_set_deliver_at = _slots["deliver_at"].__set__


def _record(
    partition: int,
    offset: int,
    timestamp: int,
    value: bytes,
    kind: ValueKind,
    key: str | None,
    headers: Mapping[str, str],
    producer_id: str | None,
    deliver_at: int | None,
) -> Record:
    record = _new_record(Record)
    _set_partition(record, partition)
    _set_offset(record, offset)
    _set_timestamp(record, timestamp)
    _set_value(record, value)
    _set_kind(record, kind)
    _set_key(record, key)
    _set_headers(record, headers)
    _set_producer(record, producer_id)
    _set_deliver_at(record, deliver_at)
    return record


def make_records(
    partition: int, first_offset: int, timestamp: int, records: Sequence[NewRecord]
) -> list[Record]:
    """The Records an append of ``records`` at ``first_offset`` made."""
    return [
        _record(
            partition,
            first_offset + i,
            timestamp,
            r.value,
            r.kind,
            r.key,
            r.headers,
            r.producer_id,
            timestamp + r.delay_ms if r.delay_ms else None,
        )
        for i, r in enumerate(records)
    ]


def read_header(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header at ``pos`` (either version); raises CorruptLog if it cannot be a
    batch header."""
    available = len(buf) - pos
    if available < HEADER_V1_SIZE:
        raise CorruptLog(f"incomplete batch header at {pos}")
    size = _HEADER_SIZES.get(buf[pos + _MAGIC_AT])
    if size is None:
        raise CorruptLog(f"not a batch header at {pos}")
    if available < size:
        raise CorruptLog(f"incomplete batch header at {pos}")
    if size == HEADER_SIZE:
        length, crc, _magic, attributes, key_id, base, count, first_ts, last_ts, epoch = (
            HEADER.unpack_from(buf, pos)
        )
    else:
        length, crc, _magic, attributes, key_id, base, count, first_ts, last_ts = (
            HEADER_V1.unpack_from(buf, pos)
        )
        epoch = 0
    if length < size or count == 0 or epoch < 0:
        raise CorruptLog(f"not a batch header at {pos}")
    return BatchHeader(length, crc, attributes, key_id, base, count, first_ts, last_ts, epoch, size)


def header_size(batch: bytes | memoryview) -> int:
    """How many bytes the header of the framed ``batch`` takes (by its version)."""
    return _HEADER_SIZES[batch[_MAGIC_AT]]


def check_batch(buf: bytes | memoryview, pos: int, header: BatchHeader) -> None:
    """Raise CorruptLog unless the whole batch is present and its CRC matches."""
    end = pos + header.length
    if end > len(buf):
        raise CorruptLog(f"torn batch at {pos}")
    if crc32c.crc32c(memoryview(buf)[pos + _CRC_START : end]) != header.crc:
        raise CorruptLog(f"CRC mismatch in batch at {pos}")


def decode_batch(
    buf: bytes | memoryview,
    pos: int,
    header: BatchHeader,
    partition: int,
    from_offset: int = 0,
) -> list[Record]:
    """Decode the records of the (checked) batch at ``pos`` with offset >= ``from_offset``."""
    if header.attributes & ATTR_ENCRYPTED:
        # EncryptionError: key missing or wrong
        plain = encryption.unseal(buf, pos, header.length, header.size)
        return decode_batch(plain, 0, read_header(plain), partition, from_offset)
    view = memoryview(buf)
    unpack = _RECORD.unpack_from
    rsize = _RECORD.size
    base = header.base_offset
    end = pos + header.length
    p = pos + header.size
    out: list[Record] = []
    try:
        for _ in range(header.record_count):
            delta, ts, kind, flags, nheaders, klen, plen, vlen = unpack(view, p)
            p += rsize
            deliver_at = None
            if flags:
                if flags != REC_DELAYED:
                    raise CorruptLog(f"unknown record flags {flags:#x} in batch at {pos}")
                deliver_at = ts + _DELAY.unpack_from(view, p)[0]
                p += 4
            key = None
            if klen >= 0:
                key = str(view[p : p + klen], "utf-8")
                p += klen
            producer = None
            if plen >= 0:
                producer = str(view[p : p + plen], "utf-8")
                p += plen
            headers: dict[str, str] = {}
            if nheaders:
                p = _decode_headers(view, p, nheaders, headers)
            value_end = p + vlen
            if base + delta >= from_offset:
                out.append(
                    _record(
                        partition,
                        base + delta,
                        ts,
                        bytes(view[p:value_end]),
                        _KINDS[kind],
                        key,
                        headers,
                        producer,
                        deliver_at,
                    )
                )
            p = value_end
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise CorruptLog(f"malformed record in batch at {pos}") from exc
    if p != end:
        raise CorruptLog(f"batch at {pos} has {end - p} stray bytes")
    return out


def _decode_headers(view: memoryview, p: int, count: int, into: dict[str, str]) -> int:
    unpack = _HEADER_PAIR.unpack_from
    for _ in range(count):
        nlen, vlen = unpack(view, p)
        p += 8
        name = str(view[p : p + nlen], "utf-8")
        p += nlen
        into[name] = str(view[p : p + vlen], "utf-8")
        p += vlen
    return p
