"""The circuit breaker of one webhook endpoint (PROTOCOL §4), as a sans-I/O state machine.

closed → (``failures`` consecutive failures) → open for ``open_ms`` → half_open: one probe
at a time → closed on success, or open again for twice as long (up to ``max_open_ms``).
While open nothing is sent, so records wait in the log and spend no attempts. Time is
passed in (STYLE principle 10).
"""

from __future__ import annotations

import enum

from delivery.config import Breaker


class EndpointState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, config: Breaker) -> None:
        self._config = config
        self.state = EndpointState.CLOSED
        self.consecutive_failures = 0
        self.open_until = 0.0
        self._open_s = config.open_ms / 1000
        self.opened_total = 0

    def allowed(self, now: float) -> int | None:
        """How many requests may be out at once right now: None (no breaker limit) while
        closed, 1 (the probe) while half open, 0 while open."""
        if self.state is EndpointState.OPEN and now >= self.open_until:
            self.state = EndpointState.HALF_OPEN
        if self.state is EndpointState.CLOSED:
            return None
        if self.state is EndpointState.HALF_OPEN:
            return 1
        return 0

    def reopens_at(self) -> float | None:
        return self.open_until if self.state is EndpointState.OPEN else None

    def on_success(self) -> None:
        self.consecutive_failures = 0
        if self.state is not EndpointState.CLOSED:
            self.state = EndpointState.CLOSED
            self._open_s = self._config.open_ms / 1000

    def on_failure(self, now: float) -> None:
        self.consecutive_failures += 1
        if self.state is EndpointState.HALF_OPEN:
            # A failed probe: open again, twice as long, up to max_open_ms.
            self._open_s = min(self._open_s * 2, self._config.max_open_ms / 1000)
            self._open(now)
        elif (
            self.state is EndpointState.CLOSED
            and self.consecutive_failures >= self._config.failures
        ):
            self._open(now)

    def _open(self, now: float) -> None:
        self.state = EndpointState.OPEN
        self.open_until = now + self._open_s
        self.opened_total += 1
