"""DedupIndex: window counted from the first publish, bounded memory (PROTOCOL §2 `id`)."""

from __future__ import annotations

import pytest

from storage.dedup import DedupEntry, DedupIndex


def test_lookup_finds_first_publish_within_window() -> None:
    index = DedupIndex(window_ms=1000)
    index.add("a", partition=2, offset=7, timestamp_ms=10_000)
    assert index.lookup("a", now_ms=10_999) == DedupEntry(2, 7, 10_000)
    assert index.lookup("b", now_ms=10_000) is None


def test_entry_is_gone_once_window_has_passed() -> None:
    index = DedupIndex(window_ms=1000)
    index.add("a", 0, 0, timestamp_ms=10_000)
    assert index.lookup("a", now_ms=11_000) is None  # window is half-open: [first, first + window)
    assert index.expire(now_ms=11_000) == 1
    assert len(index) == 0


def test_window_counts_from_first_publish_not_the_latest() -> None:
    index = DedupIndex(window_ms=1000)
    index.add("a", 0, 0, timestamp_ms=10_000)
    index.add("a", 1, 5, timestamp_ms=10_500)  # a duplicate: must not extend the window
    assert index.lookup("a", now_ms=10_900) == DedupEntry(0, 0, 10_000)
    assert index.lookup("a", now_ms=11_000) is None


def test_id_can_be_published_again_after_expiry() -> None:
    index = DedupIndex(window_ms=1000)
    index.add("a", 0, 0, timestamp_ms=10_000)
    index.add("a", 0, 9, timestamp_ms=12_000)
    assert index.lookup("a", now_ms=12_100) == DedupEntry(0, 9, 12_000)
    # The stale heap item of the first publish must not remove the second one.
    assert index.expire(now_ms=12_100) == 0
    assert len(index) == 1


def test_rebuild_out_of_order_keeps_earliest_publish() -> None:
    index = DedupIndex(window_ms=1000)
    index.add("a", 1, 3, timestamp_ms=10_500)  # partition 1 read first
    index.add("a", 0, 8, timestamp_ms=10_200)  # partition 0 holds the earlier publish
    assert index.lookup("a", now_ms=10_600) == DedupEntry(0, 8, 10_200)
    assert index.expire(now_ms=11_200) == 1
    assert len(index) == 0
    assert index.expire(now_ms=11_600) == 0


def test_expire_pops_only_due_entries_and_memory_stays_bounded() -> None:
    index = DedupIndex(window_ms=100)
    for t in range(10_000):
        index.add(f"id-{t}", 0, t, timestamp_ms=t)
        index.expire(now_ms=t)
        assert len(index) <= 100
    assert len(index._by_time) <= 100


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError):
        DedupIndex(0)
