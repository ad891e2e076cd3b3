"""A durable WebSocket consumer of one subscription (PROTOCOL §3): the engine's
`ConsumerSink` on one side, the client's frames on the other. Glue, not policy —
credit, in-flight and redelivery decisions are the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from msgspec import UNSET

from herald.protocol.close_codes import CloseCode
from herald.protocol.errors import SubscriptionNotFound
from herald.protocol.frames import AckFrame, ClientFrame, CreditFrame, ExtendFrame, NackFrame
from herald.protocol.limits import MAX_CREDIT  # PROTOCOL §3: outstanding credit is capped here
from storage.writer import wall_clock_ms
from subscribers.connection import ConsumerConnection
from subscribers.frames import is_message_id

if TYPE_CHECKING:
    from delivery.engine import DeliveryEngine
    from delivery.events import Delivery


_FIRST_SLICE = 16  # records the engine may send before their size is known


class ConsumerSession:
    """One attached consumer. Implements `delivery.engine.ConsumerSink`.

    PROTOCOL §6: the engine is handed the client's credit in slices, so that what is
    queued for the client plus what the engine may still send stays near
    ``max_unsent_bytes`` (4 MiB) at the records' running mean size: a consumer that
    grants a million credits and never reads holds a few MiB, not credit x size. The
    next slice goes when a frame has left; records of a few hundred bytes are not held
    back (their whole credit fits the bound)."""

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
        self._owed = 0  # credit the client gave that the engine has not been handed yet
        self._record_bytes = 0.0  # running mean size of an encoded record (0: unknown)

    # -- ConsumerSink: called by the engine on the loop, never block ----------------

    def send(self, topic: str, subscription: str, deliveries: Sequence[Delivery]) -> None:
        # PROTOCOL §3: one record spends one credit; the engine never exceeds the
        # credit it was handed, so the outbox stays within the slices (see the class).
        encoded = self.connection.codec.deliveries(topic, deliveries, subscription)
        if encoded:
            mean = sum(map(len, encoded)) / len(encoded)
            seen = self._record_bytes
            self._record_bytes = mean if seen == 0 else 0.8 * seen + 0.2 * mean
        self.connection.push_records(encoded)

    def _slice(self, engine_credit: int) -> int:
        """How much of the owed credit the engine may have now."""
        size = self._record_bytes
        if size == 0:
            return min(self._owed, _FIRST_SLICE) if engine_credit == 0 else 0
        queued = self.connection.queued_bytes
        room = self.connection.settings.max_unsent_bytes - queued - engine_credit * size
        n = int(room // size)
        if n <= 0 and engine_credit == 0 and queued == 0:
            n = 1  # a record larger than the bound still goes, one at a time
        return max(0, min(self._owed, n))

    def _top_up(self) -> None:
        consumer = self.consumer_id
        if consumer is None or self._detached or self._closed_by_engine or not self._owed:
            return
        try:
            n = self._slice(self.engine.credit_of(consumer))
            if n:
                self._owed -= n
                self.engine.grant_credit(consumer, n)
        except SubscriptionNotFound:
            self.connection.request_close(CloseCode.DELETED, "subscription deleted")

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
        self._owed = credit
        first = self._slice(0)
        self._owed -= first
        self.consumer_id = self.engine.attach(self.subscription, self, first)
        self.connection.on_written = self._top_up
        try:
            ready = self.connection.codec.ready_frame(
                self.subscription, self.consumer_id, credit, UNSET
            )
            await self.connection.send_now(ready)
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
                # PROTOCOL §3: credit adds up, capped; the engine gets it in slices.
                self._owed = min(self._owed + frame.n, MAX_CREDIT)
                self._top_up()
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
        if frame.req is UNSET:
            return None
        if unknown:
            # Not a message id at all: certainly not in flight (PROTOCOL §3 `unknown`);
            # listed after the well-formed unknown ids.
            unknown = [
                *(item for item in unknown if is_message_id(item)),
                *(item for item in unknown if not is_message_id(item)),
            ]
        return self.connection.codec.acked_frame(frame.req, ok, unknown)
