"""Where the server's CPU goes per one-record publish, delivery and ack (issue 27 §2).

Starts ``herald serve``, drives it with ``bench/herald_bench.py``'s latency workload
(one record per HTTP publish at a fixed rate, a WebSocket consumer acking every
record), samples the server with py-spy (every thread, ``--nonblocking``) while it runs,
and sorts each sample into one stage of the record's path by the innermost frame
that names one (so a msgspec call made by validation counts as validation, a socket
send made by the WebSocket writer as the WebSocket send). Each thread's CPU time
comes from /proc (the event loop's thread apart from the writer and pool threads),
and each stage's share of a thread's samples is printed as µs per record. Samples
of a thread parked in a wait (woken but not yet on a CPU, which py-spy counts as
running) are left out.

    python -m bench.server_profile [--rate 2000] [--seconds 20] [--acks 1] [--raw OUT]
    python -m bench.server_profile --bulk 300000 [--acks 1]
    python -m bench.server_profile --perf [--bulk N]

``--bulk N`` profiles ``herald_bench``'s throughput workload instead (N records of 1 KiB
published in batches of 500 by 4 concurrent requests, each delivered and acked): where
the server's CPU per record goes in bulk.

``--perf`` samples with Linux perf instead of py-spy (``perf record -g``, every thread,
the kernel included): the server's CPU per record split by shared object (the
interpreter, the kernel, uvloop, the C extensions) and the kernel's share by system call
(inclusive: a socket write on loopback carries the receiving side's TCP work too). It
sees what py-spy's "event loop" stage holds, which no Python frame names. Needs
``perf`` (linux-perf) and the right to profile the server.

Needs ``py-spy`` (in the venv or on the PATH) and the right to ptrace the server
(root, or ``kernel.yama.ptrace_scope=0``). A sampling profile: shares are good to a
few per cent; the µs are the shares times the thread's measured CPU per record.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable

from bench import herald_bench
from bench.common import herald_server

# (stage, markers): a frame whose text holds a marker belongs to the stage; a sample
# goes to the stage of its innermost such frame. The order only breaks ties within a
# frame (none expected).
STAGES: list[tuple[str, tuple[str, ...]]] = [
    (
        "HTTP server: uvicorn + httptools",
        ("uvicorn/protocols/http/", "httptools", "server/http_protocol.py"),
    ),
    (
        "ASGI + middleware layers",
        (
            "starlette/",
            "server/app.py",
            "server/logging.py",
            "server/limits.py",
            "server/access.py",
            "server/errors.py",
            "server/coordinated.py",
            "server/endpoint.py",
            "server/tasks.py",
        ),
    ),
    ("publish endpoint: body, answer", ("server/publish.py", "server/http.py")),
    ("validation", ("server/validation.py", "herald/protocol/publish.py")),
    # On the loop: the submit that wakes the writer, the answers run back; on the
    # writer thread: its queue and group commit.
    ("writer hand-off", ("storage/writer.py",)),
    ("cursor saves (thread pool)", ("storage/cursors.py",)),
    ("storage: publish, encode + write, log reads", ("storage/",)),
    ("delivery engine, frame encode", ("delivery/", "subscribers/wire.py")),
    (
        "WebSocket send, ack handling",
        (
            "subscribers/",
            "websockets/",
            "uvicorn/protocols/websockets/",
            "server/websocket_protocol.py",
            "server/keepalive.py",
        ),
    ),
    ("metrics, logging", ("server/metrics.py", "prometheus_client/", "logging/")),
    ("thread pool", ("concurrent/futures/",)),
]
LOOP = "event loop: uvloop, epoll, task steps, socket calls"
OTHER = "other (GC, interpreter, unattributed)"


# A thread's innermost frame while it waits: sampled when it is runnable but not yet
# on a CPU (woken, or waiting for the GIL) — on a busy host much of the time. Not CPU.
WAITS = ("Condition.wait (", "wait (threading.py", "_worker (concurrent/futures/thread.py")


def stage_of(frames: list[str]) -> str:
    for frame in reversed(frames):  # innermost first
        for stage, markers in STAGES:
            if any(marker in frame for marker in markers):
                return stage
    if any("uvloop" in frame or "asyncio/" in frame for frame in frames):
        return LOOP
    return OTHER


def stages_of(raw: str) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """py-spy's raw (collapsed) output -> samples per stage of the main thread (the
    event loop) and of the other threads, waits left out."""
    main: collections.Counter[str] = collections.Counter()
    others: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if frames[-1].startswith(WAITS):
            continue
        thread = others if any("_bootstrap (threading.py" in f for f in frames) else main
        thread[stage_of(frames)] += int(count)
    return main, others


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of the main thread (the event loop) and of all the others."""
    main = other = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        seconds = cpu_seconds_of_task(pid, int(tid))
        if int(tid) == pid:
            main += seconds
        else:
            other += seconds
    return main, other


def cpu_seconds_of_task(pid: int, tid: int) -> float:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0  # a thread that ended meanwhile
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# System calls the kernel's share is split into under --perf: (perf's symbol, label).
SYSCALLS = [
    ("ksys_write", "write: socket sends (with loopback's receive), the log"),
    ("ksys_read", "read: socket receives, eventfd"),
    ("__x64_sys_futex", "futex: the GIL, the writer thread's wake"),
    ("__x64_sys_epoll_pwait", "epoll_pwait"),
    ("__do_sys_io_uring_enter", "io_uring_enter: libuv's epoll_ctl batches"),
    ("__x64_sys_fdatasync", "fdatasync"),
]


def sample(
    sampler_argv: Callable[[int], list[str]], args: argparse.Namespace
) -> tuple[int, float, float]:
    """Run the workload under a sampler (its argv for the server's pid; it ends at
    SIGINT): (records, main thread CPU s, other threads' CPU s)."""
    with herald_server() as (url, pid):
        if args.bulk:
            asyncio.run(herald_bench.throughput(url, pid, args.acks, 20_000, 500, 4, False))
        else:  # warm
            asyncio.run(herald_bench.timed_deliveries(url, args.acks, args.rate, 1.0, False))
        main_before, other_before = thread_cpu(pid)
        sampler = subprocess.Popen(
            sampler_argv(pid),  # until the server ends (or SIGINT)
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            if args.bulk:
                bulk = herald_bench.throughput(url, pid, args.acks, args.bulk, 500, 4, False)
                records = asyncio.run(bulk).records
            else:
                run = herald_bench.timed_deliveries(url, args.acks, args.rate, args.seconds, False)
                records = len(asyncio.run(run)[1])
            main_after, other_after = thread_cpu(pid)
        finally:
            sampler.send_signal(signal.SIGINT)  # the sampler writes what it sampled and ends
            _, errors = sampler.communicate(timeout=120)
    if sampler.returncode not in (0, -signal.SIGINT):
        raise RuntimeError(f"the sampler failed: {errors.decode(errors='replace')}")
    return records, main_after - main_before, other_after - other_before


def perf_shares(perf: str, data: str, *how: str) -> list[tuple[float, str]]:
    """(percent, name) rows of ``perf report`` over ``data``, sorted and shaped by ``how``."""
    report = subprocess.run(
        [perf, "report", "-i", data, "--stdio", "-q", "-g", "none", *how],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = []
    for line in report.splitlines():
        fields = line.split()
        if fields and fields[0].endswith("%"):
            rows.append((float(fields[0].rstrip("%")), fields[-1]))
    return rows


def print_perf(perf: str, data: str, us_per_record: float) -> None:
    print("by shared object (self):")
    for percent, dso in perf_shares(perf, data, "--no-children", "--sort", "dso")[:8]:
        print(f"  {dso:<55} {percent:>5.1f}% {percent / 100 * us_per_record:>7.1f} µs")
    inclusive = {
        symbol: percent
        for percent, symbol in perf_shares(perf, data, "--children", "--sort", "sym")
    }
    print("the kernel's, by system call (inclusive):")
    for symbol, label in SYSCALLS:
        percent = inclusive.get(symbol, 0.0)
        print(f"  {label:<55} {percent:>5.1f}% {percent / 100 * us_per_record:>7.1f} µs")


def print_thread(title: str, counts: collections.Counter[str], us_per_record: float) -> None:
    total = sum(counts.values()) or 1
    print(f"{title}: {us_per_record:.0f} µs per record ({total} samples)")
    for stage, samples in counts.most_common():
        share = samples / total
        print(f"  {stage:<55} {share:>6.1%} {share * us_per_record:>7.1f} µs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=2000, help="one-record publishes per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the sampled run")
    parser.add_argument("--acks", choices=["0", "1", "all"], default="1")
    parser.add_argument("--raw", help="keep py-spy's collapsed stacks in this file")
    parser.add_argument(
        "--bulk", type=int, metavar="N", help="profile N records of the throughput workload"
    )
    parser.add_argument("--perf", action="store_true", help="sample with Linux perf instead")
    args = parser.parse_args()
    if args.perf:
        return main_perf(args)
    # The venv's own (pip install py-spy) first: running its python does not put its
    # bin/ on the PATH.
    spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if spy is None:
        print("py-spy is not on the PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="herald-profile-") as tmp:
        raw_path = args.raw or os.path.join(tmp, "stacks.txt")
        record = ["record", "--rate", "500", "--format", "raw", "--nonblocking"]
        records, main_s, other_s = sample(
            lambda pid: [spy, *record, "--pid", str(pid), "--output", raw_path], args
        )
        with open(raw_path) as stacks:
            main_counts, other_counts = stages_of(stacks.read())
    if not records:
        raise RuntimeError("no record was delivered")
    main_us, other_us = main_s / records * 1e6, other_s / records * 1e6
    print(
        f"acks={args.acks}, {describe(args, records)}: server CPU {main_us + other_us:.1f} µs per record "
        f"published, delivered and acked; load average {os.getloadavg()[0]:.1f}"
    )
    print_thread("event loop thread", main_counts, main_us)
    print_thread("other threads (writer, thread pool)", other_counts, other_us)
    return 0


def main_perf(args: argparse.Namespace) -> int:
    perf = shutil.which("perf")
    if perf is None:
        print("perf is not on the PATH (apt-get install linux-perf)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="herald-profile-") as tmp:
        data = os.path.join(tmp, "perf.data")
        records, main_s, other_s = sample(
            lambda pid: [perf, "record", "-F", "999", "-g", "-p", str(pid), "-o", data], args
        )
        if not records:
            raise RuntimeError("no record was delivered")
        us = (main_s + other_s) / records * 1e6
        print(
            f"acks={args.acks}, {describe(args, records)}: server CPU {us:.1f} µs per record "
            f"published, delivered and acked (every thread); load average "
            f"{os.getloadavg()[0]:.1f}"
        )
        print_perf(perf, data, us)
    return 0


def describe(args: argparse.Namespace, records: int) -> str:
    if args.bulk:
        return f"{records:,} records in batches of 500, 4 requests at a time"
    return f"{args.rate} one-record publishes/s for {args.seconds:g} s"


if __name__ == "__main__":
    sys.exit(main())
