"""Pull consumption over HTTP (PROTOCOL §8 Pull): `/pull`, `/ack`, `/nack` on any
subscription, push subscriptions included, sharing its cursor with WebSocket consumers
and webhooks.

    async with Puller("http://127.0.0.1:8080", "billing") as puller:
        async for msg in puller:          # long-polls; ends when closed (or after `limit`)
            handle(msg.value)
            await msg.ack()               # batched: sent with the next pull, or on close

    messages = await puller.pull(max_messages=10, wait_ms=0)
    await puller.ack([m.id for m in messages])
    await puller.nack(["0-7"], delay_ms=1000, reason="downstream is down")
"""

from __future__ import annotations

import ssl
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import quote

from herald._http import DEFAULT_URL, Nodes, Reachability, request_json
from herald.message import Message
from herald.protocol import limits
from herald.protocol.frames import ExtendFrame, NackFrame
from herald.protocol.pull import AckRequest, AckResponse, NackRequest, PullRequest, PullResponse
from herald.protocol.unchecked import unchecked_struct

MAX_MESSAGES = limits.PULL_MAX_MESSAGES.high  # PROTOCOL §8: max_messages 1..1000
MAX_WAIT_MS = limits.WAIT_MS.high  # wait_ms 0..30000
MAX_REASON = limits.MAX_NACK_REASON
# A server's answer is not checked again (herald/protocol/unchecked.py).
_PULL_RESPONSE = unchecked_struct(PullResponse)


class Puller:
    """Pulls records of one subscription. Iterating long-polls with `wait_ms` and yields
    messages one by one; `msg.ack()` / `msg.nack()` are batched and sent before the next
    pull (and on close). A record taken but never acked comes back after its ack
    deadline, like any other consumer's. `msg.extend()` has no pull counterpart.

    `url` may list a cluster's nodes (PROTOCOL §7): requests go to one and move on to
    the next when it cannot be reached or answers 503 `cluster_unavailable`. Acks are
    by record id, so they apply on whichever node they reach."""

    def __init__(
        self,
        url: str | Sequence[str] = DEFAULT_URL,
        subscription: str = "",
        token: str | None = None,
        *,
        max_messages: int = 100,
        wait_ms: int = 20_000,
        limit: int | None = None,
        timeout: float = 60.0,
        retries: int = 5,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if not subscription:
            raise ValueError("subscription is required")
        if not 1 <= max_messages <= MAX_MESSAGES:
            raise ValueError(f"max_messages must be 1..{MAX_MESSAGES}")
        if not 0 <= wait_ms <= MAX_WAIT_MS:
            raise ValueError(f"wait_ms must be 0..{MAX_WAIT_MS}")
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        # The HTTP timeout must outlast the long-poll.
        self._nodes = Nodes(url, token, max(timeout, wait_ms / 1000 + 10), ssl_context)
        self._reach = Reachability(self._nodes.url)
        self._path = f"/v1/subscriptions/{quote(subscription, safe='')}"
        self.subscription = subscription
        self.max_messages = max_messages
        self.wait_ms = wait_ms
        self.limit = limit
        self.retries = retries
        self._taken = 0
        self._buffer: deque[Message] = deque()
        self._pending_acks: list[str] = []
        self._pending_nacks: list[NackFrame] = []
        self._closed = False

    async def __aenter__(self) -> Puller:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Send what acks and nacks are pending, then close the connection pool."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.flush()
        finally:
            await self._nodes.aclose()

    # -- the protocol ------------------------------------------------------------------

    async def pull(
        self, max_messages: int | None = None, wait_ms: int | None = None
    ) -> list[Message]:
        """Up to `max_messages` records (default: the puller's), long-polling up to
        `wait_ms` while there are none; [] when none came."""
        await self.flush()
        body = PullRequest(
            max_messages=self.max_messages if max_messages is None else max_messages,
            wait_ms=self.wait_ms if wait_ms is None else wait_ms,
        )
        result: PullResponse = await self._call("POST", f"{self._path}/pull", body, _PULL_RESPONSE)
        # Read as a consumer's deliveries are: the records decoded once, wrapped.
        return [Message(record, self) for record in result.messages]

    async def ack(self, ids: Sequence[str]) -> dict[str, list[str]]:
        """`{"ok": [...], "unknown": [...]}` (unknown: not in flight any more)."""
        result: AckResponse = await self._call(
            "POST", f"{self._path}/ack", AckRequest(list(ids)), AckResponse
        )
        return {"ok": result.ok, "unknown": result.unknown}

    async def nack(
        self, ids: Sequence[str], delay_ms: int | None = None, reason: str | None = None
    ) -> None:
        """Redeliver after `delay_ms`, else after the backoff; `reason` (≤ 256 characters)
        is what a dead letter of these records says went wrong."""
        if reason is not None and len(reason) > MAX_REASON:
            raise ValueError(f"reason is over {MAX_REASON} characters")
        body = NackRequest(ids=list(ids), delay_ms=delay_ms, reason=reason)
        await self._call("POST", f"{self._path}/nack", body)  # 204: no answer

    async def flush(self) -> None:
        """Send the acks and nacks that messages queued."""
        acks, self._pending_acks = self._pending_acks, []
        nacks, self._pending_nacks = self._pending_nacks, []
        if acks:
            await self.ack(acks)
        for frame in nacks:
            await self.nack(frame.ids, frame.delay_ms, frame.reason)

    # -- iteration ---------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        while not self._buffer:
            if self._closed or (self.limit is not None and self._taken >= self.limit):
                raise StopAsyncIteration
            want = self.max_messages
            if self.limit is not None:
                want = min(want, self.limit - self._taken)
            self._buffer.extend(await self.pull(want))
        self._taken += 1
        return self._buffer.popleft()

    # -- what Message.ack / nack call ----------------------------------------------------

    def queue_ack(self, message_id: str) -> None:
        self._pending_acks.append(message_id)

    def queue_frame(self, frame: NackFrame | ExtendFrame) -> None:
        if not isinstance(frame, NackFrame):
            # PROTOCOL §8 pull answers with /ack and /nack only: no deadline extension.
            raise RuntimeError(
                f"a pulled message cannot {frame.__struct_config__.tag}: ack or nack it"
            )
        self._pending_nacks.append(frame)

    async def _call(
        self, method: str, path: str, body: Any, answer: type[Any] | None = None
    ) -> Any:
        return await request_json(
            self._nodes,
            self._reach,
            method,
            path,
            body=body,
            attempts=self.retries,
            answer=answer,
        )
