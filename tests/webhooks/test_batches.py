"""Webhook batches and raw bodies (PROTOCOL §8 `push.batch`, `push.payload`) end to end: a
real Herald and real receivers on loopback, every request verified with the official
`standardwebhooks` package (tests/webhooks/receiver.py) and with herald.webhooks.verify."""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import httpx
import orjson
import pytest
from standardwebhooks import Webhook

from herald import Message
from herald.webhooks import verify
from tests.helpers import wait_until_sync
from tests.webhooks.push import (
    NEVER_OPENS,
    SECRET,
    dead_lettering_subscription,
    publish,
    push_subscription,
    read_topic,
    stats,
)
from tests.webhooks.receiver import Answer, Received, Receiver


def config_of(url: str, name: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/v1/subscriptions/{name}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["config"])


def batch_ids(received: Received) -> list[str]:
    assert received.message is not None and "messages" in received.message
    return [m["id"] for m in received.message["messages"]]


def first_offset(received: Received) -> int:
    """Where a request's records start: requests sent side by side may land in any order."""
    return int(batch_ids(received)[0].split("-")[1])


def test_batches_fill_to_max_records_and_a_2xx_acks_all_of_them(
    herald_url: str, unique: Any
) -> None:
    topic, name = unique("bt"), unique("bs")
    with Receiver([SECRET]) as receiver:
        # A long max_wait_ms: only full batches can leave before it.
        created = push_subscription(
            herald_url,
            name,
            topic,
            receiver.url,
            push={"batch": {"max_records": 10, "max_wait_ms": 10_000}},
        )
        assert created["config"]["push"]["batch"] == {"max_records": 10, "max_wait_ms": 10_000}
        assert created["config"]["push"]["payload"] == "envelope"
        publish(herald_url, topic, [{"n": i} for i in range(20)])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 20)
        # The two batches go out side by side (push.max_in_flight 16): either may land
        # first, so they are read in the order of their first record, not of arrival.
        received = sorted(receiver.snapshot(), key=first_offset)
        wait_until_sync(lambda: stats(herald_url, name)["acked_total"] == 20)
    assert len(received) == 2 and all(r.verified for r in received)
    assert [batch_ids(r) for r in received] == [
        [f"0-{i}" for i in range(10)],
        [f"0-{i}" for i in range(10, 20)],
    ]
    assert [r.headers["webhook-id"] for r in received] == [f"{name}:0-0:10", f"{name}:0-10:10"]
    first = received[0].message
    assert first is not None and list(first) == ["messages"]
    m = first["messages"][3]
    assert (m["value"], m["subscription"], m["attempt"], m["topic"]) == ({"n": 3}, name, 1, topic)
    # The SDK reads a batch as a list of Message, in the order sent.
    records = verify(received[1].body, received[1].headers, SECRET)
    assert isinstance(records, list) and all(isinstance(r, Message) for r in records)
    assert [r.value for r in records] == [{"n": i} for i in range(10, 20)]
    # The attempt log has one entry per request: its first id and its count.
    attempts = httpx.get(f"{herald_url}/v1/subscriptions/{name}/attempts").json()["attempts"]
    assert sorted((a["id"], a["count"], a["status"]) for a in attempts) == [
        ("0-0", 10, 200),
        ("0-10", 10, 200),
    ]
    assert stats(herald_url, name)["endpoint_requests_total"] == 2


def test_max_wait_ms_sends_a_partial_batch(herald_url: str, unique: Any) -> None:
    topic, name = unique("wt"), unique("ws")
    with Receiver([SECRET]) as receiver:
        push_subscription(
            herald_url,
            name,
            topic,
            receiver.url,
            push={"batch": {"max_records": 100, "max_wait_ms": 400}},
        )
        published_at = time.monotonic()
        publish(herald_url, topic, ["a", "b", "c"])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 3)
        (request,) = receiver.snapshot()
    assert request.verified
    assert batch_ids(request) == ["0-0", "0-1", "0-2"]
    assert request.headers["webhook-id"] == f"{name}:0-0:3"
    # It waited for more records: max_wait_ms from the first one, which came after publish.
    assert request.at - published_at >= 0.4


def test_a_failed_batch_fails_every_record_which_retries_and_dead_letters_on_its_own(
    herald_url: str, unique: Any
) -> None:
    topic, name, dlq = unique("ft"), unique("fs"), unique("fd")
    with Receiver([SECRET], lambda _: Answer(500)) as receiver:
        dead_lettering_subscription(
            herald_url,
            name,
            topic,
            receiver.url,
            dlq,
            retry_backoff={"min_ms": 10, "max_ms": 20},
            push={"batch": {"max_records": 4, "max_wait_ms": 300}},
        )
        publish(herald_url, topic, list(range(4)))
        wait_until_sync(
            lambda: stats(herald_url, name)["dead_lettered_total"] == 4,
            within=30,
            what="every record dead-lettered",
        )
        received = receiver.snapshot()
    assert all(r.verified for r in received)
    sent: dict[str, list[int]] = {}
    for request in received:
        assert request.message is not None
        for m in request.message["messages"]:
            sent.setdefault(m["id"], []).append(m["attempt"])
    # Each record: three attempts (max_deliveries), each a failed delivery of its own ...
    assert sent == {f"0-{i}": [1, 2, 3] for i in range(4)}
    # ... and the records that failed together were retried together, in offset order
    # (PROTOCOL §8, settled 2026-11-26).
    assert [r.ids() for r in received] == [[f"0-{i}" for i in range(4)]] * 3
    s = stats(herald_url, name)
    assert (s["acked_total"], s["redelivered_total"], s["delivered_total"]) == (0, 8, 12)
    dead = read_topic(herald_url, dlq)
    assert sorted(m["value"] for m in dead) == [0, 1, 2, 3]
    for letter in dead:
        assert letter["headers"]["herald-source-deliveries"] == "3"
        assert letter["headers"]["herald-source-last-error"] == "http 500"


def test_a_failed_batch_is_retried_together_in_offset_order(herald_url: str, unique: Any) -> None:
    """PROTOCOL §8: records that failed together are retried together, in offset order
    within a partition, however the backoff is jittered; other requests go on meanwhile."""
    topic, name = unique("gt"), unique("gs")
    with Receiver([SECRET], fail_first_attempt_of_batches) as receiver:
        push_subscription(
            herald_url,
            name,
            topic,
            receiver.url,
            retry_backoff={"min_ms": 10, "max_ms": 200},
            push={"batch": {"max_records": 3, "max_wait_ms": 10_000}, "breaker": NEVER_OPENS},
        )
        for round in range(4):  # one publish per batch: each fills one request
            publish(herald_url, topic, [{"n": 3 * round + i} for i in range(3)])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 12, timeout=30)
        received = receiver.snapshot()
    assert all(r.verified for r in received)
    first = sorted((r for r in received if attempts_of(r) == {1}), key=first_offset)
    retries = sorted((r for r in received if attempts_of(r) == {2}), key=first_offset)
    assert len(first) + len(retries) == len(received)  # no request mixed attempts
    expected = [[f"0-{3 * b + i}" for i in range(3)] for b in range(4)]
    assert [r.ids() for r in first] == expected
    assert [r.ids() for r in retries] == expected  # the same groups, in offset order


def attempts_of(received: Received) -> set[int]:
    assert received.message is not None
    return {m["attempt"] for m in received.message["messages"]}


def fail_first_attempt_of_batches(received: Received) -> Answer:
    return Answer(500 if attempts_of(received) == {1} else 200)


def test_max_in_flight_counts_requests_a_batch_being_one(herald_url: str, unique: Any) -> None:
    topic, name = unique("mt"), unique("ms")
    lock = threading.Lock()
    out = {"requests": 0, "records": 0}
    most = {"requests": 0, "records": 0}

    def slow(received: Received) -> Answer:
        n = len(received.ids())
        with lock:
            out["requests"] += 1
            out["records"] += n
            for k in most:
                most[k] = max(most[k], out[k])
        time.sleep(0.2)
        with lock:
            out["requests"] -= 1
            out["records"] -= n
        return Answer(200)

    with Receiver([SECRET], slow) as receiver:
        push_subscription(
            herald_url,
            name,
            topic,
            receiver.url,
            push={"max_in_flight": 2, "batch": {"max_records": 5}},
        )
        publish(herald_url, topic, list(range(30)))
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 30, timeout=30)
        received = receiver.snapshot()
    assert most["requests"] <= 2  # push.max_in_flight: requests at once
    assert most["records"] > 2  # ... each carrying up to 5 records
    assert max(len(r.ids()) for r in received) == 5


def raw_subscription(url: str, name: str, topic: str, receiver: Receiver) -> None:
    created = push_subscription(url, name, topic, receiver.url, push={"payload": "raw"})
    assert created["config"]["push"]["payload"] == "raw"
    assert created["config"]["push"]["batch"] == {"max_records": 1, "max_wait_ms": 0}


def test_raw_json_bodies_carry_the_value_and_the_rest_in_headers(
    herald_url: str, unique: Any
) -> None:
    topic, name = unique("rt"), unique("rs")
    messages = [
        {"value": {"total": 12.5, "items": ["pen"]}, "key": "eu-42", "headers": {"trace": "t-1"}},
        # A null key sends no herald-key; odd header names and values survive.
        {"value": "plain", "headers": {"Trace-Id": " spaced ", "ünï": "100% ✓"}},
        {"value": None, "key": ""},
        # A delayed record (§8) carries its deliver_at in herald-deliver-at.
        {"value": 7, "delay_ms": 300},
    ]
    with Receiver([SECRET]) as receiver:
        raw_subscription(herald_url, name, topic, receiver)
        answer = httpx.post(f"{herald_url}/v1/topics/{topic}/messages", json={"messages": messages})
        assert answer.status_code == 200, answer.text
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 4)
        received = sorted(receiver.snapshot(), key=lambda r: r.headers["herald-id"])
    stored = httpx.get(f"{herald_url}/v1/topics/{topic}/partitions/0/messages?offset=0").json()
    for request, published, record in zip(received, messages, stored["messages"], strict=True):
        assert request.verified  # standardwebhooks
        assert request.headers["content-type"] == "application/json"
        assert request.body == orjson.dumps(published["value"])  # the value's JSON text
        assert request.headers["webhook-id"] == f"{name}:{record['id']}"
        assert request.headers["herald-topic"] == topic
        assert request.headers["herald-id"] == record["id"]
        assert request.headers["herald-attempt"] == "1"
        assert ("herald-key" in request.headers) == (published.get("key") is not None)
        # The SDK rebuilds M whole: what the envelope would have carried.
        message = verify(request.body, request.headers, SECRET)
        assert isinstance(message, Message)
        assert message.to_json() == {**record, "subscription": name, "attempt": 1}
    assert received[0].headers["herald-key"] == "eu-42"
    assert received[0].headers["herald-header-trace"] == "t-1"
    assert received[1].headers["herald-header-%54race-%49d"] == "%20spaced%20"
    assert received[2].headers["herald-key"] == ""
    assert "herald-deliver-at" not in received[0].headers
    assert received[3].headers["herald-deliver-at"] == str(stored["messages"][3]["deliver_at"])


def test_raw_bytes_bodies_are_octet_streams(herald_url: str, unique: Any) -> None:
    topic, name = unique("yt"), unique("ys")
    payloads = [b"text bytes", b"\x00\xff\xfe not utf-8"]
    with Receiver([SECRET]) as receiver:
        raw_subscription(herald_url, name, topic, receiver)
        answer = httpx.post(
            f"{herald_url}/v1/topics/{topic}/messages",
            json={
                "messages": [
                    {"value_b64": base64.b64encode(p).decode(), "key": "k"} for p in payloads
                ]
            },
        )
        assert answer.status_code == 200, answer.text
        receiver.wait_for(lambda: stats(herald_url, name)["acked_total"] == 2)
        received = sorted(receiver.snapshot(), key=lambda r: r.headers["herald-id"])
    assert [r.body for r in received] == payloads
    assert {r.headers["content-type"] for r in received} == {"application/octet-stream"}
    assert received[0].verified  # standardwebhooks, for a body that is UTF-8 text
    # standardwebhooks (Python) reads the body as UTF-8 text: other bytes it cannot check;
    # the signature is over the bytes sent, as herald.webhooks.verify checks.
    assert not received[1].verified
    for request, payload in zip(received, payloads, strict=True):
        message = verify(request.body, request.headers, SECRET)
        assert isinstance(message, Message)
        assert (message.value, message.is_bytes, message.key) == (payload, True, "k")


def test_raw_with_batches_is_refused(herald_url: str, unique: Any) -> None:
    topic, name = unique("xt"), unique("xs")
    push = {"url": "http://127.0.0.1:9/hook", "secret": SECRET, "payload": "raw"}
    refused = httpx.put(
        f"{herald_url}/v1/subscriptions/{name}",
        json={"topic": topic, "push": {**push, "batch": {"max_records": 2}}},
    )
    assert refused.status_code == 400
    assert refused.json()["code"] == "validation_error"
    assert httpx.get(f"{herald_url}/v1/subscriptions/{name}").status_code == 404
    bad = [
        ({"batch": {"max_records": 0}}, "validation_error"),
        ({"batch": {"max_records": 1001}}, "validation_error"),
        ({"batch": {"max_wait_ms": 10_001}}, "validation_error"),
        ({"batch": {"max_records": 2, "size": 1}}, "bad_request"),
        ({"batch": {"max_records": 1.5}}, "bad_request"),
        ({"payload": "json"}, "bad_request"),
    ]
    for fields, code in bad:
        body = {"topic": topic, "push": {"url": push["url"], "secret": SECRET, **fields}}
        answer = httpx.put(f"{herald_url}/v1/subscriptions/{name}", json=body)
        assert (answer.status_code, answer.json()["code"]) == (400, code), fields
    created = httpx.put(
        f"{herald_url}/v1/subscriptions/{name}", json={"topic": topic, "push": push}
    )
    assert created.status_code == 201, created.text
    patched = httpx.patch(
        f"{herald_url}/v1/subscriptions/{name}",
        json={"push": {"url": push["url"], "payload": "raw", "batch": {"max_records": 5}}},
    )
    assert (patched.status_code, patched.json()["code"]) == (400, "validation_error")
    assert config_of(herald_url, name)["push"]["batch"]["max_records"] == 1  # unchanged


def test_patch_switches_batches_on_and_off_live(herald_url: str, unique: Any) -> None:
    topic, name = unique("pt"), unique("ps")
    with Receiver([SECRET]) as receiver:
        push_subscription(herald_url, name, topic, receiver.url)
        assert config_of(herald_url, name)["push"]["batch"] == {"max_records": 1, "max_wait_ms": 0}
        publish(herald_url, topic, [0, 1])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 2)

        batched = {"url": receiver.url, "batch": {"max_records": 3, "max_wait_ms": 5_000}}
        answer = httpx.patch(f"{herald_url}/v1/subscriptions/{name}", json={"push": batched})
        assert answer.status_code == 200, answer.text
        assert answer.json()["config"]["push"]["batch"] == batched["batch"]
        publish(herald_url, topic, [2, 3, 4])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 5)

        answer = httpx.patch(
            f"{herald_url}/v1/subscriptions/{name}", json={"push": {"url": receiver.url}}
        )
        assert answer.status_code == 200, answer.text
        publish(herald_url, topic, [5])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 6)
        received = receiver.snapshot()
        # The dispatcher was not restarted: its request count went on.
        assert stats(herald_url, name)["endpoint_requests_total"] == len(received) == 4
    assert all(r.verified for r in received)
    forms = [("messages" in (r.message or {}), r.ids()) for r in received]
    # The first two go out side by side (push.max_in_flight > 1): either may land first.
    assert sorted(forms[:2]) == [(False, ["0-0"]), (False, ["0-1"])]
    assert forms[2:] == [(True, ["0-2", "0-3", "0-4"]), (False, ["0-5"])]
    assert received[2].headers["webhook-id"] == f"{name}:0-2:3"
    assert received[3].headers["webhook-id"] == f"{name}:0-5"


def test_standardwebhooks_verifies_single_batch_and_raw_bodies_signed_by_herald(
    herald_url: str, unique: Any
) -> None:
    """The official package, called as a receiver would, on each body form as sent."""
    topic = unique("st")
    forms = {
        unique("single"): {},
        unique("batch"): {"batch": {"max_records": 2, "max_wait_ms": 2_000}},
        unique("raw"): {"payload": "raw"},
    }
    with Receiver([]) as receiver:  # verifies nothing itself: this test calls the package
        for name, push in forms.items():
            push_subscription(herald_url, name, topic, receiver.url, push=push)
        publish(herald_url, topic, [{"a": 1}, {"b": 2}])
        # 2 singles, 1 batch of 2, 2 raw
        receiver.wait_for(lambda: len(receiver.snapshot()) == 5)
        received = receiver.snapshot()
    webhook = Webhook(SECRET)
    by_form: dict[str, list[Any]] = {}
    for request in received:
        name = request.headers["webhook-id"].split(":")[0]
        by_form.setdefault(name, []).append(webhook.verify(request.body, request.headers))
    single, batch, raw = forms
    assert sorted(m["offset"] for m in by_form[single]) == [0, 1]
    assert [[m["value"] for m in b["messages"]] for b in by_form[batch]] == [[{"a": 1}, {"b": 2}]]
    assert sorted(by_form[raw], key=str) == [{"a": 1}, {"b": 2}]
    # Any body changed by one byte: the first to arrive may be any form, and a raw
    # body of {"b":2} holds no "1" to change.
    for request in received:
        tampered = request.body[:-1] + bytes([request.body[-1] ^ 1])
        with pytest.raises(Exception, match="signature"):
            webhook.verify(tampered, request.headers)
