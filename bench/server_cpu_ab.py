"""A/B: the server's CPU per one-record publish, delivered and acked, old tree vs new.

Starts ``herald serve`` from each source tree in turn (alternating the order every
round, so that a busy host weighs on both alike), drives it with
``bench/herald_bench.py``'s latency workload (one record per HTTP publish at a fixed
rate, a WebSocket consumer acking every record) and prints the server process's
user+system CPU per record, with the publish-to-deliver p50/p99, per round and as
medians. CPU time, not latency, is the figure to compare on a shared machine.

    git archive <old-commit> | (mkdir -p /tmp/old && tar -x -C /tmp/old)
    python -m bench.server_cpu_ab /tmp/old . [--rounds 6] [--rate 2000] [--seconds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path

from bench import herald_bench
from bench.common import cpu_seconds, herald_server, percentile


def one_round(tree: Path, acks: str, rate: int, seconds: float) -> tuple[float, float, float]:
    """(server CPU µs per record, p50 ms, p99 ms) of one run against ``tree``'s server."""
    # The tree's own packages, the tree's own server: PYTHONPATH and cwd both the tree.
    env = dict(os.environ, PYTHONPATH=str(tree))
    with herald_server(env=env, cwd=tree, within_s=60, prefix="herald-ab-") as (url, pid):
        asyncio.run(herald_bench.timed_deliveries(url, acks, rate, 1.0, False))  # warm-up
        before = cpu_seconds(pid)
        sent, got = asyncio.run(herald_bench.timed_deliveries(url, acks, rate, seconds, False))
        after = cpu_seconds(pid)
    if before is None or after is None:
        raise RuntimeError("the server's CPU time is not readable (/proc)")
    latencies = [(at - sent[seq]) / 1e6 for seq, at in got.items()]
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    return (after - before) / len(got) * 1e6, p50, p99


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+", type=Path, help="source trees to compare")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--rate", type=int, default=2000, help="one-record publishes per second")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each run")
    parser.add_argument("--acks", choices=["0", "1", "all"], default="1")
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.trees]
    cpu: dict[Path, list[float]] = {tree: [] for tree in trees}
    p99s: dict[Path, list[float]] = {tree: [] for tree in trees}
    for round_ in range(args.rounds):
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            us, p50, p99 = one_round(tree, args.acks, args.rate, args.seconds)
            cpu[tree].append(us)
            p99s[tree].append(p99)
            print(f"round {round_} {tree}: {us:.1f} µs/record (p50 {p50:.2f} ms, p99 {p99:.2f} ms)")
    for tree in trees:
        runs = ", ".join(f"{us:.0f}" for us in cpu[tree])
        print(f"{tree}: median {statistics.median(cpu[tree]):.1f} µs/record [{runs}]")
    for tree in trees:
        runs = ", ".join(f"{ms:.2f}" for ms in p99s[tree])
        print(f"{tree}: median p99 {statistics.median(p99s[tree]):.2f} ms [{runs}]")
    if len(trees) == 2:
        pairs = [new / old for old, new in zip(cpu[trees[0]], cpu[trees[1]], strict=True)]
        tails = [new / old for old, new in zip(p99s[trees[0]], p99s[trees[1]], strict=True)]
        print(
            f"second / first, median of the pair-by-pair ratios: CPU {statistics.median(pairs):.3f}, "
            f"p99 {statistics.median(tails):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
