"""The data directory's lock and durable directory entries.

One process per data directory: a second Storage on a directory in use is refused before
it reads anything, and the lock goes with its holder, however the holder ends (kill -9
included). Directory entries a topic needs are fsynced into their parents before the
topic is answered for.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from storage.config import TopicConfig
from storage.durable import make_dirs
from storage.engine import Storage
from storage.lock import LOCK_FILE, DataDirLock, DataDirLocked

REPO = Path(__file__).resolve().parents[2]

HOLDER = """
import sys, time
from storage.lock import DataDirLock
lock = DataDirLock.acquire(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


def start_holder(data_dir: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(data_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "locked"
    return child


def kill(holder: subprocess.Popen[str]) -> None:
    holder.kill()  # SIGKILL: no cleanup of ours runs
    holder.wait()
    assert holder.stdout is not None
    holder.stdout.close()


async def test_a_second_storage_on_a_directory_in_use_is_refused(tmp_path: Path) -> None:
    storage = await Storage.open(tmp_path)
    try:
        await storage.create_topic("orders", TopicConfig())
        with pytest.raises(DataDirLocked, match=str(tmp_path)):
            await Storage.open(tmp_path)
        assert storage.topic("orders") is not None
    finally:
        await storage.close()
    reopened = await Storage.open(tmp_path)  # closing released it
    try:
        assert reopened.topic("orders") is not None
    finally:
        await reopened.close()


def test_the_refusal_names_the_directory_and_the_holder(tmp_path: Path) -> None:
    holder = start_holder(tmp_path)
    try:
        with pytest.raises(DataDirLocked) as refused:
            DataDirLock.acquire(tmp_path)
        message = str(refused.value)
        assert str(tmp_path.resolve()) in message
        assert f"pid {holder.pid}" in message
        assert "--data-dir" in message
    finally:
        kill(holder)


async def test_a_refused_open_touches_nothing(tmp_path: Path) -> None:
    holder = start_holder(tmp_path)
    try:
        with pytest.raises(DataDirLocked):
            await Storage.open(tmp_path)
        assert await asyncio.to_thread(os.listdir, tmp_path) == [LOCK_FILE]
    finally:
        kill(holder)


def test_kill_9_of_the_holder_releases_the_lock(tmp_path: Path) -> None:
    holder = start_holder(tmp_path)
    kill(holder)  # the lock file stays behind
    assert (tmp_path / LOCK_FILE).exists()
    lock = DataDirLock.acquire(tmp_path)
    try:
        assert lock.held
    finally:
        lock.release()
    assert not lock.held


class FsyncLog:
    """Records the path of every descriptor os.fsync is called on (the OS boundary)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[Path] = []
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            self.paths.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)


def test_make_dirs_fsyncs_every_new_level_into_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs = FsyncLog(monkeypatch)
    assert make_dirs(tmp_path / "a" / "b" / "c")
    assert fsyncs.paths == [tmp_path, tmp_path / "a", tmp_path / "a" / "b"]
    fsyncs.paths.clear()
    assert not make_dirs(tmp_path / "a" / "b")
    assert fsyncs.paths == []


async def test_a_new_topic_is_durable_in_topics_dir_before_create_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = await Storage.open(tmp_path)
    try:
        fsyncs = FsyncLog(monkeypatch)
        await storage.create_topic("orders", TopicConfig(partitions=2))
        # POSIX: the entry "orders" is durable once topics/ is fsynced, "0" and "1" once
        # topics/orders is, the segment files once their partition directory is.
        for directory in ("topics", "topics/orders", "topics/orders/0", "topics/orders/1"):
            assert tmp_path / directory in fsyncs.paths, directory
    finally:
        await storage.close()
