"""Fetch serving (cluster/fetch_serving.py): what a follower hears about a partition this
node does not lead — the error tells it whether to retry or look for its leader again."""

from __future__ import annotations

from cluster.fetch_serving import FetchServer
from cluster.follower import EpochQuery, FetchRequest
from cluster.replication import FetchError
from cluster.state import PartitionState, VersionedState
from cluster.wire import FetchEntry, Request, decode_answer, decode_request, encode_request

REF = ("t", 0)


def server(leader: str, epoch: int) -> FetchServer:
    state = PartitionState(("n1", "n2"), leader, epoch, ("n1", "n2"), {"n1": 1, "n2": 2})
    return FetchServer(
        "n1",
        leader_role=lambda topic, partition: None,
        states=lambda: {REF: VersionedState(state, 9)},
    )


def test_a_fetch_at_an_epoch_newer_than_etcd_as_seen_here_is_retried() -> None:
    assert server("n2", 3).no_role_error("t", 0, 4) is FetchError.UNKNOWN_LEADER_EPOCH


def test_a_fetch_to_a_node_becoming_leader_right_now_is_retried() -> None:
    assert server("n1", 3).no_role_error("t", 0, 3) is FetchError.UNKNOWN_LEADER_EPOCH


def test_a_fetch_to_a_node_that_does_not_lead_at_that_epoch_is_fenced() -> None:
    assert server("n2", 3).no_role_error("t", 0, 3) is FetchError.FENCED_LEADER_EPOCH
    assert server("n1", 3).no_role_error("t", 0, 2) is FetchError.FENCED_LEADER_EPOCH
    assert server("n1", 3).no_role_error("other", 0, 3) is FetchError.FENCED_LEADER_EPOCH


async def test_a_request_for_partitions_not_led_here_is_answered_with_their_errors() -> None:
    request = Request(
        node="n2",
        max_wait_ms=500,
        epochs=(EpochQuery("t", 0, leader_epoch=3, epoch=2),),
        fetch=(FetchEntry(FetchRequest("t", 0, 4, 10, 10, 1 << 20), high_watermark=8),),
        incarnation=2,
    )

    epochs, fetches = decode_answer(await server("n2", 3).serve(request))

    assert [(t, p, a.error) for t, p, a in epochs] == [("t", 0, FetchError.FENCED_LEADER_EPOCH)]
    assert [(t, p, a.error, a.batches) for t, p, a in fetches] == [
        ("t", 0, FetchError.UNKNOWN_LEADER_EPOCH, b"")
    ]


def test_the_topic_id_crosses_the_wire() -> None:
    request = Request(
        node="n2",
        max_wait_ms=0,
        epochs=(EpochQuery("t", 0, leader_epoch=3, epoch=2, topic_id=41),),
        fetch=(FetchEntry(FetchRequest("t", 0, 4, 10, 10, 1 << 20, topic_id=41), 8),),
    )
    decoded = decode_request(encode_request(request))
    assert decoded.epochs[0].topic_id == 41 and decoded.fetch[0].request.topic_id == 41
