"""Verify Herald's webhook requests (PROTOCOL §4, §8, Standard Webhooks) in one call.

    from herald.webhooks import verify

    message = verify(body_bytes, request.headers, "whsec_…")  # raises on a bad request
    message.value  # a herald.Message, as a Consumer yields: bytes records decoded

Every body form of PROTOCOL §8 is understood: the JSON of one record (a Message), a
batch `{"messages":[…]}` (`push.batch.max_records` > 1: a list of Message), and a raw
body (`push.payload` "raw": a Message built from the body and the `herald-*` headers).
``secret`` may be a list during a rotation: the request is good if any secret signed it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from herald.message import Message
from herald.protocol.patterns import SECRET_PREFIX

HEADER_PREFIX = "herald-header-"  # a raw body's record headers (docs/protocol.md)


class WebhookVerificationError(Exception):
    """The request was not signed by Herald with a known secret, or is too old/new."""


def verify(
    payload: bytes,
    headers: Mapping[str, str],
    secret: str | list[str],
    tolerance_s: float = 300,
    *,
    now: float | None = None,
) -> Message | list[Message]:
    """The record as a Message (the shape a Consumer yields: `value` is the JSON value
    or, for a record published as bytes, the decoded bytes) if the request is genuine,
    else WebhookVerificationError; for a batch body (PROTOCOL §8 `push.batch`) a list of
    them, in the order sent. A raw body (`push.payload` "raw") gives the same Message
    as its envelope would. It has no consumer: the answer's status acks it (a batch's
    acks or fails all of its records). ``tolerance_s`` bounds how far
    `webhook-timestamp` may be from now, against replays."""
    lowered = {k.lower(): v for k, v in headers.items()}
    msg_id = lowered.get("webhook-id")
    timestamp = lowered.get("webhook-timestamp")
    signatures = lowered.get("webhook-signature")
    if not (msg_id and timestamp and signatures):
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        sent = int(timestamp)
    except ValueError:
        raise WebhookVerificationError(f"bad webhook-timestamp {timestamp!r}") from None
    current = time.time() if now is None else now
    if abs(current - sent) > tolerance_s:
        raise WebhookVerificationError(
            f"webhook-timestamp is {current - sent:.0f} s off, over the {tolerance_s:g} s tolerance"
        )
    signed = b"".join((msg_id.encode(), b".", timestamp.encode(), b".", payload))
    expected = [
        hmac.new(_key(s), signed, hashlib.sha256).digest()
        for s in ([secret] if isinstance(secret, str) else secret)
    ]
    for item in signatures.split():
        version, _, encoded = item.partition(",")
        if version != "v1":
            continue
        try:
            given = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            continue
        if any(hmac.compare_digest(given, e) for e in expected):
            try:
                if "herald-id" in lowered:
                    return _raw_message(payload, lowered)
                return _envelope(payload)
            except (KeyError, TypeError, ValueError):
                raise WebhookVerificationError("the body is not a Herald record") from None
    raise WebhookVerificationError("no signature matches the secret")


def _envelope(payload: bytes) -> Message | list[Message]:
    """The JSON of M, or a batch `{"messages":[M, …]}`."""
    try:
        body = json.loads(payload)
    except ValueError:
        raise WebhookVerificationError("the body is not JSON") from None
    if not isinstance(body, dict):
        raise WebhookVerificationError("the body is not a JSON object")
    if "id" not in body and isinstance(body.get("messages"), list):
        messages = body["messages"]
        if not all(isinstance(m, dict) for m in messages):
            raise WebhookVerificationError("a batch holds something other than records")
        return [Message.from_json(m) for m in messages]
    return Message.from_json(body)


def _raw_message(payload: bytes, headers: Mapping[str, str]) -> Message:
    """PROTOCOL §8 raw: the body is the value (JSON text, or bytes sent as
    application/octet-stream); the rest of M is in percent-encoded `herald-*` headers."""
    record_id = headers["herald-id"]
    partition, _, offset = record_id.partition("-")
    data: dict[str, Any] = {
        "topic": headers["herald-topic"],
        "id": record_id,
        "partition": int(partition),
        "offset": int(offset),
        "timestamp": int(headers["herald-timestamp"]),
        **(
            {"deliver_at": int(headers["herald-deliver-at"])}
            if "herald-deliver-at" in headers
            else {}
        ),
        "key": unquote(headers["herald-key"]) if "herald-key" in headers else None,
        "headers": {
            unquote(name[len(HEADER_PREFIX) :]): unquote(value)
            for name, value in headers.items()
            if name.startswith(HEADER_PREFIX)
        },
        "subscription": headers.get("herald-subscription"),
        "attempt": int(headers["herald-attempt"]),
    }
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/octet-stream":
        data["value_b64"] = base64.b64encode(payload).decode("ascii")
    else:
        try:
            data["value"] = json.loads(payload)
        except ValueError:
            raise WebhookVerificationError("the raw body is not JSON") from None
    return Message.from_json(data)


def _key(secret: str) -> bytes:
    try:
        return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except binascii.Error:
        raise ValueError("a webhook secret is 'whsec_' followed by base64") from None


verify_webhook = verify  # the name herald/__init__.py exports
