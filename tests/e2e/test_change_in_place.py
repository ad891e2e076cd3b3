"""PROTOCOL §8 "Change in place": PATCH /v1/subscriptions/{name} against a real server."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import HeraldProcess
from tests.e2e import ack, stats
from tests.e2e.test_redelivery import FAST_BACKOFF, ack_until_ok, consumer, one_record
from tests.subscribers import (
    close_code,
    make_subscription,
    nothing_arrives,
    publish,
    receive_records,
    recv_json,
)
from tests.webhooks.receiver import Receiver, body_json

SECRET = "whsec_" + base64.b64encode(b"herald-test-secret-0123456789ab").decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"herald-other-secret-0123456789a").decode()
PUSH = {"url": "http://127.0.0.1:9/x", "secret": SECRET}  # nothing listens on port 9


async def patch(http: httpx.AsyncClient, name: str, body: Any) -> httpx.Response:
    return await http.patch(f"/v1/subscriptions/{name}", json=body)


async def config_of(http: httpx.AsyncClient, name: str) -> dict[str, Any]:
    reply = await http.get(f"/v1/subscriptions/{name}")
    assert reply.status_code == 200, reply.text
    config: dict[str, Any] = reply.json()["config"]
    return config


async def test_patch_changes_the_given_fields_and_null_restores_defaults(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("cp"), unique("cps")
    await make_subscription(
        http, name, topic, max_deliveries=9, dead_letter_topic=unique("dead"),
        retry_backoff={"min_ms": 10, "max_ms": 20},
    )  # fmt: skip
    reply = await patch(
        http,
        name,
        {"ack_deadline_ms": 1234, "max_in_flight": 7, "max_deliveries": None,
         "dead_letter_topic": None, "retry_backoff": {"max_ms": 5000}},
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["name"] == name and "stats" in body
    config = body["config"]
    assert (config["ack_deadline_ms"], config["max_in_flight"]) == (1234, 7)
    assert config["max_deliveries"] == 5, "null goes back to the default"
    assert config["dead_letter_topic"] is None
    # RFC 7396: an object is merged; min_ms was left out, so it is kept.
    assert config["retry_backoff"] == {"min_ms": 10, "max_ms": 5000}
    assert await config_of(http, name) == config
    assert (await patch(http, name, {"retry_backoff": None})).json()["config"]["retry_backoff"] == {
        "min_ms": 100,
        "max_ms": 60000,
    }
    assert (await patch(http, name, {})).json()["config"]["max_in_flight"] == 7, (
        "{} changes nothing"
    )


async def test_fixed_fields_conflict_unless_unchanged(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("cf"), unique("cfs")
    await make_subscription(http, name, topic)  # start earliest (make_subscription's default)
    same = {"topic": topic, "start": "earliest", "delivery": "at_least_once",
            "ordered_by_key": False, "max_in_flight": 3}  # fmt: skip
    reply = await patch(http, name, same)
    assert reply.status_code == 200, reply.text
    assert reply.json()["config"]["max_in_flight"] == 3
    for change in (
        {"topic": unique("other")},
        {"start": "latest"},
        {"delivery": "at_most_once"},
        {"ordered_by_key": True},
        {"start": {"timestamp": 5}},
    ):
        reply = await patch(http, name, {**change, "max_in_flight": 99})
        assert reply.status_code == 409, (change, reply.text)
        assert reply.json()["code"] == "subscription_conflict"
    assert (await config_of(http, name))["max_in_flight"] == 3, "a refused patch changes nothing"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"colour": "red"}, 400, "bad_request"),
        ({"max_in_flight": "7"}, 400, "bad_request"),
        ({"max_in_flight": 1.5}, 400, "bad_request"),
        ({"retry_backoff": {"min_ms": 1, "slope": 2}}, 400, "bad_request"),
        ({"push": {"secret": SECRET}}, 400, "bad_request"),
        ([1], 400, "bad_request"),
        ({"max_in_flight": 0}, 400, "validation_error"),
        ({"ack_deadline_ms": 99}, 400, "validation_error"),
        ({"max_deliveries": 1001}, 400, "validation_error"),
        ({"retry_backoff": {"min_ms": 70000}}, 400, "validation_error"),
        # PROTOCOL §2: an integral float is the integer it is, so inverted bounds given
        # as floats are out of range (issue 29: the fuzz oracle took them for malformed).
        ({"retry_backoff": {"min_ms": 5000.0, "max_ms": 1000.0}}, 400, "validation_error"),
        (
            {"push": {**PUSH, "breaker": {"open_ms": 5e3, "max_open_ms": 1e3}}},
            400,
            "validation_error",
        ),
        ({"push": {**PUSH, "breaker": {"failures": 2.5}}}, 400, "bad_request"),
        ({"dead_letter_topic": "no/slash"}, 400, "invalid_name"),
    ],
)
async def test_bad_patches_are_refused_and_change_nothing(
    shared_herald: HeraldProcess,
    http: httpx.AsyncClient,
    unique: Callable[[str], str],
    body: Any,
    status: int,
    code: str,
) -> None:
    topic, name = unique("cb"), unique("cbs")
    await make_subscription(http, name, topic)
    before = await config_of(http, name)
    reply = await patch(http, name, body)
    assert (reply.status_code, reply.json()["code"]) == (status, code), reply.text
    assert await config_of(http, name) == before


async def test_integral_floats_in_a_patch_are_the_integers_they_are(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("ci"), unique("cis")
    await make_subscription(http, name, topic)
    breaker = {"failures": 3.0, "open_ms": 2000.0, "max_open_ms": 4000.0}
    reply = await patch(
        http,
        name,
        {"max_in_flight": 7.0, "retry_backoff": {"min_ms": 10.0, "max_ms": 20.0},
         "push": {**PUSH, "breaker": breaker}},
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    config = reply.json()["config"]
    assert config["max_in_flight"] == 7
    assert config["retry_backoff"] == {"min_ms": 10, "max_ms": 20}
    assert config["push"]["breaker"] == {"failures": 3, "open_ms": 2000, "max_open_ms": 4000}


async def test_patch_of_a_missing_subscription_is_404(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    reply = await patch(http, unique("nobody"), {"max_in_flight": 3})
    assert (reply.status_code, reply.json()["code"]) == (404, "subscription_not_found")
    not_json = await http.patch(f"/v1/subscriptions/{unique('x')}", content=b"{")
    assert (not_json.status_code, not_json.json()["code"]) == (400, "bad_request")


async def test_push_object_without_secret_on_a_plain_subscription_is_refused(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("cn"), unique("cns")
    await make_subscription(http, name, topic)
    reply = await patch(http, name, {"push": {"url": "http://127.0.0.1:9/x"}})
    assert (reply.status_code, reply.json()["code"]) == (400, "bad_request")
    assert (await config_of(http, name))["push"] is None


async def test_in_flight_records_keep_their_deadline_and_new_sends_get_the_new_one(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("cd"), unique("cds")
    # max_deliveries 0: the new record comes back until it is acked, however late.
    await make_subscription(
        http, name, topic, ack_deadline_ms=30_000, retry_backoff=FAST_BACKOFF, max_deliveries=0
    )
    await publish(http, topic, ["old"])
    async with consumer(shared_herald, name, 10) as ws:
        await recv_json(ws)
        old = await one_record(ws)
        reply = await patch(http, name, {"ack_deadline_ms": 200})
        assert reply.status_code == 200, reply.text
        await publish(http, topic, ["new"])
        new = await one_record(ws)
        assert new["value"] == "new"
        # The new send's 200 ms deadline passes; the old one keeps its 30 s.
        again = await one_record(ws)
        assert (again["id"], again["attempt"]) == (new["id"], 2)
        # Meanwhile only the new record comes back (every 200 ms + backoff), never the old.
        seen: list[dict[str, Any]] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.6):
                while True:
                    frame = await recv_json(ws)
                    seen.extend(frame.get("messages", []))
        assert {r["id"] for r in seen} <= {new["id"]}, "the old record is not redelivered"
        reply = await ack(ws, [old["id"]])
        assert reply["ok"] == [old["id"]], "an in-flight record was kept"
        # The new one is in flight 200 ms at a time, between backoffs: acked once it is.
        await ack_until_ok(ws, again)
    current = await stats(http, name)
    assert (current["acked_total"], current["in_flight"], current["backlog"]) == (2, 0, 0)


async def test_raising_max_in_flight_lets_more_records_go_at_once(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("cm"), unique("cms")
    await make_subscription(http, name, topic, max_in_flight=1)
    await publish(http, topic, [1, 2, 3])
    async with consumer(shared_herald, name, 10) as ws:
        await recv_json(ws)
        first = await one_record(ws)
        assert await nothing_arrives(ws, 0.3)
        assert (await patch(http, name, {"max_in_flight": 3})).status_code == 200
        rest = await receive_records(ws, 2)
        assert [r["value"] for r in [first, *rest]] == [1, 2, 3], "the cursor was kept"


async def test_push_given_starts_pushing_and_null_stops_it(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("cw"), unique("cws")
    await make_subscription(http, name, topic)
    await publish(http, topic, ["a", "b"])
    with Receiver([SECRET]) as receiver:
        reply = await patch(http, name, {"push": {"url": receiver.url, "secret": SECRET}})
        assert reply.status_code == 200, reply.text
        assert "secret" not in reply.json()["config"]["push"]
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 2)
        # A push subscription refuses WebSocket consumers (PROTOCOL §4)...
        async with consumer(shared_herald, name, 10) as ws:
            assert await close_code(ws) == 4409
        reply = await patch(http, name, {"push": None})
        assert reply.status_code == 200 and reply.json()["config"]["push"] is None
        await publish(http, topic, ["c"])
        # ...and once push is null they drain it, from where the endpoint left off.
        async with consumer(shared_herald, name, 10) as ws:
            assert (await recv_json(ws))["type"] == "ready"
            record = await one_record(ws)
            assert record["value"] == "c"
            await ack(ws, [record["id"]])
        assert len(receiver.snapshot()) == 2, "nothing more was pushed"


async def test_push_without_secret_keeps_the_old_secret(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("cs"), unique("css")
    with (
        Receiver([SECRET]) as first,
        Receiver([SECRET]) as second,
        Receiver([OTHER_SECRET]) as third,
    ):
        await make_subscription(http, name, topic, push={"url": first.url, "secret": SECRET})
        await publish(http, topic, ["one"])
        first.wait_for(lambda: len(first.acked_ids()) == 1)
        reply = await patch(http, name, {"push": {"url": second.url, "timeout_ms": 5000}})
        assert reply.status_code == 200, reply.text
        push = reply.json()["config"]["push"]
        assert (push["url"], push["timeout_ms"]) == (second.url, 5000)
        assert push["max_in_flight"] == 16, "the push object replaced the old one whole"
        await publish(http, topic, ["two"])
        second.wait_for(lambda: len(second.acked_ids()) == 1)  # verified with SECRET
        [received] = second.snapshot()
        assert body_json(received)["value"] == "two"
        reply = await patch(http, name, {"push": {"url": third.url, "secret": OTHER_SECRET}})
        assert reply.status_code == 200, reply.text
        await publish(http, topic, ["three"])
        third.wait_for(lambda: len(third.acked_ids()) == 1)
        assert len(first.snapshot()) == 1 and len(second.snapshot()) == 1


def test_a_change_survives_a_restart(herald_server: HeraldProcess) -> None:
    url = herald_server.url
    assert httpx.put(f"{url}/v1/subscriptions/s", json={"topic": "t"}).status_code == 201
    reply = httpx.patch(
        f"{url}/v1/subscriptions/s", json={"max_deliveries": 0, "ack_deadline_ms": 500}
    )
    assert reply.status_code == 200, reply.text
    herald_server.terminate()
    herald_server.restart()
    config = httpx.get(f"{url}/v1/subscriptions/s").json()["config"]
    assert (config["max_deliveries"], config["ack_deadline_ms"]) == (0, 500)
