"""Webhook push (PROTOCOL §4, §8): one dispatcher per push subscription.

A dispatcher is a ConsumerSink attached to the DeliveryEngine like a WebSocket consumer,
so deadlines, backoff, max_deliveries, dead-letter, ordered_by_key and seek are the same
core. It turns each Post of its policy — one record or a batch — into one signed POST
(subscribers/webhook_request.py builds it) and each answer into acks or nacks of its records;
credit is granted back only as answers return, so at most the endpoint's current
concurrency limit (delivery/endpoint_credit.py, AIMD up to `push.max_in_flight`) is
out at once. While the breaker (delivery/breaker.py) is open no credit is granted:
records wait in the log and spend no attempts. Each endpoint has its own
httpx.AsyncClient (its own connection pool and limits: a bulkhead), so a slow or dead
endpoint delays nobody else.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_none

from delivery.config import PushConfig, SubscriptionConfig
from delivery.engine import DeliveryEngine
from delivery.events import Delivery
from delivery.push import Ack, Action, Answer, Extend, Grant, Nack, Post, PushPolicy
from herald.lifecycle import Backoff, periodic, supervised
from herald.protocol.close_codes import CloseCode
from herald.protocol.errors import SubscriptionNotFound
from storage.writer import wall_clock_ms
from subscribers.attempt_log import FLUSH_INTERVAL_S, Attempt, AttemptLog
from subscribers.destination import ANYWHERE, DestinationGuard, guarded_transport
from subscribers.signing import secret_key, webhook_headers
from subscribers.webhook_request import build_request

log = logging.getLogger("herald.webhook")

# A failed dispatcher is restarted after 1 s, then less often while it keeps failing.
RESTART_BACKOFF = Backoff(first_s=1.0, max_s=10.0, healthy_s=60.0)
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
    """ConsumerSink for one push subscription; ``run`` is its worker. The I/O of push:
    the decisions are its PushPolicy's (delivery/push.py)."""

    def __init__(
        self,
        engine: DeliveryEngine,
        name: str,
        config: SubscriptionConfig,
        *,
        verify: Verify = True,
        destinations: DestinationGuard = ANYWHERE,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        assert config.push is not None
        self.engine = engine
        self.name = name
        self.topic = config.topic
        self.config = config
        self.push = config.push
        self.policy = PushPolicy(config)
        self._verify = verify
        self._destinations = destinations
        self._clock = clock
        self._wall_ms = wall_ms
        # PROTOCOL §8: the delivery history survives restarts (subscription names are
        # safe file names: PROTOCOL §1).
        self.attempts = AttemptLog(engine.storage.data_dir / "attempts" / f"{name}.jsonl")
        self._history: asyncio.Future[None] | None = None  # its reading, once started
        self._deleted = False
        self._keys = _signing_keys(self.push)
        self._running: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._consumer: str | None = None
        self.closed = False

    # ------------------------------------------------------------------ ConsumerSink

    def send(self, topic: str, subscription: str, deliveries: Sequence[Delivery]) -> None:
        self.policy.received(deliveries, self._clock())
        self._wake.set()

    def clock_moved(self) -> None:
        """The injected clock jumped ahead (a test's fake clock): look again now, not when
        the wait computed from the old time ends."""
        self._wake.set()

    def close(self, code: int, reason: str) -> None:
        """The subscription was deleted (4410) or the server stops (1001)."""
        self.closed = True
        self._deleted = code == CloseCode.DELETED
        self._consumer = None  # detached by the engine already
        self._wake.set()

    # ------------------------------------------------------------------ state

    def use_config(self, config: SubscriptionConfig) -> None:
        """The subscription's push secrets, batch or payload changed (docs/protocol.md,
        rotating the secret; PROTOCOL §8 change in place): every request signed from now
        on uses the new secrets and takes the new form. Requests already out keep what
        they were sent with; nothing else of the dispatcher restarts (its HTTP client,
        breaker and credit keep the settings they were built with)."""
        assert config.push is not None
        self.config, self.push = config, config.push
        self.policy.use_config(config)
        self._keys = _signing_keys(config.push)
        self._wake.set()  # a smaller batch may be due now

    def stats(self) -> dict[str, Any]:
        """The push members of the subscription's stats (docs/protocol.md); ``last_error``
        as its category (PROTOCOL §6: the details are the admin's, in the attempt log)."""
        stats = self.policy.stats(self._clock(), self._credit())
        stats["last_error"] = error_category(stats.get("last_error"))
        return stats

    # ------------------------------------------------------------------ the worker

    async def history_read(self) -> None:
        """Until the attempt log kept on disk is read (or its reading failed: the run
        reports that, and is restarted). Awaited before `GET .../attempts` answers and
        before the server serves: right after a restart the history must not look empty
        for a moment (PROTOCOL §8: it survives restarts)."""
        await asyncio.wait([self._reading()])

    def _reading(self) -> asyncio.Future[None]:
        """The history's reading, started once: before the first request goes out."""
        if self._history is None:
            self._history = asyncio.ensure_future(self._read_history())
        return self._history

    async def _read_history(self) -> None:
        await self.attempts.load()
        self._restore_last_answer()

    async def run(self) -> None:
        await asyncio.shield(self._reading())  # raises what reading raised
        history = asyncio.create_task(
            periodic(
                FLUSH_INTERVAL_S,
                self.attempts.flush,
                what=f"attempt log of {self.name}",
                logger=log,
            ),
            name=f"herald-attempts-{self.name}",
        )
        try:
            await self._deliver()
        finally:
            history.cancel()
            await asyncio.wait([history])  # never swallows a cancellation of our own
            if self._deleted:
                await self.attempts.remove()
            else:
                await self.attempts.flush()

    def _restore_last_answer(self) -> None:
        """`last_status` and `last_error` survive a restart, kill -9 included (within the
        attempt log's flush interval): they are those of the newest attempt kept on disk
        (docs/protocol.md, webhook stats)."""
        last = self.attempts.last
        if last is not None and self.policy.requests_total == 0:
            self.policy.last_status, self.policy.last_error = last.status, last.error

    async def _deliver(self) -> None:
        push = self.push
        limits = httpx.Limits(
            max_connections=push.max_in_flight, max_keepalive_connections=push.max_in_flight
        )
        # PROTOCOL §6: every connection is checked after DNS resolution (no rebinding).
        transport = guarded_transport(
            self._destinations, verify=self._verify, limits=limits, trust_env=False
        )
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(push.timeout_ms / 1000),
            follow_redirects=False,  # PROTOCOL §4: redirects are not followed
            transport=transport,
            trust_env=False,
        ) as client:
            self._consumer = self.engine.attach(self.name, self, 0)
            try:
                async with asyncio.TaskGroup() as requests:
                    while not self.closed:
                        self._wake.clear()
                        self._carry_out(
                            self.policy.poll(self._clock(), self._credit()), requests, client
                        )
                        if self.closed:
                            break
                        wake_at = self.policy.next_wakeup(self._clock())
                        timeout = None if wake_at is None else max(0.0, wake_at - self._clock())
                        try:
                            async with asyncio.timeout(timeout):
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

    def _credit(self) -> int:
        consumer = self._consumer
        return 0 if consumer is None else self.engine.credit_of(consumer)

    def _carry_out(
        self, actions: list[Action], requests: asyncio.TaskGroup, client: httpx.AsyncClient
    ) -> None:
        for action in actions:
            if isinstance(action, Post):
                task = requests.create_task(self._post(client, action))
                self._running.add(task)
                task.add_done_callback(self._request_done)
            else:
                self._tell_engine(action)

    def _tell_engine(self, action: Extend | Grant | Ack | Nack) -> None:
        consumer = self._consumer
        if consumer is None:
            return  # detached: the engine gives the records back itself
        try:
            if isinstance(action, Extend):
                self.engine.extend(consumer, action.ids, action.ms)
            elif isinstance(action, Grant):
                self.engine.grant_credit(consumer, action.n)
            elif isinstance(action, Ack):
                self.engine.ack(consumer, list(action.ids))
            else:
                self.engine.nack(consumer, list(action.ids), action.delay_ms, action.reason)
        except SubscriptionNotFound:
            # Detached under us (shutdown, delete): its records are redelivered later.
            if isinstance(action, Grant):
                self.closed = True

    def _request_done(self, task: asyncio.Task[None]) -> None:
        # Runs after the task's own wake-up: only now is its slot free.
        self._running.discard(task)
        self._wake.set()

    async def _post(self, client: httpx.AsyncClient, post: Post) -> None:
        request = build_request(post, self.topic, self.name)
        body = request.body
        wall_ms = self._wall_ms()
        headers = webhook_headers(
            self._live_keys(wall_ms),
            request.webhook_id,
            wall_ms // 1000,
            body,
            request.content_type,
        )
        headers.update(request.headers)
        started = self._clock()
        status: int | None = None
        retry_after: str | None = None
        error: str | None = None
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
                            retry_after = r.headers.get("retry-after")
                            await _drain(r)
        except (httpx.TimeoutException, TimeoutError):
            error = "timeout"
        except httpx.ConnectError as exc:
            error = _connect_error(exc)
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        except httpx.InvalidURL as exc:
            # Not an HTTPError. The API refuses such URLs; one stored by an older version
            # fails its deliveries (breaker, backoff, dead letters) instead of crashing
            # the dispatcher in a restart loop.
            error = f"invalid url: {exc}"
        now = self._clock()
        answer = Answer(status, now - started, error, retry_after, wall_ms)
        verdict = self.policy.answered(post, answer, now)
        deliveries = post.deliveries
        self.attempts.add(
            Attempt(
                wall_ms,
                deliveries[0].record.id,
                # A batch's records may be on different attempts: the highest is shown.
                max(d.attempt for d in deliveries),
                status,
                answer.latency_s * 1000,
                answer.error,
                count=len(deliveries),
            )
        )
        self._tell_engine(verdict)
        self._wake.set()

    def _live_keys(self, wall_ms: int) -> list[bytes]:
        return [key for key, expires in self._keys if expires is None or wall_ms < expires]


def _connect_error(exc: httpx.ConnectError) -> str:
    """PROTOCOL §8 names a refused connection "connection refused"; other connect
    failures (DNS, TLS, unreachable) keep what went wrong."""
    seen: list[BaseException] = [exc]
    while seen and len(seen) < 64:  # bounded: a cause chain is short
        cause = seen.pop()
        if isinstance(cause, ConnectionRefusedError) or "refused" in str(cause).lower():
            return "connection refused"
        if isinstance(cause, BaseExceptionGroup):
            seen.extend(cause.exceptions)
        nested = cause.__cause__ or cause.__context__
        if nested is not None:
            seen.append(nested)
    return f"connect failed: {exc}" if str(exc) else "connect failed"


def error_category(error: str | None) -> str | None:
    """What anyone who may read a subscription sees of a failed delivery (PROTOCOL §6):
    ``timeout``, ``connection refused``, ``tls error``, ``HTTP <status>``, ``destination
    not allowed``, ``invalid url`` or ``connection failed``; never the text of the error,
    which maps the network behind the server (ports, TLS versions, names)."""
    if error is None or error in ("timeout", "connection refused") or error.startswith("HTTP "):
        return error
    lowered = error.lower()
    if "destination not allowed" in lowered:
        return "destination not allowed"
    if "ssl" in lowered or "tls" in lowered or "certificate" in lowered:
        return "tls error"
    if lowered.startswith("invalid url"):
        return "invalid url"
    return "connection failed"


async def _drain(response: httpx.Response) -> None:
    """Read (and drop) a bounded part of the answer so the connection can be reused."""
    read = 0
    async for chunk in response.aiter_raw():
        read += len(chunk)
        if read > MAX_RESPONSE_BYTES:
            break


def _same_endpoint(old: PushConfig, new: PushConfig) -> bool:
    """Whether a running dispatcher can take ``new`` without a restart: it differs from
    ``old`` only in its secrets, batch or payload (its HTTP client and policy are built
    from the rest; the policy forms each request from the config of the moment)."""
    return (old.url, old.max_in_flight, old.timeout_ms, old.breaker) == (
        new.url,
        new.max_in_flight,
        new.timeout_ms,
        new.breaker,
    )


def _signing_keys(push: PushConfig) -> list[tuple[bytes, int | None]]:
    """(HMAC key, expires_at or None), the current secret first (PROTOCOL §4)."""
    return [(secret_key(push.secret), None)] + [
        (secret_key(p.secret), p.expires_at) for p in push.previous_secrets
    ]


class WebhookDispatchers:
    """The dispatchers of all push subscriptions, supervised under the server lifespan."""

    def __init__(
        self,
        engine: DeliveryEngine,
        *,
        verify: Verify = True,
        destinations: DestinationGuard = ANYWHERE,
    ) -> None:
        self.engine = engine
        self.verify = verify
        self.destinations = destinations  # PROTOCOL §6: where webhooks may go
        self._dispatchers: dict[str, WebhookDispatcher] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopped = False

    async def start(self) -> None:
        for name in self.engine.names():
            self.ensure(name)
        # Their histories are read before the server serves (stats' last_status too).
        await asyncio.gather(*(d.history_read() for d in list(self._dispatchers.values())))

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
        dispatcher = self._dispatcher(name, config)
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

    async def reconfigured(
        self, name: str, old: SubscriptionConfig, new: SubscriptionConfig
    ) -> None:
        """PROTOCOL §8 change in place, after the engine applied it: push given starts
        pushing; push set to null stops (the records out to the endpoint go back at once,
        for the subscription's other consumers); a new url or new limits restart the
        dispatcher with them; only new secrets, batch or payload, or no push change, keep
        it running (records waiting for a request go in the new form)."""
        if old.push == new.push:
            return
        dispatcher = self._dispatchers.get(name)
        if (
            dispatcher is not None
            and not dispatcher.closed
            and old.push is not None
            and new.push is not None
            and _same_endpoint(old.push, new.push)
        ):
            dispatcher.use_config(new)
            return
        await self.stop_one(name)
        self.ensure(name)

    async def stop_one(self, name: str) -> None:
        """Stop the dispatcher of ``name``, if any; its unfinished records go back."""
        task = self._tasks.pop(name, None)
        self._dispatchers.pop(name, None)
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

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

    def _dispatcher(self, name: str, config: SubscriptionConfig) -> WebhookDispatcher:
        return WebhookDispatcher(
            self.engine, name, config, verify=self.verify, destinations=self.destinations
        )

    async def _supervise(self, dispatcher: WebhookDispatcher) -> None:
        """Run the dispatcher until its subscription is deleted or the server stops; an
        unexpected failure restarts it (its records were given back on detach) as a new
        dispatcher with its current config (the secret may have rotated)."""
        name = dispatcher.name
        runs = 0

        async def run() -> None:
            nonlocal dispatcher, runs
            runs += 1
            if runs > 1:
                if self._dispatchers.get(name) is not dispatcher:
                    return  # replaced meanwhile
                dispatcher = self._dispatcher(name, dispatcher.config)
                self._dispatchers[name] = dispatcher
            await dispatcher.run()  # returns once closed

        with contextlib.suppress(SubscriptionNotFound):  # deleted before it attached
            await supervised(
                run,
                what=f"webhook dispatcher of {name}",
                logger=log,
                backoff=RESTART_BACKOFF,
                final=(SubscriptionNotFound,),
            )
