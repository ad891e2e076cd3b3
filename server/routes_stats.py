"""The console's aggregate: `GET /v1/stats`, the stats WebSocket, and dead-letter redrive.

One snapshot carries everything the console's pages show (docs/protocol.md "Stats"):
server uptime and version, totals, every topic's partitions and every
subscription's PROTOCOL §5 stats with why delivery is paused and the age of its
oldest unacked record. The WebSocket pushes the same snapshot every second, so a
browser tab costs one build per second instead of one request per topic and
subscription.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from importlib import metadata
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from delivery.close_codes import CloseCode
from delivery.config import SubscriptionConfig
from server.routes_topics import ADMIN_BODY_LIMIT, json_response, topic_body
from server.routes_webhooks import push_stats
from server.routing import method_route
from server.validation import check_name, parse_json, read_body
from storage.errors import BadRequest, HeraldError, SubscriptionNotFound, TopicNotFound
from storage.record import Acks, NewRecord, Record
from storage.topic import PublishItem, Topic, wall_clock_ms

try:
    VERSION = metadata.version("herald")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "0+unknown"

STATS_INTERVAL_S = 1.0
SOURCE_HEADER_PREFIX = "herald-source-"  # PROTOCOL §2 dead_letter_topic headers
REDRIVE_HEADER = "herald-redriven-from"
REDRIVE_DEFAULT_RATE = 500  # records/s
REDRIVE_MAX_RATE = 10_000
REDRIVE_DEFAULT_MAX = 10_000
REDRIVE_MAX = 1_000_000
REDRIVE_BATCH = 100


class RedriveConflict(HeraldError):
    code, status, title = "redrive_conflict", 409, "Conflict"


# ------------------------------------------------------------------ snapshot


async def oldest_unacked_age_ms(
    topic: Topic, floors: list[dict[str, int]], now_ms: int
) -> int | None:
    """Age of the oldest record at or above an ack floor: one cached read per partition
    with a backlog, so the console can show it every second."""
    oldest: int | None = None
    for floor in floors:
        number, offset = floor["partition"], floor["ack_floor"]
        if number >= len(topic.partitions):
            continue
        partition = topic.partitions[number]
        if offset >= partition.end_offset:
            continue
        records = await partition.read(max(offset, partition.start_offset), 1, 1 << 20)
        if records:
            ts = records[0].timestamp
            oldest = ts if oldest is None else min(oldest, ts)
    return None if oldest is None else max(0, now_ms - oldest)


async def subscription_snapshot(state: Any, name: str, now_ms: int) -> dict[str, Any]:
    engine = state.engine
    config: SubscriptionConfig = engine.get(name)
    stats = engine.stats(name)
    topic: Topic | None = state.storage.topic(config.topic)
    age = None
    if topic is not None and stats["backlog"] > 0:
        age = await oldest_unacked_age_ms(topic, stats["partitions"], now_ms)
    push = push_stats(state, name)
    pause = engine.pause_reason(name)
    if push.get("endpoint_state") == "open":  # PROTOCOL §4: the breaker grants no credit
        pause = "circuit_open"
    return {
        "name": name,
        "topic": config.topic,
        "config": config.public_dict(),
        "stats": stats,
        "push": push or None,
        "pause_reason": pause,
        "oldest_unacked_age_ms": age,
    }


async def snapshot(state: Any) -> dict[str, Any]:
    now_ms = wall_clock_ms()
    topics = sorted(state.storage.topics(), key=lambda t: t.name)
    subscriptions = []
    for name in sorted(state.engine.names()):
        with contextlib.suppress(SubscriptionNotFound):  # deleted while we built this
            subscriptions.append(await subscription_snapshot(state, name, now_ms))
    totals: dict[str, int] = {
        "topics": len(topics),
        "subscriptions": len(subscriptions),
        "published_records_total": sum(t.messages_total for t in topics),
        "published_bytes_total": sum(t.bytes_total for t in topics),
        "storage_bytes": sum(p.size_bytes for t in topics for p in t.partitions),
    }
    for member in (
        "delivered_total",
        "acked_total",
        "redelivered_total",
        "dead_lettered_total",
        "backlog",
        "in_flight",
        "consumers",
    ):
        totals[member] = sum(s["stats"][member] for s in subscriptions)
    started_ms: int = state.started_ms
    return {
        "server": {
            "version": VERSION,
            "now_ms": now_ms,
            "started_ms": started_ms,
            "uptime_ms": max(0, now_ms - started_ms),
        },
        "totals": totals,
        "topics": [topic_body(t) for t in topics],
        "subscriptions": subscriptions,
    }


async def get_stats(request: Request) -> Response:
    return json_response(await snapshot(request.app.state))


async def stats_socket(websocket: WebSocket) -> None:
    """Push `{"type":"stats", ...snapshot}` every second until the client leaves or SIGTERM."""
    state = websocket.app.state
    await websocket.accept()
    stopping: asyncio.Event = state.stopping
    receiver = asyncio.ensure_future(_drain_client(websocket))
    stopped = asyncio.ensure_future(stopping.wait())
    try:
        while True:
            body = {"type": "stats", **await snapshot(state)}
            await websocket.send_text(orjson.dumps(body).decode())
            done, _ = await asyncio.wait(
                (receiver, stopped), timeout=STATS_INTERVAL_S, return_when=asyncio.FIRST_COMPLETED
            )
            if done:
                break
    except (WebSocketDisconnect, WebSocketDisconnected, OSError):
        # uvicorn raises ClientDisconnected (an OSError) or Starlette turns it into
        # WebSocketDisconnect; a send after the close is WebSocketDisconnected.
        return
    finally:
        for task in (receiver, stopped):
            task.cancel()
        await asyncio.gather(receiver, stopped, return_exceptions=True)
    if stopping.is_set():
        with contextlib.suppress(WebSocketDisconnect, WebSocketDisconnected, OSError):
            await websocket.close(CloseCode.GOING_AWAY, "server shutting down")


async def _drain_client(websocket: WebSocket) -> None:
    """Client frames carry nothing; reading them notices the disconnect."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return


# ------------------------------------------------------------------ redrive


def _int_member(body: dict[str, Any], name: str, default: int, top: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise BadRequest(f"{name} must be an integer from 1 to {top}", field=name)
    return value


def redrive_record(record: Record, dlq: str) -> NewRecord:
    """The source record again: same value, key and headers without the herald-source-*
    ones; its id is derived from the dead-letter offset, so a retried redrive is deduplicated
    (PROTOCOL §2 `id`) instead of publishing the record twice."""
    headers = {k: v for k, v in record.headers.items() if not k.startswith(SOURCE_HEADER_PREFIX)}
    origin = f"{dlq}/{record.partition}/{record.offset}"
    headers[REDRIVE_HEADER] = origin
    return NewRecord(
        record.value, record.kind, record.key, headers, producer_id=f"redrive:{origin}"
    )


async def redrive(request: Request) -> Response:
    name = check_name(request.path_params["name"], "subscription")
    raw = await read_body(request.stream(), request.headers.get("content-length"), ADMIN_BODY_LIMIT)
    body = parse_json(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    rate = _int_member(body, "rate", REDRIVE_DEFAULT_RATE, REDRIVE_MAX_RATE)
    limit = _int_member(body, "max_records", REDRIVE_DEFAULT_MAX, REDRIVE_MAX)
    state = request.app.state
    config: SubscriptionConfig = state.engine.get(name)
    if config.dead_letter_topic is None:
        raise RedriveConflict(f"subscription {name!r} has no dead_letter_topic")
    dlq: Topic | None = state.storage.topic(config.dead_letter_topic)
    if dlq is None:
        raise TopicNotFound(f"dead-letter topic {config.dead_letter_topic!r} does not exist")
    source: Topic | None = state.storage.topic(config.topic)
    if source is None:
        raise TopicNotFound(f"topic {config.topic!r} does not exist")
    running: set[str] = state.redrives
    if name in running:
        raise RedriveConflict(f"a redrive of {name!r} is already running")
    running.add(name)
    try:
        result = await _redrive(state, dlq, source, rate, limit)
    finally:
        running.discard(name)
    return json_response({"subscription": name, "dead_letter_topic": dlq.name, **result})


async def _redrive(state: Any, dlq: Topic, source: Topic, rate: int, limit: int) -> dict[str, Any]:
    """Scan the dead-letter topic from its start to its end *as of now* — records
    dead-lettered again while this runs wait for the next redrive, so it always ends."""
    ends = [p.end_offset for p in dlq.partitions]
    counts = {"scanned": 0, "republished": 0, "duplicates": 0, "skipped": 0}
    started = time.monotonic()
    for partition, end in zip(dlq.partitions, ends, strict=True):
        offset = partition.start_offset
        while offset < end and counts["scanned"] < limit and not state.stopping.is_set():
            want = min(REDRIVE_BATCH, end - offset, limit - counts["scanned"], rate)
            records = [r for r in await partition.read(offset, want, 1 << 22) if r.offset < end]
            if not records:
                break
            offset = records[-1].offset + 1
            counts["scanned"] += len(records)
            mine = [r for r in records if r.headers.get("herald-source-topic") == source.name]
            counts["skipped"] += len(records) - len(mine)
            if mine:
                items = [PublishItem(redrive_record(r, dlq.name)) for r in mine]
                results = await source.publish(items, Acks.ALL)
                duplicates = sum(1 for r in results if r.duplicate)
                counts["duplicates"] += duplicates
                counts["republished"] += len(results) - duplicates
            # Rate limit: never ahead of `rate` records per second since the start.
            ahead = counts["scanned"] / rate - (time.monotonic() - started)
            if ahead > 0:
                await asyncio.sleep(ahead)
    return counts


routes: list[BaseRoute] = [
    method_route("/v1/stats", GET=get_stats),
    WebSocketRoute("/v1/stats/ws", stats_socket),
    method_route("/v1/subscriptions/{name}/redrive", POST=redrive),
]
