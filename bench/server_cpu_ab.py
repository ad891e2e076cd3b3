"""A/B: the server's CPU per one-record publish, delivered and acked, old tree vs new.

Starts ``herald serve`` from each source tree in turn (alternating the order every
round, so that a busy host weighs on both alike), drives it with
``bench/herald_bench.py``'s latency workload (one record per HTTP publish at a fixed
rate, a WebSocket consumer acking every record) and prints the server process's
user+system CPU per record, with the publish-to-deliver p50/p99, per round and as
medians. CPU time, not latency, is the figure to compare on a shared machine.

    git archive <old-commit> | (mkdir -p /tmp/old && tar -x -C /tmp/old)
    python bench/server_cpu_ab.py /tmp/old . [--rounds 6] [--rate 2000] [--seconds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import herald_bench  # bench/herald_bench.py, beside this script
import httpx


def _serve(tree: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    data_dir = tempfile.mkdtemp(prefix="herald-ab-")
    port = herald_bench._free_port()
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "server.cli", "serve", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--data-dir", data_dir],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server of {tree} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url, data_dir
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"the server of {tree} did not become healthy in 60 s")


def one_round(tree: Path, acks: str, rate: int, seconds: float) -> tuple[float, float, float]:
    """(server CPU µs per record, p50 ms, p99 ms) of one run against ``tree``'s server."""
    proc, url, data_dir = _serve(tree)
    try:
        asyncio.run(herald_bench.timed_deliveries(url, acks, rate, 1.0, False))  # warm-up
        before = herald_bench.cpu_seconds(proc.pid)
        sent, got = asyncio.run(herald_bench.timed_deliveries(url, acks, rate, seconds, False))
        after = herald_bench.cpu_seconds(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data_dir, ignore_errors=True)
    if before is None or after is None:
        raise RuntimeError("the server's CPU time is not readable (/proc)")
    latencies = sorted((at - sent[seq]) / 1e6 for seq, at in got.items())
    p50 = latencies[len(latencies) // 2]
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
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
    for round_ in range(args.rounds):
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            us, p50, p99 = one_round(tree, args.acks, args.rate, args.seconds)
            cpu[tree].append(us)
            print(f"round {round_} {tree}: {us:.1f} µs/record (p50 {p50:.2f} ms, p99 {p99:.2f} ms)")
    for tree in trees:
        runs = ", ".join(f"{us:.0f}" for us in cpu[tree])
        print(f"{tree}: median {statistics.median(cpu[tree]):.1f} µs/record [{runs}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
