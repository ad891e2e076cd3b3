"""What every benchmark script shares: a free loopback port, percentiles, a process's CPU
time and memory from /proc, a temp data directory, and a `herald serve` (or any server)
started on a free port, waited for and stopped.

Every script runs from the repository's root as a module, ``python -m bench.<name>``: the
root is then on ``sys.path``, so ``server``, ``storage``, ``cluster``, ``tests`` and
``bench`` import as packages, with no ``sys.path`` edits in the scripts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SERVE: tuple[str, ...] = (sys.executable, "-m", "server.cli", "serve")
STOP_WITHIN_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 < q <= 1) of ``values``, nearest rank; sorted here."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _times(pid: int | None) -> tuple[float, float] | None:
    """(user, system) CPU seconds of a process (all its threads), from /proc; None if gone."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process (all its threads), from /proc; None if gone."""
    times = _times(pid)
    return None if times is None else times[0] + times[1]


def system_seconds(pid: int | None) -> float | None:
    """The part of :func:`cpu_seconds` spent in the kernel (system calls; on loopback,
    most of the TCP stack's work for what the process sends as well)."""
    times = _times(pid)
    return None if times is None else times[1]


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@contextlib.contextmanager
def temp_dir(prefix: str, parent: str | Path | None = None) -> Iterator[Path]:
    """A fresh directory, removed with all it holds when the block ends."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def stop(proc: subprocess.Popen[bytes], within_s: float = STOP_WITHIN_S) -> None:
    """SIGTERM and wait for a graceful stop; SIGKILL after ``within_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str, within_s: float) -> None:
    """Return once something listens on 127.0.0.1:``port``; raise if ``proc`` exits first."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {within_s:g} s")


def wait_healthy(url: str, proc: subprocess.Popen[bytes], what: str, within_s: float) -> None:
    """Return once ``url``/healthz answers 200; raise if ``proc`` exits first."""
    deadline = time.monotonic() + within_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not become healthy in {within_s:g} s")
        time.sleep(0.05)


@contextlib.contextmanager
def herald_server(
    *args: str,
    serve: Sequence[str] = SERVE,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    within_s: float = 30.0,
    prefix: str = "herald-bench-",
) -> Iterator[tuple[str, int]]:
    """`herald serve` (or ``serve``, a command taking its flags) with ``args`` on a free
    loopback port and a temp data dir, in ``env`` and ``cwd`` if given; yields (url, pid)
    once healthy (``within_s``). On exit: a graceful stop, and the data dir removed."""
    with temp_dir(prefix) as data_dir:
        port = free_port()
        cmd = [*serve, "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)]
        proc = subprocess.Popen(
            [*cmd, *args],
            cwd=cwd,
            env=None if env is None else dict(env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, "herald serve", within_s)
            yield url, proc.pid
        finally:
            stop(proc)
