"""StartAt: the one type for subscription `start`, seek targets and tail `?from=`."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from delivery.start import Position, StartAt
from herald.protocol.errors import PartitionNotFound
from subscribers.frames import parse_from_param


@dataclass
class FakePartition:
    """A partition's bounds: offsets [start_offset, end_offset), timestamp == 10 * offset."""

    partition: int
    start_offset: int
    end_offset: int

    async def offset_for_timestamp(self, timestamp_ms: int) -> int:
        return min(max(-(-timestamp_ms // 10), self.start_offset), self.end_offset)


PARTITIONS = [FakePartition(0, 5, 20), FakePartition(1, 0, 3)]


async def test_each_position_resolves_per_partition() -> None:
    assert await StartAt.earliest().offsets_in(PARTITIONS) == {0: 5, 1: 0}
    assert await StartAt.latest().offsets_in(PARTITIONS) == {0: 20, 1: 3}
    assert await StartAt.at_timestamp(71).offsets_in(PARTITIONS) == {0: 8, 1: 3}
    # One offset for every partition (a tail's ?from=N): clamped into each log.
    assert await StartAt.at_offset(2).offsets_in(PARTITIONS) == {0: 5, 1: 2}
    # Per partition (seek): only the partitions named; past the end means the end.
    assert await StartAt.at_offsets({1: 100}).offsets_in(PARTITIONS) == {1: 3}


def test_seek_partitions_are_checked_against_the_topic() -> None:
    StartAt.at_offsets({0: 1, 1: 0}).check_partitions("t", 2)
    StartAt.earliest().check_partitions("t", 0)
    for bad in (2, -1):
        with pytest.raises(PartitionNotFound):
            StartAt.at_offsets({0: 1, bad: 0}).check_partitions("t", 2)


def test_subscription_start_round_trips_through_its_json() -> None:
    for start in (StartAt.earliest(), StartAt.latest(), StartAt.at_timestamp(7)):
        assert StartAt.from_json(start.to_json()) == start
    assert StartAt.at_timestamp(7).to_json() == {"timestamp": 7}
    assert StartAt.latest().to_json() == "latest"
    with pytest.raises(ValueError):
        StartAt.at_offsets({0: 1}).to_json()  # not a subscription start


@pytest.mark.parametrize(
    ("raw", "start"),
    [
        (None, StartAt.latest()),
        ("latest", StartAt.latest()),
        ("earliest", StartAt.earliest()),
        ("12", StartAt.at_offset(12)),
        ("ts:99", StartAt.at_timestamp(99)),
        ("0012", StartAt.at_offset(12)),
        ("9" * 5000, StartAt.at_offset(2**63 - 1)),  # past every end: the end
        ("ts:" + "9" * 5000, StartAt.at_timestamp(2**63 - 1)),
    ],
)
def test_tail_from_param(raw: str | None, start: StartAt) -> None:
    assert parse_from_param(raw) == start


@pytest.mark.parametrize("raw", ["", "-1", "ts:", "ts:-5", "1.5", "soon", "١٢"])
def test_bad_tail_from_param(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_from_param(raw)


def test_offsets_are_kept_in_partition_order() -> None:
    start = StartAt.at_offsets({3: 0, 0: 12})
    assert start.position is Position.OFFSETS and start.offsets == ((0, 12), (3, 0))
