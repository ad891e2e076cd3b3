"""The CLI against a TLS server with a private CA: `--ca-file` and `HERALD_CA_FILE`
(the SDK's `ssl_context=`), over HTTPS (admin, publish, pull) and WSS (consume, tail)."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PROJECT_ROOT
from tests.security.test_tls import TlsHerald, make_ca_and_server_cert


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TlsHerald, Path]]:
    base = tmp_path_factory.mktemp("cli-tls")
    ca_path, cert_path, key_path = make_ca_and_server_cert(base)
    server = TlsHerald(
        base / "data",
        extra_args=["--tls-cert", str(cert_path), "--tls-key", str(key_path)],
        ca=ssl.create_default_context(cafile=str(ca_path)),
    ).start()
    try:
        yield server, ca_path
    finally:
        server.terminate()


def herald(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server.cli", *args],
        cwd=PROJECT_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ok(done: subprocess.CompletedProcess[str]) -> list[Any]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_without_the_ca_the_cli_refuses_the_server(tls_server: tuple[TlsHerald, Path]) -> None:
    server, _ = tls_server
    done = herald("--url", server.url, "topics", "list")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "certificate verify failed" in done.stderr


def test_ca_file_trusts_the_private_ca_for_every_command(
    tls_server: tuple[TlsHerald, Path],
) -> None:
    server, ca = tls_server
    trust = ["--url", server.url, "--ca-file", str(ca)]
    ok(
        herald(
            *trust,
            "subscriptions",
            "create",
            "cli-tls",
            "--topic",
            "cli-tls",
            "--start",
            "earliest",
        )
    )
    (first, second) = ok(herald(*trust, "publish", "cli-tls", '{"n": 1}', '{"n": 2}'))
    assert (first["offset"], second["offset"]) == (0, 1)
    (consumed,) = ok(herald(*trust, "consume", "cli-tls", "--count", "1"))  # wss://
    (pulled,) = ok(herald(*trust, "consume", "cli-tls", "--count", "1", "--pull"))  # https://
    assert sorted([consumed["value"], pulled["value"]], key=str) == [{"n": 1}, {"n": 2}]
    tailed = ok(herald(*trust, "tail", "cli-tls", "--from", "earliest", "--count", "2"))  # wss://
    assert [t["value"] for t in tailed] == [{"n": 1}, {"n": 2}]
    # After the subcommand too, as --url and --token are.
    assert ok(herald("topics", "list", "--url", server.url, "--ca-file", str(ca)))


def test_herald_ca_file_in_the_environment_does_the_same(
    tls_server: tuple[TlsHerald, Path],
) -> None:
    server, ca = tls_server
    listed = ok(herald("--url", server.url, "topics", "list", env={"HERALD_CA_FILE": str(ca)}))
    assert listed


def test_an_unreadable_ca_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = herald("--ca-file", str(tmp_path / "missing.pem"), "topics", "list")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--ca-file" in done.stderr and len(done.stderr.strip().splitlines()) == 1
