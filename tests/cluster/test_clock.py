"""The lease clock (cluster/clock.py): the clock every lease and TTL deadline is read on.

What it is for — counting the time a suspended VM did not run, as etcd's clock does —
cannot be shown here: a test cannot suspend the machine it runs on. These tests show it
is the boot-time clock where the platform has one, and a monotonic clock in any case.
"""

from __future__ import annotations

import sys
import time

import pytest

from cluster import clock
from cluster.clock import lease_clock, lease_clock_ms


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CLOCK_BOOTTIME is Linux's")
def test_on_linux_the_lease_clock_is_boot_time() -> None:
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    now = lease_clock()
    after = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert before <= now <= after


def test_the_lease_clock_never_goes_back() -> None:
    readings = [lease_clock() for _ in range(10_000)]
    assert readings == sorted(readings)


def test_the_lease_clock_counts_seconds_and_milliseconds_alike() -> None:
    seconds = lease_clock()
    millis = lease_clock_ms()
    later = lease_clock()
    assert seconds * 1000 <= millis <= later * 1000


def test_without_boot_time_it_falls_back_to_monotonic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(time, "CLOCK_BOOTTIME", raising=False)
    assert clock._pick() is time.monotonic


def test_lease_keeper_membership_and_compactor_read_the_lease_clock() -> None:
    from cluster.compaction import Compactor
    from cluster.lease import LeaseKeeper
    from cluster.membership import Membership

    for owner in (LeaseKeeper, Membership, Compactor):
        default = owner.__init__.__kwdefaults__["clock"]  # type: ignore[misc]
        assert default is lease_clock, owner
