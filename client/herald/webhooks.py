"""Verify Herald's webhook requests (PROTOCOL §4, Standard Webhooks) in one call.

    from herald.webhooks import verify

    message = verify(body_bytes, request.headers, "whsec_…")  # raises on a bad request
    message.value  # a herald.Message, as a Consumer yields: bytes records decoded

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

from herald.consumer import Message

SECRET_PREFIX = "whsec_"


class WebhookVerificationError(Exception):
    """The request was not signed by Herald with a known secret, or is too old/new."""


def verify(
    payload: bytes,
    headers: Mapping[str, str],
    secret: str | list[str],
    tolerance_s: float = 300,
    *,
    now: float | None = None,
) -> Message:
    """The record as a Message (the shape a Consumer yields: `value` is the JSON value
    or, for a record published as bytes, the decoded bytes) if the request is genuine,
    else WebhookVerificationError. It has no consumer: the answer's status acks it. ``tolerance_s`` bounds how far `webhook-timestamp` may be
    from now, against replays."""
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
                message = json.loads(payload)
            except ValueError:
                raise WebhookVerificationError("the body is not JSON") from None
            if not isinstance(message, dict):
                raise WebhookVerificationError("the body is not a JSON object")
            try:
                return Message.from_json(message)
            except (KeyError, TypeError, ValueError):
                raise WebhookVerificationError("the body is not a Herald record") from None
    raise WebhookVerificationError("no signature matches the secret")


def _key(secret: str) -> bytes:
    try:
        return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except binascii.Error:
        raise ValueError("a webhook secret is 'whsec_' followed by base64") from None


verify_webhook = verify  # the name herald/__init__.py exports
