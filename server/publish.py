"""Publish (PROTOCOL §2 ``POST /v1/topics/{topic}/messages``): the hot path.

The body is decoded once into its model (validation.decode_publish), checked in one
pass for what a type cannot say (validation.parse_publish), handed
to Topic.publish as one batch and answered with bytes built directly; nothing is
awaited per record.

``PublishEndpoint`` serves it as plain ASGI at the end of the middleware chain, so
request ids, client limits, access control and the 500 guard apply to it exactly
as to every other route, while Starlette's router, ``Request`` and ``Response``
objects are skipped: for a one-record publish they cost about as much server CPU
as the publish itself. Every other request (another method on this path, any other
path) goes on to the router, which keeps the route for its 405 and the OpenAPI
document; that route runs the same ``publish_records``.
"""

from __future__ import annotations

import asyncio
import binascii
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

import msgspec
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from cluster.errors import LeaderUnavailable
from cluster.node import ClusterNode
from herald.protocol.encodings import is_msgpack
from herald.protocol.errors import HeraldError, TopicNotFound, ValidationError
from herald.protocol.names import check_name
from herald.protocol.publish import FORWARDED_RECORDS
from server.endpoint import Endpoints
from server.errors import herald_error_response, log_server_error
from server.http import body_chunks, parse_json_body, parse_json_exact, read_body
from server.limits import charge_publish, client_address
from server.peers import FORWARDED
from server.runtime import Services, app_services, services
from server.validation import (
    PublishBatch,
    check_replication,
    decode_packed_publish,
    decode_publish,
    parse_acks,
    parse_publish,
)
from storage.config import TopicConfig
from storage.record import Acks, ValueKind
from storage.topic import PublishResult, Topic, publish_item

log = logging.getLogger("herald.server")

_RESULT = b'{"partition":%d,"offset":%d,"duplicate":%s}'
_JSON_HEADERS = (b"content-type", b"application/json")
_FORWARDED_RECORDS = FORWARDED_RECORDS.encode()
_ANY_PARTITION = 1 << 31  # the parser's bound for a topic this node does not hold yet


async def ensure_topic(
    running: Services, name: str, max_partition: int = -1, index: int = -1
) -> Topic:
    """The topic, auto-created with defaults when allowed (PROTOCOL §1 Auto-create).

    ``max_partition`` is checked against the partition count *before* creating,
    so a publish that is going to be refused leaves no topic behind.
    """
    topic = running.storage.topic(name)
    if topic is None:
        if not running.config.auto_create:
            raise TopicNotFound(f"topic {name!r} does not exist")
        defaults = TopicConfig()
        partitions = defaults.partitions
        if running.cluster is not None and max_partition >= partitions:
            # The topic may be in etcd with its copy here on its way (just created, or
            # created again): its own partition count is the one to check.
            known = await running.cluster.topic_config(name)
            partitions = known.partitions if known is not None else partitions
        _check_partition(name, partitions, max_partition, index)
        if running.cluster is not None:
            # PROTOCOL §7: etcd is the truth; the topic opens here once the node sees it.
            await running.cluster.create_topic(
                name,
                cluster_defaults(running, defaults),
                max_topics=running.config.max_topics,
                auto_created=True,
            )
            topic = running.storage.topic(name)
            if topic is None:
                raise LeaderUnavailable(f"topic {name!r} is being created; try again")
        else:
            # Race-free in Storage: two first publishes end up with one topic.
            topic, _ = await running.storage.ensure_topic(
                name, defaults, auto_created=True, max_topics=running.config.max_topics
            )
    _check_partition(name, len(topic.partitions), max_partition, index)
    return topic


def cluster_defaults(
    running: Services, config: TopicConfig, given: frozenset[str] = frozenset()
) -> TopicConfig:
    """PROTOCOL §7 defaults: replication_factor min(3, live nodes), min_insync_replicas
    min(2, replication_factor); both checked against the live nodes."""
    assert running.cluster is not None
    live = len(running.cluster.live_nodes())
    factor = config.replication_factor if "replication_factor" in given else min(3, live)
    minimum = config.min_insync_replicas if "min_insync_replicas" in given else min(2, factor)
    config = dataclasses.replace(config, replication_factor=factor, min_insync_replicas=minimum)
    check_replication(config, live)
    return config


def _check_partition(name: str, partitions: int, wanted: int, index: int) -> None:
    # PROTOCOL §2: a partition named in a message is a number out of range, not a
    # partition_not_found (which is for the partition in a read's path).
    if wanted >= partitions:
        extra = {"index": index} if index >= 0 else {}
        raise ValidationError(
            f"topic {name!r} has {partitions} partition(s); partition {wanted} does not exist",
            **extra,
        )


def _parse_batch(raw: bytes, max_message_bytes: int, partitions: int, packed: bool) -> PublishBatch:
    body: Any
    if packed:  # docs/protocol.md "MessagePack"
        body = decode_packed_publish(raw)
        return parse_publish(body, max_message_bytes, publish_item, partitions, packed=True)
    body = decode_publish(raw)
    if body is None:
        # Rare: not JSON (bad_request, as for every body), a bad message, or an integral
        # float. Parsed again with every integer exact; a body too deep for that parser
        # is refused for its depth in any case.
        body = parse_json_body(raw)
        exact = parse_json_exact(raw)
        body = body if exact is None else exact
    return parse_publish(body, max_message_bytes, publish_item, partitions)


def results_body(results: list[PublishResult]) -> bytes:
    return (
        b'{"results":['
        + b",".join(
            _RESULT % (r.partition, r.offset, b"true" if r.duplicate else b"false") for r in results
        )
        + b"]}"
    )


class Published(NamedTuple):
    """A publish's answer: its status and body, and in a cluster how many of its records
    this node forwarded to their leaders (the answer says so: ``FORWARDED_RECORDS``)."""

    status: int
    body: bytes
    forwarded: int = 0


async def publish_records(
    running: Services,
    scope: Scope,
    topic_name: str,
    acks_param: str | None,
    content_length: str | None,
    content_type: str | None,
    chunks: AsyncIterator[bytes],
) -> Published:
    """Publish one request's batch; raises HeraldError for 4xx/5xx."""
    started = time.perf_counter()
    config = running.config
    name = check_name(topic_name)
    acks = parse_acks(acks_param)
    raw = await read_body(chunks, content_length, config.max_request_bytes)
    existing = running.storage.topic(name)
    # A topic not here yet: ensure_topic checks the partitions named against the count
    # it is (or will be) created with — in a cluster, etcd's, which may not be the
    # default (a topic created again, its copy here on its way).
    partitions = len(existing.partitions) if existing is not None else _ANY_PARTITION
    packed = is_msgpack(content_type)
    batch = _parse_batch(raw, config.max_message_bytes, partitions, packed)
    charge_publish(scope, len(batch.items), len(raw))  # PROTOCOL §6 rate limits
    topic = await ensure_topic(running, name, batch.max_partition, batch.max_partition_index)
    if running.cluster is not None:
        return await _publish_cluster(running, scope, topic, acks, raw, packed, batch, started)
    if acks is Acks.NONE:
        # PROTOCOL §2: acks=0 is answered at once; the append runs under the
        # lifespan's supervisor, which SIGTERM waits for.
        await running.background.submit(topic.publish(batch.items, Acks.NONE))
        running.publish_duration.observe(time.perf_counter() - started)
        return Published(202, b"")
    results = await topic.publish(batch.items, acks)
    body = results_body(results)
    running.publish_duration.observe(time.perf_counter() - started)
    return Published(200, body)


def _partition_groups(
    cluster: ClusterNode, topic: Topic, batch: PublishBatch
) -> dict[int, list[int]]:
    """Partition -> the indexes of the batch's items that go there: as asked, by key, or
    (keyless) the one partition the cluster's round robin gives this batch (PROTOCOL §1)."""
    groups: dict[int, list[int]] = {}
    spread: int | None = None
    for index, item in enumerate(batch.items):
        partition = item.partition
        if partition is None:
            partition = topic.choose_partition(item.record.key)
        if partition is None:
            if spread is None:
                spread = cluster.next_spread(topic.name, len(topic.partitions))
            partition = spread
        groups.setdefault(partition, []).append(index)
    return groups


async def _publish_cluster(
    running: Services,
    scope: Scope,
    topic: Topic,
    acks: Acks,
    raw: bytes,
    packed: bool,
    batch: PublishBatch,
    started: float,
) -> Published:
    """PROTOCOL §7: the batch split by partition, each part appended here if this node
    leads it or forwarded to its leader, the results merged in request order."""
    cluster, peers = running.cluster, running.peers
    assert cluster is not None and peers is not None
    forwarded = _header(scope, FORWARDED.encode()) is not None
    groups = _partition_groups(cluster, topic, batch)
    messages: list[Any] | None = None
    remote = [p for p in groups if not cluster.leads(topic.name, p)]
    forwarding = sum(len(groups[p]) for p in remote)  # records sent on (at first sight)
    if remote and forwarded:  # the leader moved while the request travelled: it retries
        raise LeaderUnavailable(
            f"this node no longer leads partition {remote[0]} of {topic.name!r}"
        )
    authorization = _header(scope, b"authorization")
    client = client_address(scope)
    acks_text = {Acks.NONE: "0", Acks.LEADER: "1", Acks.ALL: "all"}[acks]

    async def part(partition: int, indexes: list[int]) -> list[tuple[int, int, bool]]:
        if cluster.leads(topic.name, partition):
            items = [publish_item(batch.items[i].record, partition) for i in indexes]
            results = await topic.publish(items, acks)
            return [(r.partition, r.offset, r.duplicate) for r in results]
        # Led elsewhere — or no longer here: the role can go while the parts run.
        if forwarded:
            raise LeaderUnavailable(f"this node no longer leads partition {partition}")
        view = cluster.require_leader(topic.name, partition)
        assert view.leader_url is not None  # require_leader: a live leader
        nonlocal messages
        if messages is None:
            messages = _packed_messages(raw, batch) if packed else _messages(raw)
        body = [{**messages[i], "partition": partition} for i in indexes]
        answered = await peers.publish(
            view.leader_url, topic.name, acks_text, body, authorization, client
        )
        cluster.counters.forwarded_records += len(indexes)
        return [(r["partition"], r["offset"], bool(r["duplicate"])) for r in answered]

    async def run() -> list[tuple[int, int, bool] | None]:
        merged: list[tuple[int, int, bool] | None] = [None] * len(batch.items)
        parts = list(groups.items())
        outcomes = await asyncio.gather(*(part(p, ix) for p, ix in parts), return_exceptions=True)
        for (_, indexes), outcome in zip(parts, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                raise outcome
            for index, result in zip(indexes, outcome, strict=False):
                merged[index] = result
        return merged

    if acks is Acks.NONE:
        await running.background.submit(run())
        running.publish_duration.observe(time.perf_counter() - started)
        return Published(202, b"", forwarding)
    merged = await run()
    body = (
        b'{"results":['
        + b",".join(
            _RESULT % (r[0], r[1], b"true" if r[2] else b"false") for r in merged if r is not None
        )
        + b"]}"
    )
    running.publish_duration.observe(time.perf_counter() - started)
    return Published(200, body, forwarding)


def _messages(raw: bytes) -> list[Any]:
    """The request's messages as JSON values, to forward them as they came."""
    try:
        body = parse_json_body(raw)
    except HeraldError:
        body = parse_json_exact(raw)
    messages: list[Any] = body["messages"]
    return messages


def _packed_messages(raw: bytes, batch: PublishBatch) -> list[Any]:
    """A msgpack request's messages as JSON values, to forward them (as JSON: between
    nodes the records are the same); each value is the record's as parsed here."""
    messages: list[dict[str, Any]] = msgspec.msgpack.decode(raw)["messages"]
    forwarded = []
    for message, item in zip(messages, batch.items, strict=True):
        record = item.record
        json = {k: v for k, v in message.items() if k not in ("value", "value_json")}
        if record.kind is ValueKind.BYTES:
            json["value_b64"] = binascii.b2a_base64(record.value, newline=False).decode()
        else:
            json["value"] = orjson.Fragment(record.value)  # its compact JSON text
        forwarded.append(json)
    return forwarded


async def publish_route(request: Request) -> Response:
    """The router's handler of the same path (reached only when PublishEndpoint is not
    in front, e.g. an app assembled without it)."""
    status, body, forwarded = await publish_records(
        services(request),
        request.scope,
        request.path_params["topic"],
        request.query_params.get("acks"),
        request.headers.get("content-length"),
        request.headers.get("content-type"),
        request.stream(),
    )
    headers = {FORWARDED_RECORDS: str(forwarded)} if forwarded else None
    return Response(
        body,
        status_code=status,
        headers=headers,
        media_type="application/json" if body else None,
    )


class PublishEndpoint:
    """The publish endpoint (the table's row whose handler is ``publish_route``) without
    the router; every other request passes through."""

    def __init__(self, app: ASGIApp, *, endpoints: Endpoints) -> None:
        self.app = app
        self.endpoints = endpoints

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] == "http":
            endpoint, params = self.endpoints.route_of(scope)
            if endpoint is not None and endpoint.handler is publish_route:
                return self._publish(scope, receive, send, params["topic"])
        # The next layer's own coroutine: no frame of this one is held for as long as a
        # WebSocket stays open (issue 27 §3: memory per idle consumer).
        return self.app(scope, receive, send)

    async def _publish(self, scope: Scope, receive: Receive, send: Send, topic: str) -> None:
        status, headers, body = await publish_answer(scope, topic, body_chunks(receive))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class Answer(NamedTuple):
    """An HTTP answer as it goes out: status, headers (the response's own; the request
    id's is added around it) and body."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


def answer_of(response: Response) -> Answer:
    """A Starlette response (a problem answer) as an :class:`Answer`."""
    return Answer(response.status_code, response.raw_headers, bytes(response.body))


async def publish_answer(scope: Scope, topic: str, chunks: AsyncIterator[bytes]) -> Answer:
    """The answer to ``POST /v1/topics/{topic}/messages``: the publish, or its problem.
    PublishEndpoint's, and the route's below ASGI (server/direct_publish.py)."""
    try:
        status, body, forwarded = await publish_records(
            app_services(scope["app"]),
            scope,
            topic,
            _last_query_value(scope["query_string"], "acks"),
            _header(scope, b"content-length"),
            _header(scope, b"content-type"),
            chunks,
        )
    except HeraldError as exc:
        log_server_error(scope["method"], scope["path"], exc)
        return answer_of(herald_error_response(exc))
    headers = [(b"content-length", b"%d" % len(body))]
    if body:
        headers.append(_JSON_HEADERS)
    if forwarded:
        headers.append((_FORWARDED_RECORDS, b"%d" % forwarded))
    return Answer(status, headers, body)


def _last_query_value(query_string: bytes, key: str) -> str | None:
    """What Starlette's ``request.query_params.get(key)`` gives: the last value."""
    if not query_string:
        return None
    text = query_string.decode("latin-1")
    if b"%" in query_string or b"+" in query_string:
        pairs = parse_qsl(text, keep_blank_values=True)
    else:
        # Nothing to unquote: parse_qsl's own split, without its ~20 µs of generality
        # (issue 27 §2) — empty parts skipped, a part without "=" a blank value.
        split = (part.partition("=") for part in text.split("&") if part)
        pairs = [(name, value) for name, _, value in split]
    value = None
    for name, item in pairs:
        if name == key:
            value = item
    return value


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            text: str = value.decode("latin-1")
            return text
    return None
