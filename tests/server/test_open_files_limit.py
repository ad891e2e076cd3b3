"""A publish-only client cannot exhaust the server's file descriptors (PROTOCOL §6,
issue 26 item 2): open files stay bounded below the process's limit, topics are capped
by --max-topics (409 limit_exceeded), and running out of descriptors anyway is 503
storage_unavailable with Retry-After, never 500, while /healthz keeps answering.

The servers run under ``prlimit`` with a low hard limit, so raising the soft limit to
the hard one at start does not lift them out of it."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import HeraldProcess

LOW_LIMIT = 256
NEW_TOPICS = 1000
MAX_TOPICS = 800


class LimitedHerald(HeraldProcess):
    """``herald serve`` under ``prlimit --nofile=N:N``."""

    def __init__(self, data_dir: Path, nofile: int, extra_args: list[str]) -> None:
        super().__init__(data_dir, extra_args=extra_args)
        self.nofile = nofile

    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={self.nofile}:{self.nofile}", "--", *super().command()]

    def open_descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[list[LimitedHerald]]:
    started: list[LimitedHerald] = []
    yield started
    for server in started:
        server.terminate()


def start(started: list[LimitedHerald], tmp_path: Path, nofile: int, *args: str) -> LimitedHerald:
    server = LimitedHerald(tmp_path / f"data-{len(started)}", nofile, list(args))
    started.append(server)
    return server.start()


def assert_problem(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == code


def test_a_thousand_new_topics_under_a_low_file_limit_get_200_or_409(
    tmp_path: Path, limited: list[LimitedHerald]
) -> None:
    server = start(limited, tmp_path, LOW_LIMIT, "--max-topics", str(MAX_TOPICS))
    assert f"open files limit: {LOW_LIMIT}" in server.log()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for i in range(NEW_TOPICS):
            response = client.post(f"/v1/topics/t{i}/messages", json={"messages": [{"value": i}]})
            if i < MAX_TOPICS:
                assert response.status_code == 200, (i, response.text)
            else:
                assert_problem(response, 409, "limit_exceeded")
            if i % 100 == 0:
                assert httpx.get(f"{server.url}/healthz", timeout=60).status_code == 200
                assert server.open_descriptors() < LOW_LIMIT
        assert httpx.get(f"{server.url}/healthz", timeout=60).status_code == 200
        # A refused creation changed nothing; an explicit PUT is refused alike.
        assert_problem(client.get(f"/v1/topics/t{MAX_TOPICS}"), 404, "topic_not_found")
        assert_problem(client.put("/v1/topics/another"), 409, "limit_exceeded")
        refused = client.put("/v1/subscriptions/s-new", json={"topic": "another"})
        assert_problem(refused, 409, "limit_exceeded")
        assert_problem(client.get("/v1/subscriptions/s-new"), 404, "subscription_not_found")
        assert len(client.get("/v1/topics").json()["topics"]) == MAX_TOPICS
        # Every topic reads right afterwards (their files open again on use).
        for i in range(MAX_TOPICS):
            read = client.get(f"/v1/topics/t{i}/partitions/0/messages", params={"offset": 0})
            assert read.status_code == 200, (i, read.text)
            assert [m["value"] for m in read.json()["messages"]] == [i]
        # And takes appends again at the right offset.
        again = client.post("/v1/topics/t0/messages", json={"messages": [{"value": "again"}]})
        assert again.json()["results"][0]["offset"] == 1
        assert server.open_descriptors() < LOW_LIMIT


def test_out_of_descriptors_is_503_with_retry_after_and_healthz_answers(
    tmp_path: Path, limited: list[LimitedHerald]
) -> None:
    limit = 128
    server = start(limited, tmp_path, limit)
    fillers: list[socket.socket] = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        assert client.get("/healthz").status_code == 200  # this connection stays open
        try:
            # Connections (each answered, so accepted) until every descriptor is in use.
            for _ in range(limit):
                if server.open_descriptors() >= limit:
                    break
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
                fillers.append(sock)
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: herald\r\n\r\n")
                assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            assert server.open_descriptors() >= limit
            response = client.post("/v1/topics/new-one/messages", json={"messages": [{"value": 1}]})
            assert_problem(response, 503, "storage_unavailable")
            assert int(response.headers["retry-after"]) >= 1
            assert client.get("/healthz").status_code == 200
        finally:
            for sock in fillers:
                sock.close()
        # Descriptors back: the same publish goes through.
        response = client.post("/v1/topics/new-one/messages", json={"messages": [{"value": 1}]})
        assert response.status_code == 200, response.text
        read = client.get("/v1/topics/new-one/partitions/0/messages", params={"offset": 0})
        assert [m["value"] for m in read.json()["messages"]] == [1]
    assert httpx.get(f"{server.url}/healthz", timeout=60).status_code == 200


@pytest.mark.soak  # 7-20 minutes: 10,000 topic creations, each fsynced (`make soak`)
@pytest.mark.timeout(1800)
def test_ten_thousand_topics_fit_under_a_limit_of_twenty_thousand(
    tmp_path: Path, limited: list[LimitedHerald]
) -> None:
    nofile, topics = 20_000, 10_000
    server = start(limited, tmp_path, nofile, "--log-level", "warning")
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for i in range(topics):
            response = client.post(f"/v1/topics/t{i}/messages", json={"messages": [{"value": i}]})
            assert response.status_code == 200, (i, response.text)
        # Half the limit (less headroom) for the partitions' files, a few dozen for the
        # server's own; the other half is left to sockets.
        assert server.open_descriptors() <= nofile // 2 + 64
        assert httpx.get(f"{server.url}/healthz", timeout=60).status_code == 200
        for i in range(topics):
            read = client.get(f"/v1/topics/t{i}/partitions/0/messages", params={"offset": 0})
            assert [m["value"] for m in read.json()["messages"]] == [i], i
        assert server.open_descriptors() <= nofile // 2 + 64
