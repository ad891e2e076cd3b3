"""A Herald cluster's figures (issue 14): three `herald serve --cluster` nodes and one etcd
on this machine, started by the tests' harness (tests/cluster/nodes.py).

    python -m bench.cluster [--seconds 5] [--rate 2000] [--sends 200] [--failovers 3]
                            [--catchup-mib 1024] [--node-ttl-ms 5000] [--only FIGURE]

Figures:

- ``throughput``: records/s answered at acks=all through the SDK (``herald.Producer``
  with its defaults: batches of up to 1000, 4 requests in flight), 100-byte values, for
  ``--seconds``, to the partition leader: a topic with replication_factor 3 against one
  with replication_factor 1 on the same cluster (the ratio; issue 14's target: >= 50 %),
  and a standalone `herald serve` (no --cluster) for reference; RF 3 through a follower
  too, with the producer's ``leader_routing`` off (the follower forwards every record to
  the leader) and on, as by default (the producer, given the follower's URL, learns the
  leader and sends there).
- ``one-at-a-time`` (issue 27): ``--sends`` one-record publishes through the SDK
  (``send_and_wait``: the next sent once the last is answered), 100-byte values, at
  acks=all and acks=1, to an RF 3 topic's leader, through a follower (forwarded:
  ``leader_routing`` off), given a follower's URL (the SDK's default: it sends to the
  leader), and to a standalone `herald serve`, taken in turn so the host's load weighs on each alike;
  the cluster holds several topics of several partitions (each follower's fetch names
  many, as in any real cluster): median and p99 of each, and the RF 3 / standalone ratio
  (the issue's target: <= 3x).
- ``publish-to-deliver``: ``--rate`` records/s (2,000) for ``--seconds`` to an RF 3
  topic through the SDK, each value stamped with its send time; an SDK Tail on the
  leader and one on a follower: p50 / p99 / max from the send to the tail's receipt;
  then the same to a standalone `herald serve` with a Tail on it, for reference.
- ``failover``: kill -9 of the leader of an RF 3 topic while a client publishes one
  record at a time at acks=all to another node (raw HTTP, a retry 20 ms after a 503 or
  no answer, so that the figure is the server's and not a client's backoff): from the
  kill to the first publish sent after it and answered 200; and to the moment every
  surviving node names the new leader. ``--failovers`` times (the killed node restarted
  and back in the ISR in between); the issue's target is node_ttl_ms + 2 s. Once more
  through the SDK: a Producer given every node's URL (the leader's first) sending one
  record at a time, its retries honouring Retry-After.
- ``consume`` and ``coordinator`` (issue 15, bench/cluster_subscriptions.py): records/s
  end to end through the SDK with the consumer on another node than the producer and
  the subscription's coordinator (relayed), RF 3; and kill -9 of a subscription's
  coordinator to the first redelivered record.
- ``catch-up``: a follower killed, ``--catchup-mib`` MiB (1 GiB) published at acks=all
  while it is down, then restarted: from its start to its return to the ISR, and MiB/s.

Not a test: it asserts nothing. The host's other work shares the CPUs and the disk.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench.cluster_subscriptions import consume_throughput, coordinator_failover
from bench.common import cpu_seconds, percentile, temp_dir
from herald import Producer, Tail
from tests.cluster.nodes import HeraldCluster
from tests.conftest import HeraldProcess

VALUE = "x" * 98  # a 100-byte JSON value with its quotes


# -- throughput ----------------------------------------------------------------------


async def produce_for(url: str, topic: str, seconds: float, *, routing: bool = True) -> float:
    """Records/s acknowledged at acks=all through the SDK's defaults (``routing``: False
    to keep the producer from sending to the leader itself, so that a node forwards)."""
    window = 20_000  # records awaiting an answer at most (the Producer batches them)
    acked = 0
    async with Producer(url, leader_routing=routing) as producer:
        pending: list[asyncio.Future[Any]] = []
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            pending += [producer.send(topic, VALUE, partition=0) for _ in range(1000)]
            if len(pending) >= window:
                done, pending = pending[: window // 2], pending[window // 2 :]
                await asyncio.gather(*done)
                acked += len(done)
        await asyncio.gather(*pending)
        acked += len(pending)
        return acked / (time.monotonic() - started)


def throughput(cluster: HeraldCluster, root: Path, seconds: float) -> None:
    cluster.create_topic("tp-rf3", replication_factor=3)
    cluster.create_topic("tp-rf1", replication_factor=1)
    rf3_leader = cluster.leader("tp-rf3")
    rf1_leader = cluster.leader("tp-rf1")
    follower = cluster.followers("tp-rf3")[0]
    rf3 = asyncio.run(produce_for(rf3_leader.url, "tp-rf3", seconds))
    rf1 = asyncio.run(produce_for(rf1_leader.url, "tp-rf1", seconds))
    forwarded = asyncio.run(produce_for(follower.url, "tp-rf3", seconds, routing=False))
    routed = asyncio.run(produce_for(follower.url, "tp-rf3", seconds))
    single = HeraldProcess(root / "standalone").start()
    try:
        alone = asyncio.run(produce_for(single.url, "tp", seconds))
    finally:
        single.terminate()
    print(
        f"throughput acks=all, SDK defaults, 100-byte values, {seconds:g} s each:\n"
        f"  RF 3 via the leader      {rf3:9,.0f} msg/s\n"
        f"  RF 3 via a follower      {forwarded:9,.0f} msg/s (forwarded)\n"
        f"  RF 3 given a follower    {routed:9,.0f} msg/s (the SDK sends to the leader)\n"
        f"  RF 1 on the cluster      {rf1:9,.0f} msg/s\n"
        f"  standalone herald serve  {alone:9,.0f} msg/s\n"
        f"  RF 3 / RF 1 = {rf3 / rf1:.0%}; RF 3 / standalone = {rf3 / alone:.0%}",
        flush=True,
    )


# -- one record at a time ---------------------------------------------------------------


async def one_at_a_time(
    targets: dict[str, tuple[str, str, bool]], acks: str, sends: int
) -> dict[str, list[float]]:
    """Seconds from send to answer of ``sends`` one-record publishes per target (name:
    (url, topic, whether the producer sends to the leader itself)), each target in
    turn, one record at a time."""
    latencies: dict[str, list[float]] = {name: [] for name in targets}
    async with contextlib.AsyncExitStack() as stack:
        producers = {
            name: await stack.enter_async_context(Producer(url, acks=acks, leader_routing=routing))
            for name, (url, _, routing) in targets.items()
        }
        for name, (_, topic, _) in targets.items():  # warm: connections open, paths taken
            for _ in range(10):
                await producers[name].send_and_wait(topic, VALUE, partition=0)
            await producers[name].partitions_for(topic)  # the leaders, where it routes
        for _ in range(sends):
            for name, (_, topic, _) in targets.items():
                started = time.perf_counter()
                await producers[name].send_and_wait(topic, VALUE, partition=0)
                latencies[name].append(time.perf_counter() - started)
    return latencies


def one_record_at_a_time(cluster: HeraldCluster, root: Path, sends: int) -> None:
    for name in ("oat-a", "oat-b", "oat-c"):
        cluster.create_topic(name, partitions=4, replication_factor=3)
    leader = cluster.leader("oat-a")
    follower = cluster.any_serving(exclude={leader.node_id})
    single = HeraldProcess(root / "standalone-oat").start()
    try:
        httpx.put(f"{single.url}/v1/topics/oat", json={"partitions": 4}).raise_for_status()
        targets = {
            "standalone herald serve": (single.url, "oat", True),
            f"RF 3 via the leader {leader.node_id}": (leader.url, "oat-a", True),
            f"RF 3 via {follower.node_id} (forwarded)": (follower.url, "oat-a", False),
            f"RF 3 given {follower.node_id} (routed)": (follower.url, "oat-a", True),
        }
        print(
            f"one record at a time (SDK send_and_wait, 100-byte values, {sends} sends per "
            "row, rows in turn; 3 topics of 4 partitions on the cluster):",
            flush=True,
        )
        for acks in ("all", "1"):
            latencies = asyncio.run(one_at_a_time(targets, acks, sends))
            alone = statistics.median(latencies["standalone herald serve"])
            for name, values in latencies.items():
                ms = [v * 1000 for v in values]
                ratio = statistics.median(values) / alone
                print(
                    f"  acks={acks:<3} {name:<28} p50 {statistics.median(ms):6.1f} ms  "
                    f"p99 {percentile(ms, 0.99):6.1f} ms  ({ratio:.1f}x standalone)",
                    flush=True,
                )
    finally:
        single.terminate()


# -- publish to deliver ----------------------------------------------------------------


async def deliver_latency(
    publish_url: str, tail_urls: dict[str, str], topic: str, rate: int, seconds: float
) -> dict[str, list[float]]:
    total = int(rate * seconds)
    latencies: dict[str, list[float]] = {name: [] for name in tail_urls}

    async def tail(name: str, url: str, ready: asyncio.Event) -> None:
        async with Tail(url, topic, start="latest", limit=total) as records:
            ready.set()
            async for message in records:
                latencies[name].append(time.monotonic() - float(message.value))

    readies = {name: asyncio.Event() for name in tail_urls}
    async with asyncio.TaskGroup() as group:
        tails = [group.create_task(tail(n, u, readies[n])) for n, u in tail_urls.items()]
        await asyncio.gather(*(r.wait() for r in readies.values()))
        await asyncio.sleep(0.5)  # the tails' subscriptions are in place
        batch = max(1, rate // 100)  # every 10 ms
        async with Producer(publish_url) as producer:
            started = time.monotonic()
            sends = []
            for k in range(0, total, batch):
                due = started + k / rate
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                now = time.monotonic()
                sends += [producer.send(topic, repr(now), partition=0) for _ in range(batch)]
            await asyncio.gather(*sends)
        await asyncio.wait_for(asyncio.gather(*tails), 60)
    return latencies


def publish_to_deliver(cluster: HeraldCluster, root: Path, rate: int, seconds: float) -> None:
    cluster.create_topic("latency", replication_factor=3)
    leader = cluster.leader("latency")
    follower = cluster.followers("latency")[0]
    processes = {f"node {n.node_id}" + (" (leader)" if n is leader else ""): n.proc
                 for n in cluster.nodes.values()}  # fmt: skip
    assert cluster.etcd is not None
    processes["etcd"] = cluster.etcd.proc
    cpu_before = {name: cpu_seconds(proc.pid) for name, proc in processes.items() if proc}
    latencies = asyncio.run(
        deliver_latency(
            leader.url,
            {f"tail on the leader {leader.node_id}": leader.url,
             f"tail on a follower {follower.node_id}": follower.url},
            "latency",
            rate,
            seconds,
        )
    )  # fmt: skip
    cpu = {name: (cpu_seconds(processes[name].pid) or 0.0) - used
           for name, used in cpu_before.items() if used is not None}  # fmt: skip
    single = HeraldProcess(root / "standalone-latency").start()
    try:
        httpx.put(f"{single.url}/v1/topics/latency").raise_for_status()
        assert single.proc is not None
        used = cpu_seconds(single.proc.pid) or 0.0
        latencies |= asyncio.run(
            deliver_latency(
                single.url, {"standalone herald serve (reference)": single.url}, "latency",
                rate, seconds,
            )
        )  # fmt: skip
        cpu["standalone herald serve"] = (cpu_seconds(single.proc.pid) or 0.0) - used
    finally:
        single.terminate()
    print(f"publish-to-deliver, {rate:,} msg/s for {seconds:g} s, RF 3, acks=all (SDK):")
    for name, values in latencies.items():
        ms = [v * 1000 for v in values]
        print(
            f"  {name}: {len(ms):,} records, p50 {statistics.median(ms):.1f} ms, "
            f"p99 {percentile(ms, 0.99):.1f} ms, max {max(ms):.1f} ms",
            flush=True,
        )
    records = rate * seconds
    print("  CPU per record published (each process, its whole run):")
    for name, used in cpu.items():
        print(f"    {name}: {used / records * 1e6:.0f} µs", flush=True)


# -- failover ------------------------------------------------------------------------


def one_failover(cluster: HeraldCluster, topic: str, seq: int) -> tuple[float, float]:
    old = cluster.leader(topic).node_id
    via = cluster.any_serving(exclude={old})
    with httpx.Client(timeout=2.0) as http:

        def publish(tag: str) -> bool:
            try:
                answer = http.post(
                    f"{via.url}/v1/topics/{topic}/messages",
                    json={"messages": [{"value": tag, "id": tag, "partition": 0}]},
                )
            except httpx.TransportError:
                return False
            return answer.status_code == 200

        for k in range(20):  # warm: the path through `via` to the leader works
            publish(f"warm-{seq}-{k}")
        killed_at = time.monotonic()
        cluster.kill(old)
        first_ack = None
        for k in range(100_000):
            if publish(f"fo-{seq}-{k}"):
                first_ack = time.monotonic() - killed_at
                break
            time.sleep(0.02)
        assert first_ack is not None
    cluster.wait_leader(topic, not_on={old}, within=60.0)
    elected = time.monotonic() - killed_at
    cluster.restart(old)
    cluster.wait_isr(topic, 0, cluster.partition_state(topic)["replicas"], within=120.0)
    return first_ack, elected


async def sdk_failover(cluster: HeraldCluster, topic: str) -> float:
    """The SDK's view: a Producer given every node's URL, the leader's first, sends one
    record at a time; from the kill to the answer of the first record sent after it
    (its retries honour Retry-After)."""
    old = cluster.leader(topic)
    urls = [old.url, *(n.url for n in cluster.nodes.values() if n is not old)]
    async with Producer(urls) as producer:
        for _ in range(20):
            await producer.send_and_wait(topic, "warm", partition=0)
        killed_at = time.monotonic()
        cluster.kill(old.node_id)
        await producer.send_and_wait(topic, "after", partition=0)
        took = time.monotonic() - killed_at
    cluster.restart(old.node_id)
    cluster.wait_isr(topic, 0, cluster.partition_state(topic)["replicas"], within=120.0)
    return took


def failover(cluster: HeraldCluster, times: int) -> None:
    cluster.create_topic("failover", replication_factor=3)
    results = [one_failover(cluster, "failover", k) for k in range(times)]
    sdk = asyncio.run(sdk_failover(cluster, "failover"))
    acks = [r[0] for r in results]
    print(
        f"failover (kill -9 of the leader, node TTL {cluster.node_ttl_ms} ms; target "
        f"{(cluster.node_ttl_ms + 2000) / 1000:g} s): first acks=all publish answered "
        f"{', '.join(f'{a:.2f}' for a in acks)} s after the kill (median "
        f"{statistics.median(acks):.2f} s); every node named the new leader after "
        f"{', '.join(f'{r[1]:.2f}' for r in results)} s; through the SDK (Producer with "
        f"every node's URL, the killed leader's first): {sdk:.2f} s",
        flush=True,
    )


# -- follower catch-up -----------------------------------------------------------------


def catch_up(cluster: HeraldCluster, mib: int) -> None:
    cluster.create_topic("catchup", replication_factor=3, min_insync_replicas=2)
    leader = cluster.leader("catchup")
    follower = cluster.followers("catchup")[0]
    cluster.kill(follower.node_id)
    survivors = [n for n in cluster.partition_state("catchup")["replicas"] if n != follower.node_id]
    cluster.wait_isr("catchup", 0, survivors, within=60.0)
    chunk = base64.b64encode(os.urandom(16 * 1024)).decode()
    body = {"messages": [{"value_b64": chunk, "partition": 0}] * 64}  # 1 MiB a request
    started = time.monotonic()
    with httpx.Client(timeout=60.0) as http:
        for _ in range(mib):
            answer = http.post(f"{leader.url}/v1/topics/catchup/messages", json=body)
            answer.raise_for_status()
    wrote = time.monotonic() - started
    restarted_at = time.monotonic()
    cluster.restart(follower.node_id)
    started_s = time.monotonic() - restarted_at
    cluster.wait_isr("catchup", 0, [*survivors, follower.node_id], within=max(600.0, mib * 2.0))
    took = time.monotonic() - restarted_at
    print(
        f"catch-up: {mib:,} MiB written while {follower.node_id} was down "
        f"({mib / wrote:.0f} MiB/s at acks=all, RF 3 with 2 in the ISR); restarted, it was "
        f"serving after {started_s:.1f} s and back in the ISR {took:.1f} s after its start "
        f"({mib / took:.0f} MiB/s)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--catchup-mib", type=int, default=1024)
    parser.add_argument("--node-ttl-ms", type=int, default=5000)
    parser.add_argument("--records", type=int, default=100_000, help="for consume")
    parser.add_argument("--sends", type=int, default=200, help="for one-at-a-time")
    figures = [
        "throughput",
        "one-at-a-time",
        "latency",
        "failover",
        "consume",
        "coordinator",
        "catchup",
    ]
    parser.add_argument("--only", choices=figures, action="append")
    args = parser.parse_args()
    only = set(args.only or figures)
    with temp_dir("herald-cluster-bench-") as root:
        print(f"3 nodes + etcd on {os.cpu_count()} CPUs, data under {root}", flush=True)
        with HeraldCluster(
            root / "cluster", 3, node_ttl_ms=args.node_ttl_ms, replica_lag_ms=10_000
        ) as cluster:
            if "throughput" in only:
                throughput(cluster, root, args.seconds)
            if "one-at-a-time" in only:
                one_record_at_a_time(cluster, root, args.sends)
            if "latency" in only:
                publish_to_deliver(cluster, root, args.rate, args.seconds)
            if "failover" in only:
                failover(cluster, args.failovers)
            if "consume" in only:
                consume_throughput(cluster, args.records)
            if "coordinator" in only:
                coordinator_failover(cluster, args.failovers)
            if "catchup" in only:
                catch_up(cluster, args.catchup_mib)


if __name__ == "__main__":
    main()
