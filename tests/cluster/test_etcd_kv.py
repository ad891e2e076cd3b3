"""cluster/etcd.py against a real etcd: keys, ranges, deletes and transactions."""

from __future__ import annotations

import pytest

from cluster.etcd import Compare, Delete, EtcdClient, EtcdError, Get, Put, RangeResult, prefix_end


async def test_put_then_get_returns_the_value_and_its_revisions(etcd: EtcdClient) -> None:
    first = await etcd.put("/t/key", "one")
    kv = await etcd.get("/t/key")
    assert kv is not None
    assert (kv.key, kv.value, kv.version) == (b"/t/key", b"one", 1)
    assert kv.create_revision == kv.mod_revision == first

    second = await etcd.put("/t/key", b"two")
    kv = await etcd.get(b"/t/key")
    assert kv is not None
    assert (kv.value, kv.version, kv.create_revision, kv.mod_revision) == (
        b"two",
        2,
        first,
        second,
    )
    assert second > first


async def test_get_of_a_missing_key_is_none(etcd: EtcdClient) -> None:
    assert await etcd.get("/t/nothing-here") is None


async def test_binary_keys_and_values_round_trip(etcd: EtcdClient) -> None:
    key, value = b"/t/\x00\xff\xfe", bytes(range(256))
    await etcd.put(key, value)
    kv = await etcd.get(key)
    assert kv is not None and (kv.key, kv.value) == (key, value)
    assert (await etcd.get(b"/t/\x00\xff")) is None  # not a prefix match


async def test_range_by_prefix_returns_every_key_under_it_in_key_order(etcd: EtcdClient) -> None:
    for key in ["/p/b", "/p/a", "/p/c", "/p", "/q/a", "/p0"]:
        await etcd.put(key, key.upper())
    result = await etcd.range("/p/", prefix=True)
    assert [kv.key for kv in result.kvs] == [b"/p/a", b"/p/b", b"/p/c"]
    assert [kv.value for kv in result.kvs] == [b"/P/A", b"/P/B", b"/P/C"]
    assert result.count == 3 and not result.more
    assert result.revision == max(
        kv.mod_revision for kv in (await etcd.range("/", prefix=True)).kvs
    )

    limited = await etcd.range("/p/", prefix=True, limit=2)
    assert len(limited.kvs) == 2 and limited.more and limited.count == 3
    assert (await etcd.range("/p/", prefix=True, count_only=True)).count == 3


async def test_range_at_an_older_revision_sees_the_old_value(etcd: EtcdClient) -> None:
    old = await etcd.put("/t/k", "old")
    await etcd.put("/t/k", "new")
    then = await etcd.range("/t/k", revision=old)
    assert [kv.value for kv in then.kvs] == [b"old"]


async def test_prefix_end_covers_exactly_the_prefix() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\x00"


async def test_delete_one_key_and_a_prefix(etcd: EtcdClient) -> None:
    for key in ["/d/1", "/d/2", "/d/3", "/e/1"]:
        await etcd.put(key, "x")
    assert await etcd.delete("/d/1") == 1
    assert await etcd.delete("/d/1") == 0
    assert await etcd.delete("/d/", prefix=True) == 2
    assert (await etcd.range("/d/", prefix=True)).kvs == ()
    assert await etcd.get("/e/1") is not None


async def test_txn_runs_success_when_the_mod_revision_still_matches(etcd: EtcdClient) -> None:
    revision = await etcd.put("/x/state", "v1")
    result = await etcd.txn(
        [Compare.mod_revision("/x/state", "=", revision)],
        [Put.of("/x/state", "v2"), Get.of("/x/state")],
        [Get.of("/x/state")],
    )
    assert result.succeeded
    put_revision, read = result.results
    assert put_revision == result.revision > revision
    assert isinstance(read, RangeResult) and read.kvs[0].value == b"v2"


async def test_txn_runs_failure_when_the_key_changed_since_it_was_read(etcd: EtcdClient) -> None:
    seen = await etcd.put("/x/state", "v1")
    await etcd.put("/x/state", "someone else")
    result = await etcd.txn(
        [Compare.mod_revision("/x/state", "=", seen)],
        [Put.of("/x/state", "mine")],
        [Get.of("/x/state")],
    )
    assert not result.succeeded
    (current,) = result.results
    assert isinstance(current, RangeResult) and current.kvs[0].value == b"someone else"
    kv = await etcd.get("/x/state")
    assert kv is not None and kv.value == b"someone else"


async def test_txn_create_only_if_absent_and_value_and_version_compares(etcd: EtcdClient) -> None:
    absent = [Compare.version("/x/node", "=", 0)]
    assert (await etcd.txn(absent, [Put.of("/x/node", "a")])).succeeded
    assert not (await etcd.txn(absent, [Put.of("/x/node", "b")])).succeeded
    kv = await etcd.get("/x/node")
    assert kv is not None and kv.value == b"a"

    assert (await etcd.txn([Compare.value("/x/node", "=", "a")], [Delete.of("/x/node")])).succeeded
    assert await etcd.get("/x/node") is None
    assert not (await etcd.txn([Compare.create_revision("/x/node", ">", 0)], [])).succeeded


async def test_txn_with_several_guards_needs_them_all(etcd: EtcdClient) -> None:
    await etcd.put("/x/a", "1")
    guards = [Compare.value("/x/a", "=", "1"), Compare.version("/x/b", ">", 0)]
    result = await etcd.txn(guards, [Put.of("/x/c", "yes")], [Put.of("/x/c", "no")])
    assert not result.succeeded
    assert result.results == (result.revision,)
    kv = await etcd.get("/x/c")
    assert kv is not None and kv.value == b"no"
    deleted = await etcd.txn([], [Delete.of("/x/", prefix=True)])
    assert deleted.succeeded and deleted.results == (2,)


async def test_a_request_etcd_refuses_is_an_etcd_error(etcd: EtcdClient) -> None:
    # Two puts of one key in one transaction: etcd answers "duplicate key given in txn".
    with pytest.raises(EtcdError) as refused:
        await etcd.txn([], [Put.of("/x/dup", "1"), Put.of("/x/dup", "2")])
    assert "duplicate key" in refused.value.message
