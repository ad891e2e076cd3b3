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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.routing import BaseRoute, Mount, WebSocketRoute
from starlette.types import Scope

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


@dataclass(frozen=True, slots=True)
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
        # The most telling segment first: the last literal ("messages", "ack", ...).
        object.__setattr__(self, "literals", tuple(reversed(literals)))
        object.__setattr__(self, "size", len(parts))

    @property
    def kind(self) -> str:
        return "websocket" if self.method == WEBSOCKET else "http"

    def allows(self, method: str) -> bool:
        return method == self.method or (method == "HEAD" and self.method == "GET")

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.slots)


@dataclass(frozen=True, slots=True)
class Matched:
    """A request's endpoint (None: none declared for its method and path) and the
    values of its path parameters, as the router matches them (``[^/]+``)."""

    endpoint: Endpoint | None
    params: dict[str, str]

    @property
    def rule(self) -> Rule:
        return ADMIN if self.endpoint is None else self.endpoint.rule


UNMATCHED = Matched(None, {})


class Endpoints:
    """The table, compiled: endpoints by scope type, method and number of segments."""

    def __init__(self, endpoints: Iterable[Endpoint]) -> None:
        self.all = tuple(endpoints)
        self._exact: dict[tuple[str, str, int], list[Endpoint]] = {}
        self._mounts: list[Endpoint] = []
        for endpoint in self.all:
            if endpoint.prefix:
                self._mounts.append(endpoint)
                continue
            if endpoint.doc is None:  # /openapi.json describes every endpoint
                raise ValueError(f"{endpoint.method} {endpoint.path} has no OpenAPI operation")
            methods = ("GET", "HEAD") if endpoint.method == "GET" else (endpoint.method,)
            for method in methods:
                key = (endpoint.kind, method, endpoint.size)
                self._exact.setdefault(key, []).append(endpoint)

    def match(self, kind: str, method: str, path: str) -> Matched:
        parts = path.split("/")
        if kind == "websocket":
            method = WEBSOCKET
        for endpoint in self._exact.get((kind, method, len(parts)), ()):
            if all(parts[i] == text for i, text in endpoint.literals) and all(
                parts[i] for i, _ in endpoint.slots
            ):
                return Matched(endpoint, {name: parts[i] for i, name in endpoint.slots})
        for mount in self._mounts:
            under = path == mount.path or path.startswith(mount.path + "/")
            if under and mount.kind == kind and mount.allows(method):
                return Matched(mount, {})
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
