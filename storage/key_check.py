"""Which encryption keys a data directory's log and meta.db need (storage/encryption.py).

An encrypted batch names its key id in its clear header. A server whose configured keys
lack one of them would find out only when a read reaches such a batch (503); checked
before the server starts, it refuses to start instead, naming the key. Only headers are
read (the file mapped, batch after batch by length): no decryption, no CRC; a torn tail
ends a segment's walk, as recovery will cut it.
"""

from __future__ import annotations

import mmap
import re
from pathlib import Path

from storage.batch import ATTR_ENCRYPTED, read_header
from storage.errors import CorruptLog
from storage.metadata import sealed_key_ids

SEGMENT_NAME = re.compile(r"\d{20}\.log")  # storage/segment.py segment_name(…, ".log")


def key_ids_needed(data_dir: Path) -> dict[int, Path]:
    """Each key id that an encrypted batch of the log names, with a segment needing it."""
    needed: dict[int, Path] = {}
    for path in sorted(Path(data_dir).rglob("*.log")):
        if SEGMENT_NAME.fullmatch(path.name) and path.is_file():
            for key_id in sorted(segment_key_ids(path)):
                needed.setdefault(key_id, path)
    meta = Path(data_dir) / "meta.db"
    for key_id in sorted(sealed_key_ids(meta)):  # sealed subscription configs
        needed.setdefault(key_id, meta)
    return needed


def segment_key_ids(path: Path) -> set[int]:
    size = path.stat().st_size
    ids: set[int] = set()
    if size == 0:
        return ids
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            position = 0
            while position < size:
                try:
                    header = read_header(view, position)
                except CorruptLog:
                    break  # a torn tail (or zeros past the end): recovery cuts it
                if position + header.length > size:
                    break
                if header.attributes & ATTR_ENCRYPTED:
                    ids.add(header.key_id)
                position += header.length
        finally:
            view.release()  # before the mapping closes
    return ids
