"""The partition state record and its compare-and-set updates (a real etcd for the latter)."""

from __future__ import annotations

import asyncio

import pytest

from cluster.etcd import EtcdClient, Put
from cluster.membership import node_key
from cluster.state import (
    MAX_TXN_OPS,
    Change,
    InvalidState,
    PartitionState,
    VersionedState,
    check_transition,
    compare_and_set,
    compare_and_set_all,
    create_partition,
    failover_guards,
    partition_key,
    read_partition,
)

STATE = PartitionState(replicas=("n1", "n2", "n3"), leader="n1", epoch=0, isr=("n1", "n2", "n3"))
KEY = partition_key("c", "orders", 0)


def test_the_state_round_trips_through_its_json_form() -> None:
    assert PartitionState.from_json(STATE.to_json()) == STATE
    leaderless = PartitionState(("a",), None, 7, ())
    assert PartitionState.from_json(leaderless.to_json()) == leaderless
    assert KEY == "/herald/c/partitions/orders/0"


@pytest.mark.parametrize(
    ("replicas", "leader", "epoch", "isr"),
    [
        ((), None, 0, ()),  # no replica
        (("a", "a"), "a", 0, ("a",)),  # a replica twice
        (("a", "b"), "a", 0, ("a", "c")),  # an ISR member that is no replica
        (("a", "b"), "b", 0, ("a",)),  # a leader outside the ISR
        (("a",), "a", -1, ("a",)),  # a negative epoch
    ],
)
def test_a_state_that_breaks_its_rules_cannot_be_built(
    replicas: tuple[str, ...], leader: str | None, epoch: int, isr: tuple[str, ...]
) -> None:
    with pytest.raises(InvalidState):
        PartitionState(replicas, leader, epoch, isr)


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"replicas": "n1", "leader": null, "epoch": 0, "isr": []}',
        b'{"replicas": ["n1"], "leader": 3, "epoch": 0, "isr": []}',
        b'{"replicas": ["n1"], "leader": null, "epoch": true, "isr": []}',
        b'{"replicas": ["n1"], "leader": null, "epoch": "1", "isr": []}',
        b'{"replicas": [""], "leader": null, "epoch": 0, "isr": []}',
        b'{"replicas": ["n1"], "leader": "n1", "epoch": 0}',
    ],
)
def test_bytes_that_are_not_a_state_are_refused(data: bytes) -> None:
    with pytest.raises(InvalidState):
        PartitionState.from_json(data)


def test_the_epoch_goes_up_by_one_with_each_new_leader_and_only_then() -> None:
    successor = STATE.led_by("n2")
    assert (successor.leader, successor.epoch) == ("n2", 1)
    check_transition(STATE, successor)
    check_transition(STATE, STATE.with_isr(("n1", "n2")))
    with pytest.raises(InvalidState):
        check_transition(STATE, PartitionState(STATE.replicas, "n2", 0, STATE.isr))
    with pytest.raises(InvalidState):
        check_transition(STATE, PartitionState(STATE.replicas, "n2", 2, STATE.isr))
    with pytest.raises(InvalidState):
        check_transition(STATE, PartitionState(STATE.replicas, "n1", 1, STATE.isr))


async def test_a_partition_is_created_once(etcd: EtcdClient) -> None:
    created = await create_partition(etcd, KEY, STATE)
    assert created.succeeded and created.current is not None
    assert await read_partition(etcd, KEY) == created.current
    again = await create_partition(etcd, KEY, STATE.led_by("n2"))
    assert not again.succeeded and again.current == created.current
    assert await read_partition(etcd, partition_key("c", "orders", 1)) is None


async def test_compare_and_set_applies_a_change_to_the_state_it_read(etcd: EtcdClient) -> None:
    read = (await create_partition(etcd, KEY, STATE)).current
    assert read is not None
    shrunk = await compare_and_set(etcd, KEY, read, STATE.with_isr(("n1", "n2")))
    assert shrunk.succeeded and shrunk.current is not None
    assert shrunk.current.mod_revision > read.mod_revision
    assert await read_partition(etcd, KEY) == shrunk.current


async def test_of_two_writers_with_the_same_view_exactly_one_wins(etcd: EtcdClient) -> None:
    read = (await create_partition(etcd, KEY, STATE)).current
    assert read is not None
    outcomes = await asyncio.gather(
        compare_and_set(etcd, KEY, read, STATE.led_by("n2")),
        compare_and_set(etcd, KEY, read, STATE.led_by("n3")),
    )
    winners = [o for o in outcomes if o.succeeded]
    loser = next(o for o in outcomes if not o.succeeded)
    assert len(winners) == 1
    assert loser.current == winners[0].current  # the loser learns what won
    stored = await read_partition(etcd, KEY)
    assert stored is not None and stored.state.epoch == 1


async def test_a_stale_view_changes_nothing(etcd: EtcdClient) -> None:
    read = (await create_partition(etcd, KEY, STATE)).current
    assert read is not None
    assert (await compare_and_set(etcd, KEY, read, STATE.with_isr(("n1",)))).succeeded
    stale = await compare_and_set(etcd, KEY, read, STATE.led_by("n2"))
    assert not stale.succeeded and stale.current is not None
    assert stale.current.state.isr == ("n1",) and stale.current.state.leader == "n1"


async def test_a_transition_that_breaks_the_epoch_rule_is_refused_before_etcd(
    etcd: EtcdClient,
) -> None:
    read = (await create_partition(etcd, KEY, STATE)).current
    assert read is not None
    with pytest.raises(InvalidState):
        await compare_and_set(etcd, KEY, read, PartitionState(STATE.replicas, "n2", 0, STATE.isr))
    assert await read_partition(etcd, KEY) == read


async def test_failover_needs_the_old_leader_gone_and_the_successor_present(
    etcd: EtcdClient,
) -> None:
    n1 = await etcd.put(node_key("c", "n1"), "{}")  # its create revision: its incarnation
    state = PartitionState(STATE.replicas, "n1", 0, STATE.isr, {"n1": n1})
    read = (await create_partition(etcd, KEY, state)).current
    assert read is not None
    n2 = n1 + 100  # not registered yet
    guards = failover_guards("c", state, "n2", n2)

    refused = await compare_and_set(etcd, KEY, read, state.led_by("n2"), guards=guards)
    assert not refused.succeeded  # n1 still registered, n2 not
    n2 = await etcd.put(node_key("c", "n2"), "{}")
    guards = failover_guards("c", state, "n2", n2)
    refused = await compare_and_set(etcd, KEY, read, state.led_by("n2"), guards=guards)
    assert not refused.succeeded  # n1 still registered as the incarnation that leads
    await etcd.delete(node_key("c", "n1"))
    taken = await compare_and_set(etcd, KEY, read, state.led_by("n2"), guards=guards)
    assert taken.succeeded
    assert await read_partition(etcd, KEY) == taken.current
    assert isinstance(taken.current, VersionedState) and taken.current.state.epoch == 1


async def test_failover_from_a_leader_that_registered_again_needs_no_wait(
    etcd: EtcdClient,
) -> None:
    """PROTOCOL §7: a restart is a new incarnation; the old one's part is over at once."""
    n1 = await etcd.put(node_key("c", "n1"), "{}")
    n2 = await etcd.put(node_key("c", "n2"), "{}")
    state = PartitionState(STATE.replicas, "n1", 0, STATE.isr, {"n1": n1, "n2": n2})
    read = (await create_partition(etcd, KEY, state)).current
    assert read is not None
    guards = failover_guards("c", state, "n2", n2)
    assert not (await compare_and_set(etcd, KEY, read, state.led_by("n2"), guards=guards)).succeeded
    await etcd.delete(node_key("c", "n1"))
    await etcd.put(node_key("c", "n1"), "{}")  # restarted within a blink: a new key
    taken = await compare_and_set(etcd, KEY, read, state.led_by("n2"), guards=guards)
    assert taken.succeeded


def test_incarnations_round_trip_and_follow_isr_changes() -> None:
    state = PartitionState(("a", "b", "c"), "a", 3, ("a", "b"), {"a": 10, "b": 11})
    assert PartitionState.from_json(state.to_json()) == state
    grown = state.with_isr(("a", "b", "c"), {"c": 12})
    assert grown.incarnations == {"a": 10, "b": 11, "c": 12}
    shrunk = grown.with_isr(("a", "c"))
    assert shrunk.incarnations == {"a": 10, "c": 12}
    assert shrunk.incarnation_of("b") == 0  # left the ISR: unknown from now on
    with pytest.raises(InvalidState):
        PartitionState(("a",), "a", 0, ("a",), {"z": 1})
    with pytest.raises(InvalidState):
        PartitionState.from_json(
            b'{"replicas":["a"],"leader":"a","epoch":0,"isr":["a"],"incarnations":{"a":true}}'
        )


async def test_a_batch_of_changes_applies_all_in_one_transaction(etcd: EtcdClient) -> None:
    keys = [partition_key("c", "orders", n) for n in range(3)]
    reads = [(await create_partition(etcd, key, STATE)).current for key in keys]
    changes = [
        Change(key, read, STATE.led_by("n2")) for key, read in zip(keys, reads, strict=True) if read
    ]
    outcome = await compare_and_set_all(etcd, changes)
    assert outcome.succeeded
    revisions = {v.mod_revision for v in outcome.current.values() if v is not None}
    assert len(revisions) == 1  # one transaction, one revision
    for key in keys:
        assert await read_partition(etcd, key) == outcome.current[key]


async def test_a_batch_with_one_stale_view_changes_nothing(etcd: EtcdClient) -> None:
    keys = [partition_key("c", "orders", n) for n in range(2)]
    reads = [(await create_partition(etcd, key, STATE)).current for key in keys]
    assert reads[0] is not None and reads[1] is not None
    moved = await compare_and_set(etcd, keys[1], reads[1], STATE.with_isr(("n1",)))
    changes = [
        Change(key, read, STATE.led_by("n2")) for key, read in zip(keys, reads, strict=True) if read
    ]
    outcome = await compare_and_set_all(etcd, changes)
    assert not outcome.succeeded
    assert outcome.current == {keys[0]: reads[0], keys[1]: moved.current}
    assert await read_partition(etcd, keys[0]) == reads[0]


async def test_a_batch_as_large_as_etcd_accepts_goes_and_a_larger_one_is_refused_before(
    etcd: EtcdClient,
) -> None:
    keys = [partition_key("c", "big", n) for n in range(MAX_TXN_OPS)]
    created = await etcd.txn([], [Put.of(key, STATE.to_json()) for key in keys])
    read = VersionedState(STATE, created.revision)
    full = [Change(key, read, STATE.led_by("n2")) for key in keys]
    assert (await compare_and_set_all(etcd, full)).succeeded
    too_many = [*full, Change(partition_key("c", "big", MAX_TXN_OPS), read, STATE.led_by("n2"))]
    with pytest.raises(ValueError, match="changes per transaction"):
        await compare_and_set_all(etcd, too_many)


def test_the_same_node_elected_again_as_a_new_incarnation_takes_the_next_epoch() -> None:
    old = PartitionState(("a", "b"), "a", 4, ("a", "b"), {"a": 10, "b": 11})
    check_transition(old, PartitionState(("a", "b"), "a", 5, ("a",), {"a": 20}))
    with pytest.raises(InvalidState):  # the same incarnation: no change of leader
        check_transition(old, PartitionState(("a", "b"), "a", 5, ("a",), {"a": 10}))
    with pytest.raises(InvalidState):  # a new incarnation still takes exactly epoch + 1
        check_transition(old, PartitionState(("a", "b"), "a", 7, ("a",), {"a": 20}))
