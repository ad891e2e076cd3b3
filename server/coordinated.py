"""Subscriptions on any node of a cluster (PROTOCOL §7 "Any node serves everything").

Each subscription runs on its coordinator (cluster/coordination.py). A request about a
subscription that arrives at another node is passed to the coordinator, as it came:

- HTTP (`GET`/`PATCH`/`PUT` of an existing `/v1/subscriptions/{name}`, and every
  `/v1/subscriptions/{name}/…` route: seek, pull, ack, nack, redrive, attempts, rotate
  secret; the endpoints server/route_table.py marks ``coordinated``) is forwarded with the client's `Authorization` and `herald-forwarded: 1`, and
  the coordinator's answer returned;
- a WebSocket consumer (`/v1/subscriptions/{name}/ws`) is accepted here and *relayed*:
  this node opens the same socket to the coordinator and copies frames both ways
  (browsers cannot follow a redirect on an upgrade). When the coordinator goes away the
  consumer's socket is closed with 1012 (service restart): its records in flight are
  redelivered by the next coordinator, and the SDK reconnects.

Creating (`PUT` of a new name), deleting and listing are answered from etcd by any node
(server/routes_subscriptions.py). The access check runs before this layer, on the node
the client called (and again on the coordinator, for forwarded HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from urllib.parse import parse_qsl, urlencode

import websockets
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from cluster.errors import LeaderUnavailable
from cluster.trust import peer_ssl
from herald.protocol.close_codes import CloseCode
from herald.protocol.encodings import MSGPACK_SUBPROTOCOL
from herald.protocol.errors import HeraldError, NodeCannotServe
from server.access import bearer_token
from server.endpoint import Endpoint, Endpoints
from server.errors import close_socket, herald_error_response, refuse
from server.http import body_chunks, read_body
from server.limits import client_address
from server.peers import FORWARDED, Peers
from server.runtime import Services, app_services

log = logging.getLogger("herald.server")

_WAIT_S = 5.0


class CoordinatorRouting:
    """ASGI layer: a request about a subscription this node does not run goes to the
    node that does (the endpoints server/route_table.py marks ``coordinated``)."""

    def __init__(self, app: ASGIApp, *, endpoints: Endpoints) -> None:
        self.app = app
        self.endpoints = endpoints

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] not in ("http", "websocket"):
            return self.app(scope, receive, send)
        endpoint, params = self.endpoints.route_of(scope)
        state = app_services(scope["app"]) if endpoint and endpoint.coordinated else None
        if endpoint is None or state is None or state.cluster is None:
            # The next layer's own coroutine: no frame of this one is held for as long
            # as a WebSocket stays open (issue 27 §3: memory per idle consumer).
            return self.app(scope, receive, send)
        return self._coordinated(endpoint, params["name"], state, scope, receive, send)

    async def _coordinated(
        self,
        endpoint: Endpoint,
        name: str,
        state: Services,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        cluster = state.cluster
        assert cluster is not None  # __call__ came here only in a cluster
        if name not in cluster.subscriptions:
            await self.app(scope, receive, send)  # 404 or a creation: the routes decide
            return
        try:
            url = await _coordinator(state, name)
        except HeraldError as exc:
            # PROTOCOL §7: a consumer comes back (1012) whatever kept its coordinator unknown.
            refusal = exc if scope["type"] == "http" else NodeCannotServe(exc.detail)
            await refuse(scope, receive, send, refusal)
            return
        if url is None:
            await self.app(scope, receive, send)  # this node coordinates it
        elif scope["type"] == "http":
            limit = state.config.max_request_bytes
            if endpoint.body_limit is not None:
                limit = endpoint.body_limit
            await _forward_http(state, url, limit, scope, receive, send)
        else:
            client = WebSocket(scope, receive, send)
            try:
                await _relay(state, url, client)
            except Exception:
                log.exception("relaying a consumer of %s to %s failed", name, url)
                if client.client_state.name == "CONNECTING":
                    await close_socket(client, _UNREACHABLE)


async def _coordinator(state: Services, name: str) -> str | None:
    """None when this node runs the subscription (once it does); else its coordinator's URL."""
    cluster = state.cluster
    assert cluster is not None
    if cluster.coordinates(name) or (
        cluster.coordinator_url(name) is None
        and await cluster.wait_coordinated(name) is not None
        and cluster.coordinates(name)
    ):
        if not await cluster.wait_applied(lambda: name in state.engine.names()):
            # Claimed here, not yet started (its copies catching up): come back shortly.
            raise LeaderUnavailable(f"subscription {name!r} is starting; try again")
        return None
    url = cluster.coordinator_url(name)
    if url is None:
        raise LeaderUnavailable(f"subscription {name!r} has no live coordinator; try again")
    return url


async def _forward_http(
    state: Services, url: str, limit: int, scope: Scope, receive: Receive, send: Send
) -> None:
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    if FORWARDED in headers:
        # It was sent here as the coordinator, which this node no longer is.
        await herald_error_response(
            LeaderUnavailable("the subscription's coordinator moved; try again")
        )(scope, receive, send)
        return
    assert state.peers is not None
    try:
        # STYLE rule 3: bounded as the coordinator's route would bound it, so an oversized
        # body is the same 413 here as there, and never held whole.
        body = await read_body(body_chunks(receive), headers.get("content-length"), limit)
        answer = await state.peers.forward(
            url,
            scope["method"],
            scope["path"],
            scope["query_string"],
            body,
            headers,
            client_address(scope),
        )
    except ClientDisconnect:
        return  # the client went away mid-body: nobody to answer
    except HeraldError as exc:
        await herald_error_response(exc)(scope, receive, send)
        return
    out = [(b"content-length", str(len(answer.content)).encode())]
    for key in ("content-type", "retry-after", "etag"):
        if key in answer.headers:
            out.append((key.encode(), answer.headers[key].encode("latin-1")))
    await send({"type": "http.response.start", "status": answer.status_code, "headers": out})
    await send({"type": "http.response.body", "body": answer.content})


# 1012 (service restart): the consumer comes back shortly. Accepted first
# (server/errors.py close_socket): a close before the handshake would be an HTTP 403,
# which clients take as final.
_UNREACHABLE = NodeCannotServe("the subscription's coordinator is unreachable")


def _upstream(peers: Peers, url: str, scope: Scope) -> tuple[str, dict[str, str]]:
    """The coordinator's WebSocket URL for this consumer's path and query, and the headers
    that carry the consumer's address and token to it."""
    target = url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + scope["path"]
    # The token goes on as a header, however the client gave it (never in a URL: logs).
    query = [
        (k, v)
        for k, v in parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
        if k != "token"
    ]
    if query:
        target += "?" + urlencode(query)
    headers = peers.on_behalf_of(client_address(scope))
    token = bearer_token(scope)
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return target, headers


async def _relay(state: Services, url: str, client: WebSocket) -> None:
    """Copy a consumer's frames to the coordinator's socket and back."""
    scope = client.scope
    assert state.peers is not None
    if not await state.peers.trusted(url):  # its token goes only to a proven node
        await close_socket(client, _UNREACHABLE)
        return
    target, headers = _upstream(state.peers, url, scope)
    # docs/protocol.md "MessagePack": the client's offer goes on, and the client gets what
    # the coordinator selected (its frames are relayed as they come, binary or text).
    offered = (
        [Subprotocol(MSGPACK_SUBPROTOCOL)]
        if MSGPACK_SUBPROTOCOL in scope.get("subprotocols", ())
        else None
    )
    try:
        upstream = await connect(
            target,
            additional_headers=headers,
            max_size=None,
            open_timeout=5,
            ssl=peer_ssl(target, state.peers.verify),
            subprotocols=offered,
        )
    except (OSError, TimeoutError, websockets.WebSocketException) as exc:
        await close_socket(client, _UNREACHABLE)
        log.info("relaying a consumer to %s: %s", url, exc)  # once the client is told
        return
    await client.accept(subprotocol=upstream.subprotocol)
    code, reason = int(CloseCode.SERVICE_RESTART), "the subscription's coordinator went away"

    async def down() -> None:
        nonlocal code, reason
        try:
            async for frame in upstream:
                if isinstance(frame, bytes):
                    await client.send_bytes(frame)
                else:
                    await client.send_text(frame)
        except websockets.ConnectionClosed:
            pass
        received = upstream.close_code
        if received is not None and received not in (CloseCode.ABNORMAL, CloseCode.INTERNAL):
            code, reason = received, upstream.close_reason or ""

    async def up() -> None:
        try:
            while True:
                message = await client.receive()
                if message["type"] == "websocket.disconnect":
                    return
                data = message.get("text")
                await upstream.send(data if data is not None else message.get("bytes") or b"")
        except (WebSocketDisconnect, websockets.ConnectionClosed):
            return

    tasks = [asyncio.create_task(down()), asyncio.create_task(up())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await client.close(code, reason[:120])
