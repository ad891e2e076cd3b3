"""ServerConfig: defaults, then HERALD_* variables, then flags; bad values are refused."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from server.config import ConfigError, ServerConfig
from tests.conftest import HeraldProcess


def test_flags_override_environment_which_overrides_defaults() -> None:
    env = {"HERALD_SEGMENT_BYTES": "1048576", "HERALD_PORT": "9000", "HERALD_AUTO_CREATE": "off"}
    config = ServerConfig.from_env(env, port=9100, data_dir="/tmp/x")
    assert config.segment_bytes == 1048576
    assert config.port == 9100
    assert config.auto_create is False
    assert config.data_dir == Path("/tmp/x")
    assert ServerConfig.from_env({}).segment_bytes == 128 * 1024 * 1024


@pytest.mark.parametrize(
    "env",
    [
        {"HERALD_SEGMENT_BYTES": "1000"},
        {"HERALD_SEGMENT_BYTES": str(1 << 32)},
        {"HERALD_SEGMENT_BYTES": "big"},
        {"HERALD_PORT": "70000"},
        {"HERALD_AUTO_CREATE": "maybe"},
        {"HERALD_CPUS": "a"},
        {"HERALD_CPUS": "3-1"},
        {"HERALD_CPUS": "-1"},
        {"HERALD_CPUS": "4096"},  # not a CPU this process may use
    ],
)
def test_bad_values_are_config_errors(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        ServerConfig.from_env(env)


def test_serve_refuses_a_bad_flag_with_a_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", "--segment-bytes", "10"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HERALD_DATA_DIR": str(tmp_path)},
    )
    assert result.returncode == 2
    assert "segment_bytes must be in 65536..4294967295" in result.stderr


def test_cpus_lists_and_ranges() -> None:
    assert ServerConfig.from_env({}).pinned_cpus is None
    assert ServerConfig.from_env({"HERALD_CPUS": "0"}).pinned_cpus == {0}
    every = sorted(os.sched_getaffinity(0))
    text = f"{every[0]}-{every[-1]}" if every == list(range(every[0], every[-1] + 1)) else ""
    if text:
        assert ServerConfig.from_env({}, cpus=text).pinned_cpus == set(every)


def test_serve_pins_every_thread_to_the_cpus_given(
    herald_factory: Callable[..., HeraldProcess],
) -> None:
    cpu = max(os.sched_getaffinity(0))
    server = herald_factory("--cpus", str(cpu))
    # Traffic, so the writer thread and the executor's threads exist.
    reply = httpx.post(
        f"{server.url}/v1/topics/pinned/messages", json={"messages": [{"value": 1}]}, timeout=30
    )
    assert reply.status_code == 200
    tasks = list(Path(f"/proc/{server.pid}/task").iterdir())
    assert len(tasks) > 1
    for task in tasks:
        status = (task / "status").read_text()
        allowed = next(line for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
        assert allowed.split(":")[1].strip() == str(cpu), (task.name, allowed)
