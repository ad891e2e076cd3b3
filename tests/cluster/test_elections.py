"""Elections (cluster/elections.py): who takes a partition whose leader is gone, by the
eligible-leader rules, and the transaction that makes it so — three registered nodes
on a real etcd, partition states written by hand."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest

from cluster.elections import Elections
from cluster.etcd import EtcdClient
from cluster.log_ends import LogEnds
from cluster.membership import Membership
from cluster.state import PartitionState, VersionedState, partition_key

CLUSTER = "el"
REF = ("t", 0)


@pytest.fixture
async def nodes(etcd: EtcdClient) -> AsyncIterator[dict[str, Membership]]:
    async with AsyncExitStack() as stack:
        members = {}
        for node_id in ("n1", "n2", "n3"):
            members[node_id] = await stack.enter_async_context(
                Membership(
                    etcd,
                    cluster=CLUSTER,
                    node_id=node_id,
                    advertise_url=f"http://127.0.0.1:9/{node_id}",
                    ttl_s=5,
                )
            )
        for membership in members.values():
            await membership.wait_until(lambda m: set(m) == {"n1", "n2", "n3"})
        yield members


def elections(
    etcd: EtcdClient,
    membership: Membership,
    states: dict[tuple[str, int], VersionedState],
    log_ends: dict[str, LogEnds] | None = None,
) -> Elections:
    return Elections(
        etcd,
        CLUSTER,
        membership.node_id,
        membership,
        log_ends=lambda: log_ends or {},
        states=lambda: states,
        changed=lambda: None,
    )


def incarnations(nodes: dict[str, Membership], *names: str) -> dict[str, int]:
    return {n: nodes[n].incarnation for n in names}


async def test_a_partition_whose_leader_is_current_is_left_alone(
    etcd: EtcdClient, nodes: dict[str, Membership]
) -> None:
    state = PartitionState(
        ("n1", "n2", "n3"), "n1", 3, ("n1", "n2", "n3"), incarnations(nodes, "n1", "n2", "n3")
    )
    for node in nodes.values():
        assert elections(etcd, node, {}).takeover(REF, VersionedState(state, 1)) is None


async def test_the_first_current_isr_member_takes_over_from_a_leader_of_an_old_incarnation(
    etcd: EtcdClient, nodes: dict[str, Membership]
) -> None:
    # n3 led under an incarnation it no longer is (it registered again since).
    recorded = incarnations(nodes, "n1", "n2") | {"n3": nodes["n3"].incarnation - 1}
    state = PartitionState(("n3", "n1", "n2"), "n3", 4, ("n3", "n1", "n2"), recorded)
    versioned = VersionedState(state, 1)

    change = elections(etcd, nodes["n1"], {}).takeover(REF, versioned)
    later = elections(etcd, nodes["n2"], {}).takeover(REF, versioned)

    assert change is not None
    assert change.new.leader == "n1" and change.new.epoch == 5
    assert change.new.isr == ("n1", "n2")  # the old incarnation leaves the ISR
    assert change.new.incarnations == incarnations(nodes, "n1", "n2")
    assert later is None  # the next member waits, so n1 does not lose a race to itself
    assert elections(etcd, nodes["n3"], {}).takeover(REF, versioned) is None


async def test_a_node_outside_the_isr_never_takes_over(
    etcd: EtcdClient, nodes: dict[str, Membership]
) -> None:
    state = PartitionState(("n1", "n2", "n3"), None, 2, ("n1",), incarnations(nodes, "n1"))
    assert elections(etcd, nodes["n2"], {}).takeover(REF, VersionedState(state, 1)) is None


async def test_with_no_current_isr_member_the_most_up_to_date_takes_it_once_all_reported(
    etcd: EtcdClient, nodes: dict[str, Membership]
) -> None:
    # Every ISR member restarted: none is the incarnation the state records.
    stale = {n: nodes[n].incarnation - 1 for n in ("n1", "n2")}
    state = PartitionState(("n1", "n2", "n3"), "n1", 6, ("n1", "n2"), stale)
    versioned = VersionedState(state, 1)
    ends = {
        "n1": LogEnds("n1", nodes["n1"].incarnation, {REF: (6, 10)}),
        "n2": LogEnds("n2", nodes["n2"].incarnation, {REF: (6, 12)}),
    }

    assert elections(etcd, nodes["n2"], {}, {"n2": ends["n2"]}).takeover(REF, versioned) is None
    change = elections(etcd, nodes["n2"], {}, ends).takeover(REF, versioned)
    assert elections(etcd, nodes["n1"], {}, ends).takeover(REF, versioned) is None

    assert change is not None
    assert (change.new.leader, change.new.epoch, change.new.isr) == ("n2", 7, ("n2",))


async def test_a_takeover_is_one_transaction_and_a_stale_one_reads_the_winner(
    etcd: EtcdClient, nodes: dict[str, Membership]
) -> None:
    recorded = incarnations(nodes, "n1", "n2") | {"n3": nodes["n3"].incarnation - 1}
    state = PartitionState(("n3", "n1", "n2"), "n3", 4, ("n3", "n1", "n2"), recorded)
    key = partition_key(CLUSTER, *REF)
    await etcd.put(key, state.to_json())
    written = await etcd.get(key)
    assert written is not None
    versioned = VersionedState(state, written.mod_revision)
    states: dict[tuple[str, int], VersionedState] = {REF: versioned}
    n1 = elections(etcd, nodes["n1"], states)
    change = n1.takeover(REF, versioned)
    assert change is not None

    await n1.take_over([change])
    stored = await etcd.get(key)
    assert stored is not None and PartitionState.from_json(stored.value) == change.new

    seen: dict[tuple[str, int], VersionedState] = {REF: versioned}
    await elections(etcd, nodes["n1"], seen).take_over([change])  # from the same old view
    assert seen[REF].state == change.new  # refused by etcd; the state it holds is read back
