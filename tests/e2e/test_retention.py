"""Retention seen from outside (PROTOCOL §1 Retention, §5 `expired_total`): a server with
small segments deletes whole old segments past `retention_bytes`; a subscription left
behind skips forward to the new log start and counts what it skipped."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import websockets

from tests.conftest import HeraldProcess
from tests.e2e import stats
from tests.helpers import wait_until
from tests.subscribers import make_subscription, receive_records, recv_json, ws_url

SEGMENT_BYTES = 64 * 1024
RETENTION_BYTES = 1024 * 1024  # the smallest PROTOCOL §1 allows
VALUE = "r" * 4000  # ~4 KiB records: ~16 per segment


async def test_a_subscription_behind_the_log_start_skips_forward_and_counts_expired(
    herald_factory: Callable[..., HeraldProcess], unique: Callable[[str], str]
) -> None:
    server = herald_factory("--segment-bytes", str(SEGMENT_BYTES), "--retention-interval", "0.2")
    topic, name = unique("ret"), unique("rets")
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        reply = await http.put(
            f"/v1/topics/{topic}", json={"partitions": 1, "retention_bytes": RETENTION_BYTES}
        )
        assert reply.status_code == 201, reply.text
        await make_subscription(http, name, topic)
        total = 0
        for _ in range(20):  # ~2.4 MB in 40 requests: more than twice the retention
            reply = await http.post(
                f"/v1/topics/{topic}/messages",
                json={"messages": [{"value": VALUE, "key": str(i)} for i in range(15)]},
            )
            assert reply.status_code == 200, reply.text
            total += 15

        async def retained_within_bound() -> bool:
            # A pass deletes the oldest segments one at a time, and a snapshot taken in the
            # middle of it (or between two passes) may see only some of them gone: wait
            # for what a finished pass leaves, at most one segment over the bound.
            partition = (await http.get(f"/v1/topics/{topic}")).json()["partitions"][0]
            return bool(partition["bytes"] <= RETENTION_BYTES + SEGMENT_BYTES)

        await wait_until(retained_within_bound, within=30, what="retention deleting old segments")
        # The bound can hold one deletion before a pass ends: the log start is read once
        # it stayed put for three retention intervals (a pass every 0.2 s).
        start = -1
        for _ in range(50):
            partition = (await http.get(f"/v1/topics/{topic}")).json()["partitions"][0]
            if partition["start_offset"] == start:
                break
            start = partition["start_offset"]
            await asyncio.sleep(0.6)
        end = partition["end_offset"]
        assert end == total
        assert start > 0
        # Offsets are never reused: a new record continues after the last one.
        reply = await http.post(f"/v1/topics/{topic}/messages", json={"messages": [{"value": 1}]})
        assert reply.json()["results"][0]["offset"] == total

        url = ws_url(server.url, f"/v1/subscriptions/{name}/ws?credit={total + 1}")
        async with websockets.connect(url, max_size=None) as ws:
            assert (await recv_json(ws))["type"] == "ready"
            records = await receive_records(ws, total + 1 - start, within=30)
        assert [r["offset"] for r in records] == list(range(start, total + 1))
        assert (await stats(http, name))["expired_total"] == start
        # The read API starts at the log start too.
        read = await http.get(f"/v1/topics/{topic}/partitions/0/messages", params={"offset": 0})
        assert read.json()["messages"][0]["offset"] == start
