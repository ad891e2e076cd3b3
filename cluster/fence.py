"""Whether this node may still answer from its own copy of the partitions it leads
(PROTOCOL §7, "Stale reads" and "etcd unreachable").

While this node's lease surely holds (``Membership.holds_lease()``: the send time of the
last renewal etcd answered, plus the TTL, less a margin), nobody can take its partitions
or its subscriptions: it serves. Past that instant two cases look the same from here:

- this node is cut off from etcd *alone*: its lease may have lapsed, another node may
  lead its partitions and coordinate its subscriptions, with newer records — it must
  answer no read, tail or delivery from its own copy;
- etcd is down *for every node*: nobody can take anything over, and committed records
  must stay readable and deliverable.

Telling them apart: this node knows ``failing_since``, the send time of its first renewal
etcd left unanswered. It asks every other node how long ago it sent its last renewal that
etcd *did* answer. A node that renewed after ``failing_since`` shows that etcd works —
for it, not for this node: this node is cut off alone, and refuses. If no node renewed
since, etcd is down for all, and this node serves. A node this one counts as live and
that does not answer could be the one etcd works for: this node refuses (it cannot tell;
fail safe). Asking the nodes whether they *hold* a lease instead (the first attempt) fails
in the first seconds of an outage for all: a node that renewed just before etcd died
still holds its lease, though etcd works for nobody.

A peer's answer ("N ms ago") is placed on this node's clock at its latest possible
instant — the probe's answer time less N — so a renewal is never placed too early; two
machines' clocks (cluster/clock.py) differ in rate by far less than the margins involved.

The verdict is kept ``FRESH_S`` (reads do not ask the peers per request), and every probe
is bounded by ``PROBE_TIMEOUT_S``. While the node's renewals go unanswered, the node
keeps it fresh from a timer (:meth:`Fence.refresh`), so that the instant the lease may
lapse, :meth:`Fence.serving` answers at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass

from cluster.clock import Clock, lease_clock

log = logging.getLogger("herald.cluster")

FRESH_S = 0.25  # how long a verdict is reused before the peers are asked again
USABLE_S = 1.0  # how old a verdict :meth:`Fence.serving` still goes by (kept fresher)
# Before its lease runs out, a node stops only for a renewal of another node this much
# later than its own first unanswered one: not for a renewal of its own merely slower
# than theirs (a loaded event loop), while a node cut off alone still sees one of the
# others' renewals (every third of a TTL) past this well before its lease ends.
EARLY_SLACK_S = 0.3
PROBE_TIMEOUT_S = 0.8  # a peer that does not answer within this is "no answer"

# node id -> URL of the nodes to ask; returns node id -> the latest instant on this
# node's clock at which that node can have sent its last answered renewal (-inf: it never
# renewed). A node that did not answer is absent.
AskRenewals = Callable[[Mapping[str, str], float], Awaitable[dict[str, float]]]


def renewed_by(answered_at: float, renewed_ago_s: float | None) -> float:
    """Where a peer's "renewed ``renewed_ago_s`` ago", answered by ``answered_at`` on this
    node's clock, falls at the latest."""
    return float("-inf") if renewed_ago_s is None else answered_at - renewed_ago_s


def etcd_down_for_all(
    failing_since: float, renewals: Mapping[str, float], must_answer: Collection[str]
) -> bool:
    """True when no node renewed after ``failing_since`` and every node of
    ``must_answer`` said so."""
    if any(node not in renewals for node in must_answer):
        return False
    return all(at <= failing_since for at in renewals.values())


@dataclass(frozen=True, slots=True)
class _Probe:
    started: float
    renewals: dict[str, float]
    must_answer: frozenset[str]


class Fence:
    """``await fence.allows()``: may this node serve from its own copy now?
    ``fence.serving()`` is the same answer without waiting (False when no fresh verdict)."""

    def __init__(
        self,
        *,
        holds_lease: Callable[[], bool],
        failing_since: Callable[[], float | None],
        peers: Callable[[], tuple[Mapping[str, str], Collection[str]]],
        ask: AskRenewals,
        clock: Clock = lease_clock,
    ) -> None:
        self._holds_lease = holds_lease
        self._failing_since = failing_since
        self._peers = peers  # (node -> URL of every other node known, the live ones)
        self._ask = ask
        self._clock = clock
        self._last: _Probe | None = None
        self._probing: asyncio.Task[_Probe] | None = None

    def serving(self) -> bool:
        failing = self._failing_since()
        if self._cut_off(failing):
            return False
        if self._holds_lease():
            return True
        last = self._last
        if failing is None or last is None or self._clock() - last.started > USABLE_S:
            return False
        return etcd_down_for_all(failing, last.renewals, last.must_answer)

    async def allows(self) -> bool:
        failing = self._failing_since()
        if self._holds_lease() and not self._cut_off(failing):
            return True
        if failing is None:
            return False  # not registered, or lost without a failed renewal: cannot tell
        return await self.down_for_all(failing)

    async def down_for_all(self, failed_at: float) -> bool:
        """Whether etcd, which failed this node at ``failed_at``, is down for every node."""
        last = self._last
        if last is None or self._clock() - last.started > FRESH_S:
            last = await self._probe()
        return etcd_down_for_all(failed_at, last.renewals, last.must_answer)

    def _cut_off(self, failing: float | None) -> bool:
        """Shown cut off alone by a fresh verdict: another node renewed after this one's
        first unanswered renewal. Then this node stops at once, its lease still running:
        what it stops (a subscription's runtime) is stopped before another node can start
        it, with the rest of the lease to spare (one coordinator at a time)."""
        last = self._last
        return (
            failing is not None
            and last is not None
            and last.started >= failing
            and self._clock() - last.started <= USABLE_S
            and any(at > failing + EARLY_SLACK_S for at in last.renewals.values())
        )

    def refusal(self) -> str:
        """Why this node may not serve now, for the operator's log: which peer renewed
        after this node's first unanswered renewal, which did not answer, or why there is
        no verdict to go by."""
        failing = self._failing_since()
        if failing is None:
            return "its lease is gone and none of its renewals failed: it cannot tell"
        last = self._last
        if last is None:
            return "no other node was asked yet"
        age = self._clock() - last.started
        if age > USABLE_S:
            return f"its last verdict is {age:.1f} s old"
        later = {node: at - failing for node, at in last.renewals.items() if at > failing}
        if later:
            return "etcd works for another node, not for this one: " + ", ".join(
                f"{node} renewed its lease {delay:.2f} s after this node's first unanswered "
                "renewal, at the latest"
                for node, delay in sorted(later.items())
            )
        silent = sorted(last.must_answer - last.renewals.keys())
        if silent:
            return (
                f"{', '.join(silent)} did not answer within {PROBE_TIMEOUT_S:g} s: etcd may "
                "work for it, so this node cannot tell"
            )
        return "etcd is down for every node"

    async def refresh(self) -> None:
        """Ask the peers again if the last verdict is older than ``FRESH_S``."""
        last = self._last
        if last is None or self._clock() - last.started > FRESH_S:
            await self._probe()

    async def _probe(self) -> _Probe:
        if self._probing is None or self._probing.done():
            self._probing = asyncio.create_task(self._ask_peers(), name="herald-fence-probe")
        # Shielded: a read cancelled while waiting does not cancel the others' probe.
        return await asyncio.shield(self._probing)

    async def _ask_peers(self) -> _Probe:
        probe = await self._ask_once()
        failing = self._failing_since()
        if failing is not None and not etcd_down_for_all(
            failing, probe.renewals, probe.must_answer
        ):
            # A refusal costs every read and delivery here, and one probe misleads on a
            # loaded host: a peer's answer stalled past PROBE_TIMEOUT_S, or a renewal
            # placed late by the time its answer waited on this node's loop (the cluster
            # loop of 2026-11-27: a node refused a read 7.6 s into an outage of etcd for
            # every node). Asked again at once: a node cut off alone is refused by the
            # second probe as by the first, and a verdict that etcd is down for every
            # node is sound by itself.
            probe = await self._ask_once()
        self._last = probe
        return probe

    async def _ask_once(self) -> _Probe:
        started = self._clock()
        urls, live = self._peers()
        try:
            renewals = await asyncio.wait_for(self._ask(urls, PROBE_TIMEOUT_S), PROBE_TIMEOUT_S + 1)
        except TimeoutError:
            renewals = {}
        return _Probe(started, renewals, frozenset(live))

    async def close(self) -> None:
        if self._probing is not None:
            self._probing.cancel()
            await asyncio.gather(self._probing, return_exceptions=True)
