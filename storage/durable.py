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
