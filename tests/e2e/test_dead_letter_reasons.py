"""PROTOCOL §8 "Dead letters say why": herald-source-subscription and
herald-source-last-error on every dead letter, over real sockets."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any

import httpx

from tests.conftest import HeraldProcess, free_port
from tests.e2e.test_redelivery import FAST_BACKOFF, consumer, one_record
from tests.subscribers import make_subscription, publish, recv_json, send_json
from tests.webhooks.receiver import Answer, Receiver

SECRET = "whsec_" + base64.b64encode(b"herald-test-secret-0123456789ab").decode()


async def dead_letter(http: httpx.AsyncClient, dead: str, offset: int = 0) -> dict[str, Any]:
    """The dead letter at ``offset`` of ``dead`` (long-polled until it is there)."""
    for _ in range(20):  # bounded: each read waits up to 10 s server-side
        read = await http.get(
            f"/v1/topics/{dead}/partitions/0/messages",
            params={"offset": offset, "limit": 1, "wait_ms": 10_000},
        )
        if read.status_code == 200 and read.json()["messages"]:
            letter: dict[str, Any] = read.json()["messages"][0]
            return letter
        await asyncio.sleep(0.05)  # the dead-letter topic may not exist yet
    raise AssertionError(f"no dead letter in {dead}")


async def test_dead_letter_names_its_subscription_and_the_nack_reason(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name, dead = unique("dw"), unique("dws"), unique("dead")
    await make_subscription(http, name, topic, max_deliveries=2, dead_letter_topic=dead)
    await publish(http, topic, ["a"], headers={"h": "v"})
    async with consumer(shared_herald, name, 5) as ws:
        await recv_json(ws)
        record = await one_record(ws)
        await send_json(ws, {"type": "nack", "ids": [record["id"]], "delay_ms": 0})
        record = await one_record(ws)
        assert record["attempt"] == 2
        # The last thing that happened wins: this reason, not the earlier bare nack.
        await send_json(
            ws, {"type": "nack", "ids": [record["id"]], "delay_ms": 0, "reason": "bad payload"}
        )
        letter = await dead_letter(http, dead)
    headers = letter["headers"]
    assert headers["h"] == "v"
    assert headers["herald-source-subscription"] == name
    assert headers["herald-source-last-error"] == "bad payload"
    assert headers["herald-source-reason"] == "max_deliveries"
    assert headers["herald-source-deliveries"] == "2"


async def test_nack_without_reason_says_nack(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name, dead = unique("dn"), unique("dns"), unique("dead")
    await make_subscription(http, name, topic, max_deliveries=1, dead_letter_topic=dead)
    await publish(http, topic, ["a"])
    async with consumer(shared_herald, name, 5) as ws:
        await recv_json(ws)
        record = await one_record(ws)
        await send_json(ws, {"type": "nack", "ids": [record["id"]]})
        letter = await dead_letter(http, dead)
    assert letter["headers"]["herald-source-last-error"] == "nack"
    assert letter["headers"]["herald-source-subscription"] == name


async def test_deadline_then_disconnect_says_disconnect(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    """An expired deadline says "ack deadline"; a consumer going away says "disconnect"."""
    topic, name, dead = unique("dd"), unique("dds"), unique("dead")
    await make_subscription(
        http, name, topic, max_deliveries=1, dead_letter_topic=dead, ack_deadline_ms=200,
        retry_backoff=FAST_BACKOFF,
    )  # fmt: skip
    await publish(http, topic, ["late"])
    async with consumer(shared_herald, name, 5) as ws:
        await recv_json(ws)
        await one_record(ws)  # never acked: its 200 ms deadline passes
        letter = await dead_letter(http, dead)
    assert letter["headers"]["herald-source-last-error"] == "ack deadline"

    # A deadline the disconnect comes well within, on a loaded host too.
    answer = await http.patch(f"/v1/subscriptions/{name}", json={"ack_deadline_ms": 60_000})
    assert answer.status_code == 200, answer.text
    await publish(http, topic, ["gone"])
    async with consumer(shared_herald, name, 5) as ws:
        await recv_json(ws)
        await one_record(ws)
    letter = await dead_letter(http, dead, offset=1)
    assert letter["value"] == "gone"
    assert letter["headers"]["herald-source-last-error"] == "disconnect"


async def test_nack_reason_over_256_characters_is_a_bad_frame(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("dl"), unique("dls")
    await make_subscription(http, name, topic)
    await publish(http, topic, ["a"])
    async with consumer(shared_herald, name, 1) as ws:
        await recv_json(ws)
        record = await one_record(ws)
        for bad in ("x" * 257, 5):
            await send_json(ws, {"type": "nack", "ids": [record["id"]], "reason": bad})
            frame = await recv_json(ws)
            assert (frame["type"], frame["code"]) == ("error", "bad_frame")
        # Nothing changed: the record is still in flight and acks fine; 256 is accepted.
        await send_json(ws, {"type": "nack", "ids": [], "reason": "y" * 256})
        await send_json(ws, {"type": "ack", "ids": [record["id"]], "req": 1})
        frame = await recv_json(ws)
        assert frame == {"type": "acked", "req": 1, "ok": [record["id"]], "unknown": []}


async def test_webhook_dead_letter_says_http_status(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name, dead = unique("dh"), unique("dhs"), unique("dead")
    with Receiver([SECRET], lambda _: Answer(500)) as receiver:
        await make_subscription(
            http, name, topic, max_deliveries=2, dead_letter_topic=dead,
            retry_backoff=FAST_BACKOFF, push={"url": receiver.url, "secret": SECRET},
        )  # fmt: skip
        await publish(http, topic, ["x"])
        letter = await dead_letter(http, dead)
    assert letter["headers"]["herald-source-last-error"] == "http 500"
    assert letter["headers"]["herald-source-subscription"] == name


async def test_webhook_dead_letter_says_connection_refused(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name, dead = unique("dc"), unique("dcs"), unique("dead")
    nobody = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    await make_subscription(
        http, name, topic, max_deliveries=1, dead_letter_topic=dead,
        push={"url": nobody, "secret": SECRET},
    )  # fmt: skip
    await publish(http, topic, ["x"])
    letter = await dead_letter(http, dead)
    assert letter["headers"]["herald-source-last-error"] == "connection refused"
