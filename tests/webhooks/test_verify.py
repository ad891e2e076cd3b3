"""herald.webhooks.verify against what the dispatcher signs (and what standardwebhooks signs)."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import orjson
import pytest
from standardwebhooks import Webhook

from delivery.events import Delivery
from delivery.push import BodyForm, Post
from herald import Message
from herald.webhooks import WebhookVerificationError, verify
from storage.record import Record, ValueKind
from subscribers.signing import secret_key, webhook_headers
from subscribers.webhook_request import build_request
from subscribers.wire import record_json
from tests.conftest import HeraldProcess
from tests.webhooks.receiver import Receiver

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
OTHER = "whsec_" + base64.b64encode(b"fedcba9876543210fedcba9876543210").decode()
BODY = (
    b'{"topic":"t","id":"0-1","partition":0,"offset":1,"timestamp":1700000000000,'
    b'"key":null,"headers":{},"subscription":"sub","attempt":1,"value":{"a":1}}'
)


def signed(secrets: list[str], body: bytes = BODY, at: int | None = None) -> dict[str, str]:
    keys = [secret_key(s) for s in secrets]
    return webhook_headers(keys, "sub:0-1", int(time.time()) if at is None else at, body)


def test_a_good_request_verifies_and_returns_the_record() -> None:
    record = verify(BODY, signed([SECRET]), SECRET)
    assert isinstance(record, Message)  # the shape a Consumer yields
    assert (record.value, record.id, record.offset, record.is_bytes) == ({"a": 1}, "0-1", 1, False)


def test_a_bytes_record_verifies_with_its_value_decoded(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    # Through a real server's push: the README's receiver reads record.value for a record
    # published as bytes (value_b64 on the wire), as it would from a Consumer.
    topic, name = unique("vb"), unique("vbs")
    with Receiver([SECRET]) as receiver:
        body = {
            "topic": topic,
            "start": "earliest",
            "push": {"url": receiver.url, "secret": SECRET},
        }
        created = httpx.put(f"{shared_herald.url}/v1/subscriptions/{name}", json=body)
        assert created.status_code == 201, created.text
        published = httpx.post(
            f"{shared_herald.url}/v1/topics/{topic}/messages",
            json={"messages": [{"value_b64": base64.b64encode(b"\x00\xffraw").decode()}]},
        )
        assert published.status_code == 200, published.text
        receiver.wait_for(lambda: len(receiver.snapshot()) >= 1)
        request = receiver.snapshot()[0]
    record = verify(request.body, request.headers, SECRET)
    assert (record.value, record.is_bytes, record.topic) == (b"\x00\xffraw", True, topic)


def test_a_body_that_is_not_a_record_is_rejected() -> None:
    body = b'{"hello":"world"}'
    with pytest.raises(WebhookVerificationError, match="not a Herald record"):
        verify(body, signed([SECRET], body), SECRET)


def test_standardwebhooks_verifies_what_herald_signs() -> None:
    assert Webhook(SECRET).verify(BODY, signed([SECRET]))["id"] == "0-1"


def test_verify_accepts_what_standardwebhooks_signs() -> None:
    now = datetime.now(tz=UTC)
    signature = Webhook(SECRET).sign("sub:0-1", now, BODY.decode())
    headers = {
        "Webhook-Id": "sub:0-1",
        "Webhook-Timestamp": str(int(now.timestamp())),
        "Webhook-Signature": signature,
    }
    assert verify(BODY, headers, SECRET).id == "0-1"


def test_a_tampered_body_is_rejected() -> None:
    with pytest.raises(WebhookVerificationError, match="no signature"):
        verify(BODY.replace(b'"a":1', b'"a":2'), signed([SECRET]), SECRET)


def test_a_tampered_id_is_rejected() -> None:
    headers = signed([SECRET]) | {"webhook-id": "sub:0-2"}
    with pytest.raises(WebhookVerificationError):
        verify(BODY, headers, SECRET)


def test_an_old_request_is_rejected_as_a_replay() -> None:
    with pytest.raises(WebhookVerificationError, match="tolerance"):
        verify(BODY, signed([SECRET], at=int(time.time()) - 301), SECRET)
    assert verify(BODY, signed([SECRET], at=int(time.time()) - 250), SECRET)


def test_a_request_from_the_future_is_rejected() -> None:
    with pytest.raises(WebhookVerificationError):
        verify(BODY, signed([SECRET], at=int(time.time()) + 600), SECRET, tolerance_s=60)


def test_missing_headers_are_rejected() -> None:
    with pytest.raises(WebhookVerificationError, match="missing"):
        verify(BODY, {}, SECRET)


def test_the_wrong_secret_is_rejected() -> None:
    with pytest.raises(WebhookVerificationError):
        verify(BODY, signed([SECRET]), OTHER)


def test_rotation_either_secret_verifies() -> None:
    headers = signed([SECRET, OTHER])
    assert verify(BODY, headers, SECRET)
    assert verify(BODY, headers, OTHER)
    assert verify(BODY, signed([OTHER]), [SECRET, OTHER])
    assert Webhook(OTHER).verify(BODY, headers)


def test_a_batch_body_verifies_as_a_list_of_messages() -> None:
    second = BODY.replace(b'"0-1"', b'"0-2"').replace(b'"offset":1', b'"offset":2')
    batch = b'{"messages":[' + BODY + b"," + second + b"]}"
    records = verify(batch, signed([SECRET], batch), SECRET)
    assert isinstance(records, list)
    assert [(r.id, r.value) for r in records] == [("0-1", {"a": 1}), ("0-2", {"a": 1})]
    assert verify(b'{"messages":[]}', signed([SECRET], b'{"messages":[]}'), SECRET) == []
    odd = b'{"messages":[1]}'
    with pytest.raises(WebhookVerificationError, match="batch"):
        verify(odd, signed([SECRET], odd), SECRET)


def raw_request(record: Record) -> tuple[bytes, dict[str, str]]:
    """A raw request as the dispatcher builds and signs it (subscribers/webhook_request.py)."""
    request = build_request(Post((Delivery(record, 2),), BodyForm.RAW), "t", "sub")
    headers = webhook_headers(
        [secret_key(SECRET)],
        request.webhook_id,
        int(time.time()),
        request.body,
        request.content_type,
    )
    return request.body, headers | request.headers


def test_a_raw_body_verifies_as_the_message_its_envelope_would_be() -> None:
    headers = {"Trace-Id": " x ", "ü/%": "✓ 100%", "": "empty name"}
    for record in (
        Record(3, 9, 1_700_000_000_000, b'{"a":[1,2]}', key="k ü", headers=headers),
        Record(0, 1, 1_700_000_000_000, b"\x00\xff", ValueKind.BYTES),
    ):
        body, sent = raw_request(record)
        envelope = orjson.loads(record_json("t", record, "sub", 2))
        message = verify(body, sent, SECRET)
        assert isinstance(message, Message)
        assert message.to_json() == envelope
        # Header names are case-insensitive in HTTP: a receiver may lower-case them all.
        lowered = verify(body, {k.lower(): v for k, v in sent.items()}, SECRET)
        assert isinstance(lowered, Message) and lowered.to_json() == envelope
