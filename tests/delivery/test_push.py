"""PushPolicy (delivery/push.py): webhook push decisions on a fake clock, no network."""

from __future__ import annotations

from delivery.config import Breaker, PushConfig, SubscriptionConfig
from delivery.events import Delivery
from delivery.push import (
    DEADLINE_SLACK_MS,
    Ack,
    Action,
    Answer,
    Extend,
    Grant,
    Nack,
    Post,
    PushPolicy,
)
from storage.record import Record

SECRET = "whsec_AAAA"


def policy(**push: object) -> PushPolicy:
    config = SubscriptionConfig(
        topic="t",
        ack_deadline_ms=30_000,
        push=PushConfig(url="http://127.0.0.1:1/hook", secret=SECRET, **push),  # type: ignore[arg-type]
    )
    return PushPolicy(config)


def deliveries(*offsets: int) -> list[Delivery]:
    return [Delivery(Record(0, o, 0, b"1"), 1) for o in offsets]


def posts(actions: list[Action]) -> list[str]:
    return [i for a in actions if isinstance(a, Post) for i in a.ids]


def post(*offsets: int) -> Post:
    """The request of these records, as the policy made it (Post compares by value)."""
    return Post(tuple(deliveries(*offsets)))


def grants(actions: list[Action]) -> int:
    return sum(a.n for a in actions if isinstance(a, Grant))


def extends(actions: list[Action]) -> list[Extend]:
    return [a for a in actions if isinstance(a, Extend)]


OK = Answer(200, latency_s=0.01)
FAILED = Answer(500, latency_s=0.01)


def test_credit_is_granted_up_to_the_concurrency_limit() -> None:
    p = policy(max_in_flight=4)
    assert grants(p.poll(0.0, credit=0)) == 4
    assert grants(p.poll(0.0, credit=4)) == 0  # outstanding credit counts
    p.received(deliveries(0, 1, 2), 0.0)
    actions = p.poll(0.0, credit=1)
    assert posts(actions) == ["0-0", "0-1", "0-2"]
    assert grants(actions) == 0  # 3 posting + 1 credit = the limit
    assert p.answered(post(0), OK, 0.1) == Ack(("0-0",))
    assert grants(p.poll(0.1, credit=1)) == 1


def test_a_post_longer_than_the_deadline_extends_its_record_first() -> None:
    p = policy(timeout_ms=40_000)
    p.received(deliveries(0), 0.0)
    actions = p.poll(0.0, credit=0)
    assert actions[:2] == [Extend(("0-0",), 40_000 + DEADLINE_SLACK_MS), post(0)]
    short = policy(timeout_ms=1_000)
    short.received(deliveries(0), 0.0)
    assert extends(short.poll(0.0, credit=0)) == []


def test_open_breaker_holds_records_and_grants_nothing_until_it_half_opens() -> None:
    p = policy(max_in_flight=4, breaker=Breaker(failures=2, open_ms=1_000, max_open_ms=8_000))
    p.received(deliveries(0, 1), 0.0)
    assert posts(p.poll(0.0, credit=0)) == ["0-0", "0-1"]
    assert p.answered(post(0), FAILED, 0.1) == Nack(("0-0",), None, "http 500")
    assert p.answered(post(1), FAILED, 0.1) == Nack(("0-1",), None, "http 500")
    p.received(deliveries(2, 3), 0.2)
    held = p.poll(0.2, credit=0)
    assert posts(held) == [] and grants(held) == 0
    assert p.stats(0.2, 0)["endpoint_state"] == "open"
    assert p.next_wakeup(0.2) is not None and 1.1 <= p.next_wakeup(0.2) <= 1.11  # type: ignore[operator]
    probe = p.poll(1.2, credit=0)
    assert posts(probe) == ["0-2"]  # half open: one probe at a time
    assert posts(p.poll(1.3, credit=0)) == []
    assert p.answered(post(2), OK, 1.4) == Ack(("0-2",))
    assert posts(p.poll(1.4, credit=0)) == ["0-3"]


def test_held_records_are_extended_before_their_deadline_without_spending_attempts() -> None:
    p = policy(breaker=Breaker(failures=1, open_ms=60_000, max_open_ms=60_000))
    p.received(deliveries(0), 0.0)
    p.poll(0.0, credit=0)
    p.answered(post(0), FAILED, 0.0)  # the breaker opens for 60 s
    p.received(deliveries(1), 1.0)
    assert extends(p.poll(1.0, credit=0)) == []
    assert p.next_wakeup(1.0) == 11.0  # a third of the 30 s deadline after it came
    assert extends(p.poll(10.9, credit=0)) == []
    assert extends(p.poll(11.0, credit=0)) == [Extend(("0-1",), 30_000)]
    assert p.next_wakeup(11.0) == 21.0
    assert p.stats(11.0, 0)["endpoint_waiting"] == 1


def test_retry_after_pauses_the_endpoint_capped_by_the_backoff_maximum() -> None:
    p = policy(max_in_flight=4)  # halved to 2 by the failure: 0-1 out, room for one
    p.received(deliveries(0, 1), 0.0)
    p.poll(0.0, credit=0)
    busy = Answer(429, latency_s=0.01, retry_after="3")
    assert p.answered(post(0), busy, 0.0) == Nack(("0-0",), 3_000, "http 429")
    p.received(deliveries(2), 0.5)
    assert posts(p.poll(0.5, credit=0)) == [] and grants(p.poll(0.5, credit=0)) == 0
    assert p.next_wakeup(0.5) == 3.0
    assert posts(p.poll(3.0, credit=0)) == ["0-2"]
    # A 500's Retry-After is not honoured; a huge one is capped at retry_backoff.max_ms.
    assert p.answered(post(1), Answer(500, 0.0, retry_after="3"), 3.0) == Nack(
        ("0-1",), None, "http 500"
    )
    huge = Answer(503, 0.0, retry_after="86400")
    assert p.answered(post(2), huge, 3.0) == Nack(("0-2",), 60_000, "http 503")


def test_answers_are_counted_for_stats() -> None:
    p = policy()
    p.received(deliveries(0, 1), 0.0)
    p.poll(0.0, credit=0)
    assert p.stats(0.0, 7)["endpoint_in_flight"] == 2
    p.answered(post(0), Answer(None, 10.0, transport_error="timeout"), 10.0)
    p.answered(post(1), Answer(204, 0.01), 10.0)
    stats = p.stats(10.0, 7)
    assert stats["endpoint_requests_total"] == 2 and stats["endpoint_failures_total"] == 1
    assert (stats["last_status"], stats["last_error"]) == (204, None)
    assert stats["endpoint_credit"] == 7 and stats["endpoint_in_flight"] == 0
    assert Answer(302, 0.0).error == "HTTP 302"  # PROTOCOL §4: redirects are failures


def test_a_redelivered_copy_waiting_next_to_the_first_one_is_posted_too() -> None:
    # The core may send a record again (its deadline passed) while the first copy still
    # waits here; both go out, the second with its own attempt.
    p = policy(max_in_flight=2, breaker=Breaker(failures=1, open_ms=1_000, max_open_ms=1_000))
    p.received(deliveries(0), 0.0)
    p.poll(0.0, credit=0)
    p.answered(post(0), FAILED, 0.0)  # open until 1.0
    p.received([Delivery(Record(0, 1, 0, b"1"), 1), Delivery(Record(0, 1, 0, b"1"), 2)], 0.5)
    assert posts(p.poll(1.0, credit=0)) == ["0-1"]  # half open: one probe
    p.answered(Post((Delivery(Record(0, 1, 0, b"1"), 1),)), OK, 1.1)
    assert posts(p.poll(1.1, credit=0)) == ["0-1"]
