"""What an endpoint is, and the one match of a request against the table of them.

Each endpoint of the API is declared once, in server/route_table.py, as an
:class:`Endpoint`: its method and path, its handler, who may call it (a :class:`Rule`,
PROTOCOL §6), the audit event it records, whether it runs on the subscription's
coordinator (PROTOCOL §7), the body limit it reads under and its OpenAPI operation.
Everything else is derived from that table: the Starlette routes, the access check,
the audit log, forwarding to a coordinator, the OpenAPI ``paths`` and ``x-websockets``
and the publish fast path.

:class:`Endpoints` compiles the table into a matcher that splits a path once and
compares literal segments (no regular expressions). A request is matched once: the
first layer that asks (``Endpoints.route_of``) stores the :class:`Matched` in the ASGI
scope, and every later layer reads it from there.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.routing import BaseRoute, Mount, Router, WebSocketRoute
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from server.http import ADMIN_BODY_LIMIT
from server.routing import Handler, method_route

WEBSOCKET = "WS"  # the method of a WebSocket endpoint
_SCOPE_KEY = "herald.endpoint"


@dataclass(frozen=True, slots=True)
class Rule:
    """What a caller needs: ``role`` on the topic named by ``topic`` (a path parameter),
    or on the topic of the subscription named by ``subscription``. ``open`` needs nothing."""

    role: str  # "open" | "token" | "admin" | "metrics" | "publish" | "subscribe" | "topic"
    topic: str | None = None
    subscription: str | None = None
    # Taking a subscription's records or moving its cursor (pull, ack, nack, seek, its
    # WebSocket): of a push subscription, admin only (PROTOCOL §6: its endpoint owns them).
    operates: bool = False


OPEN = Rule("open")
ADMIN = Rule("admin")
METRICS = Rule("metrics")  # the metrics role, or admin
ANY_TOKEN = Rule("token")  # any valid token (the route checks the rest)


def on_topic(role: str) -> Rule:
    """``role`` on the topic of the path parameter ``{topic}``."""
    return Rule(role, topic="topic")


def on_subscription(role: str, *, operates: bool = False) -> Rule:
    """``role`` on the topic of the subscription of the path parameter ``{name}`` (and
    the token's subscription patterns must match its name, PROTOCOL §6)."""
    return Rule(role, subscription="name", operates=operates)


@dataclass(frozen=True, slots=True, eq=False)  # each row is itself: hashed by identity
class Endpoint:
    """One method on one path. ``handler`` is a request handler, a WebSocket endpoint
    (method ``WS``) or, with ``prefix``, an ASGI app mounted under ``path``."""

    method: str
    path: str
    handler: Any  # Handler | a WebSocket endpoint | an ASGI app (prefix)
    rule: Rule = ADMIN  # PROTOCOL §6: anything not declared open needs admin
    audit: str | None = None  # the audit event of an answered request
    coordinated: bool = False  # PROTOCOL §7: served by the subscription's coordinator
    # PROTOCOL §2 payload_too_large: the most its body may hold; None: max_request_bytes
    body_limit: int | None = ADMIN_BODY_LIMIT
    doc: dict[str, Any] | None = None  # its OpenAPI operation (x-websockets for a WS)
    prefix: bool = False  # a mount: ``path`` and everything under it
    # Matched before the rest, by its path's text around its one parameter: the hot path
    # (publish), for which even a dict look-up per request shows.
    hot: bool = False
    # Compiled from ``path``: (index, text) of its literal segments, (index, name) of its
    # parameters, and how many segments it has.
    literals: tuple[tuple[int, str], ...] = field(init=False, repr=False, compare=False)
    slots: tuple[tuple[int, str], ...] = field(init=False, repr=False, compare=False)
    size: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = self.path.split("/")
        slots = tuple((i, p[1:-1]) for i, p in enumerate(parts) if p.startswith("{"))
        literals = tuple((i, p) for i, p in enumerate(parts) if not p.startswith("{"))
        object.__setattr__(self, "slots", slots)
        object.__setattr__(self, "literals", literals)
        object.__setattr__(self, "size", len(parts))

    @property
    def kind(self) -> str:
        return "websocket" if self.method == WEBSOCKET else "http"

    def allows(self, method: str) -> bool:
        return method == self.method or (method == "HEAD" and self.method == "GET")

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.slots)


# A request's endpoint (None: none declared for its method and path) and the values of
# its path parameters, as the router matches them (``[^/]+``). A plain tuple: made for
# every request, it costs a fraction of a class's instance.
Matched = tuple[Endpoint | None, dict[str, str]]
AppCall = Coroutine[Any, Any, None]  # an ASGI call or endpoint call, not yet awaited


def rule_of(endpoint: Endpoint | None) -> Rule:
    """PROTOCOL §6: a method and path the table does not declare needs admin."""
    return ADMIN if endpoint is None else endpoint.rule


UNMATCHED: Matched = (None, {})


@dataclass(frozen=True, slots=True)
class _Shape:
    """The endpoints of one method whose paths have the same segments at the same
    places: found by the tuple of a path's segments at those places, one dict look-up."""

    places: tuple[int, ...]
    literals: Callable[[list[str]], tuple[str, ...]]  # a path's segments at those places
    slots: tuple[tuple[int, str], ...]
    endpoints: dict[tuple[str, ...], Endpoint]


def _hot(endpoint: Endpoint) -> tuple[str, str, str, str, Endpoint]:
    """(method, text before the parameter, text after it, its name, the endpoint)."""
    if len(endpoint.slots) != 1 or endpoint.prefix:
        raise ValueError(f"{endpoint.path}: a hot endpoint has exactly one parameter")
    index, name = endpoint.slots[0]
    parts = endpoint.path.split("/")
    before = "/".join(parts[:index]) + "/"
    after = "".join("/" + p for p in parts[index + 1 :])
    return endpoint.method, before, after, name, endpoint


class Endpoints:
    """The table, compiled: shapes by scope type, method and number of segments.

    A path is split once; for each shape of its length (one or two in this API) its
    literal segments are looked up in a dict. Where two endpoints could match one path,
    the table's first wins, as in Starlette's router."""

    def __init__(self, endpoints: Iterable[Endpoint]) -> None:
        self.all = tuple(endpoints)
        self._shapes: dict[tuple[str, str, int], list[_Shape]] = {}
        self._mounts: list[Endpoint] = []
        self._hot: list[tuple[str, str, str, str, Endpoint]] = []
        for endpoint in self.all:
            if endpoint.prefix:
                self._mounts.append(endpoint)
                continue
            if endpoint.doc is None:  # /openapi.json describes every endpoint
                raise ValueError(f"{endpoint.method} {endpoint.path} has no OpenAPI operation")
            if endpoint.hot:
                self._hot.append(_hot(endpoint))
            methods = ("GET", "HEAD") if endpoint.method == "GET" else (endpoint.method,)
            for method in methods:
                self._add(
                    self._shapes.setdefault((endpoint.kind, method, endpoint.size), []), endpoint
                )

    @staticmethod
    def _add(shapes: list[_Shape], endpoint: Endpoint) -> None:
        places = tuple(i for i, _ in endpoint.literals)
        texts = tuple(text for _, text in endpoint.literals)
        for shape in shapes:
            if shape.slots == endpoint.slots and shape.places == places:
                shape.endpoints.setdefault(texts, endpoint)
                return
        # Index 0 (the "" before the first "/") is always a literal: itemgetter of two or
        # more places, so always a tuple.
        getter = operator.itemgetter(*places)
        shapes.append(_Shape(places, getter, endpoint.slots, {texts: endpoint}))

    def match(self, kind: str, method: str, path: str) -> Matched:
        for hot_method, before, after, name, hot in self._hot:
            if method == hot_method and path.startswith(before) and path.endswith(after):
                value = path[len(before) : len(path) - len(after)]
                if value and "/" not in value and kind == hot.kind:
                    return hot, {name: value}
        parts = path.split("/")
        if kind == "websocket":
            method = WEBSOCKET
        for shape in self._shapes.get((kind, method, len(parts)), ()):
            endpoint = shape.endpoints.get(shape.literals(parts))
            if endpoint is None:
                continue
            params = {}
            for i, name in shape.slots:
                if not parts[i]:  # a parameter is never empty
                    break
                params[name] = parts[i]
            else:
                return endpoint, params
        for mount in self._mounts:
            under = path == mount.path or path.startswith(mount.path + "/")
            if under and mount.kind == kind and mount.allows(method):
                return mount, {}
        return UNMATCHED

    def route_of(self, scope: Scope) -> Matched:
        """The request's endpoint, matched on first use and kept in its scope."""
        found: Matched | None = scope.get(_SCOPE_KEY)
        if found is None:
            found = self.match(scope["type"], scope.get("method", "GET"), scope["path"])
            scope[_SCOPE_KEY] = found
        return found

    def openapi_paths(self, path_parameters: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
        """OpenAPI ``paths``: each path with its parameters and an operation per method."""
        paths: dict[str, dict[str, Any]] = {}
        for endpoint in self.all:
            if endpoint.prefix or endpoint.method == WEBSOCKET or endpoint.doc is None:
                continue
            item = paths.get(endpoint.path)
            if item is None:
                item = paths[endpoint.path] = {}
                if endpoint.params:
                    item["parameters"] = [path_parameters[name] for name in endpoint.params]
            item[endpoint.method.lower()] = endpoint.doc
        return paths

    def websocket_docs(self) -> dict[str, Any]:
        """The ``x-websockets`` extension: each WebSocket endpoint's description."""
        return {e.path: e.doc for e in self.all if e.method == WEBSOCKET and e.doc is not None}

    def routes(self) -> list[BaseRoute]:
        """Starlette's routes: one per path with a handler per method (server/routing.py,
        so a 405 names every method), a WebSocketRoute per socket, a Mount per prefix."""
        handlers: dict[str, dict[str, Handler]] = {}
        order: list[Endpoint | str] = []
        for endpoint in self.all:
            if endpoint.prefix or endpoint.method == WEBSOCKET:
                order.append(endpoint)
                continue
            if endpoint.path not in handlers:
                handlers[endpoint.path] = {}
                order.append(endpoint.path)
            handlers[endpoint.path][endpoint.method] = endpoint.handler
        routes: list[BaseRoute] = []
        for item in order:
            if isinstance(item, str):
                routes.append(method_route(item, **handlers[item]))
            elif item.prefix:
                routes.append(Mount(item.path, app=item.handler))
            else:
                routes.append(WebSocketRoute(item.path, item.handler))
        return routes


class EndpointRouter(Router):
    """Starlette's router, sent straight to the route of the endpoint the table matched
    (``Endpoints.route_of``), so that a request's path is matched once. What the table
    does not match (a 404, a 405, a slash to redirect, a mount) goes the router's way."""

    def __init__(self, endpoints: Endpoints, **options: Any) -> None:
        super().__init__(routes=endpoints.routes(), **options)
        self.endpoints = endpoints
        self._route_of: dict[Endpoint, BaseRoute] = {}
        for route in self.routes:
            for endpoint in endpoints.all:
                same = not endpoint.prefix and getattr(route, "path", None) == endpoint.path
                if same and isinstance(route, WebSocketRoute) == (endpoint.method == WEBSOCKET):
                    self._route_of[endpoint] = route
        # The WebSocket endpoints (functions of a WebSocket, as the table declares them,
        # routes without middleware of their own) are called as themselves: the route's
        # wrappers would stay suspended for the connection's life (issue 27 §3), and the
        # exception handlers they apply are the app's ExceptionMiddleware's, still above.
        self._socket_endpoint: dict[Endpoint, Callable[[WebSocket], AppCall]] = {
            endpoint: route.endpoint
            for endpoint, route in self._route_of.items()
            if isinstance(route, WebSocketRoute) and inspect.isfunction(route.endpoint)
        }

    def app(self, scope: Scope, receive: Receive, send: Send) -> AppCall:
        # Returns the next layer's coroutine rather than awaiting it: no frame of the
        # router is held for as long as a WebSocket stays open (issue 27 §3).
        if scope["type"] in ("http", "websocket") and not scope.get("root_path"):
            endpoint, params = self.endpoints.route_of(scope)
            route = None if endpoint is None else self._route_of.get(endpoint)
            if route is not None:
                # What Starlette's Router.app sets when a route matches in full.
                scope.setdefault("router", self)
                scope["route"] = route
                scope["endpoint"] = route.endpoint  # type: ignore[attr-defined]
                outer = scope.get("path_params")
                scope["path_params"] = {**outer, **params} if outer else params
                socket_endpoint = self._socket_endpoint.get(endpoint)  # type: ignore[arg-type]
                if socket_endpoint is not None and scope["type"] == "websocket":
                    return socket_endpoint(WebSocket(scope, receive=receive, send=send))
                return route.handle(scope, receive, send)
        return super().app(scope, receive, send)
