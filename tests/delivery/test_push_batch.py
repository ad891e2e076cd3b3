"""PushPolicy batches and body forms (PROTOCOL §8 `push.batch`, `push.payload`), on a fake
clock, no network."""

from __future__ import annotations

from dataclasses import replace

from delivery.config import Breaker, PushBatch, PushConfig, PushPayload, SubscriptionConfig
from delivery.events import Delivery
from delivery.push import (
    Ack,
    Action,
    Answer,
    BodyForm,
    Extend,
    Grant,
    Nack,
    Post,
    PushPolicy,
    body_form,
)
from storage.record import Record

SECRET = "whsec_AAAA"
OK = Answer(200, latency_s=0.01)


def config(max_records: int, max_wait_ms: int = 0, **push: object) -> SubscriptionConfig:
    return SubscriptionConfig(
        topic="t",
        ack_deadline_ms=30_000,
        push=PushConfig(
            url="http://127.0.0.1:1/hook",
            secret=SECRET,
            batch=PushBatch(max_records, max_wait_ms),
            **push,  # type: ignore[arg-type]
        ),
    )


def deliveries(*offsets: int) -> list[Delivery]:
    return [Delivery(Record(0, o, 0, b"1"), 1) for o in offsets]


def batches(actions: list[Action]) -> list[Post]:
    return [a for a in actions if isinstance(a, Post)]


def sizes(actions: list[Action]) -> list[int]:
    return [len(p.deliveries) for p in batches(actions)]


def grants(actions: list[Action]) -> int:
    return sum(a.n for a in actions if isinstance(a, Grant))


def test_credit_makes_room_for_a_full_batch_per_request() -> None:
    p = PushPolicy(config(10, max_wait_ms=1_000, max_in_flight=4))
    assert grants(p.poll(0.0, credit=0)) == 40  # 4 requests of 10 records
    p.received(deliveries(*range(25)), 0.0)
    actions = p.poll(0.0, credit=15)
    assert sizes(actions) == [10, 10]  # full batches leave at once
    assert all(post.form is BodyForm.BATCH for post in batches(actions))
    assert batches(actions)[0].ids == tuple(f"0-{i}" for i in range(10))
    assert grants(actions) == 0  # 20 posting + 5 waiting + 15 credit = 40
    assert p.stats(0.0, 15)["endpoint_in_flight"] == 2
    assert p.stats(0.0, 15)["endpoint_in_flight_records"] == 20
    assert p.stats(0.0, 15)["endpoint_waiting"] == 5


def test_a_partial_batch_leaves_when_max_wait_ms_has_passed_since_its_first_record() -> None:
    p = PushPolicy(config(10, max_wait_ms=500))
    p.received(deliveries(0, 1), 1.0)
    p.received(deliveries(2), 1.2)
    assert sizes(p.poll(1.2, credit=0)) == []
    assert p.next_wakeup(1.2) == 1.5  # 500 ms after the first record, not the last
    assert sizes(p.poll(1.499, credit=0)) == []
    late = p.poll(1.5, credit=0)
    assert sizes(late) == [3]
    assert batches(late)[0].form is BodyForm.BATCH  # a batch body even for a partial one


def test_max_wait_ms_zero_sends_what_is_ready_at_once() -> None:
    p = PushPolicy(config(10))
    p.received(deliveries(0, 1, 2), 0.0)
    assert sizes(p.poll(0.0, credit=0)) == [3]


def test_max_in_flight_counts_requests_not_records() -> None:
    p = PushPolicy(config(5, max_in_flight=2))
    p.received(deliveries(*range(12)), 0.0)
    first = p.poll(0.0, credit=0)
    assert sizes(first) == [5, 5]  # two requests out: the third waits for a slot
    assert p.next_wakeup(0.0) is not None  # the held records' deadline refresh only
    assert sizes(p.poll(5.0, credit=0)) == []
    assert p.answered(batches(first)[0], OK, 5.0) == Ack(tuple(f"0-{i}" for i in range(5)))
    assert sizes(p.poll(5.0, credit=0)) == [2]


def test_a_failed_batch_nacks_every_record_once_and_counts_one_failure() -> None:
    p = PushPolicy(config(3, breaker=Breaker(failures=100)))
    p.received(deliveries(0, 1, 2), 0.0)
    (sent,) = batches(p.poll(0.0, credit=0))
    busy = Answer(503, 0.01, retry_after="2")
    assert p.answered(sent, busy, 0.0) == Nack(("0-0", "0-1", "0-2"), 2_000, "http 503")
    stats = p.stats(0.0, 0)
    assert (stats["endpoint_requests_total"], stats["endpoint_failures_total"]) == (1, 1)
    assert stats["endpoint_in_flight_records"] == 0


def test_records_waiting_for_a_batch_keep_their_deadline_without_spending_attempts() -> None:
    p = PushPolicy(replace(config(10, max_wait_ms=10_000), ack_deadline_ms=3_000))
    p.received(deliveries(0), 0.0)
    assert p.next_wakeup(0.0) == 1.0  # a third of the 3 s deadline, before the 10 s wait
    extended = [a for a in p.poll(1.0, credit=0) if isinstance(a, Extend)]
    assert extended == [Extend(("0-0",), 3_000)]
    assert sizes(p.poll(9.9, credit=0)) == []
    assert sizes(p.poll(10.0, credit=0)) == [1]


def test_a_new_batch_size_applies_to_records_already_waiting() -> None:
    p = PushPolicy(config(10, max_wait_ms=10_000))
    p.received(deliveries(0, 1, 2), 0.0)
    assert sizes(p.poll(0.0, credit=0)) == []
    p.use_config(config(1))
    actions = p.poll(0.1, credit=0)
    assert sizes(actions) == [1, 1, 1]
    assert {post.form for post in batches(actions)} == {BodyForm.ENVELOPE}


def test_body_form_follows_batch_and_payload() -> None:
    def push(max_records: int, payload: PushPayload) -> PushConfig:
        return PushConfig("http://h/", SECRET, batch=PushBatch(max_records), payload=payload)

    assert body_form(push(1, PushPayload.ENVELOPE)) is BodyForm.ENVELOPE
    assert body_form(push(1, PushPayload.RAW)) is BodyForm.RAW
    assert body_form(push(2, PushPayload.ENVELOPE)) is BodyForm.BATCH


def test_a_config_stored_before_batches_loads_with_the_defaults() -> None:
    stored = config(5, max_wait_ms=20).to_storage()
    assert SubscriptionConfig.from_storage(stored).push == config(5, max_wait_ms=20).push
    del stored["push"]["batch"], stored["push"]["payload"]
    push = SubscriptionConfig.from_storage(stored).push
    assert push is not None
    assert (push.batch, push.payload) == (PushBatch(1, 0), PushPayload.ENVELOPE)
