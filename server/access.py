"""The one place every request and WebSocket is checked against the auth file (PROTOCOL §6).

``AccessControlMiddleware`` checks the caller's token against the rule of the
request's endpoint (server/route_table.py declares each endpoint's rule) before
any route runs. A method and path the table does not declare needs ``admin``.
Refusals are the Unauthorized /
Forbidden errors of herald/protocol/errors.py, rendered by the same function as every
other error (STYLE principle 5): problem JSON for HTTP, and for WebSockets an
accept followed by close 4401 / 4403 (PROTOCOL §3: refusals are close codes).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import parse_qsl, unquote

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from herald.protocol.errors import Forbidden, HeraldError, SubscriptionNotFound, Unauthorized
from server import audit
from server.auth import BROWSER_PREFIX, Credentials, Principal
from server.endpoint import OPEN, Endpoints, Rule, rule_of
from server.errors import close_message, refuse
from server.limits import PublishLimiter
from server.peers import CLIENT, PEER_AUTHORIZATION
from server.runtime import app_services
from server.tasks import cancel_and_wait
from storage.writer import wall_clock_ms

log = logging.getLogger("herald.auth")

WATCH_INTERVAL_S = 1.0
_VERIFY_SLOTS = 4  # scrypt verifications (older auth files) at once (~16 MiB each)


_PREPOSITION = {"publish": "publish to", "subscribe": "subscribe on"}


def _refusal(principal: Principal, roles: tuple[str, ...], topic: str | None) -> str:
    """What a 403 says: the permission missing, and for topics the patterns the token has,
    e.g. "token 5beba147 may publish to `orders.*`, not to `orders`"."""
    who = f"token {principal.token_id}"
    held = [role for role in roles if role in principal.roles]
    if topic is None or not held:
        has = ", ".join(sorted(principal.roles)) or "none"
        return f"{who} lacks the {' or '.join(roles)} permission (it has: {has})"
    patterns = ", ".join(f"`{p}`" for p in principal.topics) or "no topic patterns"
    verbs = " or ".join(_PREPOSITION[role] for role in held)
    but = f"not {_PREPOSITION[held[0]].split()[-1]}" if len(held) == 1 else "not"
    return f"{who} may {verbs} {patterns}, {but} `{topic}`"


# docs/protocol.md: a browser cannot set headers on a WebSocket, so it offers its token as
# the subprotocol `herald.token.<token>` beside `herald.v1`, which the server selects (the
# token one is never echoed). Unlike `?token=`, no proxy or server logs a header.
SUBPROTOCOL = "herald.v1"
TOKEN_SUBPROTOCOL = "herald.token."


def bearer_token(scope: Scope) -> str | None:
    """``Authorization: Bearer`` always; on WebSockets (browsers) also the
    ``herald.token.<token>`` subprotocol, or ``?token=`` (kept for compatibility)."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    if scope["type"] == "websocket":
        for offered in scope.get("subprotocols", ()):
            if offered.startswith(TOKEN_SUBPROTOCOL) and len(offered) > len(TOKEN_SUBPROTOCOL):
                return str(offered[len(TOKEN_SUBPROTOCOL) :])
        for key, value in parse_qsl(scope.get("query_string", b"").decode("latin-1")):
            if key == "token" and value:
                return value
    return None


def selecting_subprotocol(scope: Scope, send: Send) -> Send:
    """``send`` that accepts a WebSocket with ``herald.v1`` when the client offered it (a
    browser that offered subprotocols fails a handshake that selects none)."""
    if scope["type"] != "websocket" or SUBPROTOCOL not in scope.get("subprotocols", ()):
        return send

    async def accept_with_subprotocol(message: Message) -> None:
        if message["type"] == "websocket.accept" and not message.get("subprotocol"):
            message = {**message, "subprotocol": SUBPROTOCOL}
        await send(message)

    return accept_with_subprotocol


class AccessGuard:
    """The credentials in force, their reloads (SIGHUP, file change) and the checks."""

    def __init__(self, credentials: Credentials, clock: Callable[[], int] = wall_clock_ms) -> None:
        self.credentials = credentials
        self.clock = clock  # wall-clock ms: browser tokens expire at a wall-clock time
        self.publish_limiter = PublishLimiter()
        self._verify_slots = asyncio.Semaphore(_VERIFY_SLOTS)
        self._sockets: set[OpenSocket] = set()

    async def principal(self, token: str | None) -> Principal:
        if token is None:
            raise Unauthorized("a bearer token is required")
        if token.startswith(BROWSER_PREFIX):  # signed: one HMAC, no scrypt, no thread
            browser = self.credentials.verify_browser(token, self.clock())
            if browser is None:
                raise Unauthorized("the browser token is not valid or has expired")
            return browser
        found = self.credentials.cached(token)
        if found is None and not self.credentials.slow(token):
            found = self.credentials.verify(token)  # one HMAC: no thread needed
        elif found is None:
            async with self._verify_slots:  # an older file's scrypt hash
                found = await asyncio.to_thread(self.credentials.verify, token)
        if found is None:
            raise Unauthorized("the token is not valid")
        return found

    async def peer_client(self, scope: Scope) -> str | None:
        """For a request from another node that proves it is one (an admin token, the
        cluster token, in ``herald-peer-authorization``: server/peers.py), the address of
        the client it forwards for ("" for a node's own calls); else None. ``herald-client``
        from anyone else is never believed (server/limits.py counts the connection)."""
        proof = _header(scope, PEER_AUTHORIZATION.encode())
        if proof is None:
            return None
        scheme, _, token = proof.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or token.startswith(BROWSER_PREFIX):
            return None
        try:
            principal = await self.principal(token)
        except Unauthorized:
            return None
        if not principal.is_admin:
            return None
        return _header(scope, CLIENT.encode()) or ""

    def authorize(
        self,
        principal: Principal,
        rule: Rule,
        params: dict[str, str],
        lookup: Callable[[str], tuple[str, bool]],
    ) -> None:
        """Raise Forbidden, saying which permission and topic the token lacked."""
        if rule.role == "token":
            return
        if rule.role == "topic":
            topic = params[rule.topic or "topic"]
            if not (principal.may("publish", topic) or principal.may("subscribe", topic)):
                raise Forbidden(_refusal(principal, ("publish", "subscribe"), topic))
        elif rule.subscription is not None:
            name = params[rule.subscription]
            if principal.is_admin:
                return
            if not principal.may_subscription(name):
                raise Forbidden(
                    f"token {principal.token_id} may not use subscription {name!r} (its "
                    "subscription patterns do not match it)"
                )
            try:
                topic, push = lookup(name)
            except SubscriptionNotFound:
                # Only admins learn which subscriptions exist.
                raise Forbidden(
                    f"token {principal.token_id} may not {rule.role} on subscription {name!r}"
                ) from None
            if not principal.may(rule.role, topic):
                raise Forbidden(
                    f"{_refusal(principal, (rule.role,), topic)} (the topic of subscription "
                    f"{name!r})"
                )
            if push and rule.operates:
                raise Forbidden(
                    f"subscription {name!r} is a push subscription: its records are its "
                    "endpoint's, and only admin may pull, ack, nack, seek or consume them"
                )
        elif rule.topic is not None:
            if not principal.may(rule.role, params[rule.topic]):
                raise Forbidden(_refusal(principal, (rule.role,), params[rule.topic]))
        elif not principal.may(rule.role):
            raise Forbidden(_refusal(principal, (rule.role,), None))

    # -- open WebSockets: checked again whenever the credentials change --------------

    def track(
        self, principal: Principal, rule: Rule, params: dict[str, str], scope: Scope, send: Send
    ) -> OpenSocket:
        stored = self.credentials.hash_of(principal.token_id) or ""
        socket = OpenSocket(principal.token_id, stored, rule, params, scope, send)
        socket.expires_at_ms = principal.expires_at_ms
        self._sockets.add(socket)
        return socket

    def untrack(self, socket: OpenSocket) -> None:
        self._sockets.discard(socket)

    async def recheck_sockets(self) -> int:
        """Close each open WebSocket whose token is gone (4401) or may no longer do what
        it connected for (4403); how many were closed."""
        closed = 0
        now = self.clock()
        for socket in list(self._sockets):
            # A browser token's socket stands on its minting token (revoked with it).
            current = self.credentials.standing(socket.token_id, socket.token_hash)
            try:
                if socket.expires_at_ms is not None and socket.expires_at_ms <= now:
                    raise Unauthorized("the browser token expired")
                if current is None:
                    raise Unauthorized("the token was revoked")
                self.authorize(
                    current,
                    socket.rule,
                    socket.params,
                    functools.partial(_subscription_of, socket.scope),
                )
            except HeraldError as exc:
                audit.auth_failure(socket.scope, exc)
                self._sockets.discard(socket)
                await socket.revoke(exc)
                closed += 1
        if closed:
            log.info("closed %d WebSocket(s) no longer allowed", closed)
        return closed

    async def expire_sockets(self) -> int:
        """Close (4401) each open WebSocket whose browser token has expired."""
        now = self.clock()
        if not any(s.expires_at_ms is not None and s.expires_at_ms <= now for s in self._sockets):
            return 0
        return await self.recheck_sockets()

    def next_expiry_s(self) -> float:
        """Seconds until the next browser token of an open socket expires (at most the
        watch interval): the watch loop wakes then, so sockets close at expiry."""
        now = self.clock()
        soonest = min(
            (s.expires_at_ms for s in self._sockets if s.expires_at_ms is not None),
            default=None,
        )
        if soonest is None:
            return WATCH_INTERVAL_S
        return min(WATCH_INTERVAL_S, max(0.0, (soonest - now) / 1000))

    async def _reload(self) -> None:
        if await asyncio.to_thread(self.credentials.reload):
            await self.recheck_sockets()

    async def watch(self) -> None:
        """Reload on SIGHUP and when the file's mtime changes (checked every second)."""
        loop = asyncio.get_running_loop()
        hup = asyncio.Event()
        # No SIGHUP where the loop cannot take signals (Windows: NotImplementedError; a
        # loop outside the main thread: RuntimeError): the mtime check still reloads.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, hup.set)
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.next_expiry_s()):
                        await hup.wait()
                await self.expire_sockets()
                if hup.is_set():
                    hup.clear()
                    log.info("SIGHUP: reloading %s", self.credentials.path)
                    await self._reload()
                elif await asyncio.to_thread(self.credentials.changed):
                    await self._reload()
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGHUP)


class AccessControlMiddleware:
    """Checks every request against its endpoint's rule (``guard`` None: an open server)
    and audits the endpoints that name an audit event (server/route_table.py)."""

    def __init__(self, app: ASGIApp, *, guard: AccessGuard | None, endpoints: Endpoints) -> None:
        self.app = app
        self.guard = guard
        self.endpoints = endpoints

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] == "websocket" and (
            self.guard is None or rule_of(self.endpoints.route_of(scope)[0]) is OPEN
        ):
            # Nothing to check, nothing to audit: the next layer's own call, so that no
            # frame of this one stays suspended while the socket is open (issue 27 §3).
            return self.app(scope, receive, selecting_subprotocol(scope, send))
        if scope["type"] not in ("http", "websocket"):
            return self.app(scope, receive, send)
        return self._checked(scope, receive, send)

    async def _checked(self, scope: Scope, receive: Receive, send: Send) -> None:
        send = selecting_subprotocol(scope, send)
        endpoint, path_params = self.endpoints.route_of(scope)
        rule = rule_of(endpoint)
        try:
            principal = await self.admit(scope, rule, path_params)
        except HeraldError as exc:
            # PROTOCOL §3/§6: a WebSocket is accepted, then closed 4401 / 4403.
            await refuse(scope, receive, send, exc, reason=_reason(exc))
            return
        if principal is not None and self.guard is not None and scope["type"] == "websocket":
            # Long-lived: checked again when the auth file changes.
            socket = self.guard.track(principal, rule, _decoded(path_params), scope, send)
            try:
                await self.app(scope, receive, socket.send)
            finally:
                self.guard.untrack(socket)
            return
        event = None if endpoint is None else endpoint.audit
        if scope["type"] != "http" or event is None:
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            audit.request_done(scope, event, status)

    async def admit(
        self, scope: Scope, rule: Rule, path_params: dict[str, str]
    ) -> Principal | None:
        """The caller's principal once its token allows ``rule`` (None: nothing to check,
        an open server or an open route); a refusal is audited and raised (Unauthorized,
        Forbidden). This layer's decision, and the publish route's below ASGI
        (server/direct_publish.py)."""
        if self.guard is None or rule is OPEN:
            return None
        try:
            principal = await self.guard.principal(bearer_token(scope))
            self.guard.authorize(
                principal,
                rule,
                _decoded(path_params),
                lambda name: _subscription_of(scope, name),
            )
        except HeraldError as exc:
            audit.auth_failure(scope, exc)
            raise
        state = scope.setdefault("state", {})
        state["principal"] = principal
        state["publish_limiter"] = self.guard.publish_limiter  # limits.charge_publish
        # GET /v1/cluster shows each node's, so that a mismatch is visible.
        state["credentials_digest"] = self.guard.credentials.digest
        return principal


def _decoded(path_params: dict[str, str]) -> dict[str, str]:
    # Decoded once more, as the check always has: a name a client escaped twice is
    # checked as the name it stands for (the route then refuses the escaped one).
    return {k: unquote(v) for k, v in path_params.items()}


class SocketRevoked(OSError):
    """A send on a WebSocket the guard closed: to the endpoint, a connection lost."""


class OpenSocket:
    """An authorized WebSocket, as the guard re-checks it: the token it came with (id and
    stored hash, never the token), what it connected for, and its way to be closed."""

    def __init__(
        self,
        token_id: str,
        token_hash: str,
        rule: Rule,
        params: dict[str, str],
        scope: Scope,
        send: Send,
    ) -> None:
        self.token_id, self.token_hash = token_id, token_hash
        self.rule, self.params, self.scope = rule, params, scope
        self._send = send
        self.revoked = False
        self.expires_at_ms: int | None = None  # a browser token's expiry

    async def send(self, message: Message) -> None:
        if self.revoked:
            if message["type"] == "websocket.send":
                raise SocketRevoked("the WebSocket was closed: its token no longer allows it")
            return  # its accept or close: the guard's close frame went out already
        await self._send(message)

    async def revoke(self, exc: HeraldError) -> None:
        """Close with the close code of ``exc`` (4401 / 4403); the endpoint sees a
        disconnect (its in-flight records go back at once, as for any consumer that goes
        away)."""
        if self.revoked:
            return
        self.revoked = True
        with contextlib.suppress(Exception):  # the peer may be gone already
            await self._send(close_message(exc, _reason(exc)))


def _reason(exc: HeraldError) -> str:
    """What an access refusal's close says: the problem code alone (its detail names the
    token's rights, and a close reason is no place to spell them out)."""
    return exc.code


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _subscription_of(scope: Scope, subscription: str) -> tuple[str, bool]:
    """The topic of a subscription, and whether it is a push subscription.

    In a cluster, from the metadata every node holds (etcd's view), not from this node's
    delivery engine: that runs only the subscriptions this node coordinates, and PROTOCOL
    §7 has any node serve everything a token allows (issue 26 item 8)."""
    state = app_services(scope["app"])
    if state.cluster is None:
        config = state.engine.get(subscription)
        return config.topic, config.push is not None
    raw = state.cluster.subscriptions.get(subscription)
    try:
        stored = orjson.loads(raw) if raw is not None else None
    except orjson.JSONDecodeError:
        stored = None
    if not isinstance(stored, dict) or not isinstance(stored.get("topic"), str):
        # Fails closed: a 403 to non-admins.
        raise SubscriptionNotFound(f"subscription {subscription!r} does not exist")
    return stored["topic"], stored.get("push") is not None


def access_guard(auth_file: Path | None) -> AccessGuard | None:
    """The guard of an auth file (a bad file at startup is fatal: AuthFileError), or None."""
    return None if auth_file is None else AccessGuard(Credentials(auth_file))


@contextlib.asynccontextmanager
async def watching(guard: AccessGuard | None) -> AsyncIterator[None]:
    """Runs ``guard.watch()`` for the app's lifetime (under the lifespan, STYLE principle 4)."""
    if guard is None:
        yield
        return
    task = asyncio.create_task(guard.watch(), name="herald-auth-watch")
    try:
        yield
    finally:
        await cancel_and_wait(task)
