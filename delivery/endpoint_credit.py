"""Adaptive concurrency of one webhook endpoint (issue 4): AIMD between 1 and
``push.max_in_flight`` concurrent requests.

A failure, or a success slower than twice the smoothed latency, halves the limit
(multiplicative decrease); each fast success adds 1/limit (so one whole request per
round of successes: additive increase). The endpoint gets more parallel requests only
while it keeps up.
"""

from __future__ import annotations

SLOW_FACTOR = 2.0  # a response this many times the smoothed latency counts as "slowing"
EWMA_WEIGHT = 0.2


class EndpointCredit:
    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self._limit = float(max_in_flight)
        self.smoothed_latency_s: float | None = None

    @property
    def limit(self) -> int:
        return max(1, int(self._limit))

    def on_success(self, latency_s: float) -> None:
        smoothed = self.smoothed_latency_s
        slow = smoothed is not None and latency_s > SLOW_FACTOR * smoothed and latency_s > 0.05
        self.smoothed_latency_s = (
            latency_s if smoothed is None else smoothed + EWMA_WEIGHT * (latency_s - smoothed)
        )
        if slow:
            self._decrease()
        else:
            self._limit = min(float(self.max_in_flight), self._limit + 1 / self._limit)

    def on_failure(self) -> None:
        self._decrease()

    def _decrease(self) -> None:
        self._limit = max(1.0, self._limit / 2)
