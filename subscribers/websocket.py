"""The WebSocket endpoints of PROTOCOL §3, as Starlette websocket endpoints.

    WebSocketRoute("/v1/subscriptions/{name}/ws", subscription_socket)
    WebSocketRoute("/v1/topics/{topic}/ws", topic_tail_socket)

What they use comes from the server as one typed :class:`SocketServices`
(``app.state.runtime.services.sockets``). PROTOCOL §3: the server accepts the upgrade,
then speaks; every refusal is a close code.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from herald.protocol.errors import (
    BadRequest,
    HeraldError,
    NodeCannotServe,
    PushSubscription,
    SubscriptionNotFound,
    TopicNotFound,
)
from storage.errors import resource_exhausted
from subscribers.codec import Codec, negotiated
from subscribers.connection import ConnectionSettings, ConsumerConnection
from subscribers.frames import parse_credit_param, parse_from_param, parse_positions_param
from subscribers.session import ConsumerSession
from subscribers.tail import TailRegistry, TailSession

if TYPE_CHECKING:
    from delivery.engine import DeliveryEngine
    from storage.engine import Storage

log = logging.getLogger(__name__)

_CLIENT_GONE = (WebSocketDisconnect, WebSocketDisconnected, OSError)
T = TypeVar("T")


@dataclass(frozen=True, slots=True, eq=False)
class SocketServices:
    """What the WebSocket endpoints need from the running server."""

    engine: DeliveryEngine
    storage: Storage
    tails: TailRegistry  # every open tail, closed on SIGTERM
    settings: ConnectionSettings = field(default_factory=ConnectionSettings)
    # In a cluster: whether this node may serve a tail of a topic from its own copy
    # (PROTOCOL §7: not while cut off from etcd alone, nor from a copy of a topic deleted
    # and created again since). None: always.
    may_tail: Callable[[str], Awaitable[bool]] | None = None


def socket_services(websocket: WebSocket) -> SocketServices:
    sockets: SocketServices = websocket.app.state.runtime.services.sockets
    return sockets


async def subscription_socket(websocket: WebSocket) -> None:
    """`GET /v1/subscriptions/{name}/ws[?credit=N]`: a durable consumer."""
    await _serve(websocket, _consume_subscription)


async def topic_tail_socket(websocket: WebSocket) -> None:
    """`GET /v1/topics/{topic}/ws?from=…[&credit=N][&positions=true]`: an ephemeral tail."""
    await _serve(websocket, _tail_topic)


async def _consume_subscription(websocket: WebSocket, codec: Codec) -> None:
    sockets = socket_services(websocket)
    engine = sockets.engine
    name = websocket.path_params["name"]
    credit = _query(websocket, "credit", parse_credit_param)
    try:
        config = engine.get(name)
    except SubscriptionNotFound:
        raise _gone(name) from None
    if config.push is not None:
        raise PushSubscription(f"subscription {name!r} is a push subscription")
    session = ConsumerSession(engine, name, ConsumerConnection(websocket, sockets.settings, codec))
    if websocket.client is not None:
        session.address = f"{websocket.client.host}:{websocket.client.port}"
    try:
        await session.run(credit)
    except SubscriptionNotFound:  # deleted between the lookup and attach
        raise _gone(name) from None


def _gone(name: str) -> SubscriptionNotFound:
    # Made when needed: a local of the consumer's frame would be held while it is open.
    return SubscriptionNotFound(f"subscription {name!r} does not exist")


async def _tail_topic(websocket: WebSocket, codec: Codec) -> None:
    sockets = socket_services(websocket)
    storage = sockets.storage
    name = websocket.path_params["topic"]
    credit = _query(websocket, "credit", parse_credit_param)
    start = _query(websocket, "from", parse_from_param)
    positions = _query(websocket, "positions", parse_positions_param)
    topic = storage.topic(name)
    if topic is None:  # PROTOCOL §3: tails never auto-create
        raise TopicNotFound(f"topic {name!r} does not exist")
    if sockets.may_tail is not None and not await sockets.may_tail(name):
        raise NodeCannotServe(
            f"this node cannot serve topic {name!r} now; reconnect (to another node)"
        )
    topic = storage.topic(name)  # a copy of a re-created topic was replaced meanwhile
    if topic is None:
        raise TopicNotFound(f"topic {name!r} does not exist")
    connection = ConsumerConnection(websocket, sockets.settings, codec)
    tail = TailSession(storage, topic, connection, sockets.tails)
    await tail.run(start, credit, positions)


def _query(websocket: WebSocket, name: str, parse: Callable[[str | None], T]) -> T:
    try:
        return parse(websocket.query_params.get(name))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None  # PROTOCOL §3: 4400


async def _serve(
    websocket: WebSocket, consume: Callable[[WebSocket, Codec], Awaitable[None]]
) -> None:
    """Accept, then run ``consume``; the one place a consumer socket's refusals (the
    HeraldErrors it raises, each with its close code) and failures become closes (STYLE
    5; ``HeraldError.close_frame``: the code and reason).

    A client that offered `herald.msgpack` gets it selected, and every frame in msgpack
    (docs/protocol.md "MessagePack"); else none is selected here (server/access.py then
    selects `herald.v1` when offered) and the connection speaks JSON."""
    codec = negotiated(websocket.scope.get("subprotocols", ()))
    await websocket.accept(subprotocol=codec.subprotocol)
    try:
        await consume(websocket, codec)
    except HeraldError as refused:
        if refused.status >= 500:
            log.warning("consumer connection closed: %s", refused.detail)
        await _close(websocket, refused)
    except Exception as exc:
        await _failed(websocket, exc)


async def _close(websocket: WebSocket, exc: HeraldError, reason: str | None = None) -> None:
    code, text = exc.close_frame(reason)
    with contextlib.suppress(*_CLIENT_GONE):
        await websocket.close(code, text)


async def _failed(websocket: WebSocket, exc: Exception) -> None:
    """STYLE 5: a lost client ends quietly; anything else is logged and closed 1011."""
    if _client_gone(exc):
        return
    if (exhausted := resource_exhausted(exc)) is not None:  # PROTOCOL §6: never 1011
        log.warning("consumer connection refused: %s", exhausted.detail)
        await _close(websocket, exhausted, "out of resources; try again")  # 1013
        return
    log.error("consumer connection failed", exc_info=exc)
    await _close(websocket, HeraldError("internal error"))  # 1011


def _client_gone(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_client_gone(inner) for inner in exc.exceptions)
    return isinstance(exc, _CLIENT_GONE)
