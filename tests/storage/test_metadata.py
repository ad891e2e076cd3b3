"""MetadataStore: topics and subscriptions survive a reopen; deletes cascade."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.config import TopicConfig
from storage.metadata import MetadataStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MetadataStore]:
    meta = MetadataStore(tmp_path / "meta.db")
    yield meta
    meta.close()


def test_topics_round_trip_across_reopen(tmp_path: Path) -> None:
    meta = MetadataStore(tmp_path / "meta.db")
    meta.put_topic("orders", TopicConfig(partitions=4, retention_ms=None), created_ms=123)
    meta.put_topic("audit", TopicConfig(retention_bytes=2 << 20, dedup_window_ms=5000))
    meta.close()

    reopened = MetadataStore(tmp_path / "meta.db")
    try:
        assert reopened.topics() == {
            "audit": TopicConfig(retention_bytes=2 << 20, dedup_window_ms=5000),
            "orders": TopicConfig(partitions=4, retention_ms=None),
        }
        assert reopened.topic_created_ms("orders") == 123
        assert reopened.topic_created_ms("missing") is None
    finally:
        reopened.close()


def test_an_auto_created_mark_survives_a_reopen_and_goes_with_its_topic(tmp_path: Path) -> None:
    meta = MetadataStore(tmp_path / "meta.db")
    meta.put_topic("ordres", TopicConfig(), auto_created=True)
    meta.put_topic("orders", TopicConfig())
    meta.put_topic("ordres", TopicConfig(partitions=2))  # a config change keeps the mark
    meta.close()

    reopened = MetadataStore(tmp_path / "meta.db")
    try:
        assert reopened.auto_created_topics() == {"ordres"}
        reopened.delete_topic("ordres")
        reopened.put_topic("ordres", TopicConfig())  # created again, by a PUT this time
        assert reopened.auto_created_topics() == set()
    finally:
        reopened.close()


def test_database_uses_wal_and_full_sync(store: MetadataStore, tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "meta.db") as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    other.close()
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_put_topic_updates_config_but_keeps_creation_time(store: MetadataStore) -> None:
    store.put_topic("t", TopicConfig(), created_ms=1)
    store.put_topic("t", TopicConfig(retention_ms=5000), created_ms=2)
    assert store.topics() == {"t": TopicConfig(retention_ms=5000)}
    assert store.topic_created_ms("t") == 1


def test_subscriptions_round_trip_across_reopen(tmp_path: Path) -> None:
    meta = MetadataStore(tmp_path / "meta.db")
    config = {"topic": "orders", "max_in_flight": 10, "retry_backoff": {"min_ms": 1, "max_ms": 2}}
    meta.put_subscription("billing", config)
    meta.put_subscription("gone", {"topic": "orders"})
    meta.delete_subscription("gone")
    meta.delete_subscription("never-existed")
    meta.close()

    reopened = MetadataStore(tmp_path / "meta.db")
    try:
        assert reopened.subscriptions() == {"billing": config}
    finally:
        reopened.close()


def test_delete_topic_deletes_its_subscriptions(store: MetadataStore) -> None:
    store.put_topic("a", TopicConfig())
    store.put_topic("b", TopicConfig())
    store.put_subscription("a1", {"topic": "a"})
    store.put_subscription("a2", {"topic": "a"})
    store.put_subscription("b1", {"topic": "b"})
    assert store.delete_topic("a") == ["a1", "a2"]
    assert list(store.topics()) == ["b"]
    assert list(store.subscriptions()) == ["b1"]
    assert store.delete_topic("a") == []


def test_subscription_needs_a_topic(store: MetadataStore) -> None:
    with pytest.raises(KeyError):
        store.put_subscription("s", {})


def test_usable_from_several_threads(store: MetadataStore) -> None:
    def work(i: int) -> None:
        for j in range(20):
            store.put_topic(f"t{i}-{j}", TopicConfig(partitions=i + 1))
            store.topics()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store.topics()) == 80
