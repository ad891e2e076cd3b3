"""The msgpack frames of a consumer socket (docs/protocol.md "MessagePack") as the server
writes and reads them: records and frames decodable by their models, client frames
refused with the codes of PROTOCOL §3 (pure: no socket)."""

from __future__ import annotations

import msgspec
import pytest
from msgspec import UNSET

from delivery.events import Delivery
from herald.protocol.encodings import array_header
from herald.protocol.frames import (
    AckedFrame,
    AckFrame,
    CreditFrame,
    ErrorFrame,
    NackFrame,
    PackedConsumerFrame,
    PackedDeliverFrame,
    PackedTailDeliverFrame,
    PackedTailFrame,
    ReadyFrame,
)
from herald.protocol.records import PackedDeliveredRecord, PackedTailRecord
from storage.record import Record, ValueKind
from subscribers.frames import BadFrame, parse_packed_frame
from subscribers.packed import (
    packed_acked_frame,
    packed_deliver_frame,
    packed_deliveries,
    packed_error_frame,
    packed_ready_frame,
    packed_tail_record,
)

consumer = msgspec.msgpack.Decoder(PackedConsumerFrame)
tail = msgspec.msgpack.Decoder(PackedTailFrame)

RECORDS = [
    Record(0, 7, 1_700_000_000_000, b'{"a":[1,2]}'),
    Record(1, 8, 1_700_000_000_001, b"\x00\xff", ValueKind.BYTES, "k", {"h": "v"}),
    Record(0, 9, 1_700_000_000_002, b"null", deliver_at=1_700_000_060_002),
]


def packed(frame: object) -> dict[str, object]:
    return {"type": "websocket.receive", "bytes": msgspec.msgpack.encode(frame)}


def refusal(message: dict[str, object]) -> BadFrame:
    with pytest.raises(BadFrame) as caught:
        parse_packed_frame(message)
    return caught.value


def test_records_carry_bytes_as_bin_and_json_as_its_text() -> None:
    deliveries = [Delivery(r, a) for r, a in zip(RECORDS, (1, 3, 2), strict=True)]
    frame = consumer.decode(packed_deliver_frame(packed_deliveries("t", deliveries, "s")))
    assert isinstance(frame, PackedDeliverFrame)
    first, second, third = frame.messages
    assert first == PackedDeliveredRecord(
        topic="t",
        id="0-7",
        partition=0,
        offset=7,
        timestamp=1_700_000_000_000,
        key=None,
        headers={},
        value_json='{"a":[1,2]}',
        subscription="s",
        attempt=1,
    )
    assert second.value == b"\x00\xff" and second.value_json is UNSET
    assert (second.key, second.headers, second.attempt) == ("k", {"h": "v"}, 3)
    assert third.deliver_at == 1_700_000_060_002 and third.value_json == "null"
    assert first.deliver_at is UNSET
    # deliver_at is left out, not nil, when the record has none.
    assert b"deliver_at" not in packed_deliveries("t", deliveries[:1], "s")[0]


def test_a_tail_record_has_attempt_1_and_no_subscription() -> None:
    frame = tail.decode(packed_deliver_frame([packed_tail_record("t", r) for r in RECORDS]))
    assert isinstance(frame, PackedTailDeliverFrame)
    assert all(isinstance(m, PackedTailRecord) and m.attempt == 1 for m in frame.messages)
    assert b"subscription" not in packed_tail_record("t", RECORDS[0])
    assert packed_deliveries("t", [Delivery(RECORDS[0], 1)], None) == [
        packed_tail_record("t", RECORDS[0])
    ]


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 65_535, 65_536, 70_000])
def test_a_deliver_frame_holds_any_number_of_records(n: int) -> None:
    one = packed_tail_record("t", RECORDS[1])
    frame = tail.decode(packed_deliver_frame([one] * n))
    assert isinstance(frame, PackedTailDeliverFrame) and len(frame.messages) == n
    assert array_header(n) == msgspec.msgpack.encode([None] * n)[: len(array_header(n))]


def test_the_other_frames_are_their_models() -> None:
    assert consumer.decode(packed_ready_frame("s", "c1", 5)) == ReadyFrame(
        subscription="s", consumer="c1", credit=5
    )
    assert tail.decode(packed_ready_frame(None, "c1", 0, {0: 3, 1: 0})) == ReadyFrame(
        subscription=None, consumer="c1", credit=0, positions={0: 3, 1: 0}
    )
    assert consumer.decode(packed_error_frame("bad_frame", "x")) == ErrorFrame(
        code="bad_frame", message="x"
    )
    req = msgspec.Raw(msgspec.msgpack.encode({"n": [1, b"\x00"]}))
    acked = consumer.decode(packed_acked_frame(req, ["0-1"], ["0-2"]))
    assert isinstance(acked, AckedFrame) and (acked.ok, acked.unknown) == (["0-1"], ["0-2"])
    assert msgspec.msgpack.decode(acked.req) == {"n": [1, b"\x00"]}


def test_a_binary_frame_is_read_as_msgpack() -> None:
    assert parse_packed_frame(packed({"type": "credit", "n": 3})) == CreditFrame(n=3)
    frame = parse_packed_frame(packed({"type": "nack", "ids": ["0-1"], "delay_ms": None, "x": 1}))
    assert frame == NackFrame(ids=["0-1"])
    ack = parse_packed_frame(packed({"type": "ack", "ids": ["0-1"], "req": [1, "a", b"b"]}))
    assert isinstance(ack, AckFrame) and ack.ids == ["0-1"]
    assert isinstance(ack.req, msgspec.Raw)
    assert msgspec.msgpack.decode(ack.req) == [1, "a", b"b"]


def test_a_text_frame_is_json_and_its_req_becomes_msgpack() -> None:
    text = '{"type":"ack","ids":["0-1"],"req":{"k":[1,2.5,null,"s"]}}'
    ack = parse_packed_frame({"type": "websocket.receive", "text": text})
    assert isinstance(ack, AckFrame) and isinstance(ack.req, msgspec.Raw)
    assert msgspec.msgpack.decode(ack.req) == {"k": [1, 2.5, None, "s"]}
    # JSON's leniency stays JSON's: an integral number is an integer there.
    credit = '{"type":"credit","n":4.0}'
    assert parse_packed_frame({"type": "websocket.receive", "text": credit}) == CreditFrame(n=4)
    big = '{"type":"ack","ids":[],"req":18446744073709551616}'  # no msgpack integer holds it
    assert refusal({"type": "websocket.receive", "text": big}).code == "bad_frame"


@pytest.mark.parametrize(
    ("message", "code", "says"),
    [
        ({"bytes": b"\xc1"}, "bad_frame", "not msgpack"),
        ({"bytes": b""}, "bad_frame", "not msgpack"),
        ({"bytes": b'{"type":"credit","n":1}'}, "bad_frame", ""),  # JSON in a binary frame
        ({"bytes": msgspec.msgpack.encode([1, 2])}, "bad_frame", "msgpack map"),
        ({"bytes": msgspec.msgpack.encode({"type": "credit", "n": 1}) + b"\x00"}, "bad_frame", ""),
        (packed({"type": "nope"}), "unknown_type", "nope"),
        (packed({"type": 5}), "bad_frame", "`type`"),
        (packed({"n": 1}), "bad_frame", "`type`"),
        (packed({"type": "credit", "n": 1.0}), "bad_frame", "`n`"),  # no float for an int
        (packed({"type": "credit", "n": "1"}), "bad_frame", "`n`"),
        (packed({"type": "credit", "n": 0}), "bad_frame", "`n`"),
        (packed({"type": "credit"}), "bad_frame", "`n`"),
        (packed({"type": "ack", "ids": [b"0-1"]}), "bad_frame", "`ids"),
        (packed({"type": "extend", "ids": [], "ms": 2**40}), "bad_frame", "`ms`"),
    ],
)
def test_a_bad_binary_frame_is_refused(message: dict[str, object], code: str, says: str) -> None:
    bad = refusal({"type": "websocket.receive", **message})
    assert bad.code == code
    assert says in bad.message
