"""client.webhooks.verify against what the dispatcher signs (and what standardwebhooks signs)."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook

from client.webhooks import WebhookVerificationError, verify
from subscribers.signing import secret_key, webhook_headers

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
OTHER = "whsec_" + base64.b64encode(b"fedcba9876543210fedcba9876543210").decode()
BODY = b'{"topic":"t","id":"0-1","attempt":1,"value":{"a":1}}'


def signed(secrets: list[str], body: bytes = BODY, at: int | None = None) -> dict[str, str]:
    keys = [secret_key(s) for s in secrets]
    return webhook_headers(keys, "sub:0-1", int(time.time()) if at is None else at, body)


def test_a_good_request_verifies_and_returns_the_record() -> None:
    assert verify(BODY, signed([SECRET]), SECRET)["value"] == {"a": 1}


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
    assert verify(BODY, headers, SECRET)["id"] == "0-1"


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
