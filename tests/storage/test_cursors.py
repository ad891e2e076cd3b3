"""CursorStore: round trip, crash safety (torn/garbage files), delete."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from storage.cursors import (
    CursorSnapshot,
    CursorStore,
    PartitionCursor,
    compact_cursor,
    decode_snapshot,
    encode_snapshot,
    offsets_to_ranges,
    ranges_to_offsets,
)


def snapshot(
    floor: int, acked: tuple[tuple[int, int], ...] = (), attempts: int = 1
) -> CursorSnapshot:
    return CursorSnapshot(
        partitions={0: PartitionCursor(floor, acked), 3: PartitionCursor(0)},
        attempts={(0, floor): attempts, (3, 0): 2},
    )


def test_round_trip(tmp_path: Path) -> None:
    store = CursorStore(tmp_path / "cursors")
    snap = snapshot(10, ((12, 15), (20, 21)), attempts=4)
    store.save("orders", snap)
    assert store.load("orders") == snap
    # A fresh store (a restart) reads the same thing.
    assert CursorStore(tmp_path / "cursors").load("orders") == snap


def test_missing_subscription_loads_none(tmp_path: Path) -> None:
    assert CursorStore(tmp_path).load("nobody") is None


def test_save_replaces_previous_snapshot(tmp_path: Path) -> None:
    store = CursorStore(tmp_path)
    store.save("s", snapshot(1))
    store.save("s", snapshot(2))
    assert store.load("s") == snapshot(2)


def test_leftover_partial_temp_file_is_ignored(tmp_path: Path) -> None:
    store = CursorStore(tmp_path)
    store.save("s", snapshot(5))
    # A crash in the middle of the next save leaves a torn temp file behind.
    good = encode_snapshot(snapshot(6))
    (tmp_path / "s.cursor.tmp").write_bytes(good[: len(good) // 2])
    assert CursorStore(tmp_path).load("s") == snapshot(5)
    # The next save simply overwrites it.
    store.save("s", snapshot(7))
    assert store.load("s") == snapshot(7)


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) - 3],  # truncated
        lambda b: b"",  # empty (rename reached disk before the data)
        lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]),  # flipped byte: checksum catches it
        lambda b: b"\0" * len(b),  # zero-filled block
    ],
    ids=["truncated", "empty", "bitflip", "zeroes"],
)
def test_corrupt_main_file_falls_back_to_previous_snapshot(tmp_path: Path, damage) -> None:
    store = CursorStore(tmp_path)
    store.save("s", snapshot(1))
    store.save("s", snapshot(2))
    main = tmp_path / "s.cursor"
    main.write_bytes(damage(main.read_bytes()))
    assert CursorStore(tmp_path).load("s") == snapshot(1)


def test_corrupt_main_is_not_kept_as_previous(tmp_path: Path) -> None:
    store = CursorStore(tmp_path)
    store.save("s", snapshot(1))
    store.save("s", snapshot(2))
    (tmp_path / "s.cursor").write_bytes(b"garbage")
    restarted = CursorStore(tmp_path)
    restarted.save("s", snapshot(3))
    # Main is the new one; .prev still holds the last good one, not the garbage.
    (tmp_path / "s.cursor").write_bytes(b"")
    assert restarted.load("s") == snapshot(1)


def test_crash_between_the_two_renames_loads_previous(tmp_path: Path) -> None:
    store = CursorStore(tmp_path)
    store.save("s", snapshot(1))
    store.save("s", snapshot(2))
    # State after `main -> prev` and before `tmp -> main`: no main file.
    (tmp_path / "s.cursor").rename(tmp_path / "s.cursor.prev")
    assert CursorStore(tmp_path).load("s") == snapshot(2)


def test_everything_corrupt_loads_none_without_crashing(tmp_path: Path) -> None:
    (tmp_path / "s.cursor").write_bytes(b"HCUR\x01garbage")
    (tmp_path / "s.cursor.prev").write_bytes(b"{}")
    assert CursorStore(tmp_path).load("s") is None


def test_delete_removes_every_file(tmp_path: Path) -> None:
    store = CursorStore(tmp_path)
    store.save("s", snapshot(1))
    store.save("s", snapshot(2))
    (tmp_path / "s.cursor.tmp").write_bytes(b"x")
    store.save("other", snapshot(3))
    store.delete("s")
    assert store.load("s") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.cursor"]
    store.delete("s")  # idempotent


def test_concurrent_saves_of_one_subscription_do_not_interleave(tmp_path: Path) -> None:
    store = CursorStore(tmp_path)
    threads = [
        threading.Thread(target=lambda i=i: [store.save("s", snapshot(i)) for _ in range(20)])
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.load("s") in [snapshot(i) for i in range(4)]


def test_names_that_escape_the_directory_are_refused(tmp_path: Path) -> None:
    store = CursorStore(tmp_path)
    for name in ("", "../x", ".hidden", "a/b"):
        with pytest.raises(ValueError):
            store.load(name)


def test_decode_rejects_structurally_bad_ranges() -> None:
    from storage.cursors import _Invalid

    bad = CursorSnapshot({0: PartitionCursor(10, ((5, 8),))}, {})  # range below the floor
    with pytest.raises(_Invalid):
        decode_snapshot(encode_snapshot(bad))


def test_offsets_ranges_conversion() -> None:
    assert offsets_to_ranges([]) == ()
    assert offsets_to_ranges([3, 4, 4, 5, 9, 11, 12]) == ((3, 6), (9, 10), (11, 13))
    assert list(ranges_to_offsets(((3, 6), (9, 10)))) == [3, 4, 5, 9]
    with pytest.raises(ValueError):
        offsets_to_ranges([5, 3])


def test_compact_cursor_raises_floor_over_contiguous_acks() -> None:
    assert compact_cursor(10, [8, 10, 11, 13]) == PartitionCursor(12, ((13, 14),))
    assert compact_cursor(10, [12]) == PartitionCursor(10, ((12, 13),))
    assert compact_cursor(0, []) == PartitionCursor(0)
