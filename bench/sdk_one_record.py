"""`python bench/sdk_one_record.py [--url URL] [--records N]`: what the SDK itself costs
for one record at a time: `Producer.send_and_wait` of one record, then `Puller.pull(1)`
and `Puller.ack([id])` of it (PROTOCOL §2 publish, §8 pull and ack), N times in turn.

Prints this process's CPU per record (the client's: the server runs in its own process)
and the wall time per record, each phase apart. With ``--url`` it uses a running server
(so that two builds of the SDK can be timed against one server, in turn); without, it
starts one (bench/herald_bench.py ``embedded_server``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator

import httpx

from herald import Producer, Puller


@contextlib.contextmanager
def _server(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from herald_bench import embedded_server  # bench/: run as a script from there

    with embedded_server() as (started, _):
        yield started


async def _run(url: str, records: int) -> dict[str, tuple[float, float]]:
    topic, subscription = f"sdk-{uuid.uuid4().hex[:8]}", f"sdk-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        (await http.put(f"/v1/topics/{topic}", json={"partitions": 1})).raise_for_status()
        body = {"topic": topic, "ack_deadline_ms": 60_000}
        (await http.put(f"/v1/subscriptions/{subscription}", json=body)).raise_for_status()
    figures: dict[str, tuple[float, float]] = {}
    value = {"order": 0, "note": "x" * 200}
    async with Producer(url) as producer, Puller(url, subscription, wait_ms=1_000) as puller:
        for _ in range(min(50, records)):  # warm: connections, caches
            await producer.send_and_wait(topic, value)
            for message in await puller.pull(1):
                await puller.ack([message.id])
        cpu, wall = time.process_time(), time.perf_counter()
        for n in range(records):
            await producer.send_and_wait(topic, {"order": n, "note": value["note"]})
        figures["send"] = (time.process_time() - cpu, time.perf_counter() - wall)
        cpu, wall = time.process_time(), time.perf_counter()
        taken = 0
        for _ in range(records * 2):  # bounded: a pull may come back empty
            batch = await puller.pull(1)
            for message in batch:
                await puller.ack([message.id])
                taken += 1
            if taken >= records:
                break
        figures["pull+ack"] = (time.process_time() - cpu, time.perf_counter() - wall)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (else one is started)")
    parser.add_argument("--records", type=int, default=2_000)
    args = parser.parse_args()
    with _server(args.url) as url:
        figures = asyncio.run(_run(url, args.records))
    for phase, (cpu, wall) in figures.items():
        print(
            f"{phase}: client cpu {cpu / args.records * 1e6:.1f} us/record, "
            f"wall {wall / args.records * 1e6:.1f} us/record"
        )


if __name__ == "__main__":
    main()
