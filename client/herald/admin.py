"""Topic and subscription administration over the HTTP API (PROTOCOL §2)."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from msgspec import UNSET

from herald._http import DEFAULT_URL, Nodes, Reachability, request_json
from herald.errors import checked
from herald.protocol.actions import RedriveRequest
from herald.protocol.seek import Seek
from herald.protocol.subscriptions import SubscriptionConfig, SubscriptionPatch
from herald.protocol.topics import TopicConfig

_UNSET: Any = object()  # `retention_ms=None` means unlimited, so "not given" needs its own value


class Admin:
    """`Admin(url)`: every call returns the server's JSON body; errors raise
    HeraldClientError with the problem's `code`, `status` and `detail`.

    `url` may list a cluster's nodes (PROTOCOL §7: any node answers for the whole
    cluster): calls go to one of them and move on to the next when it cannot be
    reached or answers 503 `cluster_unavailable`."""

    def __init__(
        self,
        url: str | Sequence[str] = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        retries: int = 5,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._nodes = Nodes(url, token, timeout, ssl_context)
        self._reach = Reachability(self._nodes.url)
        self.retries = retries

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._nodes.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return await request_json(
            self._nodes, self._reach, method, path, attempts=self.retries, **kwargs
        )

    # -- topics ------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        *,
        partitions: int | None = None,
        retention_ms: int | None = _UNSET,
        retention_bytes: int | None = _UNSET,
        dedup_window_ms: int | None = None,
    ) -> dict[str, Any]:
        """Create (or confirm) a topic; 409 topic_conflict if it differs."""
        body = TopicConfig(
            partitions=partitions,
            retention_ms=UNSET if retention_ms is _UNSET else retention_ms,
            retention_bytes=UNSET if retention_bytes is _UNSET else retention_bytes,
            dedup_window_ms=dedup_window_ms,
        )
        result: dict[str, Any] = await self._call("PUT", _topic(name), body=body)
        return result

    async def get_topic(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", _topic(name))
        return result

    async def list_topics(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = (await self._call("GET", "/v1/topics"))["topics"]
        return result

    async def delete_topic(self, name: str) -> None:
        await self._call("DELETE", _topic(name))

    async def read_messages(
        self,
        topic: str,
        partition: int = 0,
        *,
        offset: int | None = None,
        timestamp: int | None = None,
        limit: int | None = None,
        wait_ms: int | None = None,
    ) -> dict[str, Any]:
        """`{"messages": [...], "next_offset": K}` from one partition."""
        params = {
            name: value
            for name, value in (
                ("offset", offset),
                ("timestamp", timestamp),
                ("limit", limit),
                ("wait_ms", wait_ms),
            )
            if value is not None
        }
        path = f"{_topic(topic)}/partitions/{partition}/messages"
        result: dict[str, Any] = await self._call("GET", path, params=params)
        return result

    # -- subscriptions -------------------------------------------------------------------

    async def create_subscription(self, name: str, topic: str, **config: Any) -> dict[str, Any]:
        """Create (or confirm) a subscription; `config` takes the fields of PROTOCOL §2
        (start, delivery, ack_deadline_ms, max_in_flight, max_deliveries, retry_backoff,
        dead_letter_topic, ordered_by_key, push, filter). `push` is a dict of §4 and §8:
        url, secret, max_in_flight, timeout_ms, breaker, batch
        (`{"max_records": 1..1000, "max_wait_ms": 0..10000}`) and payload
        ("envelope" or "raw"), e.g.
        `push={"url": …, "secret": …, "batch": {"max_records": 100, "max_wait_ms": 500}}`."""
        # The model the server validates with: a bad field is refused here, with the
        # server's code and detail, before any request is sent.
        body = checked({"topic": topic, **config}, SubscriptionConfig, "the subscription config")
        result: dict[str, Any] = await self._call("PUT", _subscription(name), body=body)
        return result

    async def get_subscription(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", _subscription(name))
        return result

    async def list_subscriptions(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = (await self._call("GET", "/v1/subscriptions"))[
            "subscriptions"
        ]
        return result

    async def update_subscription(self, name: str, **changes: Any) -> dict[str, Any]:
        """Change a subscription in place (PROTOCOL §8, JSON Merge Patch): any of
        ack_deadline_ms, max_in_flight, max_deliveries, retry_backoff, dead_letter_topic,
        filter, push; a value of None sets the field back to its default (push=None stops
        pushing). A push dict replaces the old one whole (its batch and payload included:
        left out, they go back to one record per request, as an envelope); without
        "secret" it keeps the current secret."""
        body = checked(changes, SubscriptionPatch, "the subscription patch")
        result: dict[str, Any] = await self._call("PATCH", _subscription(name), body=body)
        return result

    async def delete_subscription(self, name: str) -> None:
        await self._call("DELETE", _subscription(name))

    async def seek(
        self,
        name: str,
        *,
        to: str | None = None,
        timestamp: int | None = None,
        offsets: dict[int, int] | None = None,
    ) -> dict[str, Any]:
        """Seek to "earliest"/"latest", a timestamp, or per-partition offsets (one form)."""
        forms = [form for form in (to, timestamp, offsets) if form is not None]
        if len(forms) != 1:
            raise ValueError("seek takes exactly one of to=, timestamp=, offsets=")
        keyed = None if offsets is None else {str(p): o for p, o in offsets.items()}
        # A `to` other than earliest/latest goes as given: the server's 400 is the answer.
        body = Seek(to=to, timestamp=timestamp, offsets=keyed)  # type: ignore[arg-type]
        result: dict[str, Any] = await self._call("POST", f"{_subscription(name)}/seek", body=body)
        return result

    async def redrive(
        self,
        name: str,
        *,
        rate: int | None = None,
        max_records: int | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """Republish the subscription's dead-letter topic to its topic (docs/protocol.md):
        `{"scanned", "republished", "duplicates", "skipped", "other_reasons", …}`. With
        ``reason``, only the dead letters whose `herald-source-last-error` is exactly it."""
        body = RedriveRequest(rate=rate, max_records=max_records, reason=reason)
        result: dict[str, Any] = await self._call(
            "POST", f"{_subscription(name)}/redrive", body=body
        )
        return result


def _topic(name: str) -> str:
    return f"/v1/topics/{quote(name, safe='')}"


def _subscription(name: str) -> str:
    return f"/v1/subscriptions/{quote(name, safe='')}"
