"""ServerConfig: defaults, then HERALD_* variables, then flags; bad values are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from server.config import ConfigError, ServerConfig


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
