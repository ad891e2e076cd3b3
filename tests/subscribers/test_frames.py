"""The frames of PROTOCOL §3 as the server reads and writes them: client frames decoded
through herald/protocol/frames.py, refusals answered with the field they name, and the
server's own frames decodable by its models (pure: no socket)."""

from __future__ import annotations

import msgspec
import pytest
from msgspec import UNSET

from delivery.events import Delivery
from herald.protocol.frames import (
    AckedFrame,
    AckFrame,
    ConsumerFrame,
    CreditFrame,
    DeliverFrame,
    ErrorFrame,
    ExtendFrame,
    NackFrame,
    ReadyFrame,
    TailDeliverFrame,
    TailFrame,
)
from herald.protocol.unchecked import unchecked
from storage.record import Record, ValueKind
from subscribers.frames import BadFrame, parse_frame
from subscribers.wire import acked_frame, deliver_frame, deliveries_json, error_frame, ready_frame


def parse(text: str) -> object:
    return parse_frame({"type": "websocket.receive", "text": text})


def refusal(text: str) -> BadFrame:
    with pytest.raises(BadFrame) as caught:
        parse(text)
    return caught.value


@pytest.mark.parametrize(
    ("text", "frame"),
    [
        ('{"type":"credit","n":3}', CreditFrame(n=3)),
        ('{"type":"credit","n":3.0}', CreditFrame(n=3)),  # PROTOCOL §2: integral is an integer
        (
            '{"type":"ack","ids":["0-1"],"extra":{"x":[1]}}',
            AckFrame(ids=["0-1"]),
        ),  # unknown: ignored
        ('{"ids":["0-1"],"type":"nack"}', NackFrame(ids=["0-1"])),
        (
            '{"type":"nack","ids":[],"delay_ms":0.0,"reason":"r"}',
            NackFrame(ids=[], delay_ms=0, reason="r"),
        ),
        ('{"type":"nack","ids":[],"delay_ms":null}', NackFrame(ids=[])),
        ('{"type":"extend","ids":["0-1"],"ms":100}', ExtendFrame(ids=["0-1"], ms=100)),
    ],
)
def test_a_good_frame_is_its_model(text: str, frame: object) -> None:
    assert parse(text) == frame


def test_an_ack_req_is_kept_as_sent_and_absent_when_not_sent() -> None:
    req = ' {"a": [18446744073709551616, "\\u00e9"]}'
    ack = parse('{"type":"ack","ids":[],"req":' + req + "}")
    assert isinstance(ack, AckFrame)
    assert ack.req is not UNSET and bytes(ack.req) == req.strip().encode()
    plain = parse('{"type":"ack","ids":[]}')
    assert isinstance(plain, AckFrame) and plain.req is UNSET


@pytest.mark.parametrize(
    ("text", "code", "names"),
    [
        ("not json", "bad_frame", "not JSON"),
        ("[1,2]", "bad_frame", "JSON object"),
        ('{"n":1}', "bad_frame", "`type`"),
        ('{"type":5}', "bad_frame", "`type`"),
        ('{"type":"subscribe"}', "unknown_type", "'subscribe'"),
        ('{"type":"credit"}', "bad_frame", "`n`"),
        ('{"type":"credit","n":0}', "bad_frame", "`n`"),
        ('{"type":"credit","n":1000001}', "bad_frame", "`n`"),
        ('{"type":"credit","n":1.5}', "bad_frame", "`n`"),
        ('{"type":"credit","n":1e400}', "bad_frame", "`n`"),
        ('{"type":"credit","n":"3"}', "bad_frame", "`n`"),
        ('{"type":"credit","n":true}', "bad_frame", "`n`"),
        ('{"type":"ack","ids":"0-0"}', "bad_frame", "`ids`"),
        ('{"type":"ack","ids":[0]}', "bad_frame", "`ids[0]`"),
        ('{"type":"nack","ids":["0-0"],"delay_ms":600001}', "bad_frame", "`delay_ms`"),
        ('{"type":"nack","ids":["0-0"],"reason":"' + "r" * 257 + '"}', "bad_frame", "`reason`"),
        ('{"type":"extend","ids":["0-0"],"ms":99.0}', "bad_frame", "`ms`"),
        ('{"type":"extend","ids":["0-0"]}', "bad_frame", "`ms`"),
        ('{"type":"ack","ids":[],"req":' + "[" * 1030 + "]" * 1030 + "}", "bad_frame", "not JSON"),
        ('{"type":"ack","ids":[],"req":NaN}', "bad_frame", "not JSON"),
    ],
)
def test_a_bad_frame_is_refused_naming_its_field(text: str, code: str, names: str) -> None:
    refused = refusal(text)
    assert refused.code == code
    assert names in refused.message


def test_a_binary_frame_is_refused() -> None:
    with pytest.raises(BadFrame) as caught:
        parse_frame({"type": "websocket.receive", "bytes": b'{"type":"credit","n":1}'})
    assert caught.value.code == "bad_frame"


def test_the_server_frames_are_their_models() -> None:
    consumer = msgspec.json.Decoder(ConsumerFrame)
    tail = msgspec.json.Decoder(TailFrame)
    assert consumer.decode(ready_frame("s", "c1", 5)) == ReadyFrame(
        subscription="s", consumer="c1", credit=5
    )
    assert tail.decode(ready_frame(None, "c1", 0)) == ReadyFrame(
        subscription=None, consumer="c1", credit=0
    )
    assert consumer.decode(error_frame("bad_frame", "`n`: x")) == ErrorFrame(
        code="bad_frame", message="`n`: x"
    )
    acked = consumer.decode(acked_frame(msgspec.Raw(b"[1, 2]"), ["0-1"], ["0-2"]))
    assert isinstance(acked, AckedFrame) and bytes(acked.req) == b"[1, 2]"
    assert (acked.ok, acked.unknown) == (["0-1"], ["0-2"])


def test_a_spliced_deliver_frame_is_the_deliver_model() -> None:
    records = [
        Record(0, 7, 1_700_000_000_000, b'{"a":[1,2]}'),
        Record(2, 9, 1_700_000_000_002, b"\x00\x01", ValueKind.BYTES, "k", {"h": "v"}),
        Record(0, 10, 1_700_000_000_003, b"null", deliver_at=1_700_000_060_003),
    ]
    deliveries = [Delivery(r, 1) for r in records]
    frame = msgspec.json.decode(
        deliver_frame(deliveries_json("orders", deliveries, "billing")), type=ConsumerFrame
    )
    assert isinstance(frame, DeliverFrame)
    assert [(m.subscription, m.id, m.attempt) for m in frame.messages] == [
        ("billing", "0-7", 1),
        ("billing", "2-9", 1),
        ("billing", "0-10", 1),
    ]
    assert frame.messages[2].deliver_at == 1_700_000_060_003
    tail = msgspec.json.decode(
        deliver_frame(deliveries_json("orders", deliveries, None)), type=TailFrame
    )
    assert isinstance(tail, TailDeliverFrame) and [m.id for m in tail.messages] == [
        "0-7",
        "2-9",
        "0-10",
    ]
    # The SDK reads them without the constraints; the same records all the same.
    lenient = msgspec.json.decode(
        deliver_frame(deliveries_json("orders", deliveries, "billing")),
        type=unchecked(ConsumerFrame),
    )
    assert [m.value for m in lenient.messages] == [{"a": [1, 2]}, UNSET, None]
