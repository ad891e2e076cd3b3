"""The workload clients: producers at acks=all and acks=1 through the SDK, a WebSocket
consumer and a pull consumer of subscriptions, tails, HTTP reads from every node, and a
topic deleted and created again now and then. Every client records what it did and
what it was shown into the History; all of them stop when ``stop`` is set.

Every record's value is a unique token ``{topic}/{incarnation}/{writer}/{seq}`` (bytes,
published as ``value_b64``), also its producer ``id``: a reader's record says which
write it came from, and a retried publish is deduplicated.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
from dataclasses import dataclass
from typing import Any

import httpx
import websockets

from herald import Consumer, HeraldClientError, HeraldConnectionError, Producer, Puller, Tail
from tests.nemesis.cluster import Cluster
from tests.nemesis.history import FAILED, OK, UNKNOWN, History, Incarnation, Seen, Write

MAIN, CHURN = "nem", "churn"
PARTITIONS = {MAIN: 2, CHURN: 1}
TOPIC_CONFIG = {"replication_factor": 3, "min_insync_replicas": 2}
WS_SUB, PULL_SUB = "nem-ws", "nem-pull"
SUB_CONFIG = {"start": "earliest", "max_deliveries": 0, "ack_deadline_ms": 5000}
BATCH = 5
SEND_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 3.0
CHURN_EVERY_S = (15.0, 30.0)


def token_of(message: dict[str, Any]) -> str:
    raw = message.get("value_b64")
    if raw is None:
        return f"<json {message.get('value')!r}>"
    return base64.b64decode(raw).decode(errors="replace")


@dataclass
class Clients:
    """What the workload shares: the cluster, the history, the stop signal, and which
    incarnation of each topic the writers currently write to."""

    cluster: Cluster
    history: History
    rng: random.Random
    stop: asyncio.Event
    incarnation: dict[str, int]
    churn_lock: asyncio.Lock  # held by the churn writer per batch, by the churn per delete

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.cluster.nodes.values()]

    def node_of(self, url: str) -> str:
        for name, node in self.cluster.nodes.items():
            if url.startswith(node.url):
                return name
        return "?"


# -- setup -------------------------------------------------------------------------------


async def put_until(
    clients: Clients, http: httpx.AsyncClient, path: str, body: dict[str, Any], what: str
) -> None:
    """PUT on any node until answered 200/201 (bounded: a minute)."""
    for attempt in range(300):
        url = clients.urls[attempt % len(clients.urls)]
        op = clients.history.invoke("create", what, clients.node_of(url), path=path)
        try:
            answer = await http.put(url + path, json=body)
        except httpx.TransportError as exc:
            clients.history.complete(op, UNKNOWN, error=repr(exc))
        else:
            if answer.status_code in (200, 201):
                clients.history.complete(op, OK, status=answer.status_code)
                return
            clients.history.complete(op, _refusal_outcome(answer), status=answer.status_code)
        await asyncio.sleep(0.2)
    raise RuntimeError(f"could not create {path} in a minute")


def _refusal_outcome(answer: httpx.Response) -> str:
    """A refused change did not happen, unless the problem says the outcome is unknown
    (PROTOCOL §7, settled 2026-11-26)."""
    try:
        body = answer.json()
    except ValueError:
        return UNKNOWN
    return UNKNOWN if isinstance(body, dict) and body.get("outcome") == "unknown" else FAILED


async def create_topic(clients: Clients, http: httpx.AsyncClient, topic: str) -> None:
    body = {"partitions": PARTITIONS[topic], **TOPIC_CONFIG}
    await put_until(clients, http, f"/v1/topics/{topic}", body, f"create-{topic}")
    number = clients.incarnation.get(topic, 0) + 1
    clients.incarnation[topic] = number
    clients.history.incarnations.append(Incarnation(topic, number, clients.history.now()))


async def setup(clients: Clients) -> None:
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
        for topic in (MAIN, CHURN):
            await create_topic(clients, http, topic)
        for sub in (WS_SUB, PULL_SUB):
            body = {"topic": MAIN, **SUB_CONFIG}
            await put_until(clients, http, f"/v1/subscriptions/{sub}", body, f"create-{sub}")


# -- producers ---------------------------------------------------------------------------


async def produce(clients: Clients, topic: str, acks: str, name: str, pause_s: float) -> None:
    """Batches of BATCH records, one batch at a time, until stopped."""
    history = clients.history
    seq = 0
    async with Producer(
        clients.urls, acks=acks, timeout=10.0, retries=8, max_retry_wait=2.0
    ) as producer:
        while not clients.stop.is_set():
            async with clients.churn_lock if topic == CHURN else _nothing():
                inc = clients.incarnation[topic]
                tokens = [f"{topic}/{inc}/{name}/{seq + i}" for i in range(BATCH)]
                seq += BATCH
                invoked = history.now()
                futures = [
                    producer.send(topic, token.encode(), id=token.replace("/", "."))
                    for token in tokens
                ]
                try:
                    results: list[Any] = await asyncio.wait_for(
                        asyncio.gather(*futures, return_exceptions=True), SEND_TIMEOUT_S
                    )
                except TimeoutError:
                    results = [TimeoutError()] * len(tokens)
                completed = history.now()
                for token, result in zip(tokens, results, strict=True):
                    if isinstance(result, BaseException):
                        outcome = _send_outcome(result)
                        history.writes.append(
                            Write(token, topic, inc, acks, invoked, completed, outcome)
                        )
                    else:
                        history.writes.append(
                            Write(
                                token,
                                topic,
                                inc,
                                acks,
                                invoked,
                                completed,
                                OK,
                                result.partition,
                                result.offset,
                            )
                        )
                op = history.invoke("publish", name, acks=acks, topic=topic, records=BATCH)
                op.invoked = invoked
                ok = all(not isinstance(r, BaseException) for r in results)
                history.complete(op, OK if ok else UNKNOWN)
            await _sleep(clients, pause_s)


def _send_outcome(exc: BaseException) -> str:
    # 503s and lost answers may still have been appended (PROTOCOL §7 acks): unknown.
    if isinstance(exc, HeraldClientError) and exc.status in (400, 404, 409, 413, 422):
        return FAILED
    return UNKNOWN


class _nothing:  # a context manager standing in for "no lock"
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


async def _sleep(clients: Clients, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(clients.stop.wait(), seconds)


# -- topic churn -------------------------------------------------------------------------


async def churn(clients: Clients) -> None:
    """Delete CHURN and create it again every 15-30 s, writers held off meanwhile."""
    history = clients.history
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
        while not clients.stop.is_set():
            await _sleep(clients, clients.rng.uniform(*CHURN_EVERY_S))
            if clients.stop.is_set():
                return
            async with clients.churn_lock:
                current = history.incarnations
                for i, inc in enumerate(current):
                    if inc.topic == CHURN and inc.deleting is None:
                        current[i] = Incarnation(inc.topic, inc.number, inc.created, history.now())
                await _delete_until_gone(clients, http)
                await create_topic(clients, http, CHURN)


async def _delete_until_gone(clients: Clients, http: httpx.AsyncClient) -> None:
    for attempt in range(300):
        url = clients.urls[attempt % len(clients.urls)]
        op = clients.history.invoke("delete", "churn", clients.node_of(url), topic=CHURN)
        try:
            answer = await http.delete(f"{url}/v1/topics/{CHURN}")
        except httpx.TransportError as exc:
            clients.history.complete(op, UNKNOWN, error=repr(exc))
        else:
            if answer.status_code in (200, 204, 404):
                clients.history.complete(op, OK, status=answer.status_code)
                return
            clients.history.complete(op, _refusal_outcome(answer), status=answer.status_code)
        await asyncio.sleep(0.2)
    raise RuntimeError("could not delete the churn topic in a minute")


# -- readers -----------------------------------------------------------------------------


async def read_everywhere(clients: Clients, how: str = "read", once: bool = False) -> None:
    """HTTP reads of every partition of every topic on every node, each from where that
    node got to (from 0 again once a topic is created again)."""
    position: dict[tuple[str, str, int], int] = {}
    seen_inc: dict[str, int] = {}
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
        while once or not clients.stop.is_set():
            for topic in (MAIN, CHURN):
                if seen_inc.get(topic) != clients.incarnation[topic]:
                    seen_inc[topic] = clients.incarnation[topic]
                    position = {k: v for k, v in position.items() if k[1] != topic}
                for name, node in clients.cluster.nodes.items():
                    for p in range(PARTITIONS[topic]):
                        for _ in range(10_000 if once else 1):  # once: to the end
                            at = position.get((name, topic, p), 0)
                            position[(name, topic, p)] = await _read_page(
                                clients, http, how, name, node.url, topic, p, at
                            )
                            if position[(name, topic, p)] == at:
                                break
            if once:
                return
            await _sleep(clients, 0.2)


async def _read_page(
    clients: Clients,
    http: httpx.AsyncClient,
    how: str,
    name: str,
    url: str,
    topic: str,
    partition: int,
    offset: int,
) -> int:
    history = clients.history
    op = history.invoke(how, "reader", name, topic=topic, partition=partition, offset=offset)
    path = f"{url}/v1/topics/{topic}/partitions/{partition}/messages"
    try:
        answer = await http.get(path, params={"offset": offset, "limit": 1000})
    except httpx.TransportError as exc:
        history.complete(op, FAILED, error=type(exc).__name__)
        return offset
    if answer.status_code != 200:
        history.complete(op, FAILED, status=answer.status_code)
        return offset
    body = answer.json()
    at = history.now()
    for message in body["messages"]:
        history.seen.append(
            Seen(
                how,
                name,
                topic,
                message["partition"],
                message["offset"],
                token_of(message),
                at,
                op.invoked,
            )
        )
    history.complete(op, OK, count=len(body["messages"]))
    next_offset: int = body["next_offset"]
    return next_offset


async def tail(clients: Clients, topic: str, name: str) -> None:
    """A tail of ``topic`` from the earliest record, on one node after another."""
    history = clients.history
    turn = 0
    while not clients.stop.is_set():
        url = clients.urls[turn % len(clients.urls)]
        node = clients.node_of(url)
        turn += 1
        op = history.invoke("tail", name, node, topic=topic)
        count = 0
        try:
            async with Tail(url, topic, start="earliest", open_timeout=5.0) as stream:
                async for message in _until_stopped(clients, stream):
                    count += 1
                    history.seen.append(
                        Seen(
                            "tail",
                            node,
                            topic,
                            message.partition,
                            message.offset,
                            _message_token(message.value),
                            history.now(),
                            op.invoked,
                        )
                    )
        except (
            HeraldClientError,
            HeraldConnectionError,
            OSError,
            TimeoutError,
            # the SDK's Tail lets this one through on a lost connection (seen with seed 10)
            websockets.ConnectionClosed,
        ) as exc:
            history.complete(op, FAILED, count=count, error=type(exc).__name__)
            await _sleep(clients, 0.5)
        else:
            history.complete(op, OK, count=count)


async def _until_stopped(clients: Clients, stream: Any) -> Any:
    """The stream's messages until ``stop`` is set (checked between messages and every
    second while none comes)."""
    iterator = stream.__aiter__()
    while not clients.stop.is_set():
        try:
            yield await asyncio.wait_for(iterator.__anext__(), 1.0)
        except TimeoutError:
            continue
        except StopAsyncIteration:
            return


def _message_token(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return f"<json {value!r}>"


async def consume(clients: Clients, stop: asyncio.Event) -> None:
    """A WebSocket consumer of WS_SUB over every node, acking everything."""
    history = clients.history
    op = history.invoke("consume", "ws-consumer", sub=WS_SUB)
    count = 0
    try:
        async with Consumer(clients.urls, WS_SUB, credit=100, max_backoff=1.0) as consumer:
            async for message in _until_event(stop, consumer):
                count += 1
                history.seen.append(
                    Seen(
                        "consume",
                        None,
                        MAIN,
                        message.partition,
                        message.offset,
                        _message_token(message.value),
                        history.now(),
                        op.invoked,
                    )
                )
                await message.ack()
    except (HeraldClientError, HeraldConnectionError, OSError) as exc:
        history.complete(op, FAILED, count=count, error=repr(exc))
        return
    history.complete(op, OK, count=count)


async def pull(clients: Clients, stop: asyncio.Event) -> None:
    """A pull consumer of PULL_SUB over every node, acking what each pull returns."""
    history = clients.history
    async with Puller(
        clients.urls, PULL_SUB, max_messages=100, wait_ms=1000, timeout=5.0
    ) as puller:
        while not stop.is_set():
            op = history.invoke("pull", "puller", sub=PULL_SUB)
            try:
                messages = await puller.pull()
                if messages:
                    await puller.ack([m.id for m in messages])
            except (HeraldClientError, HeraldConnectionError, OSError, httpx.HTTPError) as exc:
                history.complete(op, UNKNOWN, error=type(exc).__name__)
                await asyncio.sleep(0.5)
                continue
            for message in messages:
                history.seen.append(
                    Seen(
                        "pull",
                        None,
                        MAIN,
                        message.partition,
                        message.offset,
                        _message_token(message.value),
                        history.now(),
                        op.invoked,
                    )
                )
            history.complete(op, OK, count=len(messages))


async def _until_event(stop: asyncio.Event, stream: Any) -> Any:
    iterator = stream.__aiter__()
    while not stop.is_set():
        try:
            yield await asyncio.wait_for(iterator.__anext__(), 1.0)
        except TimeoutError:
            continue
        except StopAsyncIteration:
            return


def all_clients(clients: Clients, deliver_stop: asyncio.Event, churn_topic: bool) -> list[Any]:
    """The coroutines of the whole workload: producers, readers and tails first (they end
    on ``stop``), then the subscriptions' consumers (they end on ``deliver_stop``).
    Without ``churn_topic`` the churn topic is left alone (created once, never used)."""
    return [
        produce(clients, MAIN, "all", "all-1", 0.02),
        produce(clients, MAIN, "1", "one-1", 0.05),
        read_everywhere(clients),
        tail(clients, MAIN, "tail-main"),
        *(
            [
                produce(clients, CHURN, "all", "churn-all", 0.05),
                churn(clients),
                tail(clients, CHURN, "tail-churn"),
            ]
            if churn_topic
            else []
        ),
        consume(clients, deliver_stop),
        pull(clients, deliver_stop),
    ]
