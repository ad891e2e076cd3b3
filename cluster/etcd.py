"""An asyncio client for etcd v3 over its gRPC-gateway JSON API (PROTOCOL §7).

Why not a library from PyPI: python-etcd3 has been unmaintained for years (and pins an
old grpcio/protobuf), aetcd's maintainer declares it unmaintained, and etcd3gw — which
speaks this same gateway — is blocking (requests), so it would need a thread per call
and per watch. etcd's own gateway (``/v3/kv/range|put|txn|deleterange``,
``/v3/lease/grant|keepalive|revoke``, ``/v3/watch``) takes JSON over plain HTTP; this
is how Patroni talks to etcd v3 in production. It is about eight calls, over the httpx
Herald already depends on, with the retry and failover policy decided here and not in a
library's defaults. The data model (keys, compares, ops, results) is
:mod:`cluster.etcd_model`; watches are :mod:`cluster.etcd_watch`.

The price, measured (``bench/etcd_client.py``, this 2-core VM under other load, the
same etcd): a conditional write takes ~5 ms and ~3 ms of client CPU here, against
~2 ms and ~1 ms for aetcd over gRPC; httpx is most of it. That is ample for what the
cluster asks of etcd (a keepalive per node every TTL/3, a transaction per change of
leader or ISR — batched per node with ``state.compare_and_set_all``), and etcd is never
on the path of a record.

Failure policy, in one place (``_call``):

- Nothing was sent (connect refused/timed out): try the next endpoint, whatever the
  request, until the call's ``timeout`` — the cluster answers 503
  ``cluster_unavailable`` within 5 s, never hangs (PROTOCOL §7).
- A request safe to repeat (range, keepalive, grant, revoke, compaction) that got no
  answer: the same.
- A write (put, delete, txn) that was sent and got no answer may or may not have been
  applied — even later: a frozen member applies what sits in its socket once it runs
  again. :class:`EtcdOutcomeUnknown` at once (etcd's own clientv3 does not repeat such
  writes either); the caller re-reads and decides, and a transaction guarded by a
  revision cannot land over a later change.
- etcd answering "no leader" (refused before the request is proposed): retried.

Every failure to reach etcd is an :class:`EtcdUnavailable` (a ``HeraldError`` carrying
``cluster_unavailable`` / 503), so the server maps it in one place.
"""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import httpx
import orjson
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_before_delay,
    wait_exponential,
    wait_random,
)

from cluster.etcd_access import AuthRefused, EtcdAccess, EtcdAuthenticator, token_refused
from cluster.etcd_errors import (
    GRPC_NOT_FOUND,
    SERVER_SIDE_CODES,
    EtcdAuthFailed,
    EtcdError,
    EtcdOutcomeUnknown,
    EtcdUnavailable,
    LeaseNotFound,
    Retryable,
    WatchCompacted,
    refusal,
)
from cluster.etcd_model import (
    Compare,
    CompareOp,
    Delete,
    Get,
    KeyValue,
    Lease,
    Op,
    Put,
    RangeResult,
    TxnResult,
    b64,
    header_revision,
    parse_range,
    prefix_end,
    range_body,
    to_bytes,
)
from cluster.etcd_watch import Watch

__all__ = [  # the client, its errors, and the data model it speaks (cluster.etcd_model)
    "Compare",
    "CompareOp",
    "Delete",
    "EtcdAccess",
    "EtcdAuthFailed",
    "EtcdClient",
    "EtcdError",
    "EtcdOutcomeUnknown",
    "EtcdUnavailable",
    "Get",
    "KeyValue",
    "Lease",
    "LeaseNotFound",
    "Op",
    "Put",
    "RangeResult",
    "TxnResult",
    "WatchCompacted",
    "prefix_end",
]

Clock = Callable[[], float]
T = TypeVar("T")

DEFAULT_TIMEOUT_S = 4.0  # a whole call, retries included: under PROTOCOL §7's 5 s
DEFAULT_ATTEMPT_TIMEOUT_S = 2.0  # one HTTP request to one endpoint

# --------------------------------------------------------------------------- client


class EtcdClient:
    """etcd v3 through the gRPC gateway of one or more endpoints, with failover.

    ``async with EtcdClient(["http://127.0.0.1:2379"]) as etcd: await etcd.put("k", "v")``.
    Every call fails with :class:`EtcdUnavailable` within ``timeout`` seconds when no
    endpoint answers; each HTTP request is bounded by ``attempt_timeout``.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT_S,
        clock: Clock = time.monotonic,
        access: EtcdAccess | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.endpoints = tuple(url.rstrip("/") for url in endpoints)
        self.timeout = timeout
        self.attempt_timeout = attempt_timeout
        self.clock = clock
        self._current = 0  # the endpoint that answered last: tried first
        access = access or EtcdAccess()
        self.auth = EtcdAuthenticator(access)  # etcd's users (cluster/etcd_access.py)
        headers = {"Content-Type": "application/json"}
        verify = access.verify()  # TLS: etcd's CA and this client's certificate
        # Requests and watch streams in two pools: a watch holds its connection for
        # hours, and no number of watches may starve the calls (keepalives above all).
        self._http = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=16),
            headers=headers,
            verify=verify,
        )
        self._streams = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
            headers=headers,
            verify=verify,
        )

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._streams.aclose()

    # ------------------------------------------------------------------ key-value

    async def get(self, key: str | bytes, *, within_s: float | None = None) -> KeyValue | None:
        result = await self.range(key, within_s=within_s)
        return result.kvs[0] if result.kvs else None

    async def range(
        self,
        key: str | bytes,
        *,
        prefix: bool = False,
        revision: int = 0,
        limit: int = 0,
        count_only: bool = False,
        within_s: float | None = None,
    ) -> RangeResult:
        """The key, or with ``prefix`` every key under it (sorted by key), at the
        current revision or at ``revision``."""
        raw = to_bytes(key)
        extra: dict[str, Any] = {}
        if revision:
            extra["revision"] = str(revision)
        if limit:
            extra["limit"] = str(limit)
        if count_only:
            extra["count_only"] = True
        body = range_body(raw, prefix_end(raw) if prefix else b"", **extra)
        return parse_range(
            await self._call("/v3/kv/range", body, repeatable=True, within_s=within_s)
        )

    async def put(self, key: str | bytes, value: str | bytes, *, lease: int = 0) -> int:
        """Write one key (attached to ``lease`` if given); returns the new revision."""
        body = Put.of(key, value, lease=lease).to_json()["request_put"]
        return header_revision(await self._call("/v3/kv/put", body, repeatable=False))

    async def delete(self, key: str | bytes, *, prefix: bool = False) -> int:
        """Delete the key (or every key under the prefix); returns how many were deleted."""
        body = Delete.of(key, prefix=prefix).to_json()["request_delete_range"]
        return int(
            (await self._call("/v3/kv/deleterange", body, repeatable=False)).get("deleted", 0)
        )

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """If every compare holds, run ``success``, else ``failure`` — atomically."""
        body = {
            "compare": [c.to_json() for c in compare],
            "success": [op.to_json() for op in success],
            "failure": [op.to_json() for op in failure],
        }
        answer = await self._call("/v3/kv/txn", body, repeatable=False)
        results: list[RangeResult | int] = []
        for response in answer.get("responses", ()):
            if "response_range" in response:
                results.append(parse_range(response["response_range"]))
            elif "response_delete_range" in response:
                results.append(int(response["response_delete_range"].get("deleted", 0)))
            else:
                results.append(header_revision(response.get("response_put", {})))
        return TxnResult(
            bool(answer.get("succeeded", False)), header_revision(answer), tuple(results)
        )

    async def compact(self, revision: int) -> None:
        """Drop the history before ``revision`` (watches from older revisions fail)."""
        await self._call(
            "/v3/kv/compaction", {"revision": str(revision), "physical": True}, repeatable=True
        )

    # --------------------------------------------------------------------- leases

    async def lease_grant(self, ttl_s: int) -> Lease:
        # Repeatable: a grant answered but lost only leaves a lease that expires unused.
        answer = await self._call("/v3/lease/grant", {"TTL": str(ttl_s)}, repeatable=True)
        if answer.get("error"):
            raise EtcdError(0, str(answer["error"]))
        return Lease(int(answer["ID"]), int(answer.get("TTL", ttl_s)))

    async def lease_keepalive(self, lease_id: int, *, within_s: float | None = None) -> int:
        """Renew the lease once; returns its TTL. :class:`LeaseNotFound` once it is gone."""
        answer = await self._call(
            "/v3/lease/keepalive", {"ID": str(lease_id)}, repeatable=True, within_s=within_s
        )
        # A stream endpoint: one {"result": …} line (or {"error": …}) per request sent.
        if "error" in answer:
            error = answer["error"]
            code = int(error.get("grpc_code", error.get("code", 0)))
            if code in SERVER_SIDE_CODES:
                raise EtcdUnavailable(f"lease keepalive: {error.get('message')}")
            raise refusal(code, str(error.get("message")))
        ttl = int(answer.get("result", {}).get("TTL", 0))
        if ttl <= 0:  # etcd answers TTL 0 (omitted) for a lease that no longer exists
            raise LeaseNotFound(GRPC_NOT_FOUND, f"lease {lease_id:x} expired or revoked")
        return ttl

    async def lease_revoke(self, lease_id: int, *, within_s: float | None = None) -> None:
        """Revoke the lease, deleting every key attached to it (a lease already gone is
        not an error: repeating the call after a lost answer reaches the same state)."""
        with contextlib.suppress(LeaseNotFound):
            await self._call(
                "/v3/lease/revoke", {"ID": str(lease_id)}, repeatable=True, within_s=within_s
            )

    # ---------------------------------------------------------------------- watch

    def watch(
        self,
        key: str | bytes,
        *,
        prefix: bool = False,
        start_revision: int = 0,
        idle_probe_s: float = 2.0,
    ) -> Watch:
        """Changes to the key (or prefix) from ``start_revision`` (0: from now on).

        ``async with etcd.watch(p, prefix=True, start_revision=r) as watch:``
        ``async for event in watch: ...`` — see :mod:`cluster.etcd_watch`.
        """
        raw = to_bytes(key)
        return Watch(self, raw, prefix_end(raw) if prefix else b"", start_revision, idle_probe_s)

    # ----------------------------------------------------------------- transport

    @property
    def streams(self) -> httpx.AsyncClient:
        """The HTTP client watch streams are opened with (a pool of their own)."""
        return self._streams

    async def probe(self, endpoint: str, key: bytes = b"\0") -> bool:
        """Whether ``endpoint`` serves a linearizable read (a live member with a leader)."""
        return await self.probe_error(endpoint, key) is None

    async def probe_error(self, endpoint: str, key: bytes = b"\0") -> str | None:
        """None when ``endpoint`` serves a linearizable read; else why not. Raises
        :class:`EtcdAuthFailed` when etcd refuses the configured user."""
        body = orjson.dumps({"key": b64(key), "count_only": True})
        try:
            headers = await self.auth_headers(endpoint, self.attempt_timeout)
            response = await self._http.post(
                endpoint + "/v3/kv/range",
                content=body,
                timeout=self.attempt_timeout,
                headers=headers,
            )
        except (httpx.TransportError, ssl.SSLError, Retryable) as exc:
            return f"{exc!r}"
        if response.status_code != 200:
            message = response.text[:200]
            if token_refused(message):
                self.auth.forget(headers.get("Authorization"))
                if not self.auth.enabled:
                    raise EtcdAuthFailed(
                        f"etcd at {endpoint} has authentication enabled and no user was given"
                    )
            return f"HTTP {response.status_code}: {message}"
        return None

    async def authenticate(self, *, within_s: float | None = None) -> None:
        """Take etcd's token now (nothing to do without a user), so that the first calls
        do not spend their budget on it. :class:`EtcdAuthFailed` if etcd refuses."""
        if not self.auth.enabled:
            return

        async def attempt(endpoint: str, attempt_timeout: float) -> None:
            await self.auth_headers(endpoint, attempt_timeout)

        await self.with_failover(attempt, within_s=within_s)

    async def auth_headers(self, endpoint: str, attempt_timeout: float) -> dict[str, str]:
        """The ``Authorization`` header of etcd's user (empty without one); taking a token
        that fails to arrive is :class:`Retryable` (the call itself was not sent)."""
        try:
            return await self.auth.headers(self._http, endpoint, attempt_timeout)
        except AuthRefused as exc:
            raise EtcdAuthFailed(str(exc)) from None
        except (httpx.TransportError, ssl.SSLError) as exc:
            raise Retryable(f"{endpoint}: authenticate: {exc!r}") from exc

    @property
    def current_endpoint(self) -> str:
        return self.endpoints[self._current]

    def endpoint_failed(self, endpoint: str) -> None:
        """Prefer the next endpoint from now on (unless another call already moved on)."""
        if self.endpoints[self._current] == endpoint:
            self._current = (self._current + 1) % len(self.endpoints)

    async def with_failover(
        self,
        attempt: Callable[[str, float], Awaitable[T]],
        *,
        within_s: float | None = None,
    ) -> T:
        """Run ``attempt(endpoint, attempt_timeout)`` until it returns, moving to the
        next endpoint each time it raises ``Retryable``; EtcdUnavailable at the deadline."""
        budget = self.timeout if within_s is None else within_s
        deadline = self.clock() + budget
        last: BaseException | None = None
        retrying = AsyncRetrying(
            stop=stop_before_delay(budget),
            wait=wait_exponential(multiplier=0.05, max=0.5) + wait_random(0, 0.05),
            retry=retry_if_exception_type(Retryable),
            reraise=True,
        )
        try:
            async for try_ in retrying:
                with try_:
                    remaining = deadline - self.clock()
                    if remaining <= 0:
                        break
                    endpoint = self.current_endpoint
                    try:
                        return await attempt(endpoint, min(self.attempt_timeout, remaining))
                    except Retryable:
                        self.endpoint_failed(endpoint)
                        raise
        except Retryable as exc:
            last = exc
        raise EtcdUnavailable(
            f"no etcd endpoint answered within {budget:g} s ({', '.join(self.endpoints)}): {last}"
        )

    async def _call(
        self,
        path: str,
        body: Mapping[str, Any],
        *,
        repeatable: bool,
        within_s: float | None = None,
    ) -> dict[str, Any]:
        content = orjson.dumps(body)

        async def attempt(endpoint: str, attempt_timeout: float) -> dict[str, Any]:
            for _ in range(2):  # a second time only with a fresh etcd token
                headers = await self.auth_headers(endpoint, attempt_timeout)
                response = await self._send(
                    endpoint, path, content, attempt_timeout, headers, repeatable=repeatable
                )
                if self.auth.enabled and token_refused(response.text[:200]):
                    self.auth.forget(headers.get("Authorization"))  # refused: not applied
                    continue
                break
            return self._answer(endpoint, path, response, repeatable=repeatable)

        return await self.with_failover(attempt, within_s=within_s)

    async def _send(
        self,
        endpoint: str,
        path: str,
        content: bytes,
        attempt_timeout: float,
        headers: dict[str, str],
        *,
        repeatable: bool,
    ) -> httpx.Response:
        try:
            return await self._http.post(
                endpoint + path, content=content, timeout=attempt_timeout, headers=headers
            )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise Retryable(f"{endpoint}: {exc!r}") from exc  # nothing was sent
        except ssl.SSLError as exc:  # etcd refused the TLS handshake: nothing was applied
            raise Retryable(f"{endpoint}: {exc!r}") from exc
        except httpx.TransportError as exc:
            if repeatable:
                raise Retryable(f"{endpoint}: {exc!r}") from exc
            self.endpoint_failed(endpoint)
            raise EtcdOutcomeUnknown(
                f"etcd at {endpoint} did not answer {path}; it may have been applied: {exc!r}"
            ) from exc

    def _answer(
        self, endpoint: str, path: str, response: httpx.Response, *, repeatable: bool
    ) -> dict[str, Any]:
        try:
            answer: Any = orjson.loads(response.content) if response.content else {}
        except orjson.JSONDecodeError:
            answer = None
        if isinstance(answer, dict) and response.status_code == 200:
            return answer
        if isinstance(answer, dict):
            code = answer.get("code", 0) if isinstance(answer.get("code"), int) else 0
            message = str(answer.get("message", answer.get("error", response.reason_phrase)))
            server_side = code in SERVER_SIDE_CODES
        else:  # not the gateway answering (a proxy in between?)
            code, message, server_side = (
                0,
                f"HTTP {response.status_code}: {response.content[:200]!r}",
                True,
            )
        if server_side or response.status_code >= 500:
            if repeatable or "no leader" in message:
                raise Retryable(f"{endpoint}: {message}")
            self.endpoint_failed(endpoint)
            raise EtcdOutcomeUnknown(f"etcd at {endpoint} failed {path}: {message}")
        raise refusal(code, message)
