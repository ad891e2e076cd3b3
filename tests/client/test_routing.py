"""The producer's layout of a topic's leaders (herald/_routing.py), over the data the
server answers with: which URLs it sends to, how keyless batches rotate, how a leader
that does not answer is left alone. The whole path, on a real cluster:
tests/cluster/test_cluster_leader_routing.py."""

from __future__ import annotations

import asyncio

import crc32c

from herald import _routing
from herald._routing import Routes, partition_of_key

HOME = "http://127.0.0.1:8081"
N2, N3 = "http://127.0.0.1:8082", "http://127.0.0.1:8083"


def test_a_key_hashes_to_the_partition_the_server_chooses() -> None:
    # storage/topic.py choose_partition: CRC-32C of the UTF-8 key, modulo the count.
    for key in ("o-1", "customer-7", "é", ""):
        assert partition_of_key(key, 6) == crc32c.crc32c(key.encode()) % 6


async def test_a_layout_sends_only_to_other_nodes_of_the_same_scheme() -> None:
    async def fetch(topic: str) -> list[str | None]:
        return [HOME + "/", N2, None, "https://127.0.0.1:8443", N3]

    routes = Routes(HOME, fetch)
    assert routes.layout("t") is None  # nothing read until an answer says so
    layout = await routes.wait_layout("t")
    assert layout is not None and layout.remote
    # Home, unknown and another scheme (a token for http never goes over https, nor the
    # other way) all go home: None.
    assert layout.leaders == [None, N2, None, None, N3]
    assert [layout.spread()[0] for _ in range(7)] == [0, 1, 2, 3, 4, 0, 1]
    await routes.close()


async def test_a_leader_that_does_not_answer_is_left_alone_longer_each_time() -> None:
    now = [1000.0]

    async def fetch(topic: str) -> list[str | None]:
        return [N2, N3]

    routes = Routes(HOME, fetch, clock=lambda: now[0])
    layout = await routes.wait_layout("t")
    assert layout is not None
    routes.unanswered(N2)
    assert layout.leaders == [None, N3]  # its records go home (which forwards) now
    assert not routes.answers(N2)
    now[0] += _routing.UNANSWERED_S
    assert routes.answers(N2)
    routes.unanswered(N2)  # failed again: twice as long
    now[0] += _routing.UNANSWERED_S
    assert not routes.answers(N2)
    now[0] += _routing.UNANSWERED_S
    assert routes.answers(N2)
    routes.answered(N2)  # it answered: the next failure starts over
    routes.unanswered(N2)
    now[0] += _routing.UNANSWERED_S
    assert routes.answers(N2)
    await routes.close()


async def test_answers_that_say_forwarded_read_the_layout_at_most_every_few_seconds() -> None:
    now = [1000.0]
    reads: list[str] = []

    async def fetch(topic: str) -> list[str | None]:
        reads.append(topic)
        return [N2]

    routes = Routes(HOME, fetch, clock=lambda: now[0])
    routes.forwarded("t")
    routes.forwarded("t")  # while the read is under way: none more
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert reads == ["t"] and routes.layout("t") is not None
    routes.forwarded("t")  # a leader we route home forwards every time: no storm
    assert reads == ["t"]
    now[0] += _routing.MIN_REFETCH_S
    routes.forwarded("t")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert reads == ["t", "t"]
    routes.forget("t")  # a topic created again: read at the next answer that says so
    assert routes.layout("t") is None
    routes.forwarded("t")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert reads == ["t", "t", "t"]
    await routes.close()
