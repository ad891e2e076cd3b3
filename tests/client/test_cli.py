"""The `herald` client subcommands, run as a user runs them, against a real server."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx

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


def herald_bare(*args: str) -> subprocess.CompletedProcess[str]:
    """`herald ARGS` exactly as given: nothing appended after the subcommand."""
    return subprocess.run(
        [sys.executable, "-m", "server.cli", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_version() -> None:
    result = herald_bare("--version")
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"herald \S+ \(herald-client \d+\.\d+\.\d+\)\n", result.stdout)


def test_url_and_token_before_the_subcommand(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic = unique("glob")
    created = herald_bare(
        "--url", shared_herald.url, "--token", "unused", "topics", "create", topic
    )
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["name"] == topic
    # After the subcommand wins: the dead URL before it is not used.
    listed = herald_bare(
        "--url", "http://127.0.0.1:9", "topics", "list", "--url", shared_herald.url
    )
    assert listed.returncode == 0, listed.stderr
    wrong = herald_bare("--url", "http://127.0.0.1:9", "topics", "list")
    assert wrong.returncode == 1 and "cannot reach http://127.0.0.1:9" in wrong.stderr


def test_consume_count_grants_exactly_that_many_records(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name, url = unique("cnt"), unique("cnts"), shared_herald.url
    assert herald("subscriptions", "create", name, "--topic", topic, "--start", "earliest",
                  url=url).returncode == 0  # fmt: skip
    assert herald("publish", topic, *map(str, range(10)), url=url).returncode == 0
    for count, expected in ((1, [0]), (3, [1, 2, 3]), (2, [4, 5])):
        consumed = herald("consume", name, "--count", str(count), url=url)
        assert consumed.returncode == 0, consumed.stderr
        records = lines(consumed.stdout)
        assert [r["value"] for r in records] == expected
        # Before: a record beyond the count was sent too, came back later as attempt 2.
        assert all(r["attempt"] == 1 for r in records)
        stats = json.loads(herald("subscriptions", "get", name, url=url).stdout)["stats"]
        assert stats["in_flight"] == 0, stats


def test_tail_prints_records_and_leaves_nothing_behind(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, url = unique("tail"), shared_herald.url
    assert herald("publish", topic, "a", "b", "c", url=url).returncode == 0
    subscriptions_before = json.loads(herald("subscriptions", "list", url=url).stdout)
    tailed = herald("tail", topic, "--from", "earliest", "--count", "3", url=url)
    assert tailed.returncode == 0, tailed.stderr
    records = lines(tailed.stdout)
    assert [r["value"] for r in records] == ["a", "b", "c"]
    assert all(r["topic"] == topic and "subscription" not in r for r in records)
    from_offset = herald("tail", topic, "--from", "2", "--count", "1", url=url)
    assert [r["value"] for r in lines(from_offset.stdout)] == ["c"]
    assert json.loads(herald("subscriptions", "list", url=url).stdout) == subscriptions_before
    missing = herald("tail", unique("none"), "--count", "1", url=url)
    assert missing.returncode == 1 and "not_found" in missing.stderr  # tails never auto-create


def test_tail_sees_records_published_after_it_started(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, url = unique("tailn"), shared_herald.url
    assert herald("topics", "create", topic, url=url).returncode == 0
    tail = subprocess.Popen(
        [sys.executable, "-m", "server.cli", "tail", topic, "--count", "2", "--url", url],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        out = ""
        while tail.poll() is None and time.monotonic() < deadline:
            # Published again and again until the tail (from latest) has seen two.
            herald("publish", topic, "again", url=url)
            with contextlib.suppress(subprocess.TimeoutExpired):
                out, _ = tail.communicate(timeout=0.5)
        assert tail.returncode == 0
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.communicate()
    assert [r["value"] for r in lines(out)] == ["again", "again"]


def test_subscriptions_create_with_push_flags(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    name, url = unique("push"), shared_herald.url
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123").decode()
    created = herald(
        "subscriptions", "create", name, "--topic", unique("pusht"),
        "--push-url", "http://127.0.0.1:9/hook", "--push-secret", secret,
        "--push-max-in-flight", "4", "--push-timeout-ms", "2000",
        "--push-breaker-failures", "7", url=url,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    push = json.loads(created.stdout)["config"]["push"]
    assert push["url"] == "http://127.0.0.1:9/hook"
    assert (push["max_in_flight"], push["timeout_ms"], push["breaker"]["failures"]) == (4, 2000, 7)
    alone = herald("subscriptions", "create", unique("p2"), "--topic", "t", "--push-secret", secret,
                   url=url)  # fmt: skip
    assert alone.returncode == 1 and "--push-url" in alone.stderr


def test_subscriptions_push_batch_and_payload_flags(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    """PROTOCOL §8 push.batch and push.payload, from create and from update."""
    name, url = unique("bpush"), shared_herald.url
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123").decode()
    created = herald(
        "subscriptions", "create", name, "--topic", unique("bpusht"),
        "--push-url", "http://127.0.0.1:9/hook", "--push-secret", secret,
        "--push-batch-max-records", "50", "--push-batch-max-wait-ms", "250", url=url,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    push = json.loads(created.stdout)["config"]["push"]
    assert (push["batch"], push["payload"]) == ({"max_records": 50, "max_wait_ms": 250}, "envelope")
    raw = herald("subscriptions", "update", name, "--push-url", "http://127.0.0.1:9/hook",
                 "--push-payload", "raw", url=url)  # fmt: skip
    assert raw.returncode == 0, raw.stderr
    push = json.loads(raw.stdout)["config"]["push"]
    assert (push["batch"], push["payload"]) == ({"max_records": 1, "max_wait_ms": 0}, "raw")
    both = herald("subscriptions", "update", name, "--push-url", "http://127.0.0.1:9/hook",
                  "--push-payload", "raw", "--push-batch-max-records", "2", url=url)  # fmt: skip
    assert both.returncode == 1 and "validation_error" in both.stderr
    alone = herald("subscriptions", "update", name, "--push-batch-max-records", "2", url=url)
    assert alone.returncode == 1 and "--push-url" in alone.stderr


def test_subscriptions_redrive(shared_herald: HeraldProcess, unique: Callable[[str], str]) -> None:
    topic, dlq, name, url = unique("rd"), unique("rdq"), unique("rds"), shared_herald.url
    created = herald("subscriptions", "create", name, "--topic", topic, "--dead-letter-topic", dlq,
                     url=url)  # fmt: skip
    assert created.returncode == 0, created.stderr
    timeout = {"herald-source-topic": topic, "herald-source-last-error": "timeout"}
    dead = httpx.post(
        f"{url}/v1/topics/{dlq}/messages",
        json={
            "messages": [{"value": i, "headers": {"herald-source-topic": topic}} for i in range(3)]
            + [{"value": "slow", "headers": timeout}]
        },
    )
    assert dead.status_code == 200, dead.text
    one = herald("subscriptions", "redrive", name, "--reason", "timeout", url=url)
    assert one.returncode == 0, one.stderr
    answer = json.loads(one.stdout)
    assert (answer["republished"], answer["other_reasons"]) == (1, 3)
    redriven = herald("subscriptions", "redrive", name, "--rate", "1000", url=url)
    assert redriven.returncode == 0, redriven.stderr
    answer = json.loads(redriven.stdout)
    assert (answer["scanned"], answer["republished"], answer["dead_letter_topic"]) == (4, 3, dlq)
    assert (answer["duplicates"], answer["other_reasons"]) == (1, 0)
    read = httpx.get(f"{url}/v1/topics/{topic}/partitions/0/messages").json()["messages"]
    assert [r["value"] for r in read] == ["slow", 0, 1, 2]


def test_consume_of_a_dead_server_fails_at_once() -> None:
    started = time.monotonic()
    result = herald("consume", "anything", "--count", "1", url="http://127.0.0.1:9")
    assert result.returncode == 1 and "cannot reach" in result.stderr  # before: hung forever
    assert time.monotonic() - started < 30
