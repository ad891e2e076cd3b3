"""Making directory entries durable (POSIX: a new or renamed entry survives power loss
only once its parent directory is fsynced).

Every creation and rename on the way to an answer goes through here, so that a 201 or
an ``acks=all`` answer never comes before the directory entries it depends on are on disk.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make file creations, renames and deletions in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> bool:
    """``mkdir -p`` whose every new level is durable: each directory it creates is
    fsynced into its parent. Returns whether anything was created."""
    path = Path(path)
    missing: list[Path] = []
    probe = path
    while not probe.is_dir():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            if not directory.is_dir():
                raise
        fsync_dir(directory.parent)
    return bool(missing)


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` as the whole of ``path`` and fsync it: the first half of a
    temp file -> fsync -> rename -> fsync dir replacement (STYLE: small metadata files)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes) -> None:
    """Durably replace ``path`` with ``data``: at every instant a reader sees the old
    file or the new one, and on return the new one survives power loss."""
    tmp = path.with_name(path.name + ".tmp")
    write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)
