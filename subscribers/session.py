"""A durable WebSocket consumer of one subscription (PROTOCOL §3): the engine's
`ConsumerSink` on one side, the client's frames on the other. Glue, not policy —
credit, in-flight and redelivery decisions are the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from delivery.close_codes import CloseCode
from storage.errors import SubscriptionNotFound
from storage.writer import wall_clock_ms
from subscribers.connection import ConsumerConnection
from subscribers.frames import (
    AckFrame,
    ClientFrame,
    CreditFrame,
    ExtendFrame,
    NackFrame,
    is_message_id,
)
from subscribers.wire import acked_frame, deliveries_json, ready_frame

if TYPE_CHECKING:
    from delivery.engine import DeliveryEngine
    from delivery.events import Delivery


class ConsumerSession:
    """One attached consumer. Implements `delivery.engine.ConsumerSink`."""

    def __init__(
        self, engine: DeliveryEngine, subscription: str, connection: ConsumerConnection
    ) -> None:
        self.engine = engine
        self.subscription = subscription
        self.connection = connection
        self.consumer_id: str | None = None
        # What the console lists of a connected consumer (docs/protocol.md "Stats").
        self.address: str | None = None
        self.connected_ms = wall_clock_ms()
        self._detached = False
        self._closed_by_engine = False

    # -- ConsumerSink: called by the engine on the loop, never block ----------------

    def send(self, topic: str, subscription: str, deliveries: Sequence[Delivery]) -> None:
        # PROTOCOL §3: one record spends one credit; the engine never exceeds it, so
        # the outbox holds at most the credit the client granted.
        self.connection.push_records(deliveries_json(topic, deliveries, subscription))

    def close(self, code: int, reason: str) -> None:
        # 4410 on delete, 1001 on shutdown: the engine has already forgotten this
        # consumer, so it is not detached again.
        self._closed_by_engine = True
        self.connection.request_close(code, reason)

    # -- the connection ----------------------------------------------------------------

    async def run(self, credit: int) -> None:
        """Attach, say `ready`, then serve frames until either side closes.

        Raises SubscriptionNotFound when the subscription vanished before attaching.
        """
        # attach may already call send(); those records wait in the outbox until the
        # writer starts, so `ready` is still the first frame (PROTOCOL §3).
        self.consumer_id = self.engine.attach(self.subscription, self, credit)
        try:
            await self.connection.send_now(ready_frame(self.subscription, self.consumer_id, credit))
            await self.connection.run(self.handle, self.detach)
        finally:
            self.detach()

    def detach(self) -> None:
        """Give in-flight records back at once (PROTOCOL §3); idempotent."""
        if self.consumer_id is None or self._detached or self._closed_by_engine:
            return
        self._detached = True
        self.engine.detach(self.consumer_id)

    def handle(self, frame: ClientFrame) -> bytes | None:
        """Apply one valid client frame; returns the reply frame, if any."""
        consumer = self.consumer_id
        if consumer is None or self._detached or self._closed_by_engine:
            return None
        try:
            if isinstance(frame, CreditFrame):
                # PROTOCOL §3: credit adds up; the engine caps what is outstanding.
                self.engine.grant_credit(consumer, frame.n)
                return None
            if isinstance(frame, AckFrame):
                return self._ack(consumer, frame)
            ids = [item for item in frame.ids if is_message_id(item)]  # unknown ids are ignored
            if ids and isinstance(frame, NackFrame):
                self.engine.nack(consumer, ids, frame.delay_ms, frame.reason)
            elif ids and isinstance(frame, ExtendFrame):
                self.engine.extend(consumer, ids, frame.ms)
            return None
        except SubscriptionNotFound:
            # Deleted between frames; the engine's close(4410) may still be on its way.
            self.connection.request_close(CloseCode.DELETED, "subscription deleted")
            return None

    def _ack(self, consumer: str, frame: AckFrame) -> bytes | None:
        # The in-flight table is keyed by message id, so a string that is not one is just
        # unknown there: ids go to the engine unchecked, with no regex per acked record.
        ok: list[str] = []
        unknown: list[str] = []
        if frame.ids:
            ok, unknown = self.engine.ack(consumer, frame.ids)
        if not frame.has_req:
            return None
        if unknown:
            # Not a message id at all: certainly not in flight (PROTOCOL §3 `unknown`);
            # listed after the well-formed unknown ids.
            unknown = [
                *(item for item in unknown if is_message_id(item)),
                *(item for item in unknown if not is_message_id(item)),
            ]
        return acked_frame(frame.req, ok, unknown)
