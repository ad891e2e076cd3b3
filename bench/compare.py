"""Herald beside Redis Streams, NATS JetStream and RabbitMQ: one workload, one sitting.

Each system through its usual Python asyncio client — for Herald, its own SDK
(bench/compare_herald.py), the peers' in bench/compare_peers.py — doing the same work
per record in each mode (bench/compare_workload.py): each record built and sent
through the client, each delivery decoded by the client (a ``herald.Message``) and
acked through it. On this machine, in rounds that rotate the systems so that the
host's noise falls on all of them alike:

- end to end, one producer and one consumer with WINDOW records outstanding acking
  every record, N records of 1 KiB, for each mode: JSON (Herald: a JSON string) or
  binary (1 KiB of random bytes; Herald: ``value_b64``), sent as 4 concurrent batch
  calls of 500 (the table of 2026-11-25) or one window of 1,000 in flight, with the
  client's batch calls (``send_many`` / ``ack_many``) or its per-record ones
  (``send`` / ``message.ack()``);
- latency: one 1 KiB record per publish at a fixed rate, publish-to-deliver time,
  with the per-record calls and with batch calls of one record, JSON and binary.

Also the CPU time per record of the client (this process: producer and consumer) and
of the server process (with its children), in each run. The server's own capacity,
with a client that costs nothing, is ``python -m bench.herald_bench``'s figure.

Needs the servers (``apt-get install redis-server nats-server rabbitmq-server``) and
the clients (``pip install -e '.[bench]'``); a system whose server is missing is
skipped with a note. Run: ``python -m bench.compare [--records N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench import herald_bench
from bench.common import cpu_seconds, herald_server, percentile, system_seconds
from bench.compare_herald import Herald
from bench.compare_peers import SERVERS
from bench.compare_workload import (
    LATENCY_MODES,
    WINDOW,
    WORKLOADS,
    Calls,
    Payload,
    System,
    Workload,
    end_to_end,
    latency,
)


@dataclass(frozen=True, slots=True)
class Run:
    """One run's figures: a rate (msg/s) or latency percentiles (ms), and CPU µs per
    record of this process (client) and of the server's."""

    rate: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    client_us: float
    server_us: float
    server_system_us: float  # the part of server_us spent in the kernel


def tree_cpu_seconds(
    pid: int | None, of: Callable[[int], float | None] = cpu_seconds
) -> float | None:
    """CPU seconds of a process and every descendant alive (RabbitMQ's start script runs
    its Erlang VM as a child); ``of=system_seconds``: their kernel time alone."""
    if pid is None:
        return None
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        total += of(current) or 0.0
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    stack.extend(int(child) for child in children.read().split())
    return total


class CpuMeter:
    """CPU seconds of this process and of the server's (with its children) over a run."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.client = time.process_time()
        self.server = tree_cpu_seconds(pid)
        self.system = tree_cpu_seconds(pid, system_seconds)

    def per_record_us(self, records: int) -> tuple[float, float, float]:
        """Client, server, and the server's kernel part, in µs per record."""
        client = time.process_time() - self.client
        now = tree_cpu_seconds(self.pid)
        server = now - self.server if now is not None and self.server is not None else 0.0
        now = tree_cpu_seconds(self.pid, system_seconds)
        system = now - self.system if now is not None and self.system is not None else 0.0
        return client / records * 1e6, server / records * 1e6, system / records * 1e6


def _latency_label(calls: Calls, payload: Payload) -> str:
    return f"{payload.value}, {calls.value} calls"


async def one_round(
    systems: list[System],
    workloads: list[Workload],
    latency_modes: list[tuple[Calls, Payload]],
    args: argparse.Namespace,
) -> dict[tuple[str, str], Run]:
    """Every system's runs, keyed by (system, mode's label)."""
    runs = {}
    for system in systems:
        print(f"  {system.name} ...", file=sys.stderr, flush=True)
        for workload in workloads:
            meter = CpuMeter(system.pid)
            try:
                elapsed = await end_to_end(system, workload, args.records)
            except Exception as exc:  # a failed run is reported and left out of the medians
                _failed(system, workload.label, exc)
                continue
            client, server, kernel = meter.per_record_us(args.records)
            runs[system.name, workload.label] = Run(
                args.records / elapsed, 0, 0, 0, client, server, kernel
            )
            _show(system, workload.label, runs[system.name, workload.label])
        for calls, payload in latency_modes:
            label = _latency_label(calls, payload)
            meter = CpuMeter(system.pid)
            try:
                ordered = sorted(await latency(system, calls, payload, args.rate, args.seconds))
            except Exception as exc:
                _failed(system, label, exc)
                continue
            client, server, kernel = meter.per_record_us(len(ordered))
            runs[system.name, label] = Run(
                args.rate,
                percentile(ordered, 0.50),
                percentile(ordered, 0.99),
                percentile(ordered, 0.999),
                client,
                server,
                kernel,
            )
            _show(system, label, runs[system.name, label])
    return runs


def _failed(system: System, label: str, exc: BaseException) -> None:
    print(f"    {system.name}, {label}: failed ({exc!r}); left out", file=sys.stderr, flush=True)


def _show(system: System, label: str, run: Run) -> None:
    """Each run as it ends, so that a round cut short still leaves its figures."""
    print(f"    {system.name}, {label}: {run}", file=sys.stderr, flush=True)


def _print_tables(
    systems: list[System],
    workloads: list[Workload],
    latency_modes: list[tuple[Calls, Payload]],
    rounds: list[dict[tuple[str, str], Run]],
    args: argparse.Namespace,
) -> None:
    def median(name: str, label: str, field: str) -> float:
        values = [getattr(r[name, label], field) for r in rounds if (name, label) in r]
        return statistics.median(values) if values else math.nan

    print(
        f"End to end: {args.records} x 1 KiB records, one consumer with {WINDOW} outstanding "
        f"acking every record; medians of {len(rounds)} rounds; CPU µs per record: client = "
        "this process (producer and consumer), server = its process and children, "
        "of it in the kernel (system calls, loopback TCP)"
    )
    print(f"{'mode / system':<30} {'e2e msg/s':>10} {'cli µs':>7} {'srv µs':>7} {'kernel':>7}")
    for workload in workloads:
        print(f"-- {workload.label}")
        for system in systems:
            name, label = system.name, workload.label
            print(
                f"{name:<30} {median(name, label, 'rate'):>10,.0f} "
                f"{median(name, label, 'client_us'):>7.1f} {median(name, label, 'server_us'):>7.1f}"
                f" {median(name, label, 'server_system_us'):>7.1f}"
            )
    print(
        f"\nLatency: one 1 KiB record per publish at {args.rate} msg/s for {args.seconds:g} s, "
        "publish to delivery (ms); CPU µs per record as above"
    )
    print(
        f"{'mode / system':<30} {'p50 ms':>7} {'p99 ms':>7} {'p999 ms':>8} {'cli µs':>7} "
        f"{'srv µs':>7} {'kernel':>7}"
    )
    for calls, payload in latency_modes:
        label = _latency_label(calls, payload)
        print(f"-- {label}")
        for system in systems:
            name = system.name
            print(
                f"{name:<30} {median(name, label, 'p50_ms'):>7.2f} "
                f"{median(name, label, 'p99_ms'):>7.2f} {median(name, label, 'p999_ms'):>8.2f} "
                f"{median(name, label, 'client_us'):>7.1f} {median(name, label, 'server_us'):>7.1f}"
                f" {median(name, label, 'server_system_us'):>7.1f}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=50_000, help="records per e2e run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; figures are medians")
    parser.add_argument("--rate", type=int, default=2000, help="msg/s of the latency run")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the latency run")
    parser.add_argument("--systems", nargs="*", choices=sorted(SERVERS), default=sorted(SERVERS))
    payloads = [p.value for p in Payload]
    parser.add_argument("--payloads", nargs="*", choices=payloads, default=payloads)
    args = parser.parse_args()
    workloads = [w for w in WORKLOADS if w.payload.value in args.payloads]
    latency_modes = [(c, p) for c, p in LATENCY_MODES if p.value in args.payloads]
    # Killed (timeout, CI), still stop the servers started below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    runner = getattr(__import__("uvloop"), "run", asyncio.run)

    with contextlib.ExitStack() as stack:
        url, pid = stack.enter_context(herald_server())
        systems: list[System] = [Herald(url, "1", pid), Herald(url, "all", pid)]
        for name in args.systems:
            binary, start = SERVERS[name]
            if shutil.which(binary) is None:
                print(f"{name}: {binary} not installed, skipped", file=sys.stderr)
                continue
            systems.append(stack.enter_context(start()))
        host_start = herald_bench.HostSample.take(None)
        load_start = os.getloadavg()
        rounds = []
        for number in range(args.rounds):
            print(f"round {number + 1}/{args.rounds}", file=sys.stderr, flush=True)
            # Rotate the order so no system always runs first (warm caches, quiet host).
            shift = number % len(systems)
            rotated = systems[shift:] + systems[:shift]
            rounds.append(runner(one_round(rotated, workloads, latency_modes, args)))
        host_end = herald_bench.HostSample.take(None)
        load_end = os.getloadavg()

    _print_tables(systems, workloads, latency_modes, rounds, args)
    print(f"load average (1 min) at the start {load_start[0]:.1f}, at the end {load_end[0]:.1f}")
    if host_start is not None and host_end is not None and host_end.total > host_start.total:
        steal = (host_end.steal - host_start.steal) / (host_end.total - host_start.total)
        print(f"host: steal {steal:.1%} of CPU time during the run (taken by the hypervisor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
