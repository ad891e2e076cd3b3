"""The follower's state machine (cluster/follower.py): where it truncates (KIP-101 and
KIP-279's fix), how it fetches, what it does with each error — pure, and on real logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.follower import (
    Action,
    EpochAnswer,
    FetchResponse,
    FollowerReplica,
    Phase,
)
from cluster.replication import FetchError
from storage.partition_log import PartitionLog
from storage.record import NewRecord
from tests.cluster.replicas import SMALL


def follower(
    *, latest_epoch: int = 1, log_start: int = 0, log_end: int = 15, hw: int = 5
) -> FollowerReplica:
    return FollowerReplica(
        "b",
        topic="t",
        partition=0,
        leader="a",
        epoch=4,
        latest_epoch=latest_epoch,
        log_start=log_start,
        log_end=log_end,
        high_watermark=hw,
        max_bytes=1000,
    )


def test_it_asks_for_the_end_of_its_latest_epoch_under_the_current_one() -> None:
    f = follower(latest_epoch=3)
    query = f.epoch_query()
    assert (query.topic, query.partition, query.leader_epoch, query.epoch) == ("t", 0, 4, 3)
    with pytest.raises(RuntimeError):
        f.fetch_request(0)  # not before the divergence check


def test_it_truncates_to_the_leaders_end_of_its_epoch_not_to_its_hw() -> None:
    f = follower(latest_epoch=3, log_end=15, hw=5)
    step = f.on_epoch_answer(EpochAnswer(None, 3, 12, 0), lambda e: (3, 15))
    assert step.action is Action.TRUNCATE and step.offset == 12
    # The leader has more of this epoch than I do: nothing to cut.
    f = follower(latest_epoch=3, log_end=15, hw=5)
    step = f.on_epoch_answer(EpochAnswer(None, 3, 40, 0), lambda e: (3, 15))
    assert step.offset == 15


def test_an_older_epoch_in_the_answer_cuts_at_my_own_end_of_it_kip_279() -> None:
    # Mine: epoch 1 on 0..9, epoch 3 on 10..14. The leader never had epoch 3: its largest
    # epoch <= 3 is 2, ending at 20; my epoch 2 is my epoch 1, which ends at 10.
    asked: list[int] = []

    def own(epoch: int) -> tuple[int, int]:
        asked.append(epoch)
        return (1, 10)

    f = follower(latest_epoch=3, log_end=15)
    step = f.on_epoch_answer(EpochAnswer(None, 2, 20, 0), own)
    assert (step.action, step.offset, asked) == (Action.TRUNCATE, 10, [2])


def test_an_answer_with_no_epoch_keeps_nothing_past_the_leaders_start() -> None:
    f = follower(latest_epoch=1, log_end=15)
    step = f.on_epoch_answer(EpochAnswer(None, -1, -1, 0), lambda e: (-1, -1))
    assert (step.action, step.offset) == (Action.TRUNCATE, 0)
    f = follower(latest_epoch=1, log_start=0, log_end=15)
    step = f.on_epoch_answer(EpochAnswer(None, -1, -1, 30), lambda e: (-1, -1))
    assert (step.action, step.offset) == (Action.RESET, 30)


@pytest.mark.parametrize(
    ("error", "action", "phase"),
    [
        (FetchError.FENCED_LEADER_EPOCH, Action.STOP, Phase.STOPPED),
        (FetchError.NOT_REPLICA, Action.STOP, Phase.STOPPED),
        (FetchError.UNKNOWN_LEADER_EPOCH, Action.RETRY, Phase.FETCHING),
        # A leader whose copy is of another topic of this name: nothing taken, retried.
        (FetchError.INCONSISTENT_TOPIC_ID, Action.RETRY, Phase.FETCHING),
        (FetchError.OFFSET_OUT_OF_RANGE, Action.QUERY, Phase.TRUNCATING),
    ],
)
def test_each_fetch_error_has_its_step(error: FetchError, action: Action, phase: Phase) -> None:
    f = follower()
    f.truncated(15, 1)
    step = f.on_fetch_response(FetchResponse(error, b"", 0, 0))
    assert step.action is action and f.phase is phase


def test_an_epoch_answer_from_a_copy_of_another_topic_truncates_nothing() -> None:
    f = follower(latest_epoch=3, log_end=15)
    answer = EpochAnswer(FetchError.INCONSISTENT_TOPIC_ID, -1, -1, 0)
    step = f.on_epoch_answer(answer, lambda e: (3, 15))
    assert step.action is Action.RETRY and f.phase is Phase.TRUNCATING


def test_every_request_names_the_topic_id_of_the_local_copy() -> None:
    f = FollowerReplica(
        "b", topic="t", partition=0, leader="a", epoch=4, latest_epoch=1,
        log_start=0, log_end=15, topic_id=77,
    )  # fmt: skip
    assert f.epoch_query().topic_id == 77
    f.truncated(15, 1)
    assert f.fetch_request(15).topic_id == 77


def test_a_fetch_carries_the_epoch_the_end_and_the_fsynced_end() -> None:
    f = follower(log_end=15)
    f.truncated(12, 1)
    request = f.fetch_request(fsynced_offset=14)
    assert (request.epoch, request.fetch_offset, request.fsynced_offset, request.max_bytes) == (
        4,
        12,
        12,  # never more than what is written
        1000,
    )
    assert f.high_watermark == 5


def test_the_leaders_hw_is_adopted_bounded_by_my_end_and_never_lowered() -> None:
    f = follower(log_end=10, hw=5)
    f.truncated(10, 1)
    step = f.on_fetch_response(FetchResponse(None, b"batches", 50, 0))
    assert (step.action, step.offset, step.batches) == (Action.APPEND, 10, b"batches")
    f.appended(20, 4)
    assert f.high_watermark == 20 and f.log_end == 20 and f.latest_epoch == 4
    f.on_fetch_response(FetchResponse(None, b"", 8, 0))
    f.appended(20, 4)
    assert f.high_watermark == 20
    assert f.append_failed().action is Action.QUERY and f.phase is Phase.TRUNCATING


def test_a_leader_whose_log_starts_past_mine_asks_for_a_reset() -> None:
    f = follower(log_end=10)
    f.truncated(10, 1)
    step = f.on_fetch_response(FetchResponse(None, b"", 0, 25))
    assert (step.action, step.offset) == (Action.RESET, 25)
    f.reset(25, 1)
    assert (f.log_start, f.log_end, f.phase) == (25, 25, Phase.FETCHING)


def test_kip_279_on_real_logs_the_follower_ends_with_the_leaders_bytes(tmp_path: Path) -> None:
    leader = PartitionLog(tmp_path / "a", 0, SMALL)
    mine = PartitionLog(tmp_path / "b", 0, SMALL)
    try:
        # Both copied epoch 1's first 10 records; then the leader of epoch 1 wrote 2 more
        # that only "a" got, "a" led epoch 2 (8 records), while "b", cut off, had led an
        # epoch 3 of its own that nobody copied (5 records).
        common = [NewRecord(f"c{i}".encode()) for i in range(10)]
        leader.append(common, 100, leader_epoch=1)
        mine.append_batches(leader.read_batches(0, 1 << 20))
        leader.append([NewRecord(b"x"), NewRecord(b"y")], 101, leader_epoch=1)
        leader.append([NewRecord(f"two{i}".encode()) for i in range(8)], 102, leader_epoch=2)
        mine.append([NewRecord(f"three{i}".encode()) for i in range(5)], 103, leader_epoch=3)
        f = FollowerReplica(
            "b",
            topic="t",
            partition=0,
            leader="a",
            epoch=4,
            latest_epoch=mine.epochs.latest_epoch,
            log_start=0,
            log_end=mine.end_offset,
        )
        epoch, end = leader.end_offset_for_epoch(f.epoch_query().epoch)
        assert (epoch, end) == (2, 20)
        step = f.on_epoch_answer(EpochAnswer(None, epoch, end, 0), mine.end_offset_for_epoch)
        assert (step.action, step.offset) == (Action.TRUNCATE, 10)  # not 15: KIP-279
        mine.truncate_to(step.offset)
        f.truncated(mine.end_offset, mine.epochs.latest_epoch)
        for _ in range(20):
            request = f.fetch_request(mine.end_offset)
            if request.fetch_offset == leader.end_offset:
                break
            batches = leader.read_batches(request.fetch_offset, request.max_bytes)
            step = f.on_fetch_response(FetchResponse(None, batches, leader.end_offset, 0))
            mine.append_batches(step.batches)
            f.appended(mine.end_offset, mine.epochs.latest_epoch)
        assert mine.read_batches(0, 1 << 20) == leader.read_batches(0, 1 << 20)
        assert f.high_watermark == 20
        assert mine.epochs.entries == leader.epochs.entries == [(1, 0), (2, 12)]
    finally:
        leader.close()
        mine.close()
