"""Shared fixtures: a REAL Herald server (uvicorn, uvloop, httptools) in a subprocess.

End-to-end tests talk to it over loopback sockets exactly as clients do
(STYLE principle 11). Fixtures:

``herald_server``  (function scope) a fresh server on a fresh data dir.
                   A :class:`HeraldProcess`: ``.url``, ``.port``, ``.data_dir``,
                   ``.terminate()`` (SIGTERM, returns the exit status),
                   ``.kill()`` (SIGKILL), ``.restart()`` (same port and data
                   dir), ``.log()`` (its stdout+stderr so far).
``herald_url``     (function scope) just ``herald_server.url``.
``shared_herald``  (session scope) one server for tests that only need *a*
                   server and use their own unique topic/subscription names
                   (see ``unique``). Never kill or restart it.
``herald_factory`` (function scope) ``herald_factory("--no-auto-create", data_dir=...)``
                   starts more servers with extra ``herald serve`` flags or env;
                   all are stopped at teardown.
``unique``         a callable giving fresh names: ``unique("orders")`` -> ``orders-3f2a…``.

Example::

    def test_restart_keeps_records(herald_server):
        httpx.post(f"{herald_server.url}/v1/topics/t/messages", json={"messages": [{"value": 1}]})
        herald_server.kill()
        herald_server.restart()
        ...
"""

from __future__ import annotations

import ast
import functools
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Generous: several Pythons importing the server at once on a loaded 2-core host (two
# test workers, other suites) took over 10 s to answer /healthz.
# Hypothesis's timing checks assert a speed, and the suite runs on loaded machines: a
# property test failed its "input generation is slow" health check at load 20 (the whole
# loop of 2026-11-27). Tests assert what the code promises, never how fast it runs.
settings.register_profile("herald", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("herald")

START_TIMEOUT_S = 120.0
SERVER_LOG_TAIL_LINES = 200  # of a failed test's servers, in its report
STOP_TIMEOUT_S = 30.0


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port free now, and never handed out before in this process: a cluster's
    nodes get theirs before any binds it, and the kernel may give a port twice in a row
    (a fresh-check of 2026-11-27 reported two nodes of one cluster with one URL, and the
    records forwarded to one went to the other)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no loopback port that was not handed out already")


def freeze(proc: subprocess.Popen[bytes]) -> None:
    """SIGSTOP ``proc`` and return once every thread of it is stopped.

    kill() returns when the signal is queued; the process stops only when one of its
    threads takes the signal. On a loaded host that thread may wait for a CPU while
    another thread, woken by a request, answers it: a "frozen" etcd answered a read."""
    proc.send_signal(signal.SIGSTOP)
    tasks = Path(f"/proc/{proc.pid}/task")
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None or all(_stopped(task) for task in tasks.iterdir()):
            return
        time.sleep(0.005)
    raise AssertionError(f"pid {proc.pid} not stopped {STOP_TIMEOUT_S:g} s after SIGSTOP")


def _stopped(task: Path) -> bool:
    try:
        stat = (task / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True  # a thread that ended runs nothing
    return stat[stat.rindex(")") + 2] in "TtZX"  # the state follows the command's ")"


class HeraldProcess:
    """``python -m server.cli serve`` on 127.0.0.1, a given data dir and a free port."""

    start_timeout = START_TIMEOUT_S  # to /healthz 200, from the spawn
    verify: ssl.SSLContext | bool = True  # how /healthz checks a server that serves TLS

    def __init__(
        self,
        data_dir: Path,
        *,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.extra_args = list(extra_args)
        self.env = env or {}
        self.port = port or free_port()
        self._fixed_port = port is not None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0  # where this spawn's output begins in the log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "server.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--data-dir", str(self.data_dir),
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> HeraldProcess:
        """Start and wait for ``GET /healthz`` to answer 200 (recovery complete)."""
        for attempt in range(3):
            self._spawn()
            if self._wait_healthy():
                return self
            # A port taken between free_port() and the bind: try another one.
            if (
                not self._fixed_port
                and attempt < 2
                and "address already in use" in self.log().lower()
            ):
                self.port = free_port()
                continue
            break
        self._reap(signal.SIGKILL)
        raise RuntimeError(f"herald serve did not become healthy; its log:\n{self.log()}")

    def _spawn(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()
            self.proc = subprocess.Popen(
                self.command(), cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def _wait_healthy(self) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                healthz = httpx.get(f"{self.url}/healthz", verify=self.verify, timeout=1.0)
                if healthz.status_code == 200 and self._listening():
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        return False

    def _listening(self) -> bool:
        """Whether *this* process said it listens on the port (its startup line, written
        once uvicorn listens): an answer on the port may come from another test's
        server that was given the same port, while this one failed to bind it and is
        about to exit — the test would then talk to, and stop, a server not its own."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                started = log.read()
        except FileNotFoundError:
            return False
        return f":{self.port}/console".encode() in started and self.is_running()

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (graceful shutdown) and wait; returns the exit status."""
        return self._reap(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL: a crash, no shutdown code runs."""
        self._reap(signal.SIGKILL)

    def restart(self) -> HeraldProcess:
        """Start again on the same port and data dir (after kill() or terminate())."""
        if self.is_running():
            self.terminate()
        self._fixed_port = True
        return self.start()

    def _reap(self, sig: int, timeout: float = STOP_TIMEOUT_S) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def failure_section(self) -> tuple[str, str]:
        """The end of the log, for a failed test's report (pytest_runtest_makereport)."""
        lines = self.log().splitlines()[-SERVER_LOG_TAIL_LINES:]
        return f"herald server log ({self.url})", "\n".join(lines)


@pytest.fixture
def herald_factory(tmp_path: Path) -> Iterator[Callable[..., HeraldProcess]]:
    started: list[HeraldProcess] = []

    def start(
        *extra_args: str, data_dir: Path | None = None, env: dict[str, str] | None = None
    ) -> HeraldProcess:
        directory = data_dir or tmp_path / f"data-{len(started)}"
        process = HeraldProcess(directory, extra_args=extra_args, env=env)
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.terminate()


@pytest.fixture
def herald_server(herald_factory: Callable[..., HeraldProcess]) -> HeraldProcess:
    return herald_factory()


@pytest.fixture
def herald_url(herald_server: HeraldProcess) -> str:
    return herald_server.url


@pytest.fixture(scope="session")
def shared_herald(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeraldProcess]:
    process = HeraldProcess(tmp_path_factory.mktemp("shared-herald") / "data")
    process.start()
    yield process
    process.terminate()


@pytest.fixture
def unique() -> Callable[[str], str]:
    def make(prefix: str = "t") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:12]}"

    return make


@pytest.fixture
async def http(shared_herald: HeraldProcess) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the shared server."""
    async with httpx.AsyncClient(base_url=shared_herald.url, timeout=60) as client:
        yield client


# -- `make test` on two workers (pytest-xdist, ``-n 2 --dist loadgroup``) -----------------

# A unit of work goes to one worker whole. Each module is one, so that its scoped fixtures
# (a shared server, a browser, a cluster) start once. Modules that start a Herald cluster
# of their own (etcd and three nodes, killed, frozen and cut off from etcd by the fault
# tests) share one, and so run one after the other: two clusters at once on a 2-core host
# starve the nodes' lease renewals (2 s TTLs), a fault of the host, not the one under
# test. The Spark tests share one too: one Spark session (a JVM) serves them all.
HERALD_CLUSTER_UNIT = "herald-cluster"
SPARK_UNIT = "spark"


@functools.cache
def starts_a_herald_cluster(module: Path) -> bool:
    """Whether a test module imports HeraldCluster (tests/cluster/nodes.py)."""
    tree = ast.parse(module.read_text())
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module == "tests.cluster.nodes"
        and any(alias.name == "HeraldCluster" for alias in node.names)
        for node in ast.walk(tree)
    )


def work_unit(nodeid: str) -> str:
    """The unit of work a test (by its id) belongs to."""
    module = nodeid.split("::", 1)[0]
    if module.startswith("tests/spark/"):
        return SPARK_UNIT
    if starts_a_herald_cluster(PROJECT_ROOT / module):
        return HERALD_CLUSTER_UNIT
    return module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    # --dist loadgroup's own grouping (xdist_group marks, sent as a suffix of the test id)
    # does not reach the scheduler under pytest 9.2: groups are named here instead.
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnitScheduling(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that used Herald servers (a HeraldProcess, a cluster of them) reports
    the end of their logs: what each fixture value's ``failure_section()`` gives."""
    report = yield
    if report.when == "call" and report.failed:
        for value in getattr(item, "funcargs", {}).values():
            section = getattr(value, "failure_section", None)
            if callable(section):
                report.sections.append(section())
    return report
