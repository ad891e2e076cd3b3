"""The audit log: who changed what, and who was refused (JSON lines, no secrets).

Its own logger, ``herald.audit``; ``configure_audit(path)`` sends it to a file
of its own (one JSON object per line) instead of the server log. An entry names
the caller by token id only, never by token.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import orjson
from starlette.types import Scope

from herald.protocol.errors import HeraldError

audit_log = logging.getLogger("herald.audit")


class _JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = getattr(record, "audit", None) or {"event": record.getMessage()}
        return orjson.dumps(entry, default=str).decode()


def configure_audit(path: Path | None) -> None:
    """With a path, audit entries go to that file only (appended, one JSON line each)."""
    if path is None:
        return
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(_JsonLines())
    audit_log.handlers[:] = [handler]
    audit_log.propagate = False
    audit_log.setLevel(logging.INFO)


def record(event: str, scope: Scope | None = None, **fields: Any) -> None:
    entry: dict[str, Any] = {"ts": round(time.time(), 3), "event": event}
    if scope is not None:
        principal = scope.get("state", {}).get("principal")
        entry["token_id"] = principal.token_id if principal is not None else None
        client = scope.get("client")
        entry["client"] = client[0] if client else None
        entry["method"] = scope.get("method", "WS")
        entry["path"] = scope.get("path")
    entry.update(fields)
    audit_log.info("%s", event, extra={"audit": entry})


def auth_failure(scope: Scope, exc: HeraldError) -> None:
    record("auth_failure", scope, code=exc.code)


def request_done(scope: Scope, event: str, status: int) -> None:
    """An audited action (PROTOCOL §2 create/delete, §8 change in place, seek, redrive,
    push secret rotation: the endpoints server/route_table.py names an event for), once
    answered."""
    record(event, scope, status=status)
