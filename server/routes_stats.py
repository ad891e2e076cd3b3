"""The console's aggregate: `GET /v1/stats`, the stats WebSocket, and the dead-letter
redrive route (its work is delivery/redrive.py).

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
from collections.abc import Sequence
from dataclasses import asdict
from importlib import metadata

import msgspec
from msgspec import UNSET, UnsetType
from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from delivery.config import SubscriptionConfig
from delivery.engine import AttachedConsumer
from herald.protocol.close_codes import CloseCode
from herald.protocol.errors import SubscriptionNotFound, ValidationError
from herald.protocol.names import check_name
from herald.protocol.snapshot import (
    ConsumerView,
    ServerHistory,
    ServerInfo,
    StatsFrame,
    StatsResponse,
    StatsSnapshot,
    SubscriptionSnapshot,
    Totals,
)
from herald.protocol.stats import PartitionStats, PushStats
from herald.protocol.subscriptions import SubscriptionConfigView
from herald.protocol.topics import Topic as TopicView
from herald.protocol.unchecked import unchecked_struct
from server.http import (
    encode_model,
    is_admin,
    json_body,
    json_response,
    model_response,
    shown_to_non_admin,
    topic_body,
)
from server.runtime import Services, services
from server.validation import parse_redrive
from storage.topic import Topic
from storage.writer import wall_clock_ms

try:
    VERSION = metadata.version("herald")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "0+unknown"

STATS_INTERVAL_S = 1.0
# The parts the server builds as JSON objects for other answers too (a topic, a
# subscription's config, its push members): taken into the snapshot's models as they
# are, their constraints not checked again (the server made them).
TOPIC_VIEW = unchecked_struct(TopicView)
CONFIG_VIEW = unchecked_struct(SubscriptionConfigView)
PUSH_VIEW = unchecked_struct(PushStats)
# The totals that are sums of the subscriptions' stats (over the cluster, GET /v1/stats).
SUMMED_STATS = Totals.__struct_fields__[Totals.__struct_fields__.index("delivered_total") :]


# ------------------------------------------------------------------ snapshot


async def oldest_unacked_age_ms(
    topic: Topic, floors: Sequence[PartitionStats], now_ms: int
) -> int | None:
    """Age of the oldest record at or above an ack floor: one cached read per partition
    with a backlog, so the console can show it every second."""
    oldest: int | None = None
    for floor in floors:
        number, offset = floor.partition, floor.ack_floor
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


async def subscription_snapshot(state: Services, name: str, now_ms: int) -> SubscriptionSnapshot:
    engine = state.engine
    config: SubscriptionConfig = engine.get(name)
    stats = engine.stats_of(name)
    topic: Topic | None = state.storage.topic(config.topic)
    age = None
    if topic is not None and stats.backlog > 0:
        age = await oldest_unacked_age_ms(topic, stats.partitions, now_ms)
    pushed = state.webhooks.stats(name)
    push = None if pushed is None else msgspec.convert(pushed, PUSH_VIEW)
    pause = engine.pause_reason(name)
    if push is not None and push.endpoint_state == "open":  # PROTOCOL §4: no credit granted
        pause = "circuit_open"
    return SubscriptionSnapshot(
        name=name,
        topic=config.topic,
        config=msgspec.convert(config.public_dict(), CONFIG_VIEW),
        stats=stats,
        push=push,
        pause_reason=pause,  # type: ignore[arg-type]  # delivery/events.py PauseReason's values
        oldest_unacked_age_ms=age,
        consumers=consumer_views(engine.consumers_of(name)),
    )


def consumer_views(consumers: list[AttachedConsumer]) -> list[ConsumerView]:
    """docs/protocol.md "Stats": each connected consumer with its address, outstanding
    credit, records in flight and since when it is connected (a pull consumer has no
    connection: its address and connected_ms are null)."""
    return [
        ConsumerView(
            id=consumer.id,
            address=getattr(consumer.sink, "address", None),
            credit=consumer.credit,
            in_flight=consumer.in_flight,
            connected_ms=getattr(consumer.sink, "connected_ms", None),
        )
        for consumer in consumers
    ]


async def snapshot(state: Services) -> StatsSnapshot:
    now_ms = wall_clock_ms()
    topics = sorted(state.storage.topics(), key=lambda t: t.name)
    subscriptions = []
    for name in sorted(state.engine.names()):
        with contextlib.suppress(SubscriptionNotFound):  # deleted while we built this
            subscriptions.append(await subscription_snapshot(state, name, now_ms))
    started_ms: int = state.started_ms
    return StatsSnapshot(
        server=ServerInfo(
            version=VERSION,
            now_ms=now_ms,
            started_ms=started_ms,
            uptime_ms=max(0, now_ms - started_ms),
        ),
        totals=totals(topics, subscriptions),
        topics=[msgspec.convert(topic_body(t), TOPIC_VIEW) for t in topics],
        subscriptions=subscriptions,
    )


def totals(topics: list[Topic], subscriptions: list[SubscriptionSnapshot]) -> Totals:
    """Sums over the topics and subscriptions listed."""
    return Totals(
        topics=len(topics),
        subscriptions=len(subscriptions),
        published_records_total=sum(t.messages_total for t in topics),
        published_bytes_total=sum(t.bytes_total for t in topics),
        storage_bytes=sum(p.size_bytes for t in topics for p in t.partitions),
        **subscription_totals(subscriptions),
    )


def subscription_totals(subscriptions: list[SubscriptionSnapshot]) -> dict[str, int]:
    return {member: sum(getattr(s.stats, member) for s in subscriptions) for member in SUMMED_STATS}


async def get_stats(request: Request) -> Response:
    state = services(request)
    found = await snapshot(state)
    if state.cluster is not None and request.query_params.get("scope") != "node":
        found = await _with_cluster_subscriptions(state, found)
    if not is_admin(request.scope):
        found = shown_to_non_admin(found)
    history: ServerHistory | UnsetType = UNSET
    if request.query_params.get("history") == "1":  # docs/protocol.md "Stats": the charts' past
        history = state.history.body()
    body = StatsResponse(**msgspec.structs.asdict(found), history=history)
    return model_response(body)


async def get_history(request: Request) -> Response:
    """`GET /v1/stats/history?topic=NAME` or `?subscription=NAME` (docs/protocol.md
    "Stats"): one topic's or subscription's samples of the last 15 minutes, so its page's
    charts open with a picture."""
    params = request.query_params
    given = [kind for kind in ("topic", "subscription") if kind in params]
    if len(given) != 1:
        raise ValidationError("give exactly one of topic and subscription")
    history = services(request).history
    if given[0] == "topic":
        return model_response(history.topic_body(check_name(params["topic"])))
    name = check_name(params["subscription"], "subscription")
    return model_response(history.subscription_body(name))


async def _with_cluster_subscriptions(state: Services, found: StatsSnapshot) -> StatsSnapshot:
    """PROTOCOL §7: the stats of every subscription, from the node coordinating each
    (``?scope=node`` asks a node for its own); a node that does not answer within a
    second is left out."""
    cluster, peers = state.cluster, state.peers
    assert cluster is not None and peers is not None
    urls = [
        url
        for node, url in sorted((n, m.url) for n, m in cluster.membership.members.items())
        if node != cluster.node_id
    ]
    subscriptions = list(found.subscriptions)
    mine = {s.name for s in subscriptions}
    for theirs in await peers.node_stats(urls):
        for subscription in theirs:
            if subscription.name not in mine:
                mine.add(subscription.name)
                subscriptions.append(subscription)
    subscriptions.sort(key=lambda s: s.name)
    summed = msgspec.structs.replace(
        found.totals, subscriptions=len(subscriptions), **subscription_totals(subscriptions)
    )
    return msgspec.structs.replace(found, totals=summed, subscriptions=subscriptions)


async def stats_socket(websocket: WebSocket) -> None:
    """Push `{"type":"stats", ...snapshot}` every second until the client leaves or SIGTERM."""
    state = services(websocket)
    admin = is_admin(websocket.scope)
    await websocket.accept()
    stopping: asyncio.Event = state.stopping
    receiver = asyncio.ensure_future(_drain_client(websocket))
    stopped = asyncio.ensure_future(stopping.wait())
    try:
        while True:
            found = await snapshot(state)
            if not admin:  # a metrics token: push urls without user info or query
                found = shown_to_non_admin(found)
            frame = StatsFrame(**msgspec.structs.asdict(found))
            await websocket.send_text(encode_model(frame).decode())
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


async def redrive(request: Request) -> Response:
    """`POST /v1/subscriptions/{name}/redrive`: delivery/redrive.py does the work."""
    name = check_name(request.path_params["name"], "subscription")
    wanted = parse_redrive(await json_body(request, optional=True))
    state = services(request)
    result = await state.redrives.run(
        name,
        wanted.rate,
        wanted.max_records,
        stopping=state.stopping.is_set,
        reason=wanted.reason,
    )
    return json_response({"subscription": name, **asdict(result)})
