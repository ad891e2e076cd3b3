"""Talking to the other nodes of a cluster on a client's behalf (PROTOCOL §7 "Any node
serves everything"): publishes forwarded to partition leaders, reads proxied to them,
and the replication reports GET /v1/cluster and GET /v1/topics/{topic} gather.

A forwarded request carries ``herald-forwarded: 1`` and the client's own
``Authorization``: the leader checks the client's rights as if it had been called
directly, and a request that arrives forwarded at a node that does not lead (the
leader moved meanwhile) is answered 503 ``leader_unavailable`` rather than forwarded
again, so no request travels in a circle. Node-to-node calls of the server's own
(replication reports) carry ``--cluster-token`` when the cluster has credentials.

Credentials go only to a URL that proved it is a node of this cluster (cluster/trust.py:
etcd naming it is not enough); https:// peers are verified against ``--peer-ca-file``.

With credentials, every call also proves it comes from a node (``herald-peer-authorization``:
the cluster token), and a forwarded one names the client it is made for (``herald-client``:
its address): the receiving node counts it against that client's per-address cap, not the
forwarding node's (server/limits.py; issue 26 item 8).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar
from urllib.parse import quote

import httpx
import msgspec
import orjson

from cluster.clock import lease_clock
from cluster.errors import LeaderUnavailable
from cluster.fence import renewed_by
from cluster.trust import PeerVerifier
from herald._transport import ConnectionPool, TransportError
from herald.protocol.errors import HeraldError
from herald.protocol.snapshot import SubscriptionSnapshot
from herald.protocol.unchecked import unchecked_struct
from server.security_cli import KEEP_ALIVE_TIMEOUT_S

log = logging.getLogger("herald.server")

FORWARDED = "herald-forwarded"
CLIENT = "herald-client"  # the address of the client a forwarded request is made for
PEER_AUTHORIZATION = "herald-peer-authorization"  # "Bearer <cluster token>": a node calls
_REPORT_TIMEOUT_S = 1.0
_CONNECT_TIMEOUT_S = 3.0
_MAX_CONNECTIONS = 256  # requests at once to one peer
_MAX_IDLE_CONNECTIONS = 64
_FORWARD_TIMEOUT_S = 60.0  # publishes wait for commits; reads long-poll up to 30 s
# An idle connection to a peer is dropped well before the peer closes it: with both at
# 5 s a forwarded publish could go out on a connection the peer was closing, and came
# back as a reset (503 leader_unavailable, "did not answer: ") from a live leader.
_KEEPALIVE_EXPIRY_S = KEEP_ALIVE_TIMEOUT_S / 2


class PeerError(HeraldError):
    """A leader's problem answer, passed on to the client as it came."""

    code: ClassVar[str] = "internal_error"

    def __init__(self, status: int, problem: Mapping[str, Any], retry_after: str | None) -> None:
        extra = {
            k: v
            for k, v in problem.items()
            if k not in ("status", "title", "code", "detail", "type")
        }
        if retry_after is not None:
            extra["retry_after"] = retry_after
        super().__init__(str(problem.get("detail", "")), **extra)
        self.status = status  # type: ignore[misc]
        self.code = str(problem.get("code", "internal_error"))  # type: ignore[misc]
        self.title = str(problem.get("title", "Error"))  # type: ignore[misc]


class Peers:
    def __init__(
        self,
        cluster_token: str = "",
        *,
        verifier: PeerVerifier | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(_FORWARD_TIMEOUT_S, connect=_CONNECT_TIMEOUT_S),
            limits=httpx.Limits(
                max_connections=_MAX_CONNECTIONS,
                max_keepalive_connections=_MAX_IDLE_CONNECTIONS,
                keepalive_expiry=_KEEPALIVE_EXPIRY_S,
            ),
            verify=verify,
        )
        # Forwarded publishes, the hot path between nodes, go on the SDK's own HTTP/1.1
        # connections (herald/_transport.py): httpx's layers cost a forwarded one-record
        # publish about a millisecond more (issue 27 §1). One pool per leader URL.
        self._publish_pools: dict[str, ConnectionPool] = {}
        self.verify = verify  # for the WebSockets opened to other nodes, alike
        self._verifier = verifier
        self._peer = {PEER_AUTHORIZATION: f"Bearer {cluster_token}"} if cluster_token else {}
        self._own = (
            {"authorization": f"Bearer {cluster_token}", **self._peer} if cluster_token else {}
        )

    @property
    def own_headers(self) -> dict[str, str]:
        """The headers of this node's own calls to the others (fetches, reports)."""
        return dict(self._own)

    async def aclose(self) -> None:
        await self._http.aclose()
        pools, self._publish_pools = self._publish_pools, {}
        for pool in pools.values():
            await pool.close()
        if self._verifier is not None:
            await self._verifier.aclose()

    async def trusted(self, url: str) -> bool:
        """Whether credentials may go to ``url`` (always, in a cluster without keys)."""
        return self._verifier is None or await self._verifier.trusted(url)

    async def _check(self, url: str) -> None:
        if not await self.trusted(url):
            raise LeaderUnavailable(
                f"the node etcd names at {url} did not prove it belongs to the cluster"
            )

    def on_behalf_of(self, client: str) -> dict[str, str]:
        """The headers of a request forwarded for the client at address ``client``."""
        headers = {FORWARDED: "1"}
        if self._peer:  # without a cluster token no node can prove it is one
            headers.update(self._peer)
            headers[CLIENT] = client
        return headers

    def _client_headers(self, authorization: str | None, client: str) -> dict[str, str]:
        headers = self.on_behalf_of(client)
        if authorization:
            headers["authorization"] = authorization
        return headers

    async def publish(
        self,
        url: str,
        topic: str,
        acks: str | None,
        messages: list[Any],
        authorization: str | None,
        client: str,
    ) -> list[dict[str, Any]]:
        """Forward ``messages`` (each naming its partition) to their leader -> its results."""
        await self._check(url)
        target = f"/v1/topics/{quote(topic, safe='')}/messages"
        if acks is not None:
            target += f"?acks={quote(acks, safe='')}"
        try:
            response = await self._publish_pool(url).request(
                "POST",
                target,
                orjson.dumps({"messages": messages}),
                "application/json",
                self._client_headers(authorization, client),
            )
        except TransportError as exc:
            raise LeaderUnavailable(
                f"the partition's leader at {url} did not answer: {exc}"
            ) from exc
        if response.status == 202:
            return []
        body = _json_body(url, response.status, response.body)
        if response.status != 200:
            raise PeerError(response.status, body, response.headers.get("retry-after"))
        results = body.get("results")
        if not isinstance(results, list):
            # Not a publish answer (a proxy's page, another program on the port): the
            # leader is as good as unreachable, never a 500 here.
            raise LeaderUnavailable(f"the partition's leader at {url} gave no publish results")
        return results

    def _publish_pool(self, url: str) -> ConnectionPool:
        pool = self._publish_pools.get(url)
        if pool is None:
            # An https:// pool without a context of its own verifies with the system's CAs.
            context = self.verify if isinstance(self.verify, ssl.SSLContext) else None
            if self.verify is False:
                context = _unverified()
            pool = self._publish_pools[url] = ConnectionPool(
                url,
                timeout=_FORWARD_TIMEOUT_S,
                connect_timeout=_CONNECT_TIMEOUT_S,
                ssl_context=context,
                max_idle=_MAX_IDLE_CONNECTIONS,
                max_idle_s=_KEEPALIVE_EXPIRY_S,
                max_connections=_MAX_CONNECTIONS,  # the rest wait, as httpx's limit had them
            )
        return pool

    async def get(
        self, url: str, path: str, query: bytes, authorization: str | None, client: str
    ) -> httpx.Response:
        """A read proxied to the leader, answered as it came."""
        await self._check(url)
        try:
            return await self._http.get(
                f"{url}{path}" + (f"?{query.decode('latin-1')}" if query else ""),
                headers=self._client_headers(authorization, client),
            )
        except httpx.HTTPError as exc:
            raise LeaderUnavailable(
                f"the partition's leader at {url} did not answer: {exc}"
            ) from exc

    async def forward(
        self,
        url: str,
        method: str,
        path: str,
        query: bytes,
        body: bytes,
        headers: Mapping[str, str],
        client: str,
    ) -> httpx.Response:
        """A client's request passed on as it came (a subscription's, to its coordinator)."""
        passed = self.on_behalf_of(client)
        for key in ("authorization", "content-type", "x-request-id"):
            if key in headers:
                passed[key] = headers[key]
        await self._check(url)
        try:
            return await self._http.request(
                method,
                f"{url}{path}" + (f"?{query.decode('latin-1')}" if query else ""),
                content=body,
                headers=passed,
            )
        except httpx.HTTPError as exc:
            raise LeaderUnavailable(f"the node at {url} did not answer: {exc}") from exc

    async def node_stats(self, urls: Iterable[str]) -> list[list[SubscriptionSnapshot]]:
        """Each node's own subscriptions, from its ``GET /v1/stats?scope=node`` (within a
        second, else left out)."""

        async def one(url: str) -> list[SubscriptionSnapshot]:
            if not await self.trusted(url):
                return []
            try:
                response = await self._http.get(
                    f"{url}/v1/stats",
                    params={"scope": "node"},
                    headers=self._own,
                    timeout=_REPORT_TIMEOUT_S,
                )
                if response.status_code == 200:
                    return _node_stats(response.json())
            except (httpx.HTTPError, ValueError) as exc:
                log.debug("stats of %s: %s", url, exc)
            return []

        return list(await asyncio.gather(*(one(url) for url in urls)))

    async def renewals(self, urls: Mapping[str, str], timeout_s: float) -> dict[str, float]:
        """When each node at ``urls`` sent its last lease renewal etcd answered, at the
        latest, on this node's clock (GET /v1/cluster/lease; cluster/fence.py); a node
        that does not answer within ``timeout_s`` is left out."""

        async def one(node: str, url: str) -> tuple[str, float] | None:
            if not await self.trusted(url):  # the cluster token goes only to proven nodes
                return None
            try:
                response = await self._http.get(
                    f"{url}/v1/cluster/lease", headers=self._own, timeout=timeout_s
                )
                answered_at = lease_clock()  # the clock of failing_since (cluster/clock.py)
                if response.status_code != 200:
                    return None
                body = response.json()
                ago = body["renewed_ms_ago"]
                if body.get("node") != node or not (ago is None or isinstance(ago, int | float)):
                    return None
                return node, renewed_by(answered_at, None if ago is None else ago / 1000)
            except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.debug("lease renewal of %s: %s", url, exc)
                return None

        answers = await asyncio.gather(*(one(node, url) for node, url in urls.items()))
        return dict(a for a in answers if a is not None)

    async def replication(self, urls: Iterable[str]) -> list[dict[str, Any]]:
        """Every live node's report (GET /v1/cluster/replication: its id, the partitions
        it leads, its credentials' digest), gathered; a node that does not answer within
        a second, or not with a report, is left out."""

        async def one(url: str) -> dict[str, Any] | None:
            if not await self.trusted(url):
                return None
            try:
                response = await self._http.get(
                    f"{url}/v1/cluster/replication", headers=self._own, timeout=_REPORT_TIMEOUT_S
                )
                if response.status_code == 200:
                    report = response.json()
                    if isinstance(report, dict) and isinstance(report.get("partitions"), list):
                        return report
            except (httpx.HTTPError, ValueError) as exc:
                log.debug("replication report of %s: %s", url, exc)
            return None

        reports = await asyncio.gather(*(one(url) for url in urls))
        return [report for report in reports if report is not None]


def _node_stats(body: Any) -> list[SubscriptionSnapshot]:
    """What a node's stats say of its subscriptions, as far as it is stats: an answer of
    another shape (another program on the port, a proxy's page) says nothing, never a
    500, and a subscription not of the snapshot's shape is left out."""
    subscriptions = body.get("subscriptions") if isinstance(body, dict) else None
    if not isinstance(subscriptions, list):
        return []
    found = []
    for subscription in subscriptions:
        with contextlib.suppress(msgspec.ValidationError):
            found.append(msgspec.convert(subscription, _PEER_SUBSCRIPTION))
    return found


# A node's own answer: the shape is checked, its constraints are not checked again.
_PEER_SUBSCRIPTION = unchecked_struct(SubscriptionSnapshot)


def _json_body(node: str, status: int, content: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict) or (status >= 400 and "code" not in body):
        # Not a problem (RFC 9457) from a Herald node: passed on as the leader being
        # unreachable (503), never as the peer's status with an internal_error code.
        raise LeaderUnavailable(f"the node at {node} answered {status} without a problem body")
    return body


def _unverified() -> ssl.SSLContext:
    """A context that checks no certificate (httpx's ``verify=False``)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
