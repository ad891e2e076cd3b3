"""Standard Webhooks signatures (PROTOCOL §4): what the webhook dispatcher puts in the
`webhook-id`, `webhook-timestamp` and `webhook-signature` headers.

The signature is `v1,<base64 HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}">`
keyed with the base64-decoded part of the secret after `whsec_`. During a secret
rotation (docs/protocol.md, `push.previous_secrets`) one signature per live secret is
sent, space-separated, as the Standard Webhooks specification allows; a receiver that
knows any one of them verifies the request.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence

from herald.protocol.patterns import SECRET_PREFIX


def secret_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret (validated by server/validation.py)."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)


def signature(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    signed = b"".join((webhook_id.encode(), b".", str(timestamp).encode(), b".", body))
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signature_header(keys: Sequence[bytes], webhook_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: one `v1,…` per key, the current key first."""
    return " ".join(signature(key, webhook_id, timestamp, body) for key in keys)


def webhook_headers(
    keys: Sequence[bytes],
    webhook_id: str,
    timestamp: int,
    body: bytes,
    content_type: str = "application/json",
) -> dict[str, str]:
    return {
        "content-type": content_type,
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature_header(keys, webhook_id, timestamp, body),
    }
