"""Topic routes of PROTOCOL §2: create/inspect/delete, read; publish is server/publish.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from cluster.errors import LeaderUnavailable
from herald.protocol.errors import OffsetOutOfRange, PartitionNotFound, TopicConflict, TopicNotFound
from herald.protocol.names import check_name
from server.errors import ServiceStopping
from server.http import JSON, json_body, json_response, topic_body
from server.limits import client_address
from server.peers import FORWARDED
from server.publish import cluster_defaults
from server.routes_cluster import cluster_partitions
from server.runtime import Services, services
from server.validation import (
    check_single_node_replication,
    parse_read_query,
    parse_topic_config,
    path_int,
    topic_config_matches,
)
from storage.config import TopicConfig
from storage.record import Record
from storage.topic import Topic
from subscribers.wire import json_array, record_json


def get_topic(request: Request, name: str) -> Topic:
    topic: Topic | None = services(request).storage.topic(name)
    if topic is None:
        raise TopicNotFound(f"topic {name!r} does not exist")
    return topic


# ------------------------------------------------------------------ admin


async def put_topic(request: Request) -> Response:
    name = check_name(request.path_params["topic"])
    # PROTOCOL §2: the body is optional (an empty one is all defaults); JSON null is not.
    config, given = parse_topic_config(await json_body(request, optional=True))
    state = services(request)
    if state.cluster is not None:
        return await _put_topic_cluster(request, state, name, config, given)
    check_single_node_replication(config)
    topic, created = await state.storage.ensure_topic(
        name, config, max_topics=state.config.max_topics
    )
    if created:
        return json_response(single_node_body(state, topic), 201)
    # PROTOCOL §2: 200 only if every field *given* equals the existing config.
    if not topic_config_matches(topic.config, config, given):
        raise TopicConflict(
            f"topic {name!r} exists with a different config", config=topic.config.to_dict()
        )
    return json_response(single_node_body(state, topic), 200)


async def _put_topic_cluster(
    request: Request, state: Services, name: str, config: TopicConfig, given: frozenset[str]
) -> Response:
    assert state.cluster is not None
    config = cluster_defaults(state, config, given)
    outcome = await state.cluster.create_topic(name, config, max_topics=state.config.max_topics)
    if not outcome.created and not topic_config_matches(outcome.config, config, given):
        raise TopicConflict(
            f"topic {name!r} exists with a different config", config=outcome.config.to_dict()
        )
    topic = state.storage.topic(name)
    if topic is None:
        raise LeaderUnavailable(f"topic {name!r} is being created; try again")
    return json_response(await cluster_topic_body(state, topic), 201 if outcome.created else 200)


async def cluster_topic_body(state: Services, topic: Topic) -> dict[str, Any]:
    """PROTOCOL §7: each partition with its leader, epoch, replicas and ISR; offsets and
    size as its leader reports them (this node's copy may be behind, or absent)."""
    body = topic_body(topic)
    cluster = state.cluster
    assert cluster is not None
    leaders = {p.partition for p in topic.partitions if cluster.leads(topic.name, p.partition)}
    reports: dict[int, dict[str, Any]] = {}
    if len(leaders) < len(topic.partitions):
        rows = await cluster_partitions(state)
        reports = {r["partition"]: r for r in rows if r["topic"] == topic.name}
    for entry in body["partitions"]:
        number = entry["partition"]
        entry.update(cluster.partition_summary(topic.name, number))
        report = reports.get(number)
        if number not in leaders and report is not None and report.get("log_end") is not None:
            entry["start_offset"] = report.get("start_offset", entry["start_offset"])
            entry["end_offset"] = report["high_watermark"]
            entry["bytes"] = report.get("bytes", entry["bytes"])
    return body


async def get_topic_route(request: Request) -> Response:
    name = check_name(request.path_params["topic"])
    state = services(request)
    topic = get_topic(request, name)
    if state.cluster is not None:
        return json_response(await cluster_topic_body(state, topic))
    return json_response(single_node_body(state, topic))


def single_node_body(state: Services, topic: Topic) -> dict[str, Any]:
    """PROTOCOL §7: a single node leads every partition it has, alone, at epoch 0."""
    body = topic_body(topic)
    node = state.config.node_id
    for entry in body["partitions"]:
        entry.update({"leader": node, "epoch": 0, "replicas": [node], "isr": [node]})
    return body


async def list_topics(request: Request) -> Response:
    topics = sorted(services(request).storage.topics(), key=lambda t: t.name)
    return json_response(
        {
            "topics": [
                {"name": t.name, "config": t.config.to_dict(), "auto_created": t.auto_created}
                for t in topics
            ]
        }
    )


async def delete_topic(request: Request) -> Response:
    name = check_name(request.path_params["topic"])
    state = services(request)
    if state.cluster is not None:
        # etcd first; every node (this one included) then deletes its copy as on a
        # single node: subscriptions and tails end, then the files go.
        if not await state.cluster.delete_topic(name):
            raise TopicNotFound(f"topic {name!r} does not exist")
        return Response(status_code=204)
    async with state.admin_lock:
        get_topic(request, name)
        # PROTOCOL §2/§3: its subscriptions go first, so their consumers (and the
        # topic's tails) get 4410 before the log they read from disappears.
        await state.engine.topic_deleted(name)
        state.sockets.tails.topic_deleted(name)
        await state.storage.delete_topic(name)
    return Response(status_code=204)


# ------------------------------------------------------------------ read


async def read_messages(request: Request) -> Response:
    state = services(request)
    name = check_name(request.path_params["topic"])
    query = parse_read_query(request.query_params)
    topic = get_topic(request, name)
    number = path_int(request.path_params["partition"], "partition")
    if not 0 <= number < len(topic.partitions):
        raise PartitionNotFound(f"topic {name!r} has no partition {number}")
    partition = topic.partitions[number]
    if state.cluster is not None:
        if not state.cluster.leads(name, number):
            return await _read_at_leader(request, state, name, number)
        if not await state.cluster.may_serve(name):
            # PROTOCOL §7 (stale reads): cut off from etcd alone, another node may lead
            # the partition now; or this copy is of a topic since deleted and re-created.
            raise LeaderUnavailable(
                f"this node may no longer lead partition {number} of {name!r}: try again"
            )
        topic = get_topic(request, name)  # the copy checked, not one replaced meanwhile
        if number >= len(topic.partitions):
            raise PartitionNotFound(f"topic {name!r} has no partition {number}")
        partition = topic.partitions[number]
        role = state.cluster.leader_role(name, number)
        if role is not None and not role.replica.high_watermark_settled:
            # A new leader until its followers fetched: the old leader may have committed
            # more than the mark this node inherited (Kafka: OFFSET_NOT_AVAILABLE).
            raise LeaderUnavailable(f"partition {number} of {name!r} has a new leader; try again")
    if query.offset is not None and query.offset > partition.end_offset:
        raise OffsetOutOfRange(
            f"offset {query.offset} is past the end of partition {number} ({partition.end_offset})",
            start_offset=partition.start_offset,
            end_offset=partition.end_offset,
        )
    max_bytes: int = state.config.max_read_bytes
    deadline = time.monotonic() + query.wait_ms / 1000
    while True:
        if query.timestamp is not None:
            offset = await partition.offset_for_timestamp(query.timestamp)
        else:
            offset = max(query.offset or 0, partition.start_offset)
        records: list[Record] = await partition.read(offset, query.limit, max_bytes)
        if query.timestamp is not None:
            # A record appended between the lookup and the read may predate T.
            records = [r for r in records if r.timestamp >= query.timestamp]
        remaining = deadline - time.monotonic()
        if records or remaining <= 0 or state.stopping.is_set():
            break
        await _wait_for_append(partition, offset, remaining, state.stopping)
    next_offset = records[-1].offset + 1 if records else offset
    body = (
        b'{"messages":'
        + json_array(record_json(name, r) for r in records)
        + b',"next_offset":'
        + str(next_offset).encode()
        + b"}"
    )
    return Response(body, media_type=JSON)


async def _read_at_leader(request: Request, state: Services, name: str, number: int) -> Response:
    """PROTOCOL §7: reads are consistent from any node — the leader's high watermark is
    the one a 200 at acks=all moved, so a read is answered by the leader."""
    assert state.cluster is not None and state.peers is not None
    if request.headers.get(FORWARDED) is not None:
        raise LeaderUnavailable(f"this node no longer leads partition {number} of {name!r}")
    view = state.cluster.require_leader(name, number)
    assert view.leader_url is not None
    answer = await state.peers.get(
        view.leader_url,
        request.url.path,
        request.scope["query_string"],
        request.headers.get("authorization"),
        client_address(request.scope),
    )
    headers = {k: v for k, v in answer.headers.items() if k.lower() in _PASSED_ON}
    return Response(answer.content, status_code=answer.status_code, headers=headers)


_PASSED_ON = frozenset({"content-type", "retry-after"})


async def _wait_for_append(
    partition: Any, offset: int, seconds: float, stopping: asyncio.Event
) -> None:
    """Long-poll: until the partition grows past ``offset``, the timeout, or SIGTERM."""
    appended = asyncio.ensure_future(partition.wait_for(offset, seconds))
    stopped = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait((appended, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (appended, stopped):
            task.cancel()
        await asyncio.gather(appended, stopped, return_exceptions=True)
    if appended.done() and not appended.cancelled() and appended.exception() is not None:
        raise ServiceStopping("the partition was closed")
