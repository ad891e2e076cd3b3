"""Herald's Python SDK (asyncio). Speaks only the public protocol (PROTOCOL §2, §3).

async with Producer("http://127.0.0.1:8080") as producer:
    result = await producer.send_and_wait("orders", {"id": 1}, key="customer-7")
    futures = [producer.send("orders", {"id": n}) for n in range(1000)]  # one batch
    results = await asyncio.gather(*futures)

async with Consumer("http://127.0.0.1:8080", "billing", credit=100) as consumer:
    async for msg in consumer:
        handle(msg.value)
        await msg.ack()

async with Puller("http://127.0.0.1:8080", "billing") as puller:  # pull over HTTP
    async for msg in puller:
        handle(msg.value)
        await msg.ack()
"""

from herald.admin import Admin
from herald.consumer import Consumer
from herald.errors import (
    ConsumerClosedError,
    HeraldClientError,
    HeraldConnectionError,
    ProducerBufferFullError,
)
from herald.message import Message
from herald.producer import Producer, SendResult
from herald.puller import Puller
from herald.tail import Tail
from herald.webhooks import WebhookVerificationError, verify_webhook

__version__ = "0.1.0"  # client/pyproject.toml reads it from here

__all__ = [
    "Admin",
    "Consumer",
    "ConsumerClosedError",
    "HeraldClientError",
    "HeraldConnectionError",
    "Message",
    "Producer",
    "ProducerBufferFullError",
    "Puller",
    "SendResult",
    "Tail",
    "WebhookVerificationError",
    "verify_webhook",
]
