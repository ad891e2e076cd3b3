"""Protection of the front end (PROTOCOL §6): publish rate limits per token, concurrent
requests and WebSockets per client address, and a deadline for request bodies.

* ``TokenBucket`` / ``PublishLimiter``: messages/s and bytes/s per token from the
  auth file. A publish is admitted when the bucket holds what it costs (capped at
  one second's worth, so a batch larger than a second's allowance is still
  admitted when the bucket is full, and its debt is paid back before the next);
  otherwise 429 ``rate_limited`` with ``Retry-After`` in whole seconds.
* ``ClientLimitsMiddleware``: at most ``max_per_client`` requests and WebSockets
  at once per client address (429 / close 1013; 0 turns the cap off), and a body
  that does not move for ``body_timeout_s``, or is not whole ``body_deadline_s``
  after it began (a trickle of a byte every few seconds), ends the request with 408
  ``request_timeout``. The client address is the connection's peer, or, from a
  proxy the operator trusts (``--forwarded-allow-ips``), the address the proxy
  names in ``X-Forwarded-For`` (uvicorn's ProxyHeadersMiddleware sets it first), or,
  from another node of the cluster that proves it is one (``peer_client``), the
  address of the client it forwards for: a node is not one client, and counting
  everything it forwards under its own address let one client's parked long-polls
  refuse every other client whose requests passed the same way (issue 26 item 8).
  A node's own calls (replication reports, fetches) are not counted at all.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from herald.protocol.errors import RateLimited, RequestTimeout
from server.auth import Principal
from server.errors import refuse
from server.http_protocol import RECEIVE_READY
from server.tasks import at_task_end

MAX_REQUESTS_PER_CLIENT = 256
BODY_TIMEOUT_S = 10.0
BODY_DEADLINE_S = 60.0


@dataclass(slots=True)
class TokenBucket:
    rate: float  # tokens per second; also the capacity (one second's worth)
    clock: Callable[[], float] = time.monotonic
    tokens: float = field(init=False)
    stamp: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.rate
        self.stamp = self.clock()

    def refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.rate, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_for(self, cost: float) -> float:
        """Seconds until ``cost`` would be admitted (0: now). Call ``refill`` first."""
        needed = min(cost, self.rate)
        return 0.0 if self.tokens >= needed else (needed - self.tokens) / self.rate

    def take(self, cost: float) -> None:
        self.tokens -= cost


class PublishLimiter:
    """The buckets of every token with limits; a reload with new rates starts them fresh."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[tuple[float | None, float | None], list[TokenBucket]]] = {}

    def charge(self, principal: Principal, messages: int, size: int) -> None:
        rates = (principal.messages_per_second, principal.bytes_per_second)
        if rates == (None, None):
            return
        known = self._buckets.get(principal.token_id)
        if known is None or known[0] != rates:
            buckets = [TokenBucket(r, self._clock) if r is not None else None for r in rates]
            known = (rates, [b for b in buckets if b is not None])
            self._buckets[principal.token_id] = known
        costs = [c for c, r in zip((messages, size), rates, strict=True) if r is not None]
        pairs = list(zip(known[1], costs, strict=True))
        for bucket, _ in pairs:
            bucket.refill()
        wait = max(bucket.wait_for(cost) for bucket, cost in pairs)
        if wait > 0:
            raise RateLimited(
                f"token {principal.token_id} is over its publish rate",
                retry_after=max(1, math.ceil(wait)),
            )
        for bucket, cost in pairs:
            bucket.take(cost)


def charge_publish(scope: Scope, messages: int, size: int) -> None:
    """Charges a publish to its token's buckets (set by server/access.py); no-op when open."""
    state = scope.get("state", {})
    principal = state.get("principal")
    limiter = state.get("publish_limiter")
    if principal is not None and limiter is not None:
        limiter.charge(principal, messages, size)


def client_address(scope: Scope) -> str:
    """The address of the client a request is for (set by ClientLimitsMiddleware): what a
    node names when it forwards the request to another (server/peers.py)."""
    known = scope.get("state", {}).get("client_address")
    if isinstance(known, str):
        return known
    client = scope.get("client")
    return str(client[0]) if client else ""


# The client an authenticated peer forwards for: its address, "" for the node's own
# calls, None when the request is not from an authenticated peer (server/access.py).
PeerClient = Callable[[Scope], Awaitable[str | None]]


class ClientLimitsMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_per_client: int = MAX_REQUESTS_PER_CLIENT,
        body_timeout_s: float = BODY_TIMEOUT_S,
        body_deadline_s: float = BODY_DEADLINE_S,
        peer_client: PeerClient | None = None,
    ) -> None:
        self.app = app
        self.max_per_client = max_per_client
        self.body_timeout_s = body_timeout_s
        self.body_deadline_s = body_deadline_s
        self.peer_client = peer_client
        self._active: dict[str, int] = {}

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] == "websocket" and self.peer_client is None:
            return self._admit_socket(scope, receive, send)
        if scope["type"] not in ("http", "websocket"):
            return self.app(scope, receive, send)
        return self._limited(scope, receive, send)

    def _admit_socket(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """A WebSocket counted without a frame of this layer held while it stays open
        (issue 27 §3): its count is given back when its connection's task ends."""
        if self.max_per_client <= 0:
            return self.app(scope, receive, send)
        address = client_address(scope)
        if not self._take(address):
            return _refuse_busy(scope, receive, send, self.max_per_client)
        at_task_end(functools.partial(self._give_back, address))
        return self.app(scope, receive, send)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            admitted = await self.admit(scope)
        except RateLimited as exc:
            await refuse(scope, receive, send, exc, reason="too many connections")
            return
        try:
            await self._serve(scope, receive, send)
        finally:
            self.release(admitted)

    async def admit(self, scope: Scope) -> str | None:
        """Counts a request against its client's cap (raises RateLimited at the cap): the
        address to ``release`` when it ends, None when it is not counted (the cap is off,
        or a node's own call). This layer's decision, and the publish route's below ASGI
        (server/direct_publish.py)."""
        behind = None if self.peer_client is None else await self.peer_client(scope)
        if behind is not None:
            scope.setdefault("state", {})["client_address"] = behind
        if self.max_per_client <= 0 or behind == "":
            return None
        address = client_address(scope)
        if not self._take(address):
            raise _busy(self.max_per_client)
        return address

    def release(self, admitted: str | None) -> None:
        """Ends a request ``admit`` counted."""
        if admitted is not None:
            self._give_back(admitted)

    def _take(self, address: str) -> bool:
        """Count one more request of ``address``; False if it has its cap's worth."""
        active = self._active.get(address, 0)
        if active >= self.max_per_client:
            return False
        self._active[address] = active + 1
        return True

    def _give_back(self, address: str, *_ended: object) -> None:
        left = self._active[address] - 1
        if left:
            self._active[address] = left
        else:
            del self._active[address]

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.app(scope, self._timed(scope, receive), send)
        else:
            await self.app(scope, receive, send)

    def _timed(self, scope: Scope, receive: Receive) -> Receive:
        timeout, total = self.body_timeout_s, self.body_deadline_s
        # Whether the next receive() answers without waiting (server/http_protocol.py
        # says so; another ASGI server does not, and every receive is timed).
        ready = scope.get("extensions", {}).get(RECEIVE_READY)
        body_done = False
        deadline: float | None = None  # PROTOCOL §6: the whole body within `total`

        async def receive_with_deadline() -> Message:
            # Only the body has a deadline: later receives wait for a disconnect
            # (long-polls), which may take as long as the response does.
            nonlocal body_done, deadline
            if body_done:
                return await receive()
            now = asyncio.get_running_loop().time()
            if deadline is None:
                deadline = now + total
            stall = min(timeout, deadline - now)
            try:
                if stall <= 0:
                    raise TimeoutError
                if ready is not None and ready():
                    # Nothing to wait for, so nothing to time: a body that came with its
                    # headers (every small publish) is read without a loop timer
                    # scheduled and cancelled (issue 27 §2: ~10 µs of CPU each).
                    message = await receive()
                else:
                    async with asyncio.timeout(stall):
                        message = await receive()
            except TimeoutError:
                if stall < timeout:
                    raise RequestTimeout(
                        f"the request body did not arrive within {total:g} s"
                    ) from None
                raise RequestTimeout(f"no request body bytes for {timeout:g} s") from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        return receive_with_deadline


def _busy(limit: int) -> RateLimited:
    # PROTOCOL §6: 429 with Retry-After, and for a WebSocket close 1013 (try again later).
    return RateLimited(f"at most {limit} requests at once per client address", retry_after=1)


async def _refuse_busy(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    await refuse(scope, receive, send, _busy(limit), reason="too many connections")
