"""The publish rate limit's token buckets (server/limits.py, PROTOCOL §6) on an injected
clock (STYLE 10): what a bucket admits, refuses and refills is a matter of elapsed time,
so these tests move time instead of sleeping through it. The wire (429 ``rate_limited``
with ``Retry-After``, one bucket per token) is tests/security/test_limits.py's."""

from __future__ import annotations

import pytest

from herald.protocol.errors import RateLimited
from server.auth import Principal
from server.limits import PublishLimiter
from tests.helpers import FakeClock


def token(token_id: str, *, messages: float | None = None, size: float | None = None) -> Principal:
    return Principal(
        token_id=token_id,
        name=token_id,
        roles=frozenset({"publish"}),
        topics=("*",),
        messages_per_second=messages,
        bytes_per_second=size,
    )


def retry_after(limiter: PublishLimiter, principal: Principal, messages: int, size: int) -> int:
    """The Retry-After of a refused publish."""
    with pytest.raises(RateLimited) as refused:
        limiter.charge(principal, messages, size)
    seconds: int = refused.value.extra["retry_after"]
    return seconds


def test_a_full_bucket_admits_one_seconds_worth_then_refuses_until_it_refills() -> None:
    clock = FakeClock()
    limiter, by_count = PublishLimiter(clock), token("by-count", messages=2)
    limiter.charge(by_count, 2, 10)
    assert retry_after(limiter, by_count, 1, 10) == 1  # half a second away, said in whole s
    clock.advance(0.25)
    assert retry_after(limiter, by_count, 1, 10) == 1
    clock.advance(0.25)  # 2 messages a second: one message's worth is back
    limiter.charge(by_count, 1, 10)
    assert retry_after(limiter, by_count, 1, 10) == 1


def test_waiting_the_retry_after_it_said_is_enough() -> None:
    clock = FakeClock()
    limiter, by_count = PublishLimiter(clock), token("by-count", messages=2)
    limiter.charge(by_count, 2, 10)
    wait = retry_after(limiter, by_count, 2, 10)
    clock.advance(wait)
    limiter.charge(by_count, 2, 10)


def test_a_batch_larger_than_a_seconds_worth_is_admitted_and_its_debt_paid_first() -> None:
    clock = FakeClock()
    limiter, by_count = PublishLimiter(clock), token("by-count", messages=2)
    limiter.charge(by_count, 20, 10)  # the bucket was full: admitted, 18 messages in debt
    assert retry_after(limiter, by_count, 1, 10) == 10  # (18 + 1) / 2 = 9.5 s
    clock.advance(9.25)
    assert retry_after(limiter, by_count, 1, 10) == 1
    clock.advance(0.25)
    limiter.charge(by_count, 1, 10)


def test_bytes_per_second_is_a_bucket_of_its_own() -> None:
    clock = FakeClock()
    limiter, by_bytes = PublishLimiter(clock), token("by-bytes", size=1000)
    limiter.charge(by_bytes, 100, 750)  # no message limit: 100 messages cost nothing
    assert retry_after(limiter, by_bytes, 1, 750) == 1  # 250 left, 500 more in 0.5 s
    clock.advance(0.5)
    limiter.charge(by_bytes, 1, 750)


def test_a_publish_must_fit_both_buckets_and_a_refused_one_spends_neither() -> None:
    clock = FakeClock()
    limiter, both = PublishLimiter(clock), token("both", messages=2, size=1000)
    limiter.charge(both, 1, 1000)  # the bytes bucket is empty, the messages one is not
    assert retry_after(limiter, both, 1, 250) == 1
    clock.advance(0.25)
    # 1.5 messages and 250 bytes now: had the refusal spent its message (or its
    # bytes, in debt), this one would be refused.
    limiter.charge(both, 1, 250)
    assert retry_after(limiter, both, 1, 0) == 1  # half a message left: the count binds


def test_each_token_has_its_own_buckets_and_unlimited_tokens_none() -> None:
    clock = FakeClock()
    limiter = PublishLimiter(clock)
    first, second = token("first", messages=1), token("second", messages=1)
    limiter.charge(first, 1, 10)
    retry_after(limiter, first, 1, 10)
    limiter.charge(second, 1, 10)
    unlimited = token("admin")
    for _ in range(100):
        limiter.charge(unlimited, 1000, 1_000_000)


def test_new_rates_for_a_token_start_a_fresh_bucket() -> None:
    clock = FakeClock()
    limiter = PublishLimiter(clock)
    limiter.charge(token("reloaded", messages=1), 1, 10)
    retry_after(limiter, token("reloaded", messages=1), 1, 10)
    limiter.charge(token("reloaded", messages=5), 5, 10)  # an auth file reload raised it
