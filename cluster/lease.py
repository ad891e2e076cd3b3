"""An etcd lease kept alive, and the moment until which it is surely still held.

PROTOCOL §7: "a node that loses its lease stops acknowledging writes before its lease
can expire". etcd expires a lease TTL seconds after the last keepalive *it received*,
which is no earlier than the moment we *sent* it; so ``send time + TTL`` on our
lease clock (:mod:`cluster.clock`, which counts a suspend as etcd does) is a bound etcd cannot beat (up to the two clocks' rate difference,
which the caller covers with a margin). The bound is measured from the send time of
the last keepalive that was answered — never from when the answer came back.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

from cluster.clock import Clock, lease_clock
from cluster.etcd import EtcdClient, EtcdUnavailable, LeaseNotFound

log = logging.getLogger("herald.cluster")

# A revoke on the way out is a courtesy (the lease expires on its own after its TTL): a
# node stopping while etcd is gone must not wait out a whole etcd timeout for it.
REVOKE_WITHIN_S = 1.0


class LeaseKeeper:
    """``async with LeaseKeeper(etcd, ttl_s=5) as lease:`` grants a lease, renews it
    every third of its TTL from an owned task, and revokes it on exit.

    ``lease.id`` attaches keys to it; ``lease.valid_until()`` is the instant on the lease
    clock (:mod:`cluster.clock`) before which etcd cannot have expired it; ``lease.lost`` is set once that instant
    passed without a renewal, or etcd said the lease is gone. A lost lease stays lost:
    the caller grants a new one (its keys went with the old).
    """

    def __init__(
        self,
        etcd: EtcdClient,
        ttl_s: int,
        *,
        clock: Clock = lease_clock,
        retry_interval_s: float | None = None,
    ) -> None:
        self._etcd = etcd
        self._requested_ttl = ttl_s
        self._clock = clock
        self._retry_interval = retry_interval_s
        self.id = 0
        self.ttl = 0  # as etcd granted it (etcd rounds small TTLs up)
        self.last_keepalive_sent = float("-inf")  # send time of the last answered renewal
        # Send time of the first renewal not answered since the last one that was (None:
        # none failed). PROTOCOL §7 (stale reads): a node compares it with the other
        # nodes' last renewals to tell "cut off alone" from "etcd down for every node".
        self.first_failed_sent: float | None = None
        self._pending_sent: float | None = None  # send time of the renewal under way
        self.lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def unanswered_since(self) -> float | None:
        """The send time of the first renewal not answered (yet) since the last one that
        was: a failed one, or the one under way (etcd paused answers nothing, and the
        call fails only when the lease runs out). None when the last one was answered and
        none is under way."""
        if self.first_failed_sent is not None:
            return self.first_failed_sent
        return self._pending_sent

    def valid_until(self) -> float:
        """The instant on the lease clock before which etcd cannot have expired the lease."""
        if self.lost.is_set():
            return float("-inf")
        return self.last_keepalive_sent + self.ttl

    async def __aenter__(self) -> LeaseKeeper:
        sent = self._clock()
        lease = await self._etcd.lease_grant(self._requested_ttl)
        self.id, self.ttl, self.last_keepalive_sent = lease.id, lease.ttl, sent
        self._task = asyncio.create_task(self._keep_alive(), name=f"etcd-lease {self.id:x}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if not self.lost.is_set():
            self.lost.set()
            try:  # keys under it go now rather than at expiry
                await self._etcd.lease_revoke(self.id, within_s=REVOKE_WITHIN_S)
            except EtcdUnavailable as error:
                log.warning("lease %x not revoked (it expires on its own): %s", self.id, error)

    async def _keep_alive(self) -> None:
        retry_interval = self._retry_interval or max(0.1, self.ttl / 10)
        next_renewal = self.last_keepalive_sent + self.ttl / 3
        while True:
            await asyncio.sleep(max(0.0, next_renewal - self._clock()))
            remaining = self.valid_until() - self._clock()
            if remaining <= 0:
                log.warning("lease %x lapsed: no keepalive answered for %s s", self.id, self.ttl)
                if self.first_failed_sent is None:  # none was even sent (this process paused)
                    self.first_failed_sent = next_renewal
                self.lost.set()
                return
            sent = self._pending_sent = self._clock()
            try:
                ttl = await self._etcd.lease_keepalive(self.id, within_s=remaining)
            except LeaseNotFound:
                log.warning("lease %x is gone from etcd", self.id)
                self._failed(sent)
                self.lost.set()
                return
            except EtcdUnavailable as error:
                log.info("lease %x keepalive failed, retrying: %s", self.id, error)
                self._failed(sent)
                next_renewal = self._clock() + retry_interval
                continue
            except Exception:
                # Any other answer (an etcd member restarting says odd things) is retried
                # the same way: this loop must never end silently, or the node would
                # neither hold its lease nor notice it lost it, and never register again.
                log.exception("lease %x keepalive failed unexpectedly, retrying", self.id)
                self._failed(sent)
                next_renewal = self._clock() + retry_interval
                continue
            self.last_keepalive_sent, self.ttl = sent, ttl
            self.first_failed_sent = self._pending_sent = None
            next_renewal = sent + ttl / 3

    def _failed(self, sent: float) -> None:
        self._pending_sent = None
        if self.first_failed_sent is None:
            self.first_failed_sent = sent
