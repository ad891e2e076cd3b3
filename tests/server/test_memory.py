"""Memory stays bounded by what the server counts (STYLE principle 3), seen from outside:
the process's resident memory after many small records, not the server's own counters."""

from __future__ import annotations

import httpx
import orjson

from tests.conftest import HeraldProcess

RECORDS = 200_000
BATCH = 1000


def resident_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 1e6


def test_small_records_held_in_the_tail_cache_cost_about_their_size(
    herald_server: HeraldProcess,
) -> None:
    """The tail cache is bounded by its records' sizes (32 MiB a partition); each value
    must really cost about its size. Before values got buffers of their own, 200,000
    ten-byte values held ~830 MB (orjson keeps a 4 KiB buffer behind every result)."""
    body = orjson.dumps({"messages": [{"value": "ten bytes"}] * BATCH})
    with httpx.Client(base_url=herald_server.url, timeout=60) as http:
        assert http.put("/v1/topics/small", json={"partitions": 1}).status_code == 201
        before = resident_mb(herald_server.pid)
        for _ in range(RECORDS // BATCH):
            reply = http.post(
                "/v1/topics/small/messages?acks=1",
                content=body,
                headers={"content-type": "application/json"},
            )
            assert reply.status_code == 200, reply.text
        grown = resident_mb(herald_server.pid) - before
    assert grown < 200, f"the server grew by {grown:.0f} MB for 200,000 ten-byte records"
