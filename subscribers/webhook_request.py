"""What one webhook request carries (PROTOCOL §4, §8): its `webhook-id`, body and headers,
for each body form the push policy chose (delivery/push.py BodyForm).

- envelope: the JSON of M; `webhook-id` is `{subscription}:{id}`, the same on every retry;
- batch: `{"messages":[M, …]}`; `webhook-id` is `{subscription}:{first id}:{n}`;
- raw: the record's value — its compact JSON text (`application/json`), or its bytes
  (`application/octet-stream`) — and the rest of M in `herald-*` headers.

Raw headers carry strings that HTTP cannot carry as they are: a record header's name may
hold any character and differ from another only in case, its value and the key may hold
any character. So (docs/protocol.md) a name is sent as `herald-header-` + its UTF-8 bytes
with every byte other than a lower-case letter, a digit or one of ``!#$&'*+-.^_`|~``
written `%XX` (upper-case hex); a value with every byte other than visible ASCII written
`%XX`, and so are `%`, and a space at either end (HTTP strips those). A receiver
percent-decodes both (`urllib.parse.unquote`) and gets the exact strings back.
"""

from __future__ import annotations

from dataclasses import dataclass

from delivery.events import Delivery
from delivery.push import BodyForm, Post
from storage.record import ValueKind
from subscribers.wire import deliveries_json, record_json

JSON = "application/json"
OCTETS = "application/octet-stream"
HEADER_PREFIX = "herald-header-"

_NAME_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789!#$&'*+-.^_`|~")
_VALUE_SAFE = frozenset(range(0x21, 0x7F)) - {ord("%")}


@dataclass(frozen=True, slots=True)
class WebhookRequest:
    webhook_id: str
    body: bytes
    content_type: str
    headers: dict[str, str]  # besides content-type and the Standard Webhooks headers


def build_request(post: Post, topic: str, subscription: str) -> WebhookRequest:
    deliveries = post.deliveries
    first = deliveries[0]
    if post.form is BodyForm.BATCH:
        # PROTOCOL §8: `{"messages":[M, …]}`, M as in a deliver frame.
        messages = b",".join(deliveries_json(topic, deliveries, subscription))
        webhook_id = f"{subscription}:{first.record.id}:{len(deliveries)}"
        return WebhookRequest(webhook_id, b'{"messages":[' + messages + b"]}", JSON, {})
    webhook_id = f"{subscription}:{first.record.id}"
    if post.form is BodyForm.RAW:
        return _raw(webhook_id, topic, subscription, first)
    body = record_json(topic, first.record, subscription, first.attempt)
    return WebhookRequest(webhook_id, body, JSON, {})


def _raw(webhook_id: str, topic: str, subscription: str, delivery: Delivery) -> WebhookRequest:
    """PROTOCOL §8 `push.payload` "raw": the value is the body; `herald-topic`, `-id`,
    `-key` (absent for a null key), `-attempt` and `-header-<name>` carry the rest of M,
    and (docs/protocol.md) `herald-subscription`, `herald-timestamp` and, for a delayed
    record, `herald-deliver-at`, so a receiver
    can rebuild M whole."""
    record = delivery.record
    headers = {
        "herald-topic": topic,
        "herald-subscription": subscription,
        "herald-id": record.id,
        "herald-timestamp": str(record.timestamp),
        "herald-attempt": str(delivery.attempt),
    }
    if record.key is not None:
        headers["herald-key"] = header_value(record.key)
    if record.deliver_at is not None:  # §8 delayed delivery: M's deliver_at
        headers["herald-deliver-at"] = str(record.deliver_at)
    for name, value in record.headers.items():
        headers[HEADER_PREFIX + header_name(name)] = header_value(value)
    content_type = OCTETS if record.kind is ValueKind.BYTES else JSON
    return WebhookRequest(webhook_id, record.value, content_type, headers)


def header_name(name: str) -> str:
    """A record header's name as the tail of an HTTP header name: case and every byte
    outside a token's lower-case characters kept by percent-encoding."""
    return "".join(chr(b) if b in _NAME_SAFE else f"%{b:02X}" for b in name.encode())


def header_value(value: str) -> str:
    """A string as an HTTP header value: visible ASCII as is, spaces inside it as is,
    everything else (and `%`) percent-encoded UTF-8."""
    data = value.encode()
    last = len(data) - 1
    return "".join(
        chr(b) if b in _VALUE_SAFE or (b == 0x20 and 0 < i < last) else f"%{b:02X}"
        for i, b in enumerate(data)
    )
