"""cluster/etcd.py's cost: etcd round trips over the gRPC-gateway JSON API through httpx.

    python -m bench.etcd_client [--seconds 2] [--runs 3] [--concurrency 16] [--endpoint URL]

Without ``--endpoint`` it starts a throwaway single-member etcd (Debian's etcd-server)
on loopback ports with a temp data dir, and stops it at the end. Figures, each the
median of ``--runs`` runs:

- ``txn``: the cluster's conditional write (compare the key's mod revision, put, read
  back on failure), one at a time and ``--concurrency`` at once: round trips/s, p50/p99;
- ``range``: a linearizable read of one key, the same two ways;
- ``watch``: put → the event out of a prefix watch, one at a time: p50/p99.

Every write is fsynced by etcd (its WAL), so ``txn`` is bounded by the disk's fsync.
Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import httpx

from bench.common import free_port, percentile, temp_dir
from cluster.etcd import Compare, EtcdClient, Get, Put, RangeResult


@contextmanager
def throwaway_etcd() -> Iterator[str]:
    binary = shutil.which("etcd")
    if binary is None:
        sys.exit("etcd is not installed: `make etcd` (apt-get install etcd-server)")
    with temp_dir("herald-etcd-bench-") as workdir:
        client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
        proc = subprocess.Popen(
            [
                binary, "--name", "bench", "--data-dir", str(workdir / "data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"bench={peer}", "--log-outputs", "stderr", "--logger", "zap",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{client}/health", timeout=1).json().get("health") == "true":
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            else:
                sys.exit("etcd did not start")
            yield client
        finally:
            proc.terminate()
            proc.wait(30)


Figures = tuple[float, float, float, float]  # ops/s, p50 ms, p99 ms, client CPU µs per op


async def _timed(
    op: Callable[[int], Awaitable[object]], seconds: float, concurrency: int
) -> Figures:
    """Run ``op(i)`` back to back from ``concurrency`` workers for ``seconds``."""
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def worker(n: int) -> None:
        i = 0
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            await op(n * 1_000_000 + i)
            latencies.append(time.perf_counter() - started)
            i += 1

    started, cpu_started = time.perf_counter(), time.process_time()
    async with asyncio.TaskGroup() as tg:
        for n in range(concurrency):
            tg.create_task(worker(n))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return (
        len(latencies) / elapsed,
        percentile(latencies, 0.5) * 1e3,
        percentile(latencies, 0.99) * 1e3,
        cpu / len(latencies) * 1e6,
    )


async def _conditional_write(
    etcd: EtcdClient, worker_keys: int
) -> Callable[[int], Awaitable[object]]:
    revisions: dict[str, int] = {}

    async def op(i: int) -> object:
        key = f"/bench/txn/{i // 1_000_000 % worker_keys}"
        result = await etcd.txn(
            [Compare.mod_revision(key, "=", revisions.get(key, 0))],
            [Put.of(key, b"x" * 100)],
            [Get.of(key)],
        )
        if result.succeeded:
            revisions[key] = result.revision
        else:  # someone else wrote it (not in this benchmark): take the current revision
            (current,) = result.results
            assert isinstance(current, RangeResult)
            revisions[key] = current.kvs[0].mod_revision if current.kvs else 0
        return result

    return op


async def _watch_latency(etcd: EtcdClient, seconds: float) -> tuple[float, float]:
    samples: list[float] = []
    async with etcd.watch("/bench/watch/", prefix=True) as watch:
        stop_at = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            await etcd.put(f"/bench/watch/{i % 10}", str(i))
            await anext(watch)
            samples.append(time.perf_counter() - started)
            i += 1
    return percentile(samples, 0.5) * 1e3, percentile(samples, 0.99) * 1e3


async def measure(endpoint: str, seconds: float, runs: int, concurrency: int) -> None:
    async with EtcdClient([endpoint], timeout=30, attempt_timeout=10) as etcd:
        await etcd.put("/bench/read", "x" * 100)

        async def read(_: int) -> object:
            return await etcd.get("/bench/read")

        rows: list[tuple[str, Callable[[int], Awaitable[object]], int]] = []
        for label, width in (("1 at a time", 1), (f"{concurrency} concurrent", concurrency)):
            rows.append((f"txn (CAS put), {label}", await _conditional_write(etcd, width), width))
            rows.append((f"range (get), {label}", read, width))

        print(f"etcd at {endpoint}, {seconds:g} s per run, median of {runs} runs")
        print(f"{'':34} {'ops/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'client CPU µs/op':>17}")
        for label, op, width in rows:
            results = [await _timed(op, seconds, width) for _ in range(runs)]
            rate, p50, p99, cpu = (statistics.median(r[i] for r in results) for i in range(4))
            print(f"{label:34} {rate:9.0f} {p50:8.2f} {p99:8.2f} {cpu:17.0f}")
        watches = [await _watch_latency(etcd, seconds) for _ in range(runs)]
        p50 = statistics.median(w[0] for w in watches)
        p99 = statistics.median(w[1] for w in watches)
        print(f"{'watch: put → event, 1 at a time':34} {'':>9} {p50:8.2f} {p99:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--endpoint", help="an etcd client URL (default: start one)")
    args = parser.parse_args()
    if args.endpoint:
        asyncio.run(measure(args.endpoint, args.seconds, args.runs, args.concurrency))
        return
    with throwaway_etcd() as endpoint:
        asyncio.run(measure(endpoint, args.seconds, args.runs, args.concurrency))


if __name__ == "__main__":
    main()
