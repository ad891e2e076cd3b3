"""Herald's Python SDK (asyncio). Speaks only the public protocol (PROTOCOL §2, §3).

    async with Producer("http://127.0.0.1:8080") as producer:
        result = await producer.send("orders", {"id": 1}, key="customer-7")

    async with Consumer("http://127.0.0.1:8080", "billing", credit=100) as consumer:
        async for msg in consumer:
            handle(msg.value)
            await msg.ack()
"""

from client.admin import Admin
from client.consumer import Consumer, Message
from client.errors import ConsumerClosedError, HeraldClientError
from client.producer import Producer, SendResult
from client.webhooks import WebhookVerificationError, verify_webhook

__all__ = [
    "Admin",
    "Consumer",
    "ConsumerClosedError",
    "HeraldClientError",
    "Message",
    "Producer",
    "SendResult",
    "WebhookVerificationError",
    "verify_webhook",
]
