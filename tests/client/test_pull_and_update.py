"""The SDK's Puller and Admin.update_subscription, and `herald consume --pull` /
`herald subscriptions update`, against a real server (PROTOCOL §8)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from herald import Admin, HeraldClientError, Message, Producer, Puller
from tests.client.test_cli import herald, lines
from tests.conftest import HeraldProcess, free_port
from tests.webhooks.receiver import Receiver

SECRET = "whsec_" + base64.b64encode(b"herald-test-secret-0123456789ab").decode()


async def test_puller_iterates_acks_in_batches_and_nacks_with_a_reason(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name, dead = unique("sp"), unique("sps"), unique("dead")
    url = shared_herald.url
    async with Admin(url) as admin, Producer(url) as producer:
        await admin.create_subscription(
            name, topic, start="earliest", max_deliveries=1, dead_letter_topic=dead
        )
        for n in range(5):
            await producer.send_and_wait(topic, n)
        taken: list[Message] = []
        async with Puller(url, name, max_messages=2, wait_ms=5000, limit=5) as puller:
            async for message in puller:
                taken.append(message)
                if message.value == 3:
                    await message.nack(reason="three is bad")
                else:
                    await message.ack()
        assert [m.value for m in taken] == [0, 1, 2, 3, 4]
        assert {m.subscription for m in taken} == {name} and taken[0].attempt == 1
        stats = (await admin.get_subscription(name))["stats"]  # close flushed the acks
        assert (stats["acked_total"], stats["in_flight"]) == (4, 0)
        letters = await admin.read_messages(dead, 0, offset=0, wait_ms=10_000)
        [letter] = letters["messages"]
        assert letter["headers"]["herald-source-last-error"] == "three is bad"


async def test_puller_pull_ack_and_nack_calls(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("sq"), unique("sqs")
    url = shared_herald.url
    async with Admin(url) as admin, Producer(url) as producer, Puller(url, name) as puller:
        await admin.create_subscription(name, topic, start="earliest")
        assert await puller.pull(wait_ms=0) == []
        waiting = asyncio.create_task(puller.pull(max_messages=10, wait_ms=20_000))
        await producer.send_and_wait(topic, "woken")
        [message] = await asyncio.wait_for(waiting, 15)
        assert message.value == "woken"
        await puller.nack([message.id], delay_ms=0)
        [again] = await puller.pull(wait_ms=5000)
        assert (again.id, again.attempt) == (message.id, 2)
        assert await puller.ack([again.id, "7-7"]) == {"ok": [again.id], "unknown": ["7-7"]}
        with pytest.raises(RuntimeError):
            await again.extend(1000)  # pull has no extend
        with pytest.raises(HeraldClientError) as refused:
            await puller.pull(max_messages=1001)
        assert refused.value.code == "validation_error"


async def test_admin_update_subscription(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("su"), unique("sus")
    async with Admin(shared_herald.url) as admin:
        await admin.create_subscription(name, topic, max_deliveries=9)
        body = await admin.update_subscription(name, max_in_flight=5, max_deliveries=None)
        assert (body["config"]["max_in_flight"], body["config"]["max_deliveries"]) == (5, 5)
        with pytest.raises(HeraldClientError) as conflict:
            await admin.update_subscription(name, topic=unique("other"))
        assert (conflict.value.status, conflict.value.code) == (409, "subscription_conflict")


def test_cli_consume_pull_and_subscriptions_update(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("cp"), unique("cps")
    url = shared_herald.url
    made = herald("subscriptions", "create", name, "--topic", topic, "--start", "earliest", url=url)
    assert made.returncode == 0, made.stderr
    assert herald("publish", topic, "1", "2", "3", url=url).returncode == 0
    pulled = herald("consume", name, "--pull", "--count", "3", "--wait-ms", "5000", url=url)
    assert pulled.returncode == 0, pulled.stderr
    assert [r["value"] for r in lines(pulled.stdout)] == [1, 2, 3]
    shown = json.loads(herald("subscriptions", "get", name, url=url).stdout)
    assert (shown["stats"]["acked_total"], shown["stats"]["in_flight"]) == (3, 0)

    updated = herald(
        "subscriptions", "update", name, "--max-in-flight", "9", "--dead-letter-topic", "dl",
        "--config", '{"retry_backoff": {"max_ms": 500}}', url=url,
    )  # fmt: skip
    assert updated.returncode == 0, updated.stderr
    config = json.loads(updated.stdout)["config"]
    assert (config["max_in_flight"], config["dead_letter_topic"]) == (9, "dl")
    assert config["retry_backoff"] == {"min_ms": 100, "max_ms": 500}
    reset = herald(
        "subscriptions", "update", name, "--max-in-flight", "default",
        "--dead-letter-topic", "none", url=url,
    )  # fmt: skip
    config = json.loads(reset.stdout)["config"]
    assert (config["max_in_flight"], config["dead_letter_topic"]) == (1000, None)

    with Receiver([SECRET]) as receiver:
        push = herald(
            "subscriptions", "update", name, "--push-url", receiver.url, "--push-secret", SECRET,
            url=url,
        )  # fmt: skip
        assert push.returncode == 0, push.stderr
        assert herald("publish", topic, "4", url=url).returncode == 0
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 1)
        stop = herald("subscriptions", "update", name, "--no-push", url=url)
        assert json.loads(stop.stdout)["config"]["push"] is None
    refused = herald("subscriptions", "update", name, "--max-in-flight", "0", url=url)
    assert refused.returncode != 0 and "validation_error" in refused.stderr


@pytest.mark.parametrize(
    ("method", "config"),
    [
        ("PUT", {"topic": "t", "ack_deadline_ms": 99}),
        ("PUT", {"topic": "t", "retry_backoff": {"min_ms": 500, "max_ms": 100}}),
        ("PUT", {"topic": "t", "max_in_flight": "5"}),
        ("PUT", {"topic": "t", "bogus": 1}),
        ("PUT", {"topic": "t", "push": {"url": "ftp://example.com/", "secret": SECRET}}),
        ("PATCH", {"max_deliveries": 1001}),
        ("PATCH", {"push": {"url": "http://127.0.0.1:9/", "batch": {"max_records": 0}}}),
    ],
)
async def test_a_bad_subscription_field_raises_the_servers_error_before_any_request(
    shared_herald: HeraldProcess, unique: Callable[[str], str], method: str, config: dict[str, Any]
) -> None:
    """Issue 29 §1: the SDK builds the request model the server validates with, so a
    bad field raises the HeraldClientError the server's 400 would (same code, same detail
    naming the field) without a request: an Admin pointed at no server raises it too."""
    name = unique("bad")
    async with Admin(shared_herald.url) as admin, httpx.AsyncClient() as http:
        if method == "PATCH":
            await admin.create_subscription(name, unique("t"))
        # The server's own answer to the body.
        answer = await http.request(
            method, f"{shared_herald.url}/v1/subscriptions/{name}", json=config
        )
    assert answer.status_code == 400, answer.text
    served = HeraldClientError.from_response(answer)
    async with Admin(f"http://127.0.0.1:{free_port()}", retries=1) as nowhere:
        with pytest.raises(HeraldClientError) as raised:
            if method == "PUT":
                fields = {k: v for k, v in config.items() if k != "topic"}
                await nowhere.create_subscription(name, config["topic"], **fields)
            else:
                await nowhere.update_subscription(name, **config)
    assert type(raised.value) is HeraldClientError  # not a connection error: nothing sent
    assert (raised.value.status, raised.value.code, raised.value.detail) == (
        served.status,
        served.code,
        served.detail,
    )


async def test_a_good_subscription_config_round_trips(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name, dead = unique("rt"), unique("rts"), unique("rtd")
    async with Admin(shared_herald.url) as admin:
        created = await admin.create_subscription(
            name, topic, start={"timestamp": 5.0}, ack_deadline_ms=1500,
            retry_backoff={"min_ms": 10}, dead_letter_topic=dead, ordered_by_key=True,
            filter='key = "a"',
        )  # fmt: skip
        config = created["config"]
        assert (config["ack_deadline_ms"], config["retry_backoff"]["min_ms"]) == (1500, 10)
        assert (config["dead_letter_topic"], config["ordered_by_key"]) == (dead, True)
        assert config["filter"] == 'key = "a"'
        changed = await admin.update_subscription(name, filter=None, retry_backoff={"max_ms": 900})
        assert changed["config"]["filter"] is None
        assert changed["config"]["retry_backoff"] == {"min_ms": 10, "max_ms": 900}
