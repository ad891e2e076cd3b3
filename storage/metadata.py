"""Topic and subscription definitions in ``<data_dir>/meta.db`` (SQLite).

Admin operations are rare, so the API is synchronous; callers on the event loop may
hand it to a thread, hence one connection shared across threads behind a lock.
WAL + ``synchronous=FULL``: a put that returned survives power loss.

With encryption at rest (storage/encryption.py), a subscription's config — its push
secrets and a URL that may carry a receiver's credentials — is sealed with the active
key, bound to the subscription's name; configs written in clear before a key was
configured are sealed when the store opens, and the file vacuumed so that no page keeps
the clear text.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from storage import encryption
from storage.config import TopicConfig

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name       TEXT PRIMARY KEY,
    config     TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS subscriptions (
    name   TEXT PRIMARY KEY,
    topic  TEXT NOT NULL,
    config TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS subscriptions_by_topic ON subscriptions(topic);
CREATE TABLE IF NOT EXISTS auto_created_topics (
    name TEXT PRIMARY KEY
);
"""


class MetadataStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        # isolation_level=None: autocommit; multi-statement changes use explicit BEGIN.
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            if encryption.active():
                self._seal_clear_subscriptions()
        except BaseException:
            self._db.close()
            raise

    def _seal_clear_subscriptions(self) -> None:
        rows = self._db.execute("SELECT name, config FROM subscriptions").fetchall()
        clear = [(name, config) for name, config in rows if not encryption.is_sealed(config)]
        if not clear:
            return
        self._db.execute("BEGIN")
        try:
            for name, config in clear:
                self._db.execute(
                    "UPDATE subscriptions SET config = ? WHERE name = ?",
                    (_seal(name, config.encode()), name),
                )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("VACUUM")  # the clear text's old pages go with it

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- topics ---------------------------------------------------------------------

    def topics(self) -> dict[str, TopicConfig]:
        with self._lock:
            rows = self._db.execute("SELECT name, config FROM topics ORDER BY name").fetchall()
        return {name: TopicConfig.from_dict(orjson.loads(config)) for name, config in rows}

    def topic_created_ms(self, name: str) -> int | None:
        with self._lock:
            row = self._db.execute(
                "SELECT created_ms FROM topics WHERE name = ?", (name,)
            ).fetchone()
        return None if row is None else int(row[0])

    def auto_created_topics(self) -> set[str]:
        """The topics a publish or a subscription created (PROTOCOL §1 Auto-create)."""
        with self._lock:
            rows = self._db.execute("SELECT name FROM auto_created_topics").fetchall()
        return {row[0] for row in rows}

    def put_topic(
        self,
        name: str,
        config: TopicConfig,
        created_ms: int | None = None,
        *,
        auto_created: bool = False,
    ) -> None:
        """Insert or update a topic; an update keeps the original creation time and
        whether it was auto-created (marked with its creation, in one transaction)."""
        created = int(time.time() * 1000) if created_ms is None else created_ms
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT INTO topics (name, config, created_ms) VALUES (?, ?, ?) "
                    "ON CONFLICT(name) DO UPDATE SET config = excluded.config",
                    (name, orjson.dumps(config.to_dict()).decode(), created),
                )
                if auto_created:
                    self._db.execute(
                        "INSERT OR IGNORE INTO auto_created_topics (name) VALUES (?)", (name,)
                    )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def delete_topic(self, name: str) -> list[str]:
        """Delete a topic and, in the same transaction, its subscriptions (PROTOCOL §2:
        DELETE topic deletes its subscriptions too), so a crash cannot leave
        subscriptions of a topic that no longer exists. Returns the deleted
        subscription names."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                subs = [
                    row[0]
                    for row in self._db.execute(
                        "SELECT name FROM subscriptions WHERE topic = ? ORDER BY name", (name,)
                    )
                ]
                self._db.execute("DELETE FROM subscriptions WHERE topic = ?", (name,))
                self._db.execute("DELETE FROM topics WHERE name = ?", (name,))
                self._db.execute("DELETE FROM auto_created_topics WHERE name = ?", (name,))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return subs

    # --- subscriptions -----------------------------------------------------------------

    def subscriptions(self) -> dict[str, dict[str, Any]]:
        """Each subscription's JSON-able config (it includes ``"topic"``)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT name, config FROM subscriptions ORDER BY name"
            ).fetchall()
        return {name: orjson.loads(_open(name, config)) for name, config in rows}

    def put_subscription(self, name: str, config: dict[str, Any]) -> None:
        topic = config["topic"]
        if not isinstance(topic, str):
            raise TypeError("subscription config needs a string 'topic'")
        with self._lock:
            self._db.execute(
                "INSERT INTO subscriptions (name, topic, config) VALUES (?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET topic = excluded.topic, config = excluded.config",
                (name, topic, _seal(name, orjson.dumps(config))),
            )

    def delete_subscription(self, name: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM subscriptions WHERE name = ?", (name,))


def _seal(name: str, config: bytes) -> str:
    if not encryption.active():
        return config.decode()
    return encryption.seal_value(config, b"subscription:" + name.encode())


def _open(name: str, stored: str) -> bytes:
    if not encryption.is_sealed(stored):
        return stored.encode()
    return encryption.unseal_value(
        stored, b"subscription:" + name.encode(), f"the config of subscription {name!r}"
    )


def sealed_key_ids(path: Path) -> set[int]:
    """The encryption key ids meta.db's sealed subscription configs name (read only)."""
    if not path.exists():
        return set()
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT config FROM subscriptions").fetchall()
    except sqlite3.OperationalError:  # no table yet
        return set()
    finally:
        db.close()
    return {encryption.sealed_key_id(c) for (c,) in rows if encryption.is_sealed(c)}
