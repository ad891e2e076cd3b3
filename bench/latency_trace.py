"""Where a record's publish-to-deliver time goes, stage by stage.

Starts ``herald serve`` with stamps (CLOCK_MONOTONIC, shared by every process of
the machine) at each stage a record passes, publishes one record per request at a
fixed rate as ``bench/herald_bench.py`` does, and prints each stage's percentiles:

    client send → server reads the request → headers parsed → request task runs →
    endpoint → Topic.publish → Partition.submit_local → writer thread → written →
    visible on the loop → delivery task wakes → deliver frame queued → its send starts
    (in the connection's writer task, or at once in the delivery step) → frame written
    → client has it

The stamps wrap the server's own functions (and uvicorn's) from outside, so this
is a tool for finding where time goes, not a benchmark: tracing costs a few µs
per stage. Run: ``python -m bench.latency_trace [--acks 1] [--rate 2000]
[--seconds 10]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import gc
import itertools
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

now = time.perf_counter_ns  # CLOCK_MONOTONIC on Linux: comparable across processes

# (stage, what the time since the previous stage is spent on)
STAGES: list[tuple[str, str]] = [
    ("sent", ""),
    ("recv", "client → server reads the request"),
    ("headers", "httptools parses to the end of the headers"),
    ("task", "request task created and started"),
    ("endpoint", "layers (ASGI, or below it) to the publish"),
    ("publish", "body and validation, to Topic.publish"),
    ("submit", "Topic.publish to Partition.submit_local"),
    ("wstart", "hand-off to the writer thread"),
    ("wend", "the write"),
    ("visible", "hand-off back to the event loop"),
    ("step", "delivery task wakes"),
    ("queued", "delivery step, to the deliver frame queue"),
    ("framed", "to the frame's send (writer task or at once)"),
    ("written", "frame written to the socket"),
    ("got", "server → client reads the frame"),
]


# ---------------------------------------------------------------------- the server


def serve_traced(argv: Sequence[str], out: Path) -> int:
    """``herald serve`` with stage stamps; they are written to ``out`` at exit."""
    from uvicorn.protocols.http import httptools_impl

    from delivery.runtime import SubscriptionRuntime
    from server import publish
    from server.cli import main
    from server.http_protocol import DirectRequest, HeaderDeadlineProtocol
    from server.websocket_protocol import LeanWebSocketProtocol
    from storage.partition import Partition
    from storage.topic import Topic
    from storage.writer import Writer
    from subscribers.connection import ConsumerConnection

    by_seq: dict[int, dict[str, int]] = {}
    frames: list[tuple[str, int, bytes]] = []  # (stage, time, encoded record or frame)
    request_stamps: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar(
        "request_stamps", default=None
    )
    last_step = [0]

    def seq_of(value: bytes) -> int | None:
        try:
            return int(value)
        except ValueError:
            return None

    def wrap(cls: Any, name: str, make: Callable[[Any], Any]) -> None:
        setattr(cls, name, make(getattr(cls, name)))

    protocol = httptools_impl.HttpToolsProtocol

    def data_received(original: Any) -> Any:
        def traced(self: Any, data: bytes) -> None:
            self.herald_recv = now()
            original(self, data)

        return traced

    def on_headers_complete(original: Any) -> Any:
        def traced(self: Any) -> None:
            self.scope["herald.stamps"] = {"recv": self.herald_recv, "headers": now()}
            original(self)

        return traced

    def run_asgi(original: Any) -> Any:
        async def traced(self: Any, app: Any) -> None:
            stamps = self.scope.get("herald.stamps")
            if stamps is not None:
                stamps["task"] = now()
            await original(self, app)

        return traced

    def direct_run(original: Any) -> Any:
        async def traced(self: Any) -> None:
            stamps = self.scope.get("herald.stamps")
            if stamps is not None:
                stamps["task"] = now()
            await original(self)

        return traced

    def publish_records(original: Any) -> Any:
        async def traced(running: Any, scope: Any, *args: Any) -> Any:
            stamps = scope.get("herald.stamps")
            if stamps is not None:
                stamps["endpoint"] = now()
                request_stamps.set(stamps)
            return await original(running, scope, *args)

        return traced

    def topic_publish(original: Any) -> Any:
        async def traced(self: Any, items: Any, acks: Any) -> Any:
            stamps, seq = request_stamps.get(), seq_of(items[0].record.value)
            if stamps is not None and seq is not None:
                stamps["publish"] = now()
                by_seq[seq] = stamps
            return await original(self, items, acks)

        return traced

    def partition_submit(original: Any) -> Any:
        def traced(self: Any, records: Any, acks: Any) -> Any:
            seq = seq_of(records[0].value)
            if seq is not None and seq in by_seq:
                by_seq[seq]["submit"] = now()
            return original(self, records, acks)

        return traced

    def writer_append(original: Any) -> Any:
        def traced(self: Any, request: Any) -> Any:
            started = now()
            result = original(self, request)
            seq = seq_of(request.records[0].value)
            if seq is not None and seq in by_seq:
                by_seq[seq].update(wstart=started, wend=now())
            return result

        return traced

    def on_written(original: Any) -> Any:
        def traced(self: Any, first: int, timestamp: int, records: Any) -> None:
            seq = seq_of(records[0].value)
            if seq is not None and seq in by_seq:
                by_seq[seq]["visible"] = now()
            original(self, first, timestamp, records)

        return traced

    def step(original: Any) -> Any:
        async def traced(self: Any) -> None:
            last_step[0] = now()
            await original(self)

        return traced

    def push_records(original: Any) -> Any:
        def traced(self: Any, encoded: Any) -> None:
            encoded = list(encoded)
            at = now()
            for item in encoded:
                frames.append(("step", last_step[0], item))
                frames.append(("queued", at, item))
            original(self, encoded)

        return traced

    def send_now(original: Any) -> Any:
        async def traced(self: Any, frame: bytes) -> None:
            frames.append(("framed", now(), frame))
            await original(self, frame)
            frames.append(("written", now(), frame))

        return traced

    def send_nowait(original: Any) -> Any:
        def traced(self: Any, message: bytes, binary: bool) -> bool:
            at = now()
            sent: bool = original(self, message, binary)
            if sent:
                frames.append(("framed", at, message))
                frames.append(("written", now(), message))
            return sent

        return traced

    wrap(protocol, "data_received", data_received)
    # The server's protocol class: it serves a publish below ASGI (server/direct_publish.py)
    # or starts uvicorn's request cycle; the stamps are the same either way.
    wrap(HeaderDeadlineProtocol, "on_headers_complete", on_headers_complete)
    wrap(httptools_impl.RequestResponseCycle, "run_asgi", run_asgi)
    wrap(DirectRequest, "run", direct_run)
    wrap(publish, "publish_records", publish_records)
    wrap(Topic, "publish", topic_publish)
    wrap(Partition, "submit_local", partition_submit)
    wrap(Writer, "_append", writer_append)
    wrap(Partition, "_on_written", on_written)
    wrap(SubscriptionRuntime, "_step", step)
    wrap(ConsumerConnection, "push_records", push_records)
    wrap(ConsumerConnection, "send_now", send_now)
    wrap(LeanWebSocketProtocol, "send_nowait", send_nowait)

    try:
        return main(["serve", *argv])
    finally:
        # Frames are decoded now, not on the traced path.
        for stage, at, data in frames:
            parsed = orjson.loads(data)
            for message in parsed.get("messages", [parsed]):
                if isinstance(message, dict) and isinstance(message.get("value"), int):
                    by_seq.setdefault(message["value"], {}).setdefault(stage, at)
        out.write_bytes(orjson.dumps(by_seq, option=orjson.OPT_NON_STR_KEYS))


# ---------------------------------------------------------------------- the client


def stage_table(
    server: dict[int, dict[str, int]], sent: dict[int, int], got: dict[int, int]
) -> tuple[int, list[tuple[str, list[float]]]]:
    """(records seen at every stage, [(stage description, sorted µs)]) + a total row."""
    names = [name for name, _ in STAGES]
    complete = []
    for seq, stamps in server.items():
        if seq in sent and seq in got:
            row = {**stamps, "sent": sent[seq], "got": got[seq]}
            if all(name in row for name in names):
                complete.append(row)
    rows: list[tuple[str, list[float]]] = []
    for (before, _), (stage, what) in itertools.pairwise(STAGES):
        rows.append((what, sorted((r[stage] - r[before]) / 1e3 for r in complete)))
    rows.append(
        ("total, publish to deliver", sorted((r["got"] - r["sent"]) / 1e3 for r in complete))
    )
    return len(complete), rows


def print_table(count: int, rows: list[tuple[str, list[float]]]) -> None:
    print(f"{'stage (µs since the previous one)':<48} {'p50':>7} {'p90':>7} {'p99':>7}  n={count}")
    for what, values in rows:
        if not values:
            continue
        n = len(values)
        p50, p90, p99 = (values[min(n - 1, int(q * n))] for q in (0.5, 0.9, 0.99))
        print(f"{what:<48} {p50:>7.0f} {p90:>7.0f} {p99:>7.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--acks", choices=["0", "1", "all"], default="1")
    parser.add_argument("--rate", type=int, default=2000, help="one-record publishes per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--serve-traced", metavar="OUT", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.serve_traced:  # the server half, started by the client half below
        return serve_traced(rest, Path(args.serve_traced))

    from bench.common import ROOT, herald_server, temp_dir
    from bench.herald_bench import timed_deliveries

    with temp_dir("herald-trace-") as work:
        out = work / "stamps.json"  # written by the traced server as it stops
        traced = (sys.executable, "-m", "bench.latency_trace", "--serve-traced", str(out))
        with herald_server(serve=traced, cwd=ROOT) as (url, _):
            gc.freeze()
            runner = getattr(__import__("uvloop"), "run", asyncio.run)
            sent, got = runner(timed_deliveries(url, args.acks, args.rate, args.seconds, False))
        server = {int(k): v for k, v in orjson.loads(out.read_bytes()).items()}
    print(f"acks={args.acks}, {args.rate} one-record publishes/s for {args.seconds:g} s")
    print_table(*stage_table(server, sent, got))
    return 0


if __name__ == "__main__":
    sys.exit(main())
