"""The publish route served below ASGI (issue 27 §2).

A one-record publish paid about as much server CPU to uvicorn's request cycle and the
ASGI layers as to Herald's own work on it (README, "Where each µs of a one-record
publish goes"). So ``POST /v1/topics/{topic}/messages`` whose whole request has come in
one read is served by the HTTP protocol itself (server/http_protocol.py): no ASGI scope
is handed down a chain of layers, no ``receive`` or ``send`` is awaited, and the answer
is written as one piece.

It takes the same decisions as the layers a publish goes through on the ASGI way, by
calling the same functions on the same instances — the app's own layers, found in its
middleware stack at startup, never copies of them:

- the request id and the access line (server/logging.py, ``RequestContextMiddleware``);
- the per-client cap (server/limits.py, ``ClientLimitsMiddleware.admit``); the body's
  deadlines do not arise, as the body is all here before anything runs;
- the access check and the audit of a refusal (server/access.py,
  ``AccessControlMiddleware.admit``);
- the publish and its problem answers (server/publish.py, ``publish_answer``);
- the 500 guard (server/errors.py, ``unhandled_error_response``).

A request goes the ASGI way when any of this does not hold: the app's stack holds a
layer this module does not know (then every request does); CORS is configured and the
request names an ``Origin``; the request is not one the protocol serves directly
(server/http_protocol.py: a body still on its way, pipelining, HTTP/1.0…). Behind a
trusted proxy uvicorn wraps the app in its proxy-headers layer, and every request goes
the ASGI way. The answers are the same either way: tests/server/test_direct_publish.py
sends the same requests both ways and compares them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Scope

from herald.protocol.errors import HeraldError
from server.access import AccessControlMiddleware
from server.coordinated import CoordinatorRouting
from server.endpoint import Endpoint, Endpoints
from server.errors import InternalErrorMiddleware, herald_error_response, unhandled_error_response
from server.http_protocol import DirectHandler, DirectRequest
from server.limits import ClientLimitsMiddleware
from server.logging import (
    RequestContextMiddleware,
    log_access,
    request_id_header,
    request_id_of,
    request_id_var,
)
from server.publish import Answer, PublishEndpoint, answer_of, publish_answer, publish_route

# The layers whose every decision on a publish is taken here as well; a layer not named
# here in the app's stack sends every request the ASGI way.
_KNOWN = (
    RequestContextMiddleware,
    ClientLimitsMiddleware,
    CORSMiddleware,
    AccessControlMiddleware,
    InternalErrorMiddleware,
    CoordinatorRouting,  # publish is no subscription's request: it passes
)


class DirectPublish:
    """The app's ``direct_route`` (server/http_protocol.py): it serves publishes whose
    requests need nothing only ASGI gives."""

    def __init__(
        self,
        app: ASGIApp,
        endpoints: Endpoints,
        endpoint: Endpoint,
        context: RequestContextMiddleware,
        limits: ClientLimitsMiddleware,
        access: AccessControlMiddleware,
        cors: bool,
    ) -> None:
        self.app = app
        self.endpoints = endpoints
        self.endpoint = endpoint
        self.context = context
        self.limits = limits
        self.access = access
        self.cors = cors

    @classmethod
    def of(cls, app: ASGIApp, layers: ASGIApp, endpoints: Endpoints) -> DirectPublish | None:
        """The direct route of ``app`` whose middleware stack (below Starlette's error
        layer) is ``layers``; None when a layer in it is not one this module knows."""
        found: dict[type, Any] = {}
        layer = layers
        while not isinstance(layer, PublishEndpoint):
            if not isinstance(layer, _KNOWN):
                return None
            found[type(layer)] = layer
            layer = layer.app
        publish = [e for e in endpoints.all if e.handler is publish_route]
        if len(publish) != 1 or publish[0].audit is not None or publish[0].coordinated:
            return None
        try:
            return cls(
                app,
                endpoints,
                publish[0],
                found[RequestContextMiddleware],
                found[ClientLimitsMiddleware],
                found[AccessControlMiddleware],
                CORSMiddleware in found,
            )
        except KeyError:
            return None

    def __call__(self, scope: dict[str, Any]) -> DirectHandler | None:
        """The handler of a request whose headers are in, if it is a publish served here."""
        endpoint, _ = self.endpoints.route_of(scope)
        if endpoint is not self.endpoint:
            return None
        if self.cors and any(name == b"origin" for name, _ in scope["headers"]):
            return None  # the CORS layer's answer headers: the ASGI way
        return self.serve

    async def serve(self, request: DirectRequest) -> None:
        scope: Scope = request.scope
        scope["app"] = self.app  # as Starlette's __call__ sets it, for the routes
        request_id = request_id_of(scope)
        request_id_var.set(request_id)  # this request's task's own context
        started = time.perf_counter()
        status, headers, body = await self._answer(scope, bytes(request.body))
        await request.respond(status, [*headers, request_id_header(request_id)], body)
        if self.context.access_log_enabled:
            log_access(scope, started, status)

    async def _answer(self, scope: Scope, body: bytes) -> Answer:
        """What the layers between the request id's and the publish's would answer."""
        try:
            admitted = await self.limits.admit(scope)
        except HeraldError as exc:
            return answer_of(herald_error_response(exc))
        try:
            _, params = self.endpoints.route_of(scope)
            await self.access.admit(scope, self.endpoint.rule, params)
            return await publish_answer(scope, params["topic"], _one(body))
        except HeraldError as exc:  # the access check's refusal
            return answer_of(herald_error_response(exc))
        except Exception as exc:
            return answer_of(unhandled_error_response(scope, exc))
        finally:
            self.limits.release(admitted)


async def _one(body: bytes) -> AsyncIterator[bytes]:
    yield body
