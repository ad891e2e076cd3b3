"""`python -m bench.herald_bench`: the server's capacity, end to end, through a real server.

Its publisher is hand-built (one prebuilt body posted over and over on raw HTTP/1.1
keep-alive connections) so that the client costs next to nothing and the figure is the
server's: what users get through the SDK is bench/compare.py's.

Speaks only the public protocol (PROTOCOL §2 publish, §3 WebSocket consumer).
By default it starts its own server (``herald serve`` on a free loopback port and
a temporary data dir) so it can also read that process's CPU time and report
server CPU per delivered message.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import httpx
import orjson
import websockets

from bench.common import cpu_seconds, herald_server

RECORD_BYTES = 1024
THROUGHPUT_CREDIT = 1000
LATENCY_CREDIT = 10_000


@dataclass(frozen=True, slots=True)
class ThroughputResult:
    acks: str
    records: int
    publish_seconds: int | float
    end_to_end_seconds: float
    server_cpu_us_per_msg: float | None

    @property
    def publish_rate(self) -> float:
        return self.records / self.publish_seconds

    @property
    def end_to_end_rate(self) -> float:
        return self.records / self.end_to_end_seconds


@dataclass(frozen=True, slots=True)
class LatencyResult:
    acks: str
    rate: int
    samples: int
    p50_ms: float
    p99_ms: float
    p999_ms: float


class Progress:
    """A one-line progress bar on stderr (silent when stderr is not a terminal)."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self.done = 0
        self._last = 0.0

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            width = 30
            filled = int(width * min(self.done, self.total) / self.total)
            sys.stderr.write(
                f"\r{self.label:<22} [{'#' * filled}{'.' * (width - filled)}] "
                f"{self.done:>9}/{self.total}"
            )
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


class RawPublisher:
    """A pool of keep-alive HTTP/1.1 connections that POST prebuilt bodies.

    httpx costs a few hundred µs of client CPU per request, which on a 2-core machine
    would measure the client rather than the server; this costs a few µs.
    """

    def __init__(self, url: str, size: int) -> None:
        parsed = httpx.URL(url)
        self.host, self.port = parsed.host, parsed.port or 80
        self.size = size
        self._idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.Queue()
        )
        self._all: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> RawPublisher:
        for _ in range(self.size):
            reader, writer = await asyncio.open_connection(self.host, self.port)
            self._all.append(writer)
            self._idle.put_nowait((reader, writer))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for writer in self._all:
            writer.close()

    async def post(self, path: str, body: bytes) -> int:
        reader, writer = await self._idle.get()
        try:
            writer.write(
                b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s"
                % (path.encode(), self.host.encode(), len(body), body)
            )
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            return status
        finally:
            self._idle.put_nowait((reader, writer))


async def _setup(http: httpx.AsyncClient, topic: str, subscription: str) -> None:
    (await http.put(f"/v1/topics/{topic}", json={"partitions": 1})).raise_for_status()
    body = {"topic": topic, "start": "latest", "max_in_flight": 100_000}
    (await http.put(f"/v1/subscriptions/{subscription}", json=body)).raise_for_status()


@contextlib.asynccontextmanager
async def _consumer(
    url: str, subscription: str, credit: int
) -> AsyncIterator[websockets.ClientConnection]:
    ws_url = url.replace("http", "ws", 1) + f"/v1/subscriptions/{subscription}/ws?credit={credit}"
    async with websockets.connect(ws_url, max_size=None, compression=None) as ws:
        ready = orjson.loads(await ws.recv())
        if ready.get("type") != "ready":
            raise RuntimeError(f"expected ready, got {ready}")
        yield ws


class CreditWindow:
    """Gives credit back half the window at a time, as herald.Consumer does."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.owed = 0

    def took(self, n: int) -> int:
        """Records taken; the credit to grant now (0: not yet)."""
        self.owed += n
        if self.owed < max(1, self.window // 2):
            return 0
        owed, self.owed = self.owed, 0
        return owed


async def _ack_and_replenish(
    ws: websockets.ClientConnection, ids: list[str], window: CreditWindow
) -> None:
    await ws.send(orjson.dumps({"type": "ack", "ids": ids}).decode())
    if grant := window.took(len(ids)):
        await ws.send(orjson.dumps({"type": "credit", "n": grant}).decode())


async def _consume_acking(
    ws: websockets.ClientConnection, total: int, progress: Progress, credit: int
) -> float:
    """Receive `total` records, acking each frame's records and replenishing credit."""
    received = 0
    window = CreditWindow(credit)
    while received < total:
        frame = orjson.loads(await ws.recv())
        if frame["type"] != "deliver":
            continue
        ids = [m["id"] for m in frame["messages"]]
        received += len(ids)
        progress.advance(len(ids))
        await _ack_and_replenish(ws, ids, window)
    return time.perf_counter()


async def throughput(
    url: str, pid: int | None, acks: str, records: int, batch: int, concurrency: int, show: bool
) -> ThroughputResult:
    tag = uuid.uuid4().hex[:8]
    topic, subscription = f"bench-{acks}-{tag}", f"bench-{acks}-{tag}"
    value = "x" * (RECORD_BYTES - 2)  # its compact JSON text is RECORD_BYTES bytes
    body = orjson.dumps({"messages": [{"value": value}] * batch})
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:
        await _setup(http, topic, subscription)
        async with _consumer(url, subscription, credit=THROUGHPUT_CREDIT) as ws:
            progress = Progress(f"acks={acks} e2e", records, show)
            requests = records // batch
            queue: asyncio.Queue[None] = asyncio.Queue()
            for _ in range(requests):
                queue.put_nowait(None)

            path = f"/v1/topics/{topic}/messages?acks={acks}"

            async def produce(raw: RawPublisher) -> None:
                while not queue.empty():
                    queue.get_nowait()
                    status = await raw.post(path, body)
                    if status >= 300:
                        raise RuntimeError(f"publish answered {status}")

            cpu_start = cpu_seconds(pid)
            start = time.perf_counter()
            consumer = asyncio.ensure_future(
                _consume_acking(ws, requests * batch, progress, THROUGHPUT_CREDIT)
            )
            try:
                async with RawPublisher(url, concurrency) as raw, asyncio.TaskGroup() as group:
                    for _ in range(concurrency):
                        group.create_task(produce(raw))
                published = time.perf_counter()
                finished = await asyncio.wait_for(consumer, timeout=600)
            finally:
                consumer.cancel()
            cpu_end = cpu_seconds(pid)
        await http.delete(f"/v1/topics/{topic}")
    cpu_per_msg = None
    if cpu_start is not None and cpu_end is not None:
        cpu_per_msg = (cpu_end - cpu_start) / (requests * batch) * 1e6
    return ThroughputResult(
        acks, requests * batch, published - start, finished - start, cpu_per_msg
    )


async def latency(url: str, acks: str, rate: int, seconds: float, show: bool) -> LatencyResult:
    """Publish one record per request at a fixed rate; measure publish-to-deliver time."""
    ordered = sorted(await latencies(url, acks, rate, seconds, show))

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return LatencyResult(acks, rate, len(ordered), pct(0.50), pct(0.99), pct(0.999))


async def latencies(url: str, acks: str, rate: int, seconds: float, show: bool) -> list[float]:
    """Publish-to-deliver times (ms) of one-record publishes at ``rate`` msg/s."""
    sent, got = await timed_deliveries(url, acks, rate, seconds, show)
    return [(at - sent[seq]) / 1e6 for seq, at in got.items()]


async def timed_deliveries(
    url: str, acks: str, rate: int, seconds: float, show: bool
) -> tuple[dict[int, int], dict[int, int]]:
    """One-record publishes at ``rate`` msg/s, each acked by the consumer: when each was
    sent and when it arrived (``time.perf_counter_ns``, by sequence number)."""
    tag = uuid.uuid4().hex[:8]
    topic, subscription = f"lat-{acks}-{tag}", f"lat-{acks}-{tag}"
    total = int(rate * seconds)
    sent: dict[int, int] = {}
    got: dict[int, int] = {}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        await _setup(http, topic, subscription)
        async with _consumer(url, subscription, credit=LATENCY_CREDIT) as ws:
            window = CreditWindow(LATENCY_CREDIT)
            progress = Progress(f"acks={acks} latency", total, show)

            async def receive() -> None:
                while len(got) < total:
                    frame = orjson.loads(await ws.recv())
                    if frame["type"] != "deliver":
                        continue
                    now = time.perf_counter_ns()
                    ids = []
                    for message in frame["messages"]:
                        ids.append(message["id"])
                        got[message["value"]] = now
                    progress.advance(len(ids))
                    await _ack_and_replenish(ws, ids, window)

            path = f"/v1/topics/{topic}/messages?acks={acks}"

            async def publish(raw: RawPublisher, seq: int) -> None:
                body = orjson.dumps({"messages": [{"value": seq}]})
                sent[seq] = time.perf_counter_ns()
                status = await raw.post(path, body)
                if status >= 300:
                    raise RuntimeError(f"publish answered {status}")

            receiver = asyncio.ensure_future(receive())
            try:
                async with RawPublisher(url, 32) as raw, asyncio.TaskGroup() as group:
                    start = time.perf_counter()
                    for seq in range(total):
                        # Open-loop schedule: a slow answer never delays the next send.
                        delay = start + seq / rate - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        group.create_task(publish(raw, seq))
                await asyncio.wait_for(receiver, timeout=120)
            finally:
                receiver.cancel()
        await http.delete(f"/v1/topics/{topic}")
    return sent, got


@dataclass(frozen=True, slots=True)
class HostSample:
    """CPU time of the whole machine, of the server and of this process (s)."""

    busy: float
    steal: float
    total: float
    ours: float
    server_counted: bool  # False with --url: the server's CPU is not known to be ours

    @classmethod
    def take(cls, pid: int | None) -> HostSample | None:
        try:
            with open("/proc/stat", "rb") as stat:
                fields = [int(f) for f in stat.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        if len(fields) < 8:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        user, nice, system, idle, iowait, irq, softirq, steal = (f / ticks for f in fields)
        own = os.times()
        ours = own.user + own.system + (cpu_seconds(pid) or 0.0)
        busy = user + nice + system + irq + softirq
        return cls(busy, steal, busy + idle + iowait + steal, ours, pid is not None)


def host_line(start: HostSample | None, end: HostSample | None) -> str:
    """How busy the machine was with other work while the bench ran."""
    if start is None or end is None or end.total <= start.total:
        return "host: /proc/stat not readable, load of other work unknown"
    total = end.total - start.total
    steal = (end.steal - start.steal) / total
    others = max(0.0, (end.busy - start.busy) - (end.ours - start.ours)) / total
    whose = "other processes" if start.server_counted else "other processes (the server's too)"
    return (
        f"host during the bench: steal {steal:.1%} of CPU time (taken by the hypervisor), "
        f"{whose} {others:.1%}; a few percent of either moves the tail figures"
    )


async def run(args: argparse.Namespace, url: str, pid: int | None) -> None:
    show = sys.stderr.isatty() and not args.quiet
    host_start = HostSample.take(pid)
    rows: list[ThroughputResult] = []
    for acks in args.acks:
        runs = [
            await throughput(url, pid, acks, args.records, args.batch, args.concurrency, show)
            for _ in range(args.runs)
        ]
        rows.append(_median_run(runs))
    lat = [await latency(url, acks, args.rate, args.seconds, show) for acks in args.acks]
    host_end = HostSample.take(pid)
    print(
        f"herald bench: {args.records} x {RECORD_BYTES} B records, batch {args.batch}, "
        f"{args.concurrency} concurrent publishers, consumer credit 1000 acking every record "
        f"(credit given back half the window at a time, as herald.Consumer does); "
        f"median of {args.runs} run(s)"
        + (f"; server pinned to CPUs {args.server_cpus}" if args.server_cpus else "")
    )
    print(
        f"{'acks':<5} {'e2e msg/s':>10} {'e2e MB/s':>9} {'publish msg/s':>14} {'server CPU us/msg':>18}"
    )
    for row in rows:
        cpu = f"{row.server_cpu_us_per_msg:.1f}" if row.server_cpu_us_per_msg is not None else "n/a"
        print(
            f"{row.acks:<5} {row.end_to_end_rate:>10,.0f} "
            f"{row.end_to_end_rate * RECORD_BYTES / 1e6:>9.1f} {row.publish_rate:>14,.0f} {cpu:>18}"
        )
    print(
        f"latency publish-to-deliver at {args.rate} msg/s, one record per request, {args.seconds:g} s:"
    )
    print(f"{'acks':<5} {'samples':>8} {'p50 ms':>8} {'p99 ms':>8} {'p999 ms':>8}")
    for item in lat:
        print(
            f"{item.acks:<5} {item.samples:>8} {item.p50_ms:>8.2f} {item.p99_ms:>8.2f} {item.p999_ms:>8.2f}"
        )
    print(host_line(host_start, host_end))


def _median_run(runs: list[ThroughputResult]) -> ThroughputResult:
    ordered = sorted(runs, key=lambda r: r.end_to_end_rate)
    middle = ordered[len(ordered) // 2]
    cpus = [r.server_cpu_us_per_msg for r in runs if r.server_cpu_us_per_msg is not None]
    return ThroughputResult(
        middle.acks,
        middle.records,
        statistics.median(r.publish_seconds for r in runs),
        middle.end_to_end_seconds,
        statistics.median(cpus) if cpus else None,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.herald_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", help="bench an already running server instead of starting one")
    parser.add_argument("--records", type=int, default=200_000, help="records per throughput run")
    parser.add_argument("--batch", type=int, default=500, help="records per publish request")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent publish requests")
    parser.add_argument(
        "--runs", type=int, default=3, help="throughput runs per acks level (median)"
    )
    parser.add_argument("--acks", nargs="+", default=["1", "all"], choices=["0", "1", "all"])
    parser.add_argument(
        "--rate", type=int, default=2000, help="fixed rate of the latency run, msg/s"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the latency run")
    parser.add_argument(
        "--server-cpus",
        help="start the server pinned to these CPUs (its --cpus), e.g. 0",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The client's own collector pauses would count as delivery latency: freeze what
    # exists and make full collections rare, as the server does (server/cli.py).
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    runner = getattr(__import__("uvloop"), "run", asyncio.run) if _has_uvloop() else asyncio.run
    if args.url:
        runner(run(args, args.url.rstrip("/"), None))
        return 0
    cpus = ("--cpus", args.server_cpus) if args.server_cpus else ()
    with herald_server(*cpus) as (url, pid):
        runner(run(args, url, pid))
    return 0


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
