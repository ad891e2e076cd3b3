"""`python -m bench.filter`: server capacity for a filtered subscription (PROTOCOL §8 Filter).

One topic of N records (one partition), 1 % of them matching a filter — on a header
(``headers.region = "eu"``, the default) or on a key prefix (``hasPrefix(key, "eu-")``)
— read by two subscriptions from the start of the topic:

- **unfiltered**: every record is sent to the consumer and acked;
- **filtered**: the delivery engine reads every record, sends the 1 % that match and
  acks the other 99 % unsent (counted in ``filtered_total``).

The figure is the **skip rate**: records of the topic the subscription's cursor moves
past per second, from the consumer's attach until the record at the topic's last
offset (it matches the filter, so the filtered consumer gets it too) reaches the
consumer. Every record counts, delivered or filtered: for the unfiltered subscription
it is its delivery rate, for the filtered one its scan rate. The target (issue 16): the
filtered subscription moves through the topic at ≥ 80 % of the unfiltered one's rate.
After each run the subscription's stats are checked (``filtered_total``,
``delivered_total``, ``backlog`` 0), so a run that skipped by losing records would fail.

This is the server's capacity, not what an SDK user gets: the consumer is a raw
WebSocket client (bench/herald_bench.py's) that acks each deliver frame's records in
one ack message and gives credit back half its window at a time, as herald.Consumer
does; it costs the bench process little. The server is started by the bench (``herald
serve`` on a free loopback port and a temp dir), so its CPU time per record is read
from /proc as well: on a shared machine the firmer figure of the two.

Runs are paired and interleaved (unfiltered, filtered; then filtered, unfiltered; ...),
each pair on new subscriptions over the same topic, and the medians are printed with
the median of the per-pair ratios.

    python -m bench.filter [--records 200000] [--runs 5] [--on header|key] [--credit 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import orjson

from bench import herald_bench
from bench.common import cpu_seconds, herald_server

MATCH_EVERY = 100  # 1 % of the records match
PUBLISH_BATCH = 1000
FILTERS = {
    "header": 'headers.region = "eu"',
    "key": 'hasPrefix(key, "eu-")',
}


@dataclass(frozen=True, slots=True)
class Run:
    kind: str  # "unfiltered" | "filtered"
    records: int  # records of the topic the cursor moved past
    delivered: int
    seconds: float
    server_cpu_s: float | None

    @property
    def skip_rate(self) -> float:
        return self.records / self.seconds

    @property
    def cpu_us_per_record(self) -> float | None:
        if self.server_cpu_s is None:
            return None
        return self.server_cpu_s / self.records * 1e6


def _message(n: int, on: str, value: str) -> dict[str, object]:
    """Record n; it matches the filter when n % MATCH_EVERY == MATCH_EVERY - 1 (so the
    last record of a topic of a multiple of MATCH_EVERY records matches)."""
    region = "eu" if n % MATCH_EVERY == MATCH_EVERY - 1 else "us"
    if on == "header":
        return {"value": value, "key": f"user-{n % 1000}", "headers": {"region": region}}
    return {"value": value, "key": f"{region}-{n % 1000}", "headers": {"app": "bench"}}


async def publish_topic(url: str, topic: str, records: int, on: str, value_bytes: int) -> float:
    """Fill the topic; returns the seconds it took."""
    value = "x" * max(0, value_bytes - 2)  # compact JSON text of value_bytes bytes
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        (await http.put(f"/v1/topics/{topic}", json={"partitions": 1})).raise_for_status()
    start = time.perf_counter()
    path = f"/v1/topics/{topic}/messages?acks=1"
    # One request at a time: the offsets follow n, so the matching records are where
    # they are meant to be (the topic's last record among them).
    async with herald_bench.RawPublisher(url, 1) as raw:
        for first in range(0, records, PUBLISH_BATCH):
            batch = [
                _message(n, on, value) for n in range(first, min(records, first + PUBLISH_BATCH))
            ]
            status = await raw.post(path, orjson.dumps({"messages": batch}))
            if status >= 300:
                raise RuntimeError(f"publish answered {status}")
    return time.perf_counter() - start


async def one_run(
    url: str, pid: int | None, topic: str, kind: str, records: int, filter_: str, credit: int
) -> Run:
    name = f"{kind}-{uuid.uuid4().hex[:8]}"
    body: dict[str, object] = {"topic": topic, "start": "earliest", "max_in_flight": credit}
    if kind == "filtered":
        body["filter"] = filter_
    last_id = f"0-{records - 1}"
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        (await http.put(f"/v1/subscriptions/{name}", json=body)).raise_for_status()
        cpu_start = cpu_seconds(pid)
        start = time.perf_counter()
        delivered = 0
        # Nothing is read for a subscription before a consumer gives it credit: the
        # clock starts before the connection that brings the first credit.
        async with herald_bench._consumer(url, name, credit) as ws:
            window = herald_bench.CreditWindow(credit)
            done = False
            while not done:
                frame = orjson.loads(await asyncio.wait_for(ws.recv(), timeout=120))
                if frame["type"] != "deliver":
                    continue
                ids = [m["id"] for m in frame["messages"]]
                delivered += len(ids)
                done = last_id in ids
                await herald_bench._ack_and_replenish(ws, ids, window)
            seconds = time.perf_counter() - start
            cpu_end = cpu_seconds(pid)
            await _check(http, name, kind, records, delivered)
        (await http.delete(f"/v1/subscriptions/{name}")).raise_for_status()
    cpu = None if cpu_start is None or cpu_end is None else cpu_end - cpu_start
    return Run(kind, records, delivered, seconds, cpu)


async def _check(http: httpx.AsyncClient, name: str, kind: str, records: int, got: int) -> None:
    """The run moved past every record the honest way: each one delivered or filtered,
    and (once the last acks are in) nothing left in the backlog."""
    matching = records // MATCH_EVERY
    want_delivered = matching if kind == "filtered" else records
    want_filtered = records - matching if kind == "filtered" else 0
    deadline = time.monotonic() + 30
    while True:
        answer = (await http.get(f"/v1/subscriptions/{name}")).raise_for_status()
        stats = answer.json()["stats"]
        ok = (
            got == want_delivered
            and stats["delivered_total"] == want_delivered
            and stats["filtered_total"] == want_filtered
            and stats["backlog"] == 0
        )
        if ok:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{kind} run of {name}: consumer got {got} (want {want_delivered}); "
                f"stats {stats} (want delivered {want_delivered}, filtered {want_filtered}, "
                f"backlog 0)"
            )
        await asyncio.sleep(0.05)  # the consumer's last acks are on their way


async def run(args: argparse.Namespace, url: str, pid: int | None) -> None:
    records = args.records - args.records % MATCH_EVERY
    filter_ = FILTERS[args.on]
    topic = f"filter-bench-{uuid.uuid4().hex[:8]}"
    published = await publish_topic(url, topic, records, args.on, args.value_bytes)
    print(
        f"filter bench (server capacity): a topic of {records:,} records of "
        f"{args.value_bytes} B (one partition, published in {published:.1f} s), "
        f"filter {filter_!r} matching 1 % of them ({records // MATCH_EVERY:,}); "
        f"raw WebSocket consumer, credit {args.credit} and max_in_flight {args.credit}, "
        f"acking each frame's records in one ack message, credit given back half the "
        f"window at a time; {args.runs} interleaved pairs of runs"
    )
    host_start = herald_bench.HostSample.take(pid)
    pairs: list[tuple[Run, Run]] = []
    for i in range(args.runs):
        order = ("unfiltered", "filtered") if i % 2 == 0 else ("filtered", "unfiltered")
        done = {
            kind: await one_run(url, pid, topic, kind, records, filter_, args.credit)
            for kind in order
        }
        pair = (done["unfiltered"], done["filtered"])
        pairs.append(pair)
        print(f"  pair {i + 1}: " + "; ".join(_describe(r) for r in pair), flush=True)
    host_end = herald_bench.HostSample.take(pid)
    print(f"medians of {len(pairs)} pairs:")
    print(
        f"{'subscription':<12} {'skip rate rec/s':>16} {'delivered':>10} {'seconds':>8} "
        f"{'server CPU us/rec':>18}"
    )
    for index, kind in enumerate(("unfiltered", "filtered")):
        runs = [pair[index] for pair in pairs]
        cpus = [r.cpu_us_per_record for r in runs if r.cpu_us_per_record is not None]
        cpu = f"{statistics.median(cpus):.2f}" if cpus else "n/a"
        print(
            f"{kind:<12} {statistics.median(r.skip_rate for r in runs):>16,.0f} "
            f"{runs[0].delivered:>10,} {statistics.median(r.seconds for r in runs):>8.2f} "
            f"{cpu:>18}"
        )
    ratios = [f.skip_rate / u.skip_rate for u, f in pairs]
    ratio = statistics.median(ratios)
    verdict = "met" if ratio >= 0.8 else "MISSED"
    print(
        f"filtered / unfiltered skip rate, median of per-pair ratios: {ratio:.2f} "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}); target >= 0.80: {verdict}"
    )
    print(herald_bench.host_line(host_start, host_end))


def _describe(r: Run) -> str:
    cpu = f"{r.cpu_us_per_record:.2f}" if r.cpu_us_per_record is not None else "n/a"
    return f"{r.kind} {r.skip_rate:,.0f} rec/s ({r.seconds:.2f} s, server {cpu} us/rec)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.filter",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", help="bench an already running server instead of starting one")
    parser.add_argument("--records", type=int, default=200_000, help="records in the topic")
    parser.add_argument("--runs", type=int, default=5, help="interleaved pairs of runs (median)")
    parser.add_argument("--on", choices=sorted(FILTERS), default="header", help="filter on")
    parser.add_argument(
        "--credit", type=int, default=1000, help="consumer credit window (and max_in_flight)"
    )
    parser.add_argument("--value-bytes", type=int, default=100, help="JSON value size")
    parser.add_argument(
        "--server-cpus", help="start the server pinned to these CPUs (its --cpus), e.g. 0"
    )
    parser.add_argument(
        "--profile",
        metavar="OUT",
        help="run the server under cProfile, its stats written to OUT as it stops "
        "(read them with python -m pstats OUT); the profiler slows the server down",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.records < MATCH_EVERY:
        raise SystemExit(f"--records must be at least {MATCH_EVERY}")
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    runner = getattr(__import__("uvloop"), "run", asyncio.run)
    if args.url:
        runner(run(args, args.url.rstrip("/"), None))
        return 0
    serve: tuple[str, ...] = (sys.executable, "-m", "server.cli", "serve")
    if args.profile:
        serve = (sys.executable, "-m", "cProfile", "-o", args.profile, *serve[1:])
    cpus = ("--cpus", args.server_cpus) if args.server_cpus else ()
    with herald_server(*cpus, serve=serve) as (url, pid):
        runner(run(args, url, pid))
    return 0


if __name__ == "__main__":
    sys.exit(main())
