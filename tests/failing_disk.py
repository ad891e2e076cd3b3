"""A real disk whose write-back fails on demand, for fsync failure tests (needs root).

An ext4 file system on a loop device whose backing file lives on a small tmpfs. Filling
that tmpfs leaves ext4 free space (writes land in the page cache and succeed) but makes
every write-back, hence every fsync, fail with ENOSPC — thin-provisioned storage running
out. Emptying it again heals the disk. A power cut keeps the image as it is at that
instant (what was written back so far) and throws the page cache away, healthy dirty
pages included; a file system check then repairs the image, as a boot would.
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
    """Root, mkfs.ext4, e2fsck and losetup: what a failing disk needs."""
    return os.geteuid() == 0 and all(map(shutil.which, ("mkfs.ext4", "e2fsck", "losetup")))


needs_failing_disk = pytest.mark.skipif(
    not available(), reason="needs root, mkfs.ext4, e2fsck and loop devices to make a failing disk"
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

    def power_cut(self) -> None:
        """The disk as a power cut leaves it: whatever was not written back is lost,
        dirty pages of a healthy disk as well as pages whose write-back failed. Every
        process using the disk must be dead already (kill -9).

        The image is copied first: that copy is the disk at the cut (the kernel's
        flusher writes back only pages dirty for 30 s, so little can land while it is
        taken). The unmount then writes back into the old image, which the copy
        replaces; e2fsck repairs what the cut left half done (no journal) and the copy
        is mounted again.
        """
        cut = self.backing.parent / f"{self.backing.name}.cut.img"
        _run("cp", "--sparse=always", self.image, cut)
        try:
            _run("umount", self.mountpoint)
            self.image.unlink()  # its room first: a failing disk's tmpfs is full
            _run("cp", "--sparse=always", cut, self.image)
        finally:
            cut.unlink(missing_ok=True)
        fsck = subprocess.run(
            ["e2fsck", "-f", "-y", str(self.image)], capture_output=True, timeout=120
        )
        if fsck.returncode > 2:  # 1 and 2: errors found and corrected
            raise RuntimeError(f"e2fsck after a power cut: {fsck.stdout.decode()[-2000:]}")
        _run("mount", "-o", "loop,errors=continue,discard", self.image, self.mountpoint)


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
        # discard: freed blocks go back to the tmpfs (thin provisioning), or a long run's
        # deleted segments and rewrites would fill it for good.
        _run("mkfs.ext4", "-q", "-F", "-O", "^has_journal", disk.image)
        _run("mount", "-o", "loop,errors=continue,discard", disk.image, mountpoint)
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
