"""Server memory per idle WebSocket consumer (issue 27 §3).

Starts ``herald serve`` on a free loopback port and a temporary data dir, makes one topic
and ``--subscriptions`` subscriptions (80), then opens ``--consumers`` durable consumers
(10,000) spread evenly over the subscriptions, from ``--processes`` client processes (4;
open files are capped per process). Each consumer reads its ``ready`` frame and then
stays idle (credit 100, nothing published). The figure is the server's VmRSS
(/proc/PID/status) with every consumer open (2 s to settle) minus its VmRSS before,
divided by the number of consumers. Before is taken after a warm-up: 200 consumers
opened and closed, so that what any first connection allocates once is not counted.

``--compression`` makes the clients offer permessage-deflate (python-websockets'
defaults); without it they offer none, as the SDK does by default. ``--tails`` opens
tails of the topic (``/v1/topics/mem/ws?from=latest``, what the browser SDK and the
console open; browsers always offer permessage-deflate) instead of durable consumers.
``--auth`` starts the server with an auth file (PROTOCOL §6) of two tokens made by
``herald token create``: an admin one that sets up, and a ``subscribe`` one on the topic
that every consumer presents (``Authorization: Bearer``), so that each socket is checked
and tracked for the auth file's reloads.

``--trace N`` instead runs the server under tracemalloc (25 frames), opens N consumers
(1,000) and prints what the server's Python heap grew by, per consumer, grouped by
allocation site and by traceback: where each byte of a connection goes; then the objects
the collector tracks, counted by type before and after (gc.get_objects), per consumer.

Run: ``python -m bench.consumer_memory [--consumers 10000] [--compression]``; the
server's command line can be replaced with ``--serve`` (e.g. an older tree's python with
PYTHONPATH set) to compare trees.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import linecache
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.common import ROOT, SERVE, herald_server, temp_dir, vm_rss_kib

WARMUP = 200
CREDIT = 100
HANDSHAKES_AT_ONCE = 32  # per client process
TOKEN_ENV = "HERALD_BENCH_TOKEN"  # the consumers' token, to the client processes
FRAMES = int(os.environ.get("HERALD_BENCH_TRACE_FRAMES", "25"))  # tracemalloc frames kept


@contextlib.contextmanager
def traced_or_plain_server(
    serve: Sequence[str], trace_dir: str | None, flags: Sequence[str] = ()
) -> Iterator[tuple[str, int]]:
    # Every consumer comes from 127.0.0.1: the per-address cap (256) out of the way
    # (a big number, not 0: older trees read 0 as "none at all").
    env = {**os.environ, "HERALD_MAX_REQUESTS_PER_CLIENT": "1000000"}
    cwd = None  # an older tree's --serve command runs where it was asked to
    if trace_dir is not None:
        env["HERALD_BENCH_TRACE_DIR"] = trace_dir
        cwd = ROOT  # where `python -m bench.consumer_memory` is found
    # tracemalloc makes the start slow
    with herald_server(*flags, serve=serve, env=env, cwd=cwd, within_s=180) as server:
        yield server


@dataclass(frozen=True, slots=True)
class Access:
    """An auth file's server flags and the tokens of the setup and of the consumers."""

    flags: tuple[str, ...] = ()
    admin: str | None = None
    consumer: str | None = None


def _token(auth_file: Path, *roles: str) -> str:
    """A new token of ``roles`` appended to ``auth_file`` (`herald token create`)."""
    made = subprocess.run(
        [sys.executable, "-m", "server.cli", "token", "create", *roles],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    with auth_file.open("a") as lines:
        lines.write(made.stdout)
    return next(line.split()[1] for line in made.stderr.splitlines() if line.startswith("token: "))


@contextlib.contextmanager
def access(auth: bool) -> Iterator[Access]:
    if not auth:
        yield Access()
        return
    with temp_dir("herald-mem-auth-") as folder:
        auth_file = folder / "auth.toml"
        admin = _token(auth_file, "--role", "admin")
        consumer = _token(auth_file, "--role", "subscribe", "--topics", "mem")
        yield Access(("--auth-file", str(auth_file)), admin, consumer)


def setup(url: str, subscriptions: int, token: str | None = None) -> list[str]:
    names = [f"mem-{i}" for i in range(subscriptions)]
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, timeout=30, headers=headers) as http:
        http.put("/v1/topics/mem", json={"partitions": 1}).raise_for_status()
        for name in names:
            body = {"topic": "mem", "start": "latest"}
            http.put(f"/v1/subscriptions/{name}", json=body).raise_for_status()
    return names


# -- client processes ------------------------------------------------------------------


async def _hold(urls: list[str], compression: bool) -> None:
    """Open every url as a consumer, say `open` on stdout, hold them until stdin closes."""
    import websockets

    gate = asyncio.Semaphore(HANDSHAKES_AT_ONCE)
    stack = contextlib.AsyncExitStack()
    token = os.environ.get(TOKEN_ENV)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}

    async def one(url: str) -> None:
        async with gate:
            ws = await stack.enter_async_context(
                websockets.connect(
                    url,
                    compression="deflate" if compression else None,
                    additional_headers=headers,
                    open_timeout=120,
                    ping_interval=None,  # the server pings; the client answers
                )
            )
            ready = await ws.recv()
            if b'"ready"' not in (ready if isinstance(ready, bytes) else ready.encode()):
                raise RuntimeError(f"expected ready, got {ready!r}")

    async with stack:
        await asyncio.gather(*(one(url) for url in urls))
        print("open", flush=True)
        await asyncio.to_thread(sys.stdin.read)


def client_main(compression: bool) -> None:
    urls = sys.stdin.readline().split()
    asyncio.run(_hold(urls, compression))


class Clients:
    """``count`` consumers held open by ``processes`` client processes."""

    def __init__(self, url: str, subscriptions: list[str], count: int, processes: int,
                 compression: bool, tails: bool = False,
                 token: str | None = None) -> None:  # fmt: skip
        ws = url.replace("http", "ws", 1)
        urls = [f"{ws}/v1/subscriptions/{subscriptions[i % len(subscriptions)]}/ws"
                f"?credit={CREDIT}" for i in range(count)]  # fmt: skip
        if tails:
            urls = [f"{ws}/v1/topics/mem/ws?from=latest&credit={CREDIT}"] * count
        cmd = [sys.executable, "-m", "bench.consumer_memory", "--client"]
        if compression:
            cmd.append("--compression")
        env = {**os.environ}
        if token is not None:
            env[TOKEN_ENV] = token
        self.procs: list[subprocess.Popen[str]] = []
        for part in range(processes):
            share = urls[part::processes]
            if not share:
                continue
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            assert proc.stdin is not None
            proc.stdin.write(" ".join(share) + "\n")
            proc.stdin.flush()
            self.procs.append(proc)

    def wait_open(self) -> None:
        for proc in self.procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "open":
                raise RuntimeError("a client process failed to open its consumers")

    def close(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            with contextlib.suppress(OSError):
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def consumers(url: str, subscriptions: list[str], count: int, processes: int,
              compression: bool, tails: bool = False,
              token: str | None = None) -> Iterator[None]:  # fmt: skip
    clients = Clients(url, subscriptions, count, processes, compression, tails, token)
    try:
        clients.wait_open()
        yield
    finally:
        clients.close()


# -- the tracemalloc profile -----------------------------------------------------------


def traced_server_main(argv: list[str]) -> int:
    """``herald serve`` with a watcher thread: a file ``NAME.take`` written into
    $HERALD_BENCH_TRACE_DIR makes it dump a tracemalloc snapshot to ``NAME``. Tracing
    (25 frames) starts at the first snapshot: only what is allocated after it is traced,
    which is what a diff of two snapshots needs (and the start stays quick)."""
    trace_dir = Path(os.environ["HERALD_BENCH_TRACE_DIR"])

    def watch() -> None:
        while True:
            for ask in trace_dir.glob("*.take"):
                if not tracemalloc.is_tracing():
                    tracemalloc.start(FRAMES)
                gc.collect()  # what is held, not cycles waiting for the collector
                tracemalloc.take_snapshot().dump(str(ask.with_suffix("")))
                types = Counter(type(o).__qualname__ for o in gc.get_objects())
                ask.with_suffix(".types").write_bytes(json.dumps(types).encode())
                ask.unlink()
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()
    # This tree goes after PYTHONPATH, so that an older tree given there is the one served.
    sys.path = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    sys.path.append(str(ROOT))
    from server.cli import main

    return main(["serve", *argv])


def object_counts(trace_dir: str, name: str) -> Counter[str]:
    """The objects the collector tracked at snapshot ``name``, by type."""
    return Counter(json.loads(Path(trace_dir, f"{name}.types").read_bytes()))


def print_object_counts(before: Counter[str], after: Counter[str], n: int) -> None:
    grown = {kind: after[kind] - before[kind] for kind in after}
    total = sum(grown.values())
    print(f"\nobjects the collector tracks, per consumer: {total / n:.1f}")
    shown = sorted(((v, k) for k, v in grown.items() if v / n >= 0.5), reverse=True)
    print("  " + ", ".join(f"{k} {v / n:.1f}" for v, k in shown))


def snapshot(trace_dir: str, name: str) -> tracemalloc.Snapshot:
    ask = Path(trace_dir, f"{name}.take")
    ask.touch()
    deadline = time.monotonic() + 120
    while ask.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not dump its snapshot")
        time.sleep(0.1)
    time.sleep(0.5)  # the dump is written before the ask is removed
    return tracemalloc.Snapshot.load(str(Path(trace_dir, name)))


def _ours(frame: tracemalloc.Frame) -> bool:
    return "tracemalloc" not in frame.filename and "consumer_memory" not in frame.filename


def print_profile(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, n: int) -> None:
    filters = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)]
    before, after = before.filter_traces(filters), after.filter_traces(filters)
    lines = after.compare_to(before, "lineno")
    total = sum(d.size_diff for d in lines)
    print(f"Python heap per consumer: {total / n / 1024:.2f} KiB ({n} consumers)")
    by_package: dict[str, int] = {}
    for d in lines:
        name = _short(d.traceback[0].filename)
        package = name.split("/")[0] if "/" in name else name
        by_package[package] = by_package.get(package, 0) + d.size_diff
    print("by package (bytes per consumer): " + ", ".join(
        f"{k} {v / n:.0f}" for k, v in sorted(by_package.items(), key=lambda kv: -kv[1])
        if v / n >= 16))  # fmt: skip
    print("\nby allocation site (bytes per consumer, count per consumer):")
    for d in [d for d in lines if d.size_diff / n >= 16][:30]:
        f = d.traceback[0]
        print(f"  {d.size_diff / n:8.0f} B {d.count_diff / n:6.1f}  {_short(f.filename)}:{f.lineno}"
              f"  {linecache.getline(f.filename, f.lineno).strip()[:70]}")  # fmt: skip
    print("\nby traceback (innermost last, bytes per consumer):")
    for d in [d for d in after.compare_to(before, "traceback") if d.size_diff / n >= 64][:15]:
        print(f"  {d.size_diff / n:8.0f} B {d.count_diff / n:6.1f} blocks")
        for f in list(d.traceback)[-8:]:
            print(f"      {_short(f.filename)}:{f.lineno}")


def _short(filename: str) -> str:
    for marker in ("site-packages/", "python3.11/", str(ROOT) + "/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


# -- main ------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> None:
    serve = shlex.split(args.serve) if args.serve else list(SERVE)
    with access(args.auth) as auth, traced_or_plain_server(serve, None, auth.flags) as (url, pid):
        names = setup(url, args.subscriptions, auth.admin)
        token = auth.consumer
        with consumers(url, names, WARMUP, 1, args.compression, args.tails, token):
            pass
        time.sleep(2)
        before = vm_rss_kib(pid)
        started = time.monotonic()
        with consumers(
            url, names, args.consumers, args.processes, args.compression, args.tails, token
        ):
            opened = time.monotonic() - started
            time.sleep(2)
            after = vm_rss_kib(pid)
    per = (after - before) / args.consumers
    what = (
        "tails of one topic" if args.tails else f"consumers on {args.subscriptions} subscriptions"
    )
    print(f"{args.consumers} idle {what}, "
          f"compression {'on' if args.compression else 'off'}"
          f"{', auth file' if args.auth else ''}: server RSS "
          f"{before / 1024:.1f} -> {after / 1024:.1f} MiB, {per:.1f} KiB per consumer "
          f"(opened in {opened:.1f} s; load average {os.getloadavg()[0]:.2f})")  # fmt: skip


def trace(args: argparse.Namespace) -> None:
    trace_dir = tempfile.mkdtemp(prefix="herald-mem-trace-")
    serve = [sys.executable, "-m", "bench.consumer_memory", "--traced-server"]
    try:
        with (
            access(args.auth) as auth,
            traced_or_plain_server(serve, trace_dir, auth.flags) as (url, _),
        ):
            names = setup(url, args.subscriptions, auth.admin)
            token = auth.consumer
            with consumers(url, names, WARMUP, 1, args.compression, args.tails, token):
                pass
            time.sleep(1)
            before = snapshot(trace_dir, "before")
            with consumers(
                url, names, args.trace, args.processes, args.compression, args.tails, token
            ):
                time.sleep(1)
                after = snapshot(trace_dir, "after")
        print(f"{'tails' if args.tails else 'consumers'}, "
              f"compression {'on' if args.compression else 'off'}"
              f"{', auth file' if args.auth else ''}")  # fmt: skip
        print_profile(before, after, args.trace)
        print_object_counts(
            object_counts(trace_dir, "before"), object_counts(trace_dir, "after"), args.trace
        )
        if args.keep:
            before.dump(f"{args.keep}.before")
            after.dump(f"{args.keep}.after")
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--traced-server":
        return traced_server_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--consumers", type=int, default=10_000)
    p.add_argument("--subscriptions", type=int, default=80)
    p.add_argument("--processes", type=int, default=4, help="client processes (default 4)")
    p.add_argument("--compression", action="store_true", help="clients offer permessage-deflate")
    p.add_argument("--tails", action="store_true", help="open tails instead of consumers")
    p.add_argument("--auth", action="store_true", help="serve with an auth file; tokens checked")
    p.add_argument("--trace", type=int, metavar="N", help="profile N consumers with tracemalloc")
    p.add_argument("--keep", metavar="PREFIX", help="with --trace: save the two snapshots")
    p.add_argument("--serve", help="the server command taking serve's flags (default: this tree)")
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.client:
        client_main(args.compression)
    elif args.trace:
        trace(args)
    else:
        measure(args)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
