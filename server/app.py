"""The Starlette app: routes, middleware, and the lifespan that owns the background work.

``create_app(config)`` builds the app; the lifespan opens Storage (recovery),
starts the DeliveryEngine, runs the retention loop, and on shutdown drains in
the order PROTOCOL §3 asks for SIGTERM: pending appends finish, cursors are
persisted and consumers closed with 1001 (DeliveryEngine.stop), then Storage
closes. ``app.state`` carries ``config``, ``storage``, ``engine`` (what the
WebSocket endpoints in subscribers/websocket.py read) and ``runtime``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute

from delivery.engine import DeliveryEngine
from delivery.redrive import Redrives
from server import (
    console,
    metrics,
    openapi,
    routes_cluster,
    routes_stats,
    routes_subscriptions,
    routes_topics,
)
from server.access import AccessControlMiddleware, access_guard, watching
from server.config import ServerConfig
from server.errors import (
    EXCEPTION_HANDLERS,
    InternalErrorMiddleware,
    ServiceStopping,
    problem_response,
)
from server.http import push_stats
from server.limits import ClientLimitsMiddleware
from server.logging import RequestContextMiddleware
from server.metrics import Histogram
from server.publish import PublishEndpoint
from server.routes_webhooks import routes as webhook_routes
from server.tasks import cancel_and_wait
from storage.engine import Storage
from storage.lock import DataDirLock
from subscribers.webhook import WebhookDispatchers, webhook_verify

log = logging.getLogger("herald.server")


class BackgroundAppends:
    """Supervises the appends of acks=0 publishes, which are answered before they run.

    Bounded (STYLE principle 3): when ``limit`` appends are pending, the next
    acks=0 request waits for a slot before it is answered, which pushes back on
    the producer instead of queueing without end. SIGTERM waits for all of them.
    """

    def __init__(self, limit: int) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def submit(self, append: Coroutine[Any, Any, Any]) -> None:
        try:
            if self._closed:
                raise ServiceStopping("the server is shutting down")
            await self._slots.acquire()
        except BaseException:
            append.close()  # never started: close it so it is not reported as never awaited
            raise
        task = asyncio.create_task(append)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._slots.release()
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Nobody waits for an acks=0 answer; the log is the only place this can go.
            log.error("acks=0 append failed: %s", exc, exc_info=exc)

    async def drain(self) -> None:
        self._closed = True
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


class Runtime:
    """The app-wide workers and their start/stop order."""

    def __init__(self, config: ServerConfig, data_lock: DataDirLock | None = None) -> None:
        self.config = config
        self._data_lock = data_lock  # taken by `herald serve` before it bound its port
        self.stopping = asyncio.Event()  # wakes long-polls on SIGTERM
        self.background = BackgroundAppends(config.max_pending_unacked_publishes)
        self.storage: Storage | None = None
        self.engine: DeliveryEngine | None = None
        self.webhooks: WebhookDispatchers | None = None  # PROTOCOL §4 push subscriptions
        self._retention: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._drained = False
        self._closed = False

    async def start(self) -> None:
        lock = self._data_lock if self._data_lock is not None and self._data_lock.held else None
        self.storage = await Storage.open(
            self.config.data_dir, segment_bytes=self.config.segment_bytes, lock=lock
        )
        try:
            self.engine = DeliveryEngine(self.storage)
            await self.engine.start()
            verify = await asyncio.to_thread(webhook_verify, self.config.webhook_ca_file)
            self.webhooks = WebhookDispatchers(self.engine, verify=verify)
            await self.webhooks.start()
        except BaseException:
            await self.storage.close()
            raise
        self._retention = asyncio.create_task(self._retention_loop(), name="herald-retention")
        if self.config.flush_interval_s > 0:
            self._flusher = asyncio.create_task(self._flush_loop(), name="herald-flush")

    async def _retention_loop(self) -> None:
        assert self.storage is not None
        while True:
            await asyncio.sleep(self.config.retention_interval_s)
            try:
                await self.storage.run_retention()
            except Exception:  # one failed pass must not end retention for good
                log.exception("retention pass failed")

    async def _flush_loop(self) -> None:
        """Bound what power loss can take from acks=1 appends to about one interval."""
        assert self.storage is not None
        while True:
            await asyncio.sleep(self.config.flush_interval_s)
            try:
                await self.storage.flush()
            except Exception:  # a failed fsync is retried on the next tick
                log.exception("periodic flush failed")

    async def drain(self, state: Any = None) -> None:
        """Stop serving consumers: wake long-polls, finish acks=0 appends, persist cursors,
        close consumers with 1001. Idempotent; runs before uvicorn closes connections."""
        if self._drained:
            return
        self._drained = True
        self.stopping.set()
        await self.background.drain()
        if self.engine is not None:
            if self.webhooks is not None:  # first: unfinished POSTs give their records back
                await self.webhooks.stop()
            await self.engine.stop()
        tails = getattr(state, "tails", None)  # subscribers.tail.TailRegistry, if any tail ran
        if tails is not None:
            tails.close_all()

    async def close(self, state: Any = None) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.drain(state)
        finally:
            try:
                await cancel_and_wait(self._retention, self._flusher)
            finally:
                if self.storage is not None:
                    await self.storage.close()


# ------------------------------------------------------------------ small routes


async def healthz(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    if runtime.stopping.is_set():
        return problem_response(
            503, "Service Unavailable", "storage_unavailable", "the server is shutting down"
        )
    return Response(b'{"status":"ok"}', media_type="application/json")


async def metrics_route(request: Request) -> Response:
    state = request.app.state
    engine = state.engine
    stats = {name: engine.stats(name) | push_stats(state, name) for name in sorted(engine.names())}
    topics = sorted(state.storage.topics(), key=lambda t: t.name)
    text = metrics.render(topics, stats, state.publish_duration)
    return Response(text, media_type=metrics.CONTENT_TYPE)


_OPENAPI = openapi.document_bytes()


async def openapi_route(request: Request) -> Response:
    return Response(_OPENAPI, media_type="application/json")


def websocket_routes() -> list[BaseRoute]:
    """The WebSocket consumers of PROTOCOL §3, once subscribers/websocket.py exists."""
    try:
        from subscribers import websocket
    except ModuleNotFoundError as exc:
        if exc.name != "subscribers.websocket":
            raise  # a missing dependency *of* that module is a real error
        log.warning("subscribers.websocket is not available: WebSocket consumers are off")
        return []
    return [
        WebSocketRoute("/v1/subscriptions/{name}/ws", websocket.subscription_socket),
        WebSocketRoute("/v1/topics/{topic}/ws", websocket.topic_tail_socket),
    ]


def create_app(
    config: ServerConfig | None = None, *, data_lock: DataDirLock | None = None
) -> Starlette:
    """The app for ``config``. ``data_lock``: the data directory's lock if the caller took
    it already; else the lifespan takes it when it opens Storage."""
    config = config or ServerConfig()
    guard = access_guard(config.auth_file)  # PROTOCOL §6; None: an open server

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime = Runtime(config, data_lock)
        await runtime.start()
        app.state.runtime = runtime
        app.state.storage = runtime.storage
        app.state.engine = runtime.engine
        app.state.webhooks = runtime.webhooks
        app.state.stopping = runtime.stopping
        app.state.background = runtime.background
        assert runtime.engine is not None  # started
        app.state.redrives = Redrives(runtime.engine)  # delivery/redrive.py
        log.info("recovered %s; serving", config.data_dir)
        try:
            async with watching(guard):
                yield
        finally:
            await runtime.close(app.state)
            log.info("stopped")

    routes: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
        Route("/openapi.json", openapi_route, methods=["GET"]),
        *routes_topics.routes,
        *routes_subscriptions.routes,
        *webhook_routes,
        *websocket_routes(),
        *routes_stats.routes,
        *routes_cluster.routes,
        *console.routes,
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(RequestContextMiddleware, access_log_enabled=config.access_log),
            Middleware(
                ClientLimitsMiddleware,
                max_per_client=config.max_requests_per_client,
                body_timeout_s=config.body_timeout_s,
            ),
            Middleware(AccessControlMiddleware, guard=guard),
            Middleware(InternalErrorMiddleware),
            Middleware(PublishEndpoint),  # the publish hot path, past every check above
        ],
        exception_handlers=dict(EXCEPTION_HANDLERS),
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.publish_duration = Histogram()
    app.state.admin_lock = asyncio.Lock()
    app.state.started_ms = time.time_ns() // 1_000_000  # GET /v1/stats uptime
    return app
