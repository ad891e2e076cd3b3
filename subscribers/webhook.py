"""Webhook push (PROTOCOL §4): one dispatcher per push subscription.

A dispatcher is a ConsumerSink attached to the DeliveryEngine like a WebSocket consumer,
so deadlines, backoff, max_deliveries, dead-letter, ordered_by_key and seek are the same
core. It turns each delivery into one signed POST and each answer into an ack or a nack;
credit is granted back only as answers return, so at most the endpoint's current
concurrency limit (subscribers/endpoint_credit.py, AIMD up to `push.max_in_flight`) is
out at once. While the breaker (subscribers/breaker.py) is open no credit is granted:
records wait in the log and spend no attempts. Each endpoint has its own
httpx.AsyncClient (its own connection pool and limits: a bulkhead), so a slow or dead
endpoint delays nobody else.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import email.utils
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_none

from delivery.config import PushConfig, SubscriptionConfig
from delivery.engine import DeliveryEngine
from delivery.events import Delivery
from storage.errors import SubscriptionNotFound
from storage.writer import wall_clock_ms
from subscribers.attempt_log import Attempt, AttemptLog
from subscribers.breaker import CircuitBreaker
from subscribers.endpoint_credit import EndpointCredit
from subscribers.signing import secret_key, webhook_headers
from subscribers.wire import record_json

log = logging.getLogger("herald.webhook")

DEADLINE_SLACK_MS = 1_000  # a request's record stays in flight this long past timeout_ms
RESTART_AFTER_FAILURE_S = 1.0
MAX_RESPONSE_BYTES = 64 * 1024  # of a receiver's answer body we read (and drop)


# A pooled keep-alive connection the endpoint closed while idle fails at once with "server
# disconnected": a transport glitch, not an answer — one immediate retry on a fresh
# connection, so it does not spend a delivery attempt. Every other failure is the delivery
# core's to retry, with the subscription's backoff.
def _stale_connection_retry() -> AsyncRetrying:
    return AsyncRetrying(  # one per request: a retrying object keeps per-call state
        stop=stop_after_attempt(2),
        retry=retry_if_exception_type(httpx.RemoteProtocolError),
        wait=wait_none(),
        reraise=True,
    )


Verify = ssl.SSLContext | str | bool  # httpx's `verify`: a custom CA comes in here


def webhook_verify(ca_file: Path | str | None) -> Verify:
    """httpx's `verify` for webhook TLS: the system CAs, plus ``ca_file`` when given
    (ServerConfig.webhook_ca_file, for endpoints behind a private CA)."""
    if ca_file is None or str(ca_file) == "":
        return True
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=str(ca_file))
    return context


class WebhookDispatcher:
    """ConsumerSink for one push subscription; ``run`` is its worker."""

    def __init__(
        self,
        engine: DeliveryEngine,
        name: str,
        config: SubscriptionConfig,
        *,
        verify: Verify = True,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        assert config.push is not None
        self.engine = engine
        self.name = name
        self.topic = config.topic
        self.config = config
        self.push = config.push
        self._verify = verify
        self._clock = clock
        self._wall_ms = wall_ms
        self.breaker = CircuitBreaker(self.push.breaker)
        self.credit = EndpointCredit(self.push.max_in_flight)
        self.attempts = AttemptLog()
        self._keys = _signing_keys(self.push)
        self._ready: deque[Delivery] = deque()  # received, not POSTed yet
        self._held_since: dict[str, float] = {}  # ready record id -> last deadline extension
        self._granted = 0  # credit granted and not yet used by the engine
        self._running: set[asyncio.Task[None]] = set()
        self._not_before = 0.0  # Retry-After of a 429/503 pauses the whole endpoint
        self._wake = asyncio.Event()
        self._consumer: str | None = None
        self.closed = False
        self.last_status: int | None = None
        self.last_error: str | None = None
        self.requests_total = 0
        self.failures_total = 0

    # ------------------------------------------------------------------ ConsumerSink

    def send(self, topic: str, subscription: str, deliveries: Sequence[Delivery]) -> None:
        self._granted = max(0, self._granted - len(deliveries))
        now = self._clock()
        for delivery in deliveries:
            self._ready.append(delivery)
            self._held_since[_record_id(delivery)] = now
        self._wake.set()

    def close(self, code: int, reason: str) -> None:
        """The subscription was deleted (4410) or the server stops (1001)."""
        self.closed = True
        self._consumer = None  # detached by the engine already
        self._wake.set()

    # ------------------------------------------------------------------ state

    def use_config(self, config: SubscriptionConfig) -> None:
        """The subscription's push secrets changed (docs/protocol.md, rotating the secret):
        every request signed from now on uses the new set. Requests already out keep the
        signatures they were sent with; nothing else of the dispatcher restarts (its HTTP
        client, breaker and credit keep the settings they were built with)."""
        assert config.push is not None
        self.config, self.push = config, config.push
        self._keys = _signing_keys(config.push)

    def stats(self) -> dict[str, Any]:
        """The push members of the subscription's stats (docs/protocol.md)."""
        self.breaker.allowed(self._clock())  # an elapsed open period shows as half_open
        return {
            "endpoint_state": self.breaker.state.value,
            "last_status": self.last_status,
            "last_error": self.last_error,
            "endpoint_concurrency": self.credit.limit,
            "endpoint_in_flight": len(self._running),
            "endpoint_waiting": len(self._ready),  # received, held (breaker, Retry-After)
            "endpoint_credit": self._granted,
            "endpoint_requests_total": self.requests_total,
            "endpoint_failures_total": self.failures_total,
            "breaker_opened_total": self.breaker.opened_total,
        }

    # ------------------------------------------------------------------ the worker

    async def run(self) -> None:
        push = self.push
        timeout_s = push.timeout_ms / 1000
        limits = httpx.Limits(
            max_connections=push.max_in_flight, max_keepalive_connections=push.max_in_flight
        )
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s),
            limits=limits,
            follow_redirects=False,  # PROTOCOL §4: redirects are not followed
            verify=self._verify,
            trust_env=False,
        ) as client:
            self._consumer = self.engine.attach(self.name, self, 0)
            try:
                async with asyncio.TaskGroup() as requests:
                    while not self.closed:
                        self._wake.clear()
                        wait_s = self._pump(requests, client)
                        if self.closed:
                            break
                        try:
                            async with asyncio.timeout(wait_s):
                                await self._wake.wait()
                        except TimeoutError:
                            pass
                    for task in list(self._running):
                        task.cancel()
            finally:
                consumer, self._consumer = self._consumer, None
                if consumer is not None:
                    # Records of unfinished requests go back at once, their attempts kept.
                    self.engine.detach(consumer)

    def _pump(self, requests: asyncio.TaskGroup, client: httpx.AsyncClient) -> float | None:
        """Start what may start now and grant the credit that leaves room for; returns
        how long to sleep at most before looking again."""
        now = self._clock()
        allowed = self.breaker.allowed(now)
        limit = self.credit.limit if allowed is None else min(allowed, self.credit.limit)
        wait_s: float | None = None
        if now < self._not_before:
            limit, wait_s = 0, self._not_before - now
        while self._ready and len(self._running) < limit:
            delivery = self._ready.popleft()
            self._held_since.pop(_record_id(delivery), None)
            self._start(requests, client, delivery)
        self._extend_held(now)
        if self._ready:
            wait_s = _min(wait_s, self.config.ack_deadline_ms / 3000)
        reopens = self.breaker.reopens_at()
        if reopens is not None:
            wait_s = _min(wait_s, max(0.0, reopens - now) + 0.001)
        want = limit - len(self._running) - len(self._ready) - self._granted
        if want > 0 and self._consumer is not None:
            self._granted += want
            try:
                self.engine.grant_credit(self._consumer, want)
            except SubscriptionNotFound:
                self.closed = True  # detached under us: the engine is stopping
        return wait_s

    def _extend_held(self, now: float) -> None:
        """Records received but not POSTed yet (the breaker opened, or a Retry-After)
        stay in flight without spending an attempt: their deadline is pushed out."""
        if not self._held_since or self._consumer is None:
            return
        due = now - self.config.ack_deadline_ms / 3000
        stale = [i for i, since in self._held_since.items() if since <= due]
        if stale:
            self.engine.extend(self._consumer, stale, self.config.ack_deadline_ms)
            for record_id in stale:
                self._held_since[record_id] = now

    def _start(
        self, requests: asyncio.TaskGroup, client: httpx.AsyncClient, delivery: Delivery
    ) -> None:
        record_id = _record_id(delivery)
        if self._consumer is not None and self.push.timeout_ms + DEADLINE_SLACK_MS > (
            self.config.ack_deadline_ms
        ):
            # The POST may take timeout_ms: the core must not redeliver meanwhile.
            self.engine.extend(
                self._consumer, [record_id], self.push.timeout_ms + DEADLINE_SLACK_MS
            )
        task = requests.create_task(self._post(client, delivery, record_id))
        self._running.add(task)
        task.add_done_callback(self._request_done)

    def _request_done(self, task: asyncio.Task[None]) -> None:
        # Runs after the task's own wake-up: only now is its slot free.
        self._running.discard(task)
        self._wake.set()

    async def _post(self, client: httpx.AsyncClient, delivery: Delivery, record_id: str) -> None:
        body = record_json(self.topic, delivery.record, self.name, delivery.attempt)
        wall_ms = self._wall_ms()
        headers = webhook_headers(
            self._live_keys(wall_ms), f"{self.name}:{record_id}", wall_ms // 1000, body
        )
        started = self._clock()
        status: int | None = None
        error: str | None = None
        retry_after_ms: int | None = None
        try:
            # PROTOCOL §4: a 2xx within timeout_ms, the whole exchange (httpx's own timeouts
            # are per phase: connect, each read...).
            async with asyncio.timeout(self.push.timeout_ms / 1000):
                async for connection_attempt in _stale_connection_retry():
                    with connection_attempt:
                        async with client.stream(
                            "POST", self.push.url, content=body, headers=headers
                        ) as r:
                            status = r.status_code
                            await _drain(r)
            assert status is not None
            if not 200 <= status < 300:
                error = f"HTTP {status}"
                if status in (429, 503):
                    retry_after_ms = parse_retry_after(r.headers.get("retry-after"), wall_ms)
        except (httpx.TimeoutException, TimeoutError):
            error = "timeout"
        except httpx.ConnectError as exc:
            error = f"connect failed: {exc}" if str(exc) else "connect failed"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        latency_s = self._clock() - started
        self._finish(delivery, record_id, wall_ms, status, error, latency_s, retry_after_ms)

    def _live_keys(self, wall_ms: int) -> list[bytes]:
        return [key for key, expires in self._keys if expires is None or wall_ms < expires]

    def _finish(
        self,
        delivery: Delivery,
        record_id: str,
        wall_ms: int,
        status: int | None,
        error: str | None,
        latency_s: float,
        retry_after_ms: int | None,
    ) -> None:
        now = self._clock()
        self.requests_total += 1
        self.last_status, self.last_error = status, error
        self.attempts.add(
            Attempt(wall_ms, record_id, delivery.attempt, status, latency_s * 1000, error)
        )
        consumer = self._consumer
        if error is None:
            self.breaker.on_success()
            self.credit.on_success(latency_s)
            if consumer is not None:
                _apply(lambda: self.engine.ack(consumer, [record_id]))
        else:
            self.failures_total += 1
            self.breaker.on_failure(now)
            self.credit.on_failure()
            delay_ms = None
            if retry_after_ms is not None:
                # Honoured, capped by the backoff maximum (PROTOCOL §4, issue 4).
                delay_ms = min(retry_after_ms, self.config.retry_backoff.max_ms)
                self._not_before = max(self._not_before, now + delay_ms / 1000)
            if consumer is not None:
                _apply(lambda: self.engine.nack(consumer, [record_id], delay_ms))
        self._wake.set()


def parse_retry_after(value: str | None, now_ms: int) -> int | None:
    """RFC 9110 `Retry-After`: delay-seconds or an HTTP date; ms from now, or None."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return int(value) * 1000
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0, int(when.timestamp() * 1000) - now_ms)


async def _drain(response: httpx.Response) -> None:
    """Read (and drop) a bounded part of the answer so the connection can be reused."""
    read = 0
    async for chunk in response.aiter_raw():
        read += len(chunk)
        if read > MAX_RESPONSE_BYTES:
            break


def _apply(verdict: Callable[[], object]) -> None:
    # Detached meanwhile (shutdown, delete): the record is redelivered later.
    with contextlib.suppress(SubscriptionNotFound):
        verdict()


def _signing_keys(push: PushConfig) -> list[tuple[bytes, int | None]]:
    """(HMAC key, expires_at or None), the current secret first (PROTOCOL §4)."""
    return [(secret_key(push.secret), None)] + [
        (secret_key(p.secret), p.expires_at) for p in push.previous_secrets
    ]


def _record_id(delivery: Delivery) -> str:
    return f"{delivery.record.partition}-{delivery.record.offset}"


def _min(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)


class WebhookDispatchers:
    """The dispatchers of all push subscriptions, supervised under the server lifespan."""

    def __init__(self, engine: DeliveryEngine, *, verify: Verify = True) -> None:
        self.engine = engine
        self.verify = verify
        self._dispatchers: dict[str, WebhookDispatcher] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopped = False
        # One INFO line per POST from httpx would drown the server log.
        logging.getLogger("httpx").setLevel(logging.WARNING)

    async def start(self) -> None:
        for name in self.engine.names():
            self.ensure(name)

    def ensure(self, name: str) -> None:
        """Start the dispatcher of ``name`` if it is a push subscription without one."""
        running = self._dispatchers.get(name)
        if self._stopped or (running is not None and not running.closed):
            return  # a closed one is a deleted subscription's, still winding down
        try:
            config = self.engine.get(name)
        except SubscriptionNotFound:
            return
        if config.push is None:
            return
        # A fresh context: the dispatcher outlives the request that created it (its log
        # lines must not carry that request's id).
        # Registered at once, so the PUT that created it already shows its stats.
        dispatcher = WebhookDispatcher(self.engine, name, config, verify=self.verify)
        self._dispatchers[name] = dispatcher
        task = asyncio.create_task(
            self._supervise(dispatcher),
            name=f"herald-webhook-{name}",
            context=contextvars.Context(),
        )
        self._tasks[name] = task
        task.add_done_callback(lambda _: self._forget(name, task))

    def get(self, name: str) -> WebhookDispatcher | None:
        return self._dispatchers.get(name)

    async def update_push(
        self, name: str, change: Callable[[PushConfig], PushConfig]
    ) -> SubscriptionConfig:
        """Change the push config of ``name`` in the engine (persisted) and hand it to its
        running dispatcher, which signs its next request with it (no restart: no record is
        given back, none sent twice). Raises as DeliveryEngine.update_push."""
        config = await self.engine.update_push(name, change)
        dispatcher = self._dispatchers.get(name)
        if dispatcher is not None and not dispatcher.closed:
            dispatcher.use_config(config)
        return config

    def stats(self, name: str) -> dict[str, Any] | None:
        dispatcher = self._dispatchers.get(name)
        return None if dispatcher is None else dispatcher.stats()

    async def stop(self) -> None:
        """Shutdown: cancel every dispatcher; their unfinished records go back at once."""
        self._stopped = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _forget(self, name: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(name) is task:  # not replaced by a re-created subscription's
            del self._tasks[name]
            del self._dispatchers[name]

    async def _supervise(self, dispatcher: WebhookDispatcher) -> None:
        """Run the dispatcher until its subscription is deleted or the server stops; an
        unexpected failure restarts it (its records were given back on detach)."""
        name = dispatcher.name
        while True:
            try:
                await dispatcher.run()
            except SubscriptionNotFound:
                return  # deleted before it attached
            except Exception:
                log.exception("webhook dispatcher of %s failed; restarting", name)
                await asyncio.sleep(RESTART_AFTER_FAILURE_S)
                if self._dispatchers.get(name) is not dispatcher:
                    return  # replaced meanwhile
                # Its config, not the one it started with: the secret may have rotated.
                dispatcher = WebhookDispatcher(
                    self.engine, name, dispatcher.config, verify=self.verify
                )
                self._dispatchers[name] = dispatcher
                continue
            if dispatcher.closed:
                return
