"""GET /v1/stats, the stats WebSocket and dead-letter redrive against a real server."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import httpx
import websockets

from tests.helpers import wait_until_sync
from tests.server import assert_problem

DEAD = {"herald-source-topic": "src", "herald-source-partition": "0", "herald-source-offset": "0"}


def publish(http: httpx.Client, topic: str, messages: list[dict[str, object]]) -> None:
    response = http.post(f"/v1/topics/{topic}/messages", json={"messages": messages})
    assert response.status_code == 200, response.text


def test_snapshot_has_totals_topics_and_subscriptions_with_pause_reason_and_age(
    herald_url: str,
) -> None:
    with httpx.Client(base_url=herald_url) as http:
        publish(http, "src", [{"value": i} for i in range(4)])
        sub = {"topic": "src", "start": "earliest"}
        assert http.put("/v1/subscriptions/s1", json=sub).status_code == 201
        time.sleep(0.05)  # the oldest record is at least this old
        body = http.get("/v1/stats").json()
    assert body["server"]["uptime_ms"] >= 0 and body["server"]["version"]
    assert body["totals"]["published_records_total"] == 4
    assert body["totals"]["backlog"] == 4 and body["totals"]["subscriptions"] == 1
    assert body["totals"]["storage_bytes"] > 0
    assert [t["name"] for t in body["topics"]] == ["src"]
    assert body["topics"][0]["partitions"][0]["end_offset"] == 4
    [s1] = body["subscriptions"]
    assert s1["name"] == "s1" and s1["topic"] == "src" and s1["push"] is None
    assert s1["pause_reason"] == "no_credit"  # nobody connected
    assert s1["oldest_unacked_age_ms"] >= 50
    assert s1["stats"]["backlog"] == 4


async def test_stats_websocket_pushes_a_snapshot_every_second(herald_url: str) -> None:
    ws_url = herald_url.replace("http://", "ws://")
    async with websockets.connect(f"{ws_url}/v1/stats/ws") as ws:
        first = json.loads(await ws.recv())
        async with httpx.AsyncClient(base_url=herald_url) as http:
            answer = await http.post("/v1/topics/t/messages", json={"messages": [{"value": 1}]})
            assert answer.status_code == 200, answer.text
        # Snapshots go out every second whatever happens: one built before the publish
        # landed (a loaded host) still says 0. Each is a second after the one before,
        # by the server's clock (no bound on when it arrives here).
        frames = [first]
        for _ in range(30):
            frames.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            if frames[-1]["totals"]["published_records_total"] == 1:
                break
    assert first["totals"]["published_records_total"] == 0
    assert frames[-1]["totals"]["published_records_total"] == 1
    for before, after in itertools.pairwise(frames):
        assert after["type"] == before["type"] == "stats"
        assert after["server"]["now_ms"] - before["server"]["now_ms"] >= 900


def test_redrive_republishes_once_skips_other_topics_and_is_rate_limited(herald_url: str) -> None:
    # A redrive at 10/s takes 2 s by design: more than httpx's default 5 s on a loaded host.
    with httpx.Client(base_url=herald_url, timeout=60) as http:
        sub = {"topic": "src", "dead_letter_topic": "dlq"}
        assert http.put("/v1/subscriptions/s", json=sub).status_code == 201
        other = {**DEAD, "herald-source-topic": "elsewhere"}
        publish(http, "dlq", [{"key": f"k{i}", "value": i, "headers": DEAD} for i in range(20)])
        publish(http, "dlq", [{"value": "not ours", "headers": other}])
        started = time.monotonic()
        first = http.post("/v1/subscriptions/s/redrive", json={"rate": 10})
        elapsed = time.monotonic() - started
        assert first.status_code == 200, first.text
        assert first.json() == {
            "subscription": "s",
            "dead_letter_topic": "dlq",
            "scanned": 21,
            "republished": 20,
            "duplicates": 0,
            "skipped": 1,
            "other_reasons": 0,
        }
        assert elapsed >= 1.5  # 21 records at 10/s
        again = http.post("/v1/subscriptions/s/redrive", json={"rate": 10000}).json()
        assert again["republished"] == 0 and again["duplicates"] == 20
        records = http.get("/v1/topics/src/partitions/0/messages?limit=100").json()["messages"]
    assert [r["value"] for r in records] == list(range(20))
    assert records[3]["key"] == "k3"
    assert records[3]["headers"] == {"herald-redriven-from": "dlq/0/3"}


def test_redrive_by_reason_republishes_only_that_reasons_dead_letters(herald_url: str) -> None:
    # The dead letters get there for real: a pull consumer nacks each record with a reason,
    # and max_deliveries 1 dead-letters it (PROTOCOL §8 "Dead letters say why").
    with httpx.Client(base_url=herald_url) as http:
        sub = {"topic": "src", "max_deliveries": 1, "dead_letter_topic": "src.dlq"}
        assert http.put("/v1/subscriptions/s", json={**sub, "start": "earliest"}).status_code == 201
        publish(http, "src", [{"value": i} for i in range(5)])
        ids: list[str] = []
        for _ in range(20):  # bounded: a pull may answer with what is ready so far
            wanted = {"max_messages": 5 - len(ids), "wait_ms": 5000}
            ids += [
                m["id"]
                for m in http.post("/v1/subscriptions/s/pull", json=wanted).json()["messages"]
            ]
            if len(ids) == 5:
                break
        assert sorted(ids) == [f"0-{i}" for i in range(5)]
        for chunk, reason in ((ids[:3], "bad amount"), (ids[3:], "unknown customer")):
            nacked = http.post("/v1/subscriptions/s/nack", json={"ids": chunk, "reason": reason})
            assert nacked.status_code == 204, nacked.text

        def dead_letters() -> int:
            topic = http.get("/v1/topics/src.dlq")
            return topic.json()["partitions"][0]["end_offset"] if topic.status_code == 200 else 0

        wait_until_sync(lambda: dead_letters() == 5, what="5 dead letters")
        nothing = http.post("/v1/subscriptions/s/redrive", json={"reason": "bad"}).json()
        assert (nothing["republished"], nothing["other_reasons"]) == (0, 5)
        some = http.post("/v1/subscriptions/s/redrive", json={"reason": "bad amount"}).json()
        assert (some["scanned"], some["republished"], some["other_reasons"]) == (5, 3, 2)
        again = http.post("/v1/subscriptions/s/redrive", json={"reason": "bad amount"}).json()
        assert (again["republished"], again["duplicates"]) == (0, 3)
        records = http.get("/v1/topics/src/partitions/0/messages?offset=5").json()["messages"]
    assert [r["value"] for r in records] == [0, 1, 2]
    assert all("herald-source-last-error" not in r["headers"] for r in records)


def test_redrive_errors_are_problem_json(herald_url: str) -> None:
    with httpx.Client(base_url=herald_url) as http:
        assert_problem(http.post("/v1/subscriptions/nope/redrive"), 404, "subscription_not_found")
        assert http.put("/v1/subscriptions/plain", json={"topic": "src"}).status_code == 201
        assert_problem(http.post("/v1/subscriptions/plain/redrive"), 409, "redrive_conflict")
        sub = {"topic": "src", "dead_letter_topic": "never.written"}
        assert http.put("/v1/subscriptions/s", json=sub).status_code == 201
        assert_problem(http.post("/v1/subscriptions/s/redrive"), 404, "topic_not_found")
        # One validator for every body (PROTOCOL §2 codes): wrong types and unknown
        # fields are bad_request, numbers out of range validation_error.
        bad = ({"rate": "fast"}, {"max_records": True}, [1], {"rate": 1, "x": 1}, {"reason": 5})
        for body in bad:
            assert_problem(http.post("/v1/subscriptions/s/redrive", json=body), 400, "bad_request")
        null = http.post("/v1/subscriptions/s/redrive", content="null")
        assert_problem(null, 400, "bad_request")
        too_long = {"reason": "x" * 4097}
        for body in ({"rate": 0}, {"rate": 10_001}, {"max_records": 1_000_001}, too_long):
            assert_problem(
                http.post("/v1/subscriptions/s/redrive", json=body), 400, "validation_error"
            )
        assert_problem(
            http.post("/v1/subscriptions/s/redrive", json={"rate": 2.5}), 400, "bad_request"
        )
        # An integral number is an integer, as everywhere: the redrive runs (and finds
        # its dead-letter topic missing).
        assert_problem(
            http.post("/v1/subscriptions/s/redrive", json={"rate": 945.0, "max_records": 1e1}),
            404,
            "topic_not_found",
        )
