"""The clock every lease and TTL deadline of the cluster is measured on.

etcd expires a lease TTL seconds after the last keepalive it received, on its own
machine's clock, which keeps running while this node's VM is suspended (or its laptop
sleeps). ``CLOCK_MONOTONIC`` stops during a suspend on Linux: a node resumed after a
minute would still think a lease valid that etcd expired long ago, and go on acting as
leader or coordinator. ``CLOCK_BOOTTIME`` is monotonic too and counts the suspended
time, so a deadline measured on it lapses during a suspend as etcd's does.

Where there is no ``CLOCK_BOOTTIME`` (macOS, Windows) this falls back to
:func:`time.monotonic`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _pick() -> Clock:
    if hasattr(time, "CLOCK_BOOTTIME"):
        try:
            _boottime()
        except OSError:  # a kernel without it (before Linux 2.6.39)
            return time.monotonic
        return _boottime
    return time.monotonic


lease_clock: Clock = _pick()
"""Seconds on a monotonic clock that keeps counting while the machine is suspended."""


def lease_clock_ms() -> float:
    """:func:`lease_clock` in milliseconds."""
    return lease_clock() * 1000
