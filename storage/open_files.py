"""A bound on the descriptors partitions keep open (PROTOCOL §6: open files are bounded
below the process's limit, so the topic cap, not the file limit, is what a tenant meets).

Only a partition's active segment keeps descriptors between operations (its log and its
two indexes; readers open their own and close them at once). Each partition reports to
one :class:`OpenFiles` how many it holds after it used them; past ``max_files`` the
least recently used partitions are asked to close theirs (an idle partition fsyncs and
closes its files, and opens them again, transparently, on its next write). A partition
in the middle of an operation is skipped: it holds its own lock while it works, and the
registry only ever *tries* that lock, so eviction never waits for a writer thread and
never deadlocks with one (lock order: a partition's lock, then the registry's).
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Protocol

log = logging.getLogger(__name__)


class FileHolder(Protocol):
    """What the registry asks of a partition log."""

    def release_files(self) -> int:
        """Close the files if no operation is running on them (try the holder's lock,
        never wait for it); how many descriptors were closed, 0 if busy or none."""
        ...


class OpenFiles:
    """The least recently used order of partitions holding descriptors, and their sum."""

    def __init__(self, max_files: int | None = None) -> None:
        if max_files is not None and max_files < 1:
            raise ValueError("max_files must be positive")
        self.max_files = max_files  # None: unbounded
        self._lock = threading.Lock()
        self._holders: collections.OrderedDict[FileHolder, int] = collections.OrderedDict()
        self._count = 0
        # The holder that reported last, read without the lock by holders that skip
        # reporting again when it is themselves with as many files (the append path).
        self.most_recent: FileHolder | None = None
        self.evictions = 0  # partitions whose files were closed to stay within the bound

    @property
    def count(self) -> int:
        """Descriptors held by partitions now (an upper bound)."""
        return self._count

    def used(self, holder: FileHolder, files: int) -> None:
        """``holder`` (under its own lock) just used its files and now holds ``files``
        descriptors: it becomes the most recently used, and others are closed until the
        sum is within the bound again (those busy right now are skipped)."""
        with self._lock:
            self._count += files - self._holders.pop(holder, 0)
            self.most_recent = holder if files else None
            if files:
                self._holders[holder] = files
            if self.max_files is None or self._count <= self.max_files:
                return
            for victim in list(self._holders):
                if self._count <= self.max_files:
                    break
                if victim is holder:
                    continue
                if victim.release_files():
                    self._count -= self._holders.pop(victim)
                    self.evictions += 1

    def released(self, holder: FileHolder) -> None:
        """``holder`` closed its files itself (closed, deleted, or released)."""
        with self._lock:
            self._count -= self._holders.pop(holder, 0)
            if self.most_recent is holder:
                self.most_recent = None
