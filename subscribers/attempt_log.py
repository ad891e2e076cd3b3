"""The last N delivery attempts of a push subscription (issue 4), for
`GET /v1/subscriptions/{name}/attempts`. Bounded (STYLE principle 3)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

ATTEMPT_LOG_SIZE = 100


@dataclass(frozen=True, slots=True)
class Attempt:
    time_ms: int  # wall clock when the request was sent
    id: str  # the record id "{partition}-{offset}"
    attempt: int
    status: int | None  # the HTTP status; None when no response came
    latency_ms: float
    error: str | None  # "timeout", "connection refused"… or "HTTP 500"; None on success

    def as_dict(self) -> dict[str, Any]:
        return {
            "time": self.time_ms,
            "id": self.id,
            "attempt": self.attempt,
            "status": self.status,
            "latency_ms": round(self.latency_ms, 3),
            "error": self.error,
        }


class AttemptLog:
    def __init__(self, size: int = ATTEMPT_LOG_SIZE) -> None:
        self._attempts: deque[Attempt] = deque(maxlen=size)
        self.total = 0

    def add(self, attempt: Attempt) -> None:
        self._attempts.append(attempt)
        self.total += 1

    def recent(self) -> list[Attempt]:
        """Oldest first."""
        return list(self._attempts)

    @property
    def last(self) -> Attempt | None:
        return self._attempts[-1] if self._attempts else None
