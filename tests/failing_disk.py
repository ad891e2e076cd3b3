"""A real disk whose write-back fails on demand, for fsync failure tests (needs root).

An ext4 file system on a loop device whose backing file lives on a small tmpfs. Filling
that tmpfs leaves ext4 free space (writes land in the page cache and succeed) but makes
every write-back, hence every fsync, fail with ENOSPC — thin-provisioned storage running
out. Emptying it again heals the disk. Unmounting and mounting again drops the page
cache: what is then read is what a power loss would have left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

BACKING_MB = 24  # the tmpfs holding the disk image: what the image may really use
IMAGE_MB = 128  # what ext4 believes it has


def available() -> bool:
    """Root, mkfs.ext4 and losetup: what mounting a failing disk needs."""
    return os.geteuid() == 0 and bool(shutil.which("mkfs.ext4") and shutil.which("losetup"))


needs_failing_disk = pytest.mark.skipif(
    not available(), reason="needs root, mkfs.ext4 and loop devices to make a failing disk"
)


def _run(*command: str | Path) -> None:
    subprocess.run([str(c) for c in command], check=True, capture_output=True, timeout=60)


@dataclass
class FailingDisk:
    backing: Path
    mountpoint: Path
    backing_mb: int = BACKING_MB

    @property
    def image(self) -> Path:
        return self.backing / "disk.img"

    def fail_fsyncs(self) -> None:
        """Fill the backing tmpfs: writes still land in the page cache, write-back fails."""
        with (self.backing / "filler").open("wb") as filler:
            chunk = b"\0" * (1 << 20)
            try:
                for _ in range(4 * self.backing_mb):
                    filler.write(chunk)
                    filler.flush()
            except OSError:
                return
        raise AssertionError("the backing tmpfs did not fill up")

    def heal(self) -> None:
        (self.backing / "filler").unlink(missing_ok=True)

    def power_cycle(self) -> None:
        """Unmount and mount again (every file on it closed): the page cache is gone."""
        _run("umount", self.mountpoint)
        _run("mount", "-o", "loop,errors=continue", self.image, self.mountpoint)


@contextmanager
def failing_disk(
    backing: Path, mountpoint: Path, backing_mb: int = BACKING_MB, image_mb: int = IMAGE_MB
) -> Iterator[FailingDisk]:
    """Mount a fresh failing disk at ``mountpoint`` (which must exist), its image on a
    tmpfs mounted at ``backing`` (made here); both unmounted at the end."""
    backing.mkdir()
    _run("mount", "-t", "tmpfs", "-o", f"size={backing_mb}m", "tmpfs", backing)
    disk = FailingDisk(backing, mountpoint, backing_mb)
    try:
        with disk.image.open("wb") as f:
            f.truncate(image_mb << 20)  # sparse
        # No journal, errors=continue: a failed write-back is reported to fsync and the
        # file system stays writable (no remount read-only), as a plain data disk would.
        _run("mkfs.ext4", "-q", "-F", "-O", "^has_journal", disk.image)
        _run("mount", "-o", "loop,errors=continue", disk.image, mountpoint)
        try:
            yield disk
        finally:
            disk.heal()
            _unmount(mountpoint)
    finally:
        _unmount(backing)


def _unmount(path: Path) -> None:
    # Lazily if a failed test left a file open: its directory must still go away.
    if subprocess.run(["umount", str(path)], check=False, capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=60)
