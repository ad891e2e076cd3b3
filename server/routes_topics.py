"""Topic routes of PROTOCOL §2: create/inspect/delete, read; publish is server/publish.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from server.errors import ServiceStopping
from server.http import JSON, json_body, json_response, topic_body
from server.publish import publish_route
from server.routing import method_route
from server.runtime import services
from server.validation import (
    check_name,
    parse_read_query,
    parse_topic_config,
    path_int,
    topic_config_matches,
)
from storage.errors import (
    OffsetOutOfRange,
    PartitionNotFound,
    TopicConflict,
    TopicNotFound,
)
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
    topic, created = await services(request).storage.ensure_topic(name, config)
    if created:
        return json_response(topic_body(topic), 201)
    # PROTOCOL §2: 200 only if every field *given* equals the existing config.
    if not topic_config_matches(topic.config, config, given):
        raise TopicConflict(
            f"topic {name!r} exists with a different config", config=topic.config.to_dict()
        )
    return json_response(topic_body(topic), 200)


async def get_topic_route(request: Request) -> Response:
    name = check_name(request.path_params["topic"])
    return json_response(topic_body(get_topic(request, name)))


async def list_topics(request: Request) -> Response:
    topics = sorted(services(request).storage.topics(), key=lambda t: t.name)
    return json_response(
        {"topics": [{"name": t.name, "config": t.config.to_dict()} for t in topics]}
    )


async def delete_topic(request: Request) -> Response:
    name = check_name(request.path_params["topic"])
    state = services(request)
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


routes = [
    method_route("/v1/topics", GET=list_topics),
    method_route("/v1/topics/{topic}", GET=get_topic_route, PUT=put_topic, DELETE=delete_topic),
    method_route("/v1/topics/{topic}/messages", POST=publish_route),
    method_route("/v1/topics/{topic}/partitions/{partition}/messages", GET=read_messages),
]
