"""The WebSocket endpoints of PROTOCOL §3, as Starlette websocket endpoints.

    WebSocketRoute("/v1/subscriptions/{name}/ws", subscription_socket)
    WebSocketRoute("/v1/topics/{topic}/ws", topic_tail_socket)

They read `app.state.engine` (DeliveryEngine) and `app.state.storage` (Storage),
and optionally `app.state.tails` (TailRegistry; created on first use) and
`app.state.consumer_settings` (ConnectionSettings). PROTOCOL §3: the server
accepts the upgrade, then speaks; every refusal is a close code.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from delivery.close_codes import CloseCode
from storage.errors import SubscriptionNotFound
from subscribers.connection import ConnectionSettings, ConsumerConnection
from subscribers.frames import parse_credit_param, parse_from_param
from subscribers.session import ConsumerSession
from subscribers.tail import TailRegistry, TailSession

if TYPE_CHECKING:
    from delivery.engine import DeliveryEngine
    from storage.engine import Storage

log = logging.getLogger(__name__)

_CLIENT_GONE = (WebSocketDisconnect, WebSocketDisconnected, OSError)


async def subscription_socket(websocket: WebSocket) -> None:
    """`GET /v1/subscriptions/{name}/ws[?credit=N]`: a durable consumer."""
    engine: DeliveryEngine = websocket.app.state.engine
    name = websocket.path_params["name"]
    await websocket.accept()
    try:
        credit = parse_credit_param(websocket.query_params.get("credit"))
    except ValueError as exc:
        await _refuse(websocket, CloseCode.BAD_QUERY, str(exc))
        return
    try:
        config = engine.get(name)
    except SubscriptionNotFound:
        await _refuse(websocket, CloseCode.NOT_FOUND, f"subscription {name!r} does not exist")
        return
    if config.push is not None:
        await _refuse(
            websocket, CloseCode.PUSH_SUBSCRIPTION, f"subscription {name!r} is a push subscription"
        )
        return
    session = ConsumerSession(engine, name, ConsumerConnection(websocket, _settings(websocket)))
    try:
        await session.run(credit)
    except SubscriptionNotFound:  # deleted between the lookup and attach
        await _refuse(websocket, CloseCode.NOT_FOUND, f"subscription {name!r} does not exist")
    except Exception as exc:
        await _failed(websocket, exc)


async def topic_tail_socket(websocket: WebSocket) -> None:
    """`GET /v1/topics/{topic}/ws?from=…[&credit=N]`: an ephemeral tail."""
    storage: Storage = websocket.app.state.storage
    name = websocket.path_params["topic"]
    await websocket.accept()
    try:
        credit = parse_credit_param(websocket.query_params.get("credit"))
        start = parse_from_param(websocket.query_params.get("from"))
    except ValueError as exc:
        await _refuse(websocket, CloseCode.BAD_QUERY, str(exc))
        return
    topic = storage.topic(name)
    if topic is None:  # PROTOCOL §3: tails never auto-create
        await _refuse(websocket, CloseCode.NOT_FOUND, f"topic {name!r} does not exist")
        return
    connection = ConsumerConnection(websocket, _settings(websocket))
    tail = TailSession(storage, topic, connection, tail_registry(websocket.app.state))
    try:
        await tail.run(start, credit)
    except Exception as exc:
        await _failed(websocket, exc)


def tail_registry(state: Any) -> TailRegistry:
    """The app's TailRegistry (`app.state.tails`), created on first use."""
    registry = getattr(state, "tails", None)
    if registry is None:
        registry = state.tails = TailRegistry()
    return registry


def _settings(websocket: WebSocket) -> ConnectionSettings:
    settings = getattr(websocket.app.state, "consumer_settings", None)
    return settings if isinstance(settings, ConnectionSettings) else ConnectionSettings()


async def _refuse(websocket: WebSocket, code: int, reason: str) -> None:
    # A close reason is at most 123 bytes (RFC 6455 §5.5).
    with contextlib.suppress(*_CLIENT_GONE):
        await websocket.close(code, reason.encode()[:123].decode(errors="ignore"))


async def _failed(websocket: WebSocket, exc: Exception) -> None:
    """STYLE 5: a lost client ends quietly; anything else is logged and closed 1011."""
    if _client_gone(exc):
        return
    log.error("consumer connection failed", exc_info=exc)
    await _refuse(websocket, CloseCode.INTERNAL, "internal error")


def _client_gone(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_client_gone(inner) for inner in exc.exceptions)
    return isinstance(exc, _CLIENT_GONE)
