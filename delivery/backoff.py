"""Redelivery backoff (PROTOCOL §2 Subscription config, `retry_backoff`).

Pure functions: the jitter source is injected so tests are exact.
"""

from __future__ import annotations

from collections.abc import Callable

# 2**62 * min_ms dwarfs any max_ms (≤ 3,600,000); stop doubling long before that.
_MAX_EXPONENT = 62


def backoff_ms(redelivery: int, min_ms: int, max_ms: int) -> int:
    """The un-jittered delay before redelivery ``n`` (n ≥ 1): min(max, min·2^(n-1))."""
    exponent = min(max(redelivery, 1) - 1, _MAX_EXPONENT)
    return min(max_ms, min_ms << exponent)


def jittered_backoff_ms(
    redelivery: int, min_ms: int, max_ms: int, rand: Callable[[], float]
) -> float:
    """The delay jittered within [0.8·d, d]; ``rand`` returns a float in [0, 1)."""
    delay = backoff_ms(redelivery, min_ms, max_ms)
    return delay * (0.8 + 0.2 * rand())
