"""PROTOCOL §8 "Pull": /pull, /ack and /nack against a real server over real sockets."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import HeraldProcess
from tests.e2e import stats
from tests.e2e.test_dead_letter_reasons import dead_letter
from tests.e2e.test_redelivery import FAST_BACKOFF, consumer
from tests.helpers import wait_until, wait_until_sync
from tests.subscribers import make_subscription, publish, receive_records, recv_json
from tests.webhooks.receiver import Answer, Receiver

SECRET = "whsec_" + base64.b64encode(b"herald-test-secret-0123456789ab").decode()


async def pull(http: httpx.AsyncClient, name: str, **body: Any) -> list[dict[str, Any]]:
    reply = await http.post(f"/v1/subscriptions/{name}/pull", json=body, timeout=40)
    assert reply.status_code == 200, reply.text
    messages: list[dict[str, Any]] = reply.json()["messages"]
    return messages


async def ack(http: httpx.AsyncClient, name: str, ids: list[str]) -> dict[str, Any]:
    reply = await http.post(f"/v1/subscriptions/{name}/ack", json={"ids": ids})
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


async def nack(http: httpx.AsyncClient, name: str, **body: Any) -> None:
    reply = await http.post(f"/v1/subscriptions/{name}/nack", json=body)
    assert reply.status_code == 204, reply.text


async def test_pull_then_ack_takes_records_from_the_cursor(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("pl"), unique("pls")
    await make_subscription(http, name, topic)
    await publish(http, topic, [1, 2, 3], key="k")
    first = await pull(http, name, max_messages=2)
    assert [m["value"] for m in first] == [1, 2]
    m = first[0]
    assert (m["topic"], m["subscription"], m["attempt"], m["key"]) == (topic, name, 1, "k")
    assert (m["id"], m["partition"], m["offset"]) == ("0-0", 0, 0)
    assert (await stats(http, name))["in_flight"] == 2, "pulled records are in flight"
    rest = await pull(http, name)  # default max_messages 100
    assert [m["value"] for m in rest] == [3]
    assert await pull(http, name) == [], "nothing left, nothing in flight is pulled twice"
    reply = await ack(http, name, ["0-0", "0-1", "0-1", "9-9", "nonsense"])
    assert reply == {"ok": ["0-0", "0-1"], "unknown": ["0-1", "9-9", "nonsense"]}
    current = await stats(http, name)
    assert (current["delivered_total"], current["acked_total"], current["in_flight"]) == (3, 2, 1)
    assert current["consumers"] == 0, "a pull is a consumer only while it waits"
    metrics = (await http.get("/metrics")).text
    assert f'herald_delivered_records_total{{subscription="{name}"}} 3' in metrics


async def test_long_poll_wakes_on_a_new_record(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("pw"), unique("pws")
    await make_subscription(http, name, topic)
    # wait_ms 0 answers at once: well before a long poll's 30 s could have run out.
    assert await asyncio.wait_for(pull(http, name, wait_ms=0), 25) == []
    started = time.monotonic()
    waiting = asyncio.create_task(pull(http, name, wait_ms=30_000))

    async def waits() -> bool:
        return (await stats(http, name))["consumers"] == 1

    await wait_until(waits, what="the pull waits")
    assert not waiting.done(), "nothing yet: the pull waits"
    await publish(http, topic, ["late"])
    messages = await asyncio.wait_for(waiting, 40)
    assert [m["value"] for m in messages] == ["late"]
    assert time.monotonic() - started < 25, "woken by the append, not by the 30 s timeout"


async def test_long_poll_ends_at_wait_ms_with_nothing(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("pe"), unique("pes")
    await make_subscription(http, name, topic)
    started = time.monotonic()
    assert await pull(http, name, wait_ms=400) == []
    assert time.monotonic() - started >= 0.38  # it waited (no bound on a loaded host)


async def test_unacked_pulled_record_is_redelivered_after_its_deadline(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("pd"), unique("pds")
    await make_subscription(http, name, topic, ack_deadline_ms=200, retry_backoff=FAST_BACKOFF)
    await publish(http, topic, ["x"])
    [first] = await pull(http, name)
    [again] = await pull(http, name, wait_ms=5000)
    assert (again["id"], again["attempt"]) == (first["id"], 2)
    # This attempt has 200 ms too: an ack later than that (a loaded host) is answered
    # unknown, and the record is pulled again and acked then.
    for _ in range(20):
        if (await ack(http, name, [first["id"]]))["ok"] == [first["id"]]:
            break
        [again] = await pull(http, name, wait_ms=5000)
        assert again["id"] == first["id"]
    else:
        raise AssertionError("never acked within its deadline")
    current = await stats(http, name)
    assert current["backlog"] == 0
    assert current["redelivered_total"] == again["attempt"] - 1


async def test_nack_redelivers_and_dead_letters_with_the_reason(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name, dead = unique("pn"), unique("pns"), unique("dead")
    await make_subscription(http, name, topic, max_deliveries=2, dead_letter_topic=dead)
    await publish(http, topic, ["y"])
    [first] = await pull(http, name)
    await nack(http, name, ids=[first["id"], "1-1", "junk"], delay_ms=0)
    [again] = await pull(http, name, wait_ms=5000)
    assert again["attempt"] == 2
    await nack(http, name, ids=[again["id"]], delay_ms=0, reason="cannot parse")
    letter = await dead_letter(http, dead)
    assert letter["headers"]["herald-source-last-error"] == "cannot parse"
    assert letter["headers"]["herald-source-subscription"] == name
    assert await pull(http, name) == []


async def test_pull_shares_the_cursor_with_a_websocket_consumer(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("ps"), unique("pss")
    await make_subscription(http, name, topic)
    await publish(http, topic, list(range(10)))
    async with consumer(shared_herald, name, 4) as ws:
        await recv_json(ws)
        pushed = await receive_records(ws, 4)
        pulled = await pull(http, name, max_messages=100)
    ids = [m["id"] for m in pushed] + [m["id"] for m in pulled]
    assert sorted(ids) == sorted(f"0-{i}" for i in range(10)), "each record once"


async def test_pull_respects_max_in_flight(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("pm"), unique("pms")
    await make_subscription(http, name, topic, max_in_flight=2)
    await publish(http, topic, list(range(5)))
    assert len(await pull(http, name, max_messages=10)) == 2
    assert await pull(http, name, max_messages=10) == []
    await ack(http, name, ["0-0"])
    assert [m["id"] for m in await pull(http, name, max_messages=10)] == ["0-2"]


async def test_pull_on_a_push_subscription_never_takes_what_the_endpoint_holds(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("pp"), unique("pps")
    # The endpoint holds each request for a while: its records stay in flight to it.
    with Receiver([SECRET], lambda _: Answer(200, delay_s=1.5)) as receiver:
        await make_subscription(
            http, name, topic, push={"url": receiver.url, "secret": SECRET, "max_in_flight": 2}
        )
        await publish(http, topic, list(range(8)))

        async def endpoint_busy() -> bool:
            return len(receiver.snapshot()) >= 1 or (await stats(http, name))["in_flight"] >= 2

        await wait_until(endpoint_busy, what="the endpoint holds records")
        pulled = await pull(http, name, max_messages=100)
        assert pulled, "pull works on a push subscription"
        await ack(http, name, [m["id"] for m in pulled])
        receiver.wait_for(lambda: len(receiver.acked_ids()) + len(pulled) >= 8, timeout=30)
        pushed = receiver.acked_ids()
    assert not pushed & {m["id"] for m in pulled}, "never the same record to both"
    assert pushed | {m["id"] for m in pulled} == {f"0-{i}" for i in range(8)}


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        ("pull", {"max_messages": 0}, "validation_error"),
        ("pull", {"max_messages": 1001}, "validation_error"),
        ("pull", {"wait_ms": 30_001}, "validation_error"),
        ("pull", {"wait_ms": -1}, "validation_error"),
        ("pull", {"max_messages": "5"}, "bad_request"),
        ("pull", {"limit": 5}, "bad_request"),
        ("ack", {}, "bad_request"),
        ("ack", {"ids": "0-0"}, "bad_request"),
        ("ack", {"ids": [1]}, "bad_request"),
        ("nack", {"ids": ["0-0"], "delay_ms": 600_001}, "validation_error"),
        ("nack", {"ids": ["0-0"], "reason": "r" * 257}, "validation_error"),
        ("nack", {"ids": ["0-0"], "reason": 5}, "bad_request"),
        ("nack", {"ids": ["0-0"], "why": "x"}, "bad_request"),
    ],
)
async def test_bad_pull_ack_and_nack_bodies_are_400(
    shared_herald: HeraldProcess,
    http: httpx.AsyncClient,
    unique: Callable[[str], str],
    path: str,
    body: Any,
    code: str,
) -> None:
    topic, name = unique("pb"), unique("pbs")
    await make_subscription(http, name, topic)
    await publish(http, topic, ["z"])
    reply = await http.post(f"/v1/subscriptions/{name}/{path}", json=body)
    assert (reply.status_code, reply.json()["code"]) == (400, code), reply.text
    current = await stats(http, name)
    assert (current["delivered_total"], current["in_flight"]) == (0, 0), "nothing changed"


async def test_pull_of_a_missing_subscription_is_404(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    for path, body in (("pull", {}), ("ack", {"ids": []}), ("nack", {"ids": []})):
        reply = await http.post(f"/v1/subscriptions/{unique('none')}/{path}", json=body)
        assert (reply.status_code, reply.json()["code"]) == (404, "subscription_not_found")
    empty = await http.post(f"/v1/subscriptions/{unique('none')}/pull")
    assert empty.status_code == 404, "no body is all defaults"


def test_sigterm_ends_a_long_poll(herald_server: HeraldProcess) -> None:
    url = herald_server.url
    assert httpx.put(f"{url}/v1/subscriptions/s", json={"topic": "t"}).status_code == 201
    answer: list[httpx.Response | Exception] = []

    def long_poll() -> None:
        try:
            answer.append(
                httpx.post(f"{url}/v1/subscriptions/s/pull", json={"wait_ms": 30_000}, timeout=60)
            )
        except httpx.HTTPError as exc:
            answer.append(exc)

    thread = threading.Thread(target=long_poll)
    thread.start()
    # The pull is waiting (a consumer while it waits) when SIGTERM comes.
    wait_until_sync(
        lambda: httpx.get(f"{url}/v1/subscriptions/s").json()["stats"]["consumers"] == 1,
        what="the pull waits",
    )
    started = time.monotonic()
    assert herald_server.terminate() == 0
    thread.join(30)
    assert not thread.is_alive()
    assert time.monotonic() - started < 15.0, "the long-poll did not hold the shutdown"
    [result] = answer
    assert isinstance(result, httpx.Response), result
    assert (result.status_code, result.json()) == (200, {"messages": []})
