"""The sans-I/O parts of webhook push: breaker, adaptive concurrency, Retry-After."""

from __future__ import annotations

from delivery.breaker import CircuitBreaker, EndpointState
from delivery.config import Breaker
from delivery.endpoint_credit import EndpointCredit
from delivery.push import parse_retry_after


def test_breaker_opens_after_consecutive_failures_only() -> None:
    breaker = CircuitBreaker(Breaker(failures=3, open_ms=100, max_open_ms=400))
    breaker.on_failure(0.0)
    breaker.on_failure(0.0)
    breaker.on_success()
    breaker.on_failure(0.0)
    breaker.on_failure(0.0)
    assert breaker.allowed(0.0) is None
    breaker.on_failure(0.0)
    assert breaker.state is EndpointState.OPEN and breaker.allowed(0.05) == 0


def test_breaker_probes_one_at_a_time_and_doubles_while_probes_fail() -> None:
    breaker = CircuitBreaker(Breaker(failures=1, open_ms=100, max_open_ms=250))
    breaker.on_failure(0.0)
    assert breaker.allowed(0.099) == 0
    assert breaker.allowed(0.1) == 1 and breaker.state is EndpointState.HALF_OPEN
    breaker.on_failure(0.1)  # failed probe: open for 200 ms
    assert breaker.allowed(0.299) == 0 and breaker.allowed(0.301) == 1
    breaker.on_failure(0.3)  # 400 capped at 250 ms
    assert breaker.allowed(0.549) == 0 and breaker.allowed(0.551) == 1
    breaker.on_success()
    assert breaker.state is EndpointState.CLOSED and breaker.allowed(0.551) is None
    breaker.on_failure(1.0)  # back to open_ms after a close
    assert breaker.allowed(1.1) == 1


def test_concurrency_halves_on_failure_and_grows_back_additively() -> None:
    credit = EndpointCredit(16)
    credit.on_failure()
    credit.on_failure()
    assert credit.limit == 4
    for _ in range(5):  # + 1/limit each: one more request per round of successes
        credit.on_success(0.01)
    assert credit.limit == 5
    for _ in range(200):
        credit.on_success(0.01)
    assert credit.limit == 16


def test_concurrency_shrinks_when_the_endpoint_slows() -> None:
    credit = EndpointCredit(8)
    for _ in range(10):
        credit.on_success(0.02)
    credit.on_success(0.5)
    assert credit.limit == 4


def test_retry_after_seconds_and_dates() -> None:
    assert parse_retry_after("2", 0) == 2000
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:10 GMT", 4_000) == 6_000
    assert parse_retry_after("soon", 0) is None
    assert parse_retry_after(None, 0) is None
