"""Hypothesis fuzz of segment bytes given to recovery: no crash, and no acknowledged record
before the damage is lost (bounded examples)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from herald.protocol.errors import HeraldError
from storage.config import TopicConfig
from storage.engine import Storage
from storage.record import Acks, NewRecord
from storage.topic import PublishItem

BATCHES = [[f"b{b}-r{r}".encode() for r in range(3)] for b in range(4)]
FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


async def _build(directory: Path) -> None:
    storage = await Storage.open(directory)
    try:
        topic = await storage.create_topic("fuzz", TopicConfig(partitions=1))
        for batch in BATCHES:
            await topic.publish([PublishItem(NewRecord(v)) for v in batch], Acks.ALL)
    finally:
        await storage.close()


async def _recover(directory: Path) -> list[bytes]:
    storage = await Storage.open(directory)
    try:
        topic = storage.topic("fuzz")
        assert topic is not None
        partition = topic.partitions[0]
        records = await partition.read(0, 1000, 1 << 20)
        # The recovered log still takes appends after the cut.
        await topic.publish([PublishItem(NewRecord(b"after"))], Acks.ALL)
        return [r.value for r in records]
    finally:
        await storage.close()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pristine") / "data"
    asyncio.run(_build(directory))
    return directory


def _segment(directory: Path) -> Path:
    (log,) = [p for p in directory.rglob("*.log") if p.stat().st_size > 0]
    return log


def _intact_prefix(size_before_damage: int, segment_size: int) -> list[bytes]:
    """The records of the batches that end before the damage (batches are equal-sized)."""
    per_batch = segment_size // len(BATCHES)
    whole = min(len(BATCHES), size_before_damage // per_batch)
    return [v for batch in BATCHES[:whole] for v in batch]


def _run_on_copy(pristine: Path, damage: object) -> tuple[list[bytes] | None, int]:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "data"
        shutil.copytree(pristine, copy)
        log = _segment(copy)
        size = log.stat().st_size
        assert callable(damage)
        damage(log)
        try:
            return asyncio.run(_recover(copy)), size
        except HeraldError:
            return None, size  # refused with a clear error: not a crash


@FUZZ
@given(tail=st.binary(min_size=1, max_size=300))
def test_garbage_after_the_last_batch_loses_nothing(pristine: Path, tail: bytes) -> None:
    def append(log: Path) -> None:
        with log.open("ab") as f:
            f.write(tail)

    values, _ = _run_on_copy(pristine, append)
    assert values == [v for batch in BATCHES for v in batch]


@FUZZ
@given(cut=st.floats(min_value=0, max_value=1))
def test_a_torn_tail_keeps_every_whole_batch(pristine: Path, cut: float) -> None:
    position: list[int] = []

    def truncate(log: Path) -> None:
        position.append(int(log.stat().st_size * cut))
        with log.open("r+b") as f:
            f.truncate(position[0])

    values, size = _run_on_copy(pristine, truncate)
    assert values == _intact_prefix(position[0], size)


@FUZZ
@given(where=st.floats(min_value=0, max_value=0.999), junk=st.binary(min_size=1, max_size=64))
def test_overwritten_bytes_never_crash_recovery_nor_lose_earlier_batches(
    pristine: Path, where: float, junk: bytes
) -> None:
    position: list[int] = []

    def overwrite(log: Path) -> None:
        position.append(int(log.stat().st_size * where))
        with log.open("r+b") as f:
            f.seek(position[0])
            f.write(junk)

    values, size = _run_on_copy(pristine, overwrite)
    if values is not None:
        expected = _intact_prefix(position[0], size)
        assert values[: len(expected)] == expected
