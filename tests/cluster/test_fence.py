"""cluster/fence.py: telling a node cut off from etcd alone from an outage of etcd for
every node (PROTOCOL §7, stale reads), with the peers' answers given in."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from cluster.fence import EARLY_SLACK_S, FRESH_S, USABLE_S, Fence, etcd_down_for_all, renewed_by


def test_a_peer_renewal_after_the_first_unanswered_one_means_cut_off_alone() -> None:
    # This node's renewal sent at 10.0 went unanswered; n2 renewed at 10.2 at the latest.
    assert not etcd_down_for_all(10.0, {"n2": 10.2, "n3": 9.0}, {"n2", "n3"})


def test_renewals_before_the_first_unanswered_one_mean_etcd_is_down_for_all() -> None:
    # n2 renewed a moment before etcd stopped, and still holds its lease: etcd is down.
    assert etcd_down_for_all(10.0, {"n2": 9.99, "n3": 9.5}, {"n2", "n3"})


def test_a_live_node_that_does_not_answer_means_cannot_tell() -> None:
    assert not etcd_down_for_all(10.0, {"n2": 9.0}, {"n2", "n3"})
    # A node not known live (dead before the outage) need not answer; if it does, it counts.
    assert etcd_down_for_all(10.0, {"n2": 9.0}, {"n2"})
    assert not etcd_down_for_all(10.0, {"n2": 9.0, "old": 10.5}, {"n2"})


def test_a_peer_renewal_is_placed_at_its_latest_possible_instant() -> None:
    assert renewed_by(answered_at=12.0, renewed_ago_s=1.5) == 10.5
    assert renewed_by(answered_at=12.0, renewed_ago_s=None) == float("-inf")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fence_with(
    clock: Clock, renewals: dict[str, float], *, lease: bool, failing: float | None
) -> tuple[Fence, list[int]]:
    asked: list[int] = []

    async def ask(urls: Mapping[str, str], timeout_s: float) -> dict[str, float]:
        asked.append(len(urls))
        return dict(renewals)

    fence = Fence(
        holds_lease=lambda: lease,
        failing_since=lambda: failing,
        peers=lambda: ({"n2": "http://n2", "n3": "http://n3"}, {"n2", "n3"}),
        ask=ask,
        clock=clock,
    )
    return fence, asked


def test_a_node_within_its_lease_serves_without_asking() -> None:
    clock = Clock()
    fence, asked = fence_with(clock, {}, lease=True, failing=99.0)
    assert asyncio.run(fence.allows())
    assert fence.serving()
    assert asked == []


def test_past_its_lease_a_node_serves_only_while_no_peer_renewed_since() -> None:
    clock = Clock()
    down, asked = fence_with(clock, {"n2": 98.0, "n3": 98.5}, lease=False, failing=99.0)
    assert not down.serving()  # no verdict yet: cannot tell
    assert asyncio.run(down.allows())
    assert down.serving()
    assert asyncio.run(down.allows())
    assert asked == [2]  # the verdict is kept a moment
    clock.now += FRESH_S + 0.01
    assert down.serving()  # still usable, while a fresher one is asked for
    asyncio.run(down.refresh())
    assert asked == [2, 2]
    clock.now += USABLE_S + 0.01
    assert not down.serving()  # too old to go by

    alone, _ = fence_with(clock, {"n2": 99.3, "n3": 98.5}, lease=False, failing=99.0)
    assert not asyncio.run(alone.allows())
    assert not alone.serving()


def test_past_its_lease_a_node_that_never_failed_a_renewal_does_not_serve() -> None:
    # Paused past its lease, it sent no renewal at all: it cannot tell, so it refuses.
    clock = Clock()
    fence, _ = fence_with(clock, {"n2": 1.0, "n3": 1.0}, lease=False, failing=None)
    assert not asyncio.run(fence.allows())


def test_shown_cut_off_alone_a_node_stops_before_its_lease_runs_out() -> None:
    clock = Clock()
    # n2 renewed just after this node's renewal went out unanswered: that is no proof
    # (this node's own may merely be slower); its lease holds, it serves.
    slow, _ = fence_with(clock, {"n2": 99.0 + EARLY_SLACK_S / 2}, lease=True, failing=99.0)
    asyncio.run(slow.refresh())
    assert slow.serving()
    fence, _ = fence_with(clock, {"n2": 99.4, "n3": 98.5}, lease=True, failing=99.0)
    assert fence.serving()  # no verdict yet: its lease holds
    asyncio.run(fence.refresh())
    assert not fence.serving()
    assert not asyncio.run(fence.allows())
    # A verdict from before this episode of unanswered renewals shows nothing about it.
    later, _ = fence_with(clock, {"n2": 99.4}, lease=True, failing=clock.now + 1)
    asyncio.run(later.refresh())
    assert later.serving()


def test_a_refusal_names_the_peer_that_renewed_since_or_did_not_answer() -> None:
    """The log line of a fenced node says why: a load-stalled peer that did not answer in
    time is no proof of a partition, and an operator must be able to tell the two apart."""
    clock = Clock()
    alone, _ = fence_with(clock, {"n2": 99.4, "n3": 98.5}, lease=False, failing=99.0)
    assert alone.refusal() == "no other node was asked yet"
    asyncio.run(alone.refresh())
    assert not alone.serving()
    assert alone.refusal() == (
        "etcd works for another node, not for this one: n2 renewed its lease 0.40 s after "
        "this node's first unanswered renewal, at the latest"
    )

    silent, _ = fence_with(clock, {"n2": 98.0}, lease=False, failing=99.0)
    asyncio.run(silent.refresh())
    assert not silent.serving()
    assert silent.refusal().startswith("n3 did not answer within")

    clock.now += USABLE_S + 0.01
    assert silent.refusal() == f"its last verdict is {USABLE_S + 0.01:.1f} s old"


def test_a_verdict_against_serving_is_asked_again_once_before_it_stands() -> None:
    """One probe misleads on a loaded host (a peer's answer stalls past the probe's
    timeout): a node of an outage for every node refused a read. A negative verdict is
    asked again at once; a node cut off alone is refused by both."""
    clock = Clock()
    answers = [{"n2": 98.0}, {"n2": 98.0, "n3": 98.5}]  # n3 stalled, then answered
    asked: list[int] = []

    async def ask(urls: Mapping[str, str], timeout_s: float) -> dict[str, float]:
        asked.append(len(urls))
        return answers.pop(0)

    fence = Fence(
        holds_lease=lambda: False,
        failing_since=lambda: 99.0,
        peers=lambda: ({"n2": "http://n2", "n3": "http://n3"}, {"n2", "n3"}),
        ask=ask,
        clock=clock,
    )
    assert asyncio.run(fence.allows())
    assert fence.serving()
    assert asked == [2, 2]

    alone, asked_alone = fence_with(clock, {"n2": 99.4, "n3": 98.5}, lease=False, failing=99.0)
    assert not asyncio.run(alone.allows())
    assert asked_alone == [2, 2]
    down, asked_down = fence_with(clock, {"n2": 98.0, "n3": 98.5}, lease=False, failing=99.0)
    assert asyncio.run(down.allows())
    assert asked_down == [2]  # a verdict for serving is not asked again
