"""How Herald proves itself to etcd: TLS (a CA to verify etcd with, a client certificate
for etcd's ``--client-cert-auth``) and etcd's own users (``auth enable``).

Named after Patroni's etcd options (``cacert``, ``cert``, ``key``, ``username``,
``password``): ``herald serve --etcd-ca-file --etcd-cert-file --etcd-key-file
--etcd-user`` and the password in ``HERALD_ETCD_PASSWORD`` (a flag would show it in
``ps``; it is never logged).

etcd's v3 gateway authenticates with ``POST /v3/auth/authenticate`` → a token, sent
as the ``Authorization`` header of every later call (no ``Bearer``: the gateway hands
it to gRPC as metadata). etcd forgets a simple token after ``--auth-token-ttl`` (300 s)
unused, and every member knows a token issued by any (it goes through raft), so one
token serves all endpoints; a call refused with "invalid auth token" takes a new one
and is sent again (it was not applied).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

# etcd checks a password with bcrypt (cost 10): 0.6-0.9 s per authenticate on this 2-core
# VM at load 36, and over 3 s at load 50 (against ~5 ms for a read). Taking a token gets
# one long attempt rather than several short ones: each abandoned attempt still costs etcd
# its bcrypt, which slows the next.
AUTHENTICATE_S = 10.0

# Refusals that mean "authenticate (again)", not "you may not".
TOKEN_REFUSALS = ("invalid auth token", "user name is empty", "auth token is expired")


class AuthRefused(Exception):
    """etcd refused the user name and password, or the client certificate (the client
    raises it as an ``EtcdAuthFailed``)."""


@dataclass(frozen=True, slots=True)
class EtcdAccess:
    user: str = ""
    password: str = field(default="", repr=False)  # never in a repr, a log or an error
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def verify(self) -> ssl.SSLContext | bool:
        """What httpx verifies etcd's certificate with (and presents as the client's)."""
        if self.ca_file is None and self.cert_file is None:
            return True  # https:// etcd URLs are verified against the system's CAs
        context = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file is not None else None
        )
        if self.cert_file is not None:
            context.load_cert_chain(
                str(self.cert_file), str(self.key_file) if self.key_file is not None else None
            )
        return context


def token_refused(message: str) -> bool:
    return any(text in message for text in TOKEN_REFUSALS)


class EtcdAuthenticator:
    """The token of ``access.user`` (none without a user), taken once and renewed when
    etcd says it is no longer valid."""

    def __init__(self, access: EtcdAccess) -> None:
        self._access = access
        self._token: str | None = None
        self._lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self._access.user)

    async def headers(
        self, http: httpx.AsyncClient, endpoint: str, attempt_s: float
    ) -> dict[str, str]:
        if not self._access.user:
            return {}
        token = self._token
        if token is None:
            async with self._lock:
                if self._token is None:
                    self._token = await self._authenticate(http, endpoint, attempt_s)
                token = self._token
        return {"Authorization": token}

    def forget(self, token_sent: str | None) -> None:
        """The token was refused: the next call takes a new one (unless one already did)."""
        if token_sent is None or self._token == token_sent:
            self._token = None

    async def _authenticate(self, http: httpx.AsyncClient, endpoint: str, attempt_s: float) -> str:
        body = orjson.dumps({"name": self._access.user, "password": self._access.password})
        response = await http.post(
            endpoint + "/v3/auth/authenticate",
            content=body,
            timeout=max(attempt_s, AUTHENTICATE_S),
        )
        try:
            answer = orjson.loads(response.content) if response.content else {}
        except orjson.JSONDecodeError:
            answer = {}
        if response.status_code == 200 and isinstance(answer, dict) and answer.get("token"):
            return str(answer["token"])
        message = (
            str((answer.get("message") or answer.get("error")) if isinstance(answer, dict) else "")
            or response.text.strip()[:200]
        )
        if "CommonName" in message:
            # etcd's gateway, with auth enabled, refuses a client certificate that has a
            # Common Name (it would be mistaken for the user).
            raise AuthRefused(
                f"etcd at {endpoint} refused the client certificate: {message} (with etcd "
                "auth enabled, --etcd-cert-file must have no Common Name)"
            )
        if response.status_code >= 500 and "authentication failed" not in message:
            # etcd itself failing (no leader): the caller's failover policy decides.
            raise httpx.TransportError(f"authenticate: HTTP {response.status_code}: {message}")
        raise AuthRefused(
            f"etcd at {endpoint} refused user {self._access.user!r}: "
            f"{message or response.status_code}"
        )
