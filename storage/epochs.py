"""The leader epoch cache of one partition (Kafka's LeaderEpochFileCache, KIP-101).

Which leader epoch began at which offset: ``[(epoch, start_offset), ...]``, both rising.
A replica that comes back after a change of leader asks the current leader for the end
offset of its own latest epoch and truncates there, never to its own high watermark,
so that it drops exactly the records the new leader does not have (KIP-101 shows how
truncating to the high watermark loses or forks records).

Every batch carries its epoch (storage/batch.py), so the cache is derived data; it is
kept in ``leader-epoch-checkpoint`` (temp file, fsync, rename, fsync dir) so that opening
a partition does not scan its log. A log that never had a leader epoch above 0 (every
single node) needs no file: no file means "epoch 0 from the log start".
"""

from __future__ import annotations

import itertools
from pathlib import Path

from storage.durable import replace_file

CHECKPOINT_FILE = "leader-epoch-checkpoint"
_VERSION = "0"
UNDEFINED = -1  # Kafka's UNDEFINED_EPOCH / UNDEFINED_EPOCH_OFFSET


class StaleEpoch(ValueError):
    """An append under an epoch older than the newest the log holds (a deposed leader)."""


class CorruptCheckpoint(ValueError):
    """A checkpoint file that cannot be parsed or breaks the cache's order."""


class LeaderEpochCache:
    def __init__(self, directory: Path, entries: list[tuple[int, int]]) -> None:
        self.path = directory / CHECKPOINT_FILE
        self._entries = entries

    @classmethod
    def load(cls, directory: Path, start_offset: int) -> LeaderEpochCache:
        """The partition's cache; raises CorruptCheckpoint if its file is damaged (the log
        then rebuilds it from its batches). No file: epoch 0 from ``start_offset``."""
        path = directory / CHECKPOINT_FILE
        try:
            text = path.read_text("ascii")
        except FileNotFoundError:
            return cls(directory, [(0, start_offset)])
        except (OSError, UnicodeDecodeError) as exc:
            raise CorruptCheckpoint(f"{path}: {exc}") from exc
        return cls(directory, _parse(path, text))

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        entries = self._entries
        return entries[-1][0] if entries else UNDEFINED

    def assign(self, epoch: int, start_offset: int) -> None:
        """Note that ``epoch`` began at ``start_offset`` (called before its first batch is
        written, so the file never lags the log). Same epoch again: nothing changes."""
        latest = self.latest_epoch
        if epoch == latest:
            return
        if epoch < latest:
            raise StaleEpoch(f"epoch {epoch} is older than the log's epoch {latest}")
        if self._entries and start_offset < self._entries[-1][1]:
            raise ValueError(
                f"epoch {epoch} cannot start at {start_offset}, before epoch {latest} "
                f"(at {self._entries[-1][1]})"
            )
        # A new list, never a change in place: the event loop reads the cache (latest_epoch,
        # end_offset_for) while the writer thread changes it, and must see a whole list.
        if self._entries and self._entries[-1][1] == start_offset:
            # The previous epoch wrote nothing: it has no range of its own (Kafka drops it).
            self._entries = [*self._entries[:-1], (epoch, start_offset)]
        else:
            self._entries = [*self._entries, (epoch, start_offset)]
        self._save()

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """(the largest epoch <= ``epoch``, the offset where it ended): the start of the
        next epoch, or ``log_end`` for the latest. (UNDEFINED, UNDEFINED) when ``epoch``
        is older than every epoch the cache knows (KIP-279's OffsetsForLeaderEpoch)."""
        entries = self._entries  # one snapshot: the writer thread replaces the list
        found = UNDEFINED
        for i, (e, _start) in enumerate(entries):
            if e > epoch:
                break
            found = i
        if found == UNDEFINED:
            return UNDEFINED, UNDEFINED
        if found == len(entries) - 1:
            return entries[found][0], log_end
        return entries[found][0], entries[found + 1][1]

    def epoch_at(self, offset: int) -> int:
        """The epoch the record at ``offset`` was appended under."""
        epoch = UNDEFINED
        for e, start in self._entries:
            if start > offset:
                break
            epoch = e
        return epoch

    def clear(self) -> None:
        """Forget every epoch (the log was emptied and restarts elsewhere: its next
        batches bring their epochs)."""
        if self._entries:
            self._entries = []
            self._save()

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that began at or after ``end_offset`` (the log was cut there)."""
        kept = [(e, s) for e, s in self._entries if s < end_offset]
        if kept != self._entries:
            self._entries = kept
            self._save()

    def truncate_from_start(self, start_offset: int) -> None:
        """Retention moved the log start to ``start_offset``: epochs wholly below it go,
        and the oldest one left starts there."""
        kept = [
            (e, s)
            for i, (e, s) in enumerate(self._entries)
            if i + 1 == len(self._entries) or self._entries[i + 1][1] > start_offset
        ]
        if kept and kept[0][1] < start_offset:
            kept[0] = (kept[0][0], start_offset)
        if kept != self._entries:
            self._entries = kept
            self._save()

    def _save(self) -> None:
        if all(epoch == 0 for epoch, _ in self._entries) and not self.path.exists():
            return  # epoch 0 alone (or nothing): no file needed (see the module docstring)
        lines = [_VERSION, str(len(self._entries))]
        lines += [f"{epoch} {start}" for epoch, start in self._entries]
        data = ("\n".join(lines) + "\n").encode("ascii")
        replace_file(self.path, data)


def _parse(path: Path, text: str) -> list[tuple[int, int]]:
    lines = text.split("\n")
    try:
        if lines[0] != _VERSION or lines[-1] != "":
            raise ValueError("bad version or torn file")
        count = int(lines[1])
        if len(lines) != count + 3:
            raise ValueError("entry count does not match")
        entries = []
        for line in lines[2 : 2 + count]:
            epoch_text, start_text = line.split(" ")
            entries.append((int(epoch_text), int(start_text)))
    except (ValueError, IndexError) as exc:
        raise CorruptCheckpoint(f"{path}: {exc}") from exc
    for (e1, s1), (e2, s2) in itertools.pairwise(entries):
        if not (e1 < e2 and s1 < s2):
            raise CorruptCheckpoint(f"{path}: entries out of order")
    if any(e < 0 or s < 0 for e, s in entries):
        raise CorruptCheckpoint(f"{path}: negative entry")
    return entries
