"""The Starlette app: routes (from server/route_table.py), middleware, and the lifespan.

``create_app(config)`` builds the app; its lifespan starts a
:class:`~server.runtime.Runtime` (recovery, delivery, webhooks, retention) and on
shutdown closes it in the order PROTOCOL §3 asks for SIGTERM. Routes reach what they
use through ``server.runtime.services(request)``, typed; ``app.state`` holds only the
runtime.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from server.access import AccessControlMiddleware, access_guard, watching
from server.cluster_trust import cluster_keys
from server.config import ServerConfig
from server.coordinated import CoordinatorRouting
from server.direct_publish import DirectPublish
from server.endpoint import EndpointRouter
from server.errors import EXCEPTION_HANDLERS, InternalErrorMiddleware
from server.limits import ClientLimitsMiddleware
from server.logging import RequestContextMiddleware
from server.publish import PublishEndpoint
from server.route_table import endpoints
from server.runtime import Runtime
from storage.lock import DataDirLock

log = logging.getLogger("herald.server")


class _HttpExceptionMiddleware(ExceptionMiddleware):
    """Starlette's ExceptionMiddleware, which a WebSocket passes without a frame of it:
    the handlers a socket's route could reach go into its scope as Starlette puts them."""

    def __call__(  # type: ignore[override]
        self, scope: Scope, receive: Receive, send: Send
    ) -> Awaitable[None]:
        if scope["type"] == "websocket":
            scope["starlette.exception_handlers"] = self.handlers
            return self.app(scope, receive, send)
        return super().__call__(scope, receive, send)

    @property
    def handlers(self) -> tuple[object, object]:
        return self._exception_handlers, self._status_handlers


class HeraldApp(Starlette):
    """Starlette, whose own two layers a WebSocket does not go through.

    For a WebSocket, Starlette's ServerErrorMiddleware only passes it on, and no
    handler of its ExceptionMiddleware is reached (the socket endpoints and our layers
    turn every failure into a close code themselves: subscribers/websocket.py,
    server/access.py, server/limits.py); yet each keeps a suspended frame, the second
    also two closures, for as long as the socket stays open (issue 27 §3: memory per
    idle consumer). So a WebSocket enters the app's own layers (``middleware``, the
    same instances HTTP goes through) directly, and ``__call__`` returns their call
    instead of awaiting it. HTTP goes Starlette's way, unchanged."""

    _layers: ASGIApp  # the app's own layers over the router, below ServerErrorMiddleware
    # What the HTTP protocol serves below ASGI (server/direct_publish.py): publishes,
    # once the stack is built (at the lifespan's start); None: everything through ASGI.
    direct_route: DirectPublish | None = None

    def build_middleware_stack(self) -> ASGIApp:
        # As Starlette builds it (no body limit is configured here), with the
        # ExceptionMiddleware a WebSocket passes.
        last_resort = {k: v for k, v in self.exception_handlers.items() if k in (500, Exception)}
        handlers = {k: v for k, v in self.exception_handlers.items() if k not in last_resort}
        app: ASGIApp = _HttpExceptionMiddleware(self.router, handlers=handlers, debug=self.debug)
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        self._layers = app
        if isinstance(self.router, EndpointRouter):
            self.direct_route = DirectPublish.of(self, app, self.router.endpoints)
        handler = next(iter(last_resort.values()), None)
        return ServerErrorMiddleware(app, handler=handler, debug=self.debug)

    def __call__(  # type: ignore[override]
        self, scope: Scope, receive: Receive, send: Send
    ) -> Awaitable[None]:
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        if scope["type"] == "websocket":
            scope["app"] = self
            return self._layers(scope, receive, send)
        return super().__call__(scope, receive, send)


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
        app.state.runtime = runtime  # the one thing on app.state: see server/runtime.py
        log.info("recovered %s; serving", config.data_dir)
        try:
            async with watching(guard):
                yield
        finally:
            await runtime.close()
            log.info("stopped")

    # server/route_table.py: every route, declared once
    table = endpoints(guard, cluster_keys(config) if config.clustered else None, config.node_url)
    # CORS (docs/browser.md): outside the access check, so that preflights need no token
    # and refusals carry the headers a page needs to read them. None configured: no layer.
    cors = [
        Middleware(
            CORSMiddleware,
            allow_origins=config.allowed_origins,
            allow_methods=["GET", "HEAD", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
            expose_headers=["Retry-After", "X-Request-Id", "ETag"],
            max_age=600,
        )
    ]
    if not config.allowed_origins:
        cors = []
    app = HeraldApp(
        middleware=[
            Middleware(RequestContextMiddleware, access_log_enabled=config.access_log),
            Middleware(
                ClientLimitsMiddleware,
                max_per_client=config.max_requests_per_client,
                body_timeout_s=config.body_timeout_s,
                body_deadline_s=config.body_deadline_s,
                # PROTOCOL §7: a node forwarding for a client counts as that client.
                peer_client=guard.peer_client if guard is not None else None,
            ),
            *cors,
            Middleware(AccessControlMiddleware, guard=guard, endpoints=table),
            Middleware(InternalErrorMiddleware),
            # PROTOCOL §7: a subscription's requests go to its coordinator.
            Middleware(CoordinatorRouting, endpoints=table),
            # The publish hot path, past every check above.
            Middleware(PublishEndpoint, endpoints=table),
        ],
        exception_handlers=dict(EXCEPTION_HANDLERS),
    )
    # The router goes straight to the route of the endpoint the table matched (the path
    # is matched once per request: server/endpoint.py).
    app.router = EndpointRouter(table, lifespan=lifespan)
    return app
