"""Talking to the other nodes of a cluster on a client's behalf (PROTOCOL §7 "Any node
serves everything"): publishes forwarded to partition leaders, reads proxied to them,
and the replication reports GET /v1/cluster and GET /v1/topics/{topic} gather.

A forwarded request carries ``herald-forwarded: 1`` and the client's own
``Authorization``: the leader checks the client's rights as if it had been called
directly, and a request that arrives forwarded at a node that does not lead (the
leader moved meanwhile) is answered 503 ``leader_unavailable`` rather than forwarded
again, so no request travels in a circle. Node-to-node calls of the server's own
(replication reports) carry ``--cluster-token`` when the cluster has credentials.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import httpx
import orjson

from cluster.errors import LeaderUnavailable
from server.security_cli import KEEP_ALIVE_TIMEOUT_S
from storage.errors import HeraldError

log = logging.getLogger("herald.server")

FORWARDED = "herald-forwarded"
_REPORT_TIMEOUT_S = 1.0
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
    def __init__(self, cluster_token: str = "") -> None:
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(_FORWARD_TIMEOUT_S, connect=3.0),
            limits=httpx.Limits(
                max_connections=256,
                max_keepalive_connections=64,
                keepalive_expiry=_KEEPALIVE_EXPIRY_S,
            ),
        )
        self._own = {"authorization": f"Bearer {cluster_token}"} if cluster_token else {}

    async def aclose(self) -> None:
        await self._http.aclose()

    @staticmethod
    def _client_headers(authorization: str | None) -> dict[str, str]:
        headers = {FORWARDED: "1"}
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
    ) -> list[dict[str, Any]]:
        """Forward ``messages`` (each naming its partition) to their leader -> its results."""
        params = {"acks": acks} if acks is not None else {}
        try:
            response = await self._http.post(
                f"{url}/v1/topics/{topic}/messages",
                params=params,
                content=orjson.dumps({"messages": messages}),
                headers={**self._client_headers(authorization), "content-type": "application/json"},
            )
        except httpx.HTTPError as exc:
            raise LeaderUnavailable(
                f"the partition's leader at {url} did not answer: {exc}"
            ) from exc
        if response.status_code == 202:
            return []
        body = _json(response)
        if response.status_code != 200:
            raise PeerError(response.status_code, body, response.headers.get("retry-after"))
        results = body.get("results")
        if not isinstance(results, list):
            # Not a publish answer (a proxy's page, another program on the port): the
            # leader is as good as unreachable, never a 500 here.
            raise LeaderUnavailable(f"the partition's leader at {url} gave no publish results")
        return results

    async def get(
        self, url: str, path: str, query: bytes, authorization: str | None
    ) -> httpx.Response:
        """A read proxied to the leader, answered as it came."""
        try:
            return await self._http.get(
                f"{url}{path}" + (f"?{query.decode('latin-1')}" if query else ""),
                headers=self._client_headers(authorization),
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
    ) -> httpx.Response:
        """A client's request passed on as it came (a subscription's, to its coordinator)."""
        passed = {FORWARDED: "1"}
        for key in ("authorization", "content-type", "x-request-id"):
            if key in headers:
                passed[key] = headers[key]
        try:
            return await self._http.request(
                method,
                f"{url}{path}" + (f"?{query.decode('latin-1')}" if query else ""),
                content=body,
                headers=passed,
            )
        except httpx.HTTPError as exc:
            raise LeaderUnavailable(f"the node at {url} did not answer: {exc}") from exc

    async def node_stats(self, urls: Iterable[str]) -> list[dict[str, Any]]:
        """Each node's own ``GET /v1/stats?scope=node`` (within a second, else left out)."""

        async def one(url: str) -> dict[str, Any]:
            try:
                response = await self._http.get(
                    f"{url}/v1/stats",
                    params={"scope": "node"},
                    headers=self._own,
                    timeout=_REPORT_TIMEOUT_S,
                )
                if response.status_code == 200:
                    body: dict[str, Any] = response.json()
                    return body
            except (httpx.HTTPError, ValueError) as exc:
                log.debug("stats of %s: %s", url, exc)
            return {}

        return list(await asyncio.gather(*(one(url) for url in urls)))

    async def replication(self, urls: Iterable[str]) -> list[dict[str, Any]]:
        """Every live node's led partitions (GET /v1/cluster/replication), gathered; a node
        that does not answer within a second is left out."""

        async def one(url: str) -> list[dict[str, Any]]:
            try:
                response = await self._http.get(
                    f"{url}/v1/cluster/replication", headers=self._own, timeout=_REPORT_TIMEOUT_S
                )
                if response.status_code == 200:
                    partitions: list[dict[str, Any]] = response.json()["partitions"]
                    return partitions
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                log.debug("replication report of %s: %s", url, exc)
            return []

        reports = await asyncio.gather(*(one(url) for url in urls))
        return [p for report in reports for p in report]


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or (response.status_code >= 400 and "code" not in body):
        # Not a problem (RFC 9457) from a Herald node: passed on as the leader being
        # unreachable (503), never as the peer's status with an internal_error code.
        raise LeaderUnavailable(
            f"the node at {response.url.host}:{response.url.port} answered "
            f"{response.status_code} without a problem body"
        )
    return body
