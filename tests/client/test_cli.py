"""The `herald` client subcommands, run as a user runs them, against a real server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from tests.conftest import PROJECT_ROOT, HeraldProcess


def herald(*args: str, url: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server.cli", *args, "--url", url],
        cwd=PROJECT_ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def lines(output: str) -> list[Any]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def test_publish_then_consume_round_trip(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("cli"), unique("clis")
    url = shared_herald.url
    created = herald(
        "subscriptions", "create", name, "--topic", topic, "--start", "earliest", url=url
    )
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["config"]["topic"] == topic

    published = herald("publish", topic, "1", '{"a": 2}', "hello world", "--key", "k", url=url)
    assert published.returncode == 0, published.stderr
    assert [r["offset"] for r in lines(published.stdout)] == [0, 1, 2]
    piped = herald("publish", topic, "--acks", "1", url=url, stdin="[true]\nplain text\n")
    assert piped.returncode == 0, piped.stderr
    assert [r["offset"] for r in lines(piped.stdout)] == [3, 4]

    consumed = herald("consume", name, "--count", "5", url=url)
    assert consumed.returncode == 0, consumed.stderr
    records = lines(consumed.stdout)
    assert [r["value"] for r in records] == [1, {"a": 2}, "hello world", [True], "plain text"]
    assert all(r["key"] == "k" for r in records[:3])

    stats = json.loads(herald("subscriptions", "get", name, url=url).stdout)["stats"]
    assert stats["backlog"] == 0, "consume acks what it prints"


def test_topic_commands(shared_herald: HeraldProcess, unique: Callable[[str], str]) -> None:
    topic, url = unique("clit"), shared_herald.url
    created = herald(
        "topics", "create", topic, "--partitions", "3", "--retention-ms", "none", url=url
    )
    assert created.returncode == 0, created.stderr
    config = json.loads(created.stdout)["config"]
    assert config["partitions"] == 3 and config["retention_ms"] is None
    listed = json.loads(herald("topics", "list", url=url).stdout)
    assert topic in [t["name"] for t in listed]
    assert json.loads(herald("topics", "get", topic, url=url).stdout)["name"] == topic
    assert herald("topics", "delete", topic, url=url).returncode == 0
    missing = herald("topics", "get", topic, url=url)
    assert missing.returncode == 1 and "topic_not_found" in missing.stderr


def test_seek_command(shared_herald: HeraldProcess, unique: Callable[[str], str]) -> None:
    topic, name, url = unique("clik"), unique("cliks"), shared_herald.url
    assert herald("publish", topic, "a", "b", "c", url=url).returncode == 0
    assert herald("subscriptions", "create", name, "--topic", topic, url=url).returncode == 0
    sought = herald("subscriptions", "seek", name, "--offset", "0=1", url=url)
    assert sought.returncode == 0, sought.stderr
    consumed = herald("consume", name, "--count", "2", url=url)
    assert [r["value"] for r in lines(consumed.stdout)] == ["b", "c"]


def test_unreachable_server_is_a_clean_error() -> None:
    result = herald("topics", "list", url="http://127.0.0.1:9")
    assert result.returncode == 1 and "cannot reach" in result.stderr
