"""Rotating a push subscription's secret (docs/protocol.md "Rotating the secret") end to
end: a real Herald, real receivers on loopback, signatures checked with the official
`standardwebhooks` package."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from server.auth import new_token, toml_entry
from tests.helpers import wait_until_sync
from tests.webhooks.receiver import Received, Receiver

OLD = "whsec_" + base64.b64encode(b"rotation-old-secret-0123456789a").decode()
NEW = "whsec_" + base64.b64encode(b"rotation-new-secret-0123456789b").decode()
NEWER = "whsec_" + base64.b64encode(b"rotation-newer-secret-012345678").decode()


@pytest.fixture
def herald_url(shared_herald: Any) -> str:
    """One server for the tests that never stop it (their names are unique)."""
    return str(shared_herald.url)


def create(url: str, name: str, topic: str, receiver_url: str, **headers: str) -> None:
    body = {"topic": topic, "start": "earliest", "push": {"url": receiver_url, "secret": OLD}}
    response = httpx.put(f"{url}/v1/subscriptions/{name}", json=body, headers=headers)
    assert response.status_code == 201, response.text


def rotate(url: str, name: str, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/subscriptions/{name}/push/rotate-secret", json=body, headers=headers
    )


def publish(url: str, topic: str, values: list[Any], **headers: str) -> None:
    response = httpx.post(
        f"{url}/v1/topics/{topic}/messages",
        json={"messages": [{"value": v} for v in values]},
        headers=headers,
    )
    assert response.status_code == 200, response.text


def subscription(url: str, name: str, **headers: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/v1/subscriptions/{name}", headers=headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


def verifies_with(received: Received, secret: str) -> bool:
    try:
        Webhook(secret).verify(received.body, received.headers)
    except Exception:
        return False
    return True


def signatures(received: Received) -> int:
    return len(received.headers["webhook-signature"].split(" "))


def signature_of(secret: str, received: Received) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = (
        f"{received.headers['webhook-id']}.{received.headers['webhook-timestamp']}.".encode()
        + received.body
    )
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


TTL_MS = 3_000  # previous secret's lifetime in the rotation test: records 3..5 go within it


def by_id(receiver: Receiver) -> dict[str, Received]:
    return {r.message["id"]: r for r in receiver.snapshot() if r.message is not None}


def test_rotation_signs_with_both_secrets_until_expiry_then_only_the_new_one(
    herald_url: str, unique: Any
) -> None:
    topic, name = unique("t"), unique("s")
    with Receiver([OLD, NEW]) as receiver:
        create(herald_url, name, topic, receiver.url)
        publish(herald_url, topic, [0, 1, 2])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 3)

        before = time.time() * 1000
        response = rotate(herald_url, name, {"secret": NEW, "previous_ttl_ms": TTL_MS})
        assert response.status_code == 200, response.text
        (previous,) = response.json()["config"]["push"]["previous_secrets"]
        assert set(previous) == {"expires_at"}  # never the secret itself
        assert before + TTL_MS <= previous["expires_at"] <= time.time() * 1000 + TTL_MS
        assert "secret" not in response.json()["config"]["push"]

        publish(herald_url, topic, [3, 4, 5])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 6)

        wait_until_sync(lambda: time.time() * 1000 > previous["expires_at"] + 50, within=5)
        publish(herald_url, topic, [6, 7, 8])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 9)
        got = by_id(receiver)

    for i in range(3):  # before: the old secret only
        r = got[f"0-{i}"]
        assert verifies_with(r, OLD) and not verifies_with(r, NEW) and signatures(r) == 1
    for i in range(3, 6):  # during: both, the new one first
        r = got[f"0-{i}"]
        signed_ms = int(r.headers["webhook-timestamp"]) * 1000  # whole seconds
        if signed_ms + 1000 > previous["expires_at"]:
            # Not sent until the previous secret (maybe) expired: a loaded machine was slow.
            assert verifies_with(r, NEW) and r.headers["webhook-signature"].startswith(
                signature_of(NEW, r)
            )
            continue
        assert verifies_with(r, OLD) and verifies_with(r, NEW) and signatures(r) == 2
        assert r.headers["webhook-signature"].split(" ")[0] == signature_of(NEW, r)
    for i in range(6, 9):  # after expiry: the new one only
        r = got[f"0-{i}"]
        assert verifies_with(r, NEW) and not verifies_with(r, OLD) and signatures(r) == 1
    assert subscription(herald_url, name)["config"]["push"]["previous_secrets"] == [previous]


def test_rotating_while_records_flow_delivers_each_record_once(
    herald_url: str, unique: Any
) -> None:
    topic, name = unique("t"), unique("s")
    done = threading.Event()

    def produce() -> None:
        n = 0
        while not done.is_set():
            publish(herald_url, topic, [n, n + 1])
            n += 2
            time.sleep(0.005)

    with Receiver([OLD, NEW]) as receiver:
        create(herald_url, name, topic, receiver.url)
        producer = threading.Thread(target=produce)
        producer.start()
        try:
            receiver.wait_for(lambda: len(receiver.acked_ids()) >= 20)
            stats_before = subscription(herald_url, name)["stats"]
            response = rotate(herald_url, name, {"secret": NEW})  # default: 24 h
            assert response.status_code == 200, response.text
            rotated_at = len(receiver.acked_ids())
            receiver.wait_for(lambda: len(receiver.acked_ids()) >= rotated_at + 20)
        finally:
            done.set()
            producer.join()
        end = httpx.get(f"{herald_url}/v1/topics/{topic}").json()["partitions"][0]["end_offset"]
        wait_until_sync(lambda: subscription(herald_url, name)["stats"]["backlog"] == 0)
        received = receiver.snapshot()

    stats = subscription(herald_url, name)["stats"]
    expires_at = response.json()["config"]["push"]["previous_secrets"][0]["expires_at"]
    assert expires_at >= time.time() * 1000 + 86_400_000 - 60_000
    assert all(r.message is not None and r.status == 200 for r in received)
    counts = Counter(r.message["id"] for r in received if r.message is not None)
    assert set(counts) == {f"0-{i}" for i in range(end)}
    assert set(counts.values()) == {1}  # rotating redelivers nothing, skips nothing
    assert stats["redelivered_total"] == 0
    assert stats["delivered_total"] == stats["acked_total"] == end
    assert stats["delivered_total"] > stats_before["delivered_total"]
    assert stats["partitions"] == [{"partition": 0, "ack_floor": end}]
    assert any(signatures(r) == 2 and verifies_with(r, NEW) for r in received)
    assert all(verifies_with(r, OLD) for r in received)  # old receivers keep verifying


def test_a_zero_ttl_drops_the_old_secret_at_once(herald_url: str, unique: Any) -> None:
    topic, name = unique("t"), unique("s")
    with Receiver([OLD, NEW]) as receiver:
        create(herald_url, name, topic, receiver.url)
        response = rotate(herald_url, name, {"secret": NEW, "previous_ttl_ms": 0})
        assert response.status_code == 200, response.text
        assert "previous_secrets" not in response.json()["config"]["push"]
        publish(herald_url, topic, ["x"])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 1)
        (received,) = receiver.snapshot()
    assert signatures(received) == 1
    assert verifies_with(received, NEW) and not verifies_with(received, OLD)


def test_a_restart_keeps_the_new_secret_signing_for_the_same_subscription(
    herald_server: Any, unique: Any
) -> None:
    url = herald_server.url
    topic, name = unique("t"), unique("s")
    with Receiver([OLD, NEW]) as receiver:
        create(url, name, topic, receiver.url)
        publish(url, topic, [0, 1])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 2)
        response = rotate(url, name, {"secret": NEW, "previous_ttl_ms": 600_000})
        assert response.status_code == 200, response.text
        expires = response.json()["config"]["push"]["previous_secrets"]
        herald_server.kill()  # a crash: the rotation itself must have been persisted
        herald_server.restart()
        assert subscription(url, name)["config"]["push"]["previous_secrets"] == expires
        publish(url, topic, [2])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 3)
        got = by_id(receiver)
        counts = Counter(r.message["id"] for r in receiver.snapshot() if r.message)
    # PROTOCOL §3: a crash may redeliver acks of its last second; 0-2 came after it.
    assert set(counts) == {"0-0", "0-1", "0-2"} and counts["0-2"] == 1
    after = got["0-2"]
    assert signatures(after) == 2
    assert verifies_with(after, NEW) and verifies_with(after, OLD)
    assert after.headers["webhook-signature"].split(" ")[0] == signature_of(NEW, after)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "bad_request"),
        ({"secret": None}, "bad_request"),
        ({"secret": "nope"}, "bad_request"),
        ({"secret": "whsec_!!!"}, "bad_request"),
        ({"secret": "whsec_AA=="}, "validation_error"),
        ({"secret": 7}, "bad_request"),
        ({"secret": NEW, "previous_ttl_ms": -1}, "validation_error"),
        ({"secret": NEW, "previous_ttl_ms": 2_592_000_001}, "validation_error"),
        ({"secret": NEW, "previous_ttl_ms": 1.5}, "bad_request"),
        ({"secret": NEW, "previous_expires_at": 1}, "bad_request"),
        ([NEW], "bad_request"),
    ],
)
def test_bad_rotation_requests_are_400_and_change_nothing(
    herald_url: str, unique: Any, body: Any, code: str
) -> None:
    topic, name = unique("t"), unique("s")
    with Receiver([OLD]) as receiver:
        create(herald_url, name, topic, receiver.url)
        before = subscription(herald_url, name)["config"]
        response = rotate(herald_url, name, body)
        assert response.status_code == 400, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["code"] == code
        assert subscription(herald_url, name)["config"] == before
        publish(herald_url, topic, ["x"])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 1)
        (received,) = receiver.snapshot()
    assert signatures(received) == 1 and verifies_with(received, OLD)


def test_rotating_an_unknown_or_a_non_push_subscription_is_refused(
    herald_url: str, unique: Any
) -> None:
    missing = rotate(herald_url, unique("nope"), {"secret": NEW})
    assert missing.status_code == 404
    assert missing.json()["code"] == "subscription_not_found"
    empty = httpx.post(f"{herald_url}/v1/subscriptions/{unique('nope')}/push/rotate-secret")
    assert empty.status_code == 400 and empty.json()["code"] == "bad_request"

    topic, name = unique("t"), unique("s")
    created = httpx.put(f"{herald_url}/v1/subscriptions/{name}", json={"topic": topic})
    assert created.status_code == 201
    refused = rotate(herald_url, name, {"secret": NEW})
    assert refused.status_code == 400
    assert refused.json()["code"] == "bad_request"
    assert "not a push subscription" in refused.json()["detail"]
    assert subscription(herald_url, name)["config"] == created.json()["config"]


def test_rotating_to_the_current_secret_again_changes_nothing(herald_url: str, unique: Any) -> None:
    topic, name = unique("t"), unique("s")
    with Receiver([OLD]) as receiver:
        create(herald_url, name, topic, receiver.url)
        first = rotate(herald_url, name, {"secret": NEW, "previous_ttl_ms": 60_000})
        retried = rotate(herald_url, name, {"secret": NEW, "previous_ttl_ms": 60_000})
    assert first.status_code == retried.status_code == 200
    assert retried.json()["config"] == first.json()["config"]
    assert len(first.json()["config"]["push"]["previous_secrets"]) == 1


def test_rotation_needs_admin_and_is_audited(
    herald_factory: Any, tmp_path: Path, unique: Any
) -> None:
    auth_file, audit_file = tmp_path / "auth.toml", tmp_path / "audit.jsonl"
    tokens = {}
    entries = []
    for who, roles in (("admin", ["admin"]), ("subscriber", ["subscribe", "publish"])):
        token_id, token = new_token()
        tokens[who] = token
        entries.append(toml_entry(token_id, token, roles, ["rot.*"] if who != "admin" else []))
    auth_file.write_text("\n".join(entries))
    server = herald_factory(
        "--auth-file", str(auth_file), "--audit-log", str(audit_file),
        "--webhook-allow-cidr", "127.0.0.0/8",  # PROTOCOL §6: the receiver is on loopback
    )  # fmt: skip
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    subscriber = {"Authorization": f"Bearer {tokens['subscriber']}"}
    topic, name = unique("rot.t"), unique("s")
    with Receiver([OLD]) as receiver:
        create(server.url, name, topic, receiver.url, **admin)
        before = subscription(server.url, name, **admin)["config"]

        anonymous = rotate(server.url, name, {"secret": NEW})
        assert anonymous.status_code == 401
        refused = rotate(server.url, name, {"secret": NEW}, **subscriber)
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
        # The subscriber may read the subscription (it subscribes on its topic) ...
        assert subscription(server.url, name, **subscriber)["config"] == before
        # ... and its refused rotation changed nothing.
        publish(server.url, topic, ["x"], **admin)
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 1)
        assert signatures(receiver.snapshot()[0]) == 1

        allowed = rotate(server.url, name, {"secret": NEW}, **admin)
        assert allowed.status_code == 200, allowed.text
    audit = [json.loads(line) for line in audit_file.read_text().splitlines()]
    admin_id = tokens["admin"].split("_")[1]
    rotated = [e for e in audit if e["event"] == "subscription_secret_rotated"]
    assert rotated == [
        {**rotated[0], "token_id": admin_id, "status": 200, "method": "POST",
         "path": f"/v1/subscriptions/{name}/push/rotate-secret"}
    ]  # fmt: skip
    assert any(e["event"] == "auth_failure" and e["code"] == "forbidden" for e in audit)
    text = audit_file.read_text()
    assert NEW not in text and OLD not in text
    assert tokens["admin"] not in text
