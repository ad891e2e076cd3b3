"""The data directory's lock: one Herald process per data directory.

Two servers on one directory would both append at the same offsets and lose
acknowledged records, so the first thing a server does with its data directory is take
an exclusive ``flock`` on ``<data_dir>/.lock`` (Kafka's ``.lock`` the same way), held for
the life of the process. The kernel drops it when the holder exits, however it exits
(kill -9 included), so a lock file left behind never blocks a restart; the file only
carries the holder's pid, for the message a second process prints.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from herald.protocol.errors import HeraldError
from storage.durable import make_dirs

LOCK_FILE = ".lock"


class DataDirLocked(HeraldError):
    """Another process holds the data directory."""

    code, status, title = "storage_unavailable", 503, "Service Unavailable"


class DataDirLock:
    """An exclusive lock on a data directory. Take it with :meth:`acquire`."""

    def __init__(self, data_dir: Path, fd: int) -> None:
        self.data_dir = data_dir
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Lock ``data_dir`` (created if missing) or raise :class:`DataDirLocked` at once,
        having read and written nothing else in it."""
        data_dir = Path(data_dir).resolve()
        make_dirs(data_dir)
        path = data_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f" (pid {holder})" if holder else ""
            raise DataDirLocked(
                f"data directory {data_dir} is in use by another Herald process{who}; "
                "stop that process, or give this one another --data-dir (HERALD_DATA_DIR)"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(data_dir, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the directory up (idempotent). The file stays: removing it would race a
        process that has it open and is about to lock it."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the descriptor drops the flock


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
