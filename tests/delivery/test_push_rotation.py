"""PushConfig.rotated (docs/protocol.md "Rotating the secret"): pure, time passed in."""

from __future__ import annotations

import base64

from delivery.config import PreviousSecret, PushConfig
from herald.protocol.limits import MAX_PREVIOUS_SECRETS


def secret(n: int) -> str:
    return "whsec_" + base64.b64encode(f"rotation-secret-{n:016d}".encode()).decode()


NOW = 1_000_000


def test_the_current_secret_becomes_a_previous_one_until_its_expiry() -> None:
    push = PushConfig("http://127.0.0.1:9/hook", secret(1))
    rotated = push.rotated(secret(2), NOW + 500, NOW)
    assert rotated.secret == secret(2)
    assert rotated.previous_secrets == (PreviousSecret(secret(1), NOW + 500),)
    assert (rotated.url, rotated.timeout_ms, rotated.breaker) == (
        push.url,
        push.timeout_ms,
        push.breaker,
    )


def test_an_expiry_not_after_now_drops_the_replaced_secret_at_once() -> None:
    push = PushConfig("http://127.0.0.1:9/hook", secret(1))
    assert push.rotated(secret(2), NOW, NOW).previous_secrets == ()


def test_expired_previous_secrets_are_dropped_and_the_most_recently_retired_come_first() -> None:
    push = PushConfig(
        "http://127.0.0.1:9/hook",
        secret(1),
        previous_secrets=(PreviousSecret(secret(8), NOW - 1), PreviousSecret(secret(9), NOW + 9)),
    )
    rotated = push.rotated(secret(2), NOW + 100, NOW)
    assert rotated.previous_secrets == (
        PreviousSecret(secret(1), NOW + 100),
        PreviousSecret(secret(9), NOW + 9),
    )


def test_at_most_five_previous_secrets_are_kept_dropping_the_longest_retired() -> None:
    push = PushConfig("http://127.0.0.1:9/hook", secret(0))
    for n in range(1, 9):
        push = push.rotated(secret(n), NOW + 1000 + n, NOW)
    assert len(push.previous_secrets) == MAX_PREVIOUS_SECRETS
    assert [p.secret for p in push.previous_secrets] == [secret(n) for n in (7, 6, 5, 4, 3)]


def test_rotating_to_the_current_secret_changes_nothing() -> None:
    push = PushConfig("http://127.0.0.1:9/hook", secret(1)).rotated(secret(2), NOW + 5, NOW)
    assert push.rotated(secret(2), NOW + 999, NOW) is push


def test_rotating_back_to_a_previous_secret_does_not_list_it_twice() -> None:
    push = PushConfig("http://127.0.0.1:9/hook", secret(1)).rotated(secret(2), NOW + 5, NOW)
    back = push.rotated(secret(1), NOW + 7, NOW)
    assert back.secret == secret(1)
    assert back.previous_secrets == (PreviousSecret(secret(2), NOW + 7),)
