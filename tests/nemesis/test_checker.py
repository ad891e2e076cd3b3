"""The nemesis checker over small hand-made histories: each violation kind is found, and
a clean history has none (tests/nemesis/checker.py)."""

from __future__ import annotations

from typing import Any

import orjson

from tests.nemesis import checker
from tests.nemesis.etcd_log import GAP, EtcdLog
from tests.nemesis.history import OK, UNKNOWN, Fault, History, Incarnation, Seen, Write

TOPICS = {"t": 1}


def history_with(*writes: Write, seen: tuple[Seen, ...] = ()) -> History:
    history = History()
    history.incarnations.append(Incarnation("t", 1, 0.0))
    history.writes += writes
    history.seen += seen
    return history


def ack(token: str, offset: int, acks: str = "all", inc: int = 1) -> Write:
    return Write(token, "t", inc, acks, 1.0, 2.0, OK, 0, offset)


def shown(how: str, offset: int, token: str, node: str | None = "n1", at: float = 3.0) -> Seen:
    return Seen(how, node, "t", 0, offset, token, at, at - 0.1)


def kinds(violations: list[checker.Violation]) -> list[str]:
    return sorted(v.kind for v in violations)


def test_a_clean_history_has_no_violation() -> None:
    history = history_with(
        ack("t/1/a/0", 0),
        ack("t/1/a/1", 1),
        seen=(
            shown("read", 0, "t/1/a/0"),
            shown("tail", 1, "t/1/a/1", node="n2"),
            shown("final-read", 0, "t/1/a/0"),
            shown("final-read", 1, "t/1/a/1"),
        ),
    )
    assert checker.check_history(history, TOPICS) == []


def test_an_acked_record_missing_from_a_final_read_is_lost() -> None:
    history = history_with(
        ack("t/1/a/0", 0),
        ack("t/1/a/1", 1),
        seen=(
            shown("final-read", 0, "t/1/a/0"),
            shown("final-read", 0, "t/1/a/0", node="n2"),
            shown("final-read", 1, "t/1/a/1"),  # n2 lost offset 1
        ),
    )
    [violation] = checker.check_history(history, TOPICS)
    assert violation.kind == "lost-acked"
    assert violation.examples[0]["missing_on"] == ["n2"]


def test_an_acks_1_record_may_be_lost_and_an_unknown_one_may_appear() -> None:
    history = history_with(
        ack("t/1/b/0", 0, acks="1"),
        Write("t/1/a/0", "t", 1, "all", 1.0, 2.0, UNKNOWN),
        seen=(shown("read", 0, "t/1/a/0"), shown("final-read", 0, "t/1/a/0")),
    )
    assert checker.check_history(history, TOPICS) == []


def test_two_records_at_one_offset_and_a_record_never_written() -> None:
    history = history_with(
        ack("t/1/a/0", 0),
        seen=(
            shown("read", 0, "t/1/a/0"),
            shown("tail", 0, "t/1/zz/9", node="n3"),
            shown("final-read", 0, "t/1/a/0"),
        ),
    )
    assert kinds(checker.check_history(history, TOPICS)) == [
        "never-written",
        "two-records-at-offset",
    ]


def test_an_acknowledgement_counts_as_a_reader_of_its_offset() -> None:
    history = history_with(
        ack("t/1/a/0", 0),
        ack("t/1/a/1", 1),
        seen=(shown("read", 0, "t/1/a/1"),),  # offset 0 shown holding the other record
    )
    assert "two-records-at-offset" in kinds(checker.check_history(history, TOPICS))


def test_a_record_of_a_deleted_incarnation_read_after_the_re_create() -> None:
    history = History()
    history.incarnations += [Incarnation("t", 1, 0.0, 10.0), Incarnation("t", 2, 12.0)]
    history.writes += [ack("t/1/a/0", 0), ack("t/2/a/5", 0, inc=2)]
    history.seen += [
        Seen("tail", "n3", "t", 0, 0, "t/1/a/0", 20.0, 15.0),
        Seen("final-read", "n1", "t", 0, 0, "t/2/a/5", 30.0, 29.0),
    ]
    violations = checker.check_history(history, TOPICS)
    assert "deleted-topic-served" in kinds(violations)
    # the record at offset 0 of incarnation 2 differs from what the ack said, too
    assert "two-records-at-offset" in kinds(violations)


def test_records_not_delivered_to_a_subscription() -> None:
    history = history_with(ack("t/1/a/0", 0), seen=(shown("consume", 0, "t/1/a/0", None),))
    [violation] = checker.check_delivery(history, "t")
    assert violation.kind == "not-delivered"
    assert "pull" in violation.what


def put(revision: int, key: str, value: dict[str, Any], header: bytes = b"") -> dict[str, Any]:
    raw = (header + orjson.dumps(value)).decode(errors="replace")
    return {"key": key, "type": "PUT", "revision": revision, "value": raw}


P = "/herald/herald/partitions/t/0"


def state(leader: str | None, epoch: int, isr: list[str]) -> dict[str, Any]:
    return {"replicas": ["n1", "n2", "n3"], "leader": leader, "epoch": epoch, "isr": isr}


def test_etcd_history_epochs_and_isr() -> None:
    good = [
        put(5, P, state("n1", 0, ["n1", "n2", "n3"])),
        put(9, P, state("n1", 0, ["n1", "n2"])),
        put(12, P, state("n2", 1, ["n2"])),
        put(14, P, state("n2", 2, ["n2"])),  # a restart of n2 is a new incarnation: +1
    ]
    assert checker.check_etcd(good) == []
    bad = [
        put(5, P, state("n1", 0, ["n1", "n2", "n3"])),
        put(9, P, state("n2", 0, ["n2", "n3"])),  # new leader, same epoch
        put(12, P, state("n3", 3, ["n2"])),  # jumps by 3, leader outside the ISR
    ]
    assert kinds(checker.check_etcd(bad)) == ["epoch", "leader-not-in-isr"]


def test_no_etcd_rule_is_read_across_a_gap_in_the_recorded_history() -> None:
    gap = {"key": "", "type": GAP, "revision": 40, "value": ""}
    across = [
        put(5, P, state("n1", 0, ["n1", "n2", "n3"])),
        gap,  # elections the recorder missed: epoch 0 → 3 is no finding
        put(41, P, state("n3", 3, ["n3"])),
        put(44, P, state("n1", 3, ["n1", "n3"])),  # after the gap, read again: a finding
    ]
    assert kinds(checker.check_etcd(across)) == ["epoch"]


def test_a_cursor_going_back_in_etcd() -> None:
    key = "/herald/herald/cursors/s"
    events = [
        put(5, key, {"p": {"0": [10, []]}, "a": []}, b"HCUR\x01\x00"),
        put(6, key, {"p": {"0": [12, [14]]}, "a": []}, b"HCUR\x01\x00"),
        put(7, key, {"p": {"0": [11, []]}, "a": []}, b"HCUR\x01\x00"),
    ]
    [violation] = checker.check_etcd(events)
    assert violation.kind == "cursor-back"
    assert violation.examples[0]["went_back"] == {"0": (12, 11)}


def test_a_restarted_leader_keeping_its_epoch() -> None:
    history = History()
    history.faults.append(Fault("wipe", "n1", 10.0, 15.0, "", (8, 20)))
    events = [
        put(5, P, state("n1", 0, ["n1", "n2", "n3"])),
        put(18, P, state("n1", 0, ["n1", "n2"])),
    ]
    [violation] = checker.check_restarts(history, events)
    assert violation.kind == "restart-kept-leadership"
    elected = [*events, put(19, P, state("n2", 1, ["n2"])), put(20, P, state("n1", 2, ["n1"]))]
    assert checker.check_restarts(history, elected) == []
    deleted = {"key": P, "type": "DELETE", "revision": 12, "value": ""}
    re_created = [events[0], deleted, events[1]]  # a new topic led by n1 at epoch 0
    assert checker.check_restarts(history, re_created) == []


def test_a_restart_past_the_end_of_the_recorded_history_is_not_read() -> None:
    """The recorder did not catch up (seed 927: it recorded nothing past revision 2,582 of
    a run that went on to ~4,000): a restart after that is not judged by the last state
    recorded before it, which would read as a leadership kept."""
    history = History()
    history.faults.append(Fault("kill", "n1", 10.0, 15.0, "", (30, 40)))
    recorded = [
        put(5, P, state("n1", 0, ["n1", "n2", "n3"])),
        put(18, P, state("n1", 0, ["n1", "n2"])),
        put(35, P, state("n1", 0, ["n1"])),  # written during the restart
    ]
    [violation] = checker.check_restarts(history, recorded)  # as the run read it
    assert violation.kind == "restart-kept-leadership"
    recorded = recorded[:2]  # what the recorder caught: nothing past revision 18
    log = EtcdLog([], "/herald/herald/")
    log.events, log.next_revision = list(recorded), 19
    log.end_unrecorded()
    assert checker.check_restarts(history, log.events) == []
    assert checker.check_etcd(log.events) == []


def test_a_topic_created_again_or_a_new_incarnation_is_not_a_kept_leadership() -> None:
    history = History()
    history.faults.append(Fault("kill-later", "n1", 10.0, 15.0, "", (8, 20)))
    recreated = [
        put(5, P, state("n1", 0, ["n1", "n2", "n3"])),
        {"key": P, "type": "DELETE", "revision": 12, "value": ""},
        put(14, P, state("n1", 0, ["n1", "n2", "n3"])),  # the topic created again
    ]
    assert checker.check_restarts(history, recreated) == []
    before = {**state("n1", 0, ["n1", "n2"]), "incarnations": {"n1": 4, "n2": 3}}
    after = {**state("n1", 0, ["n1", "n2"]), "incarnations": {"n1": 16, "n2": 3}}
    assert checker.check_restarts(history, [put(5, P, before), put(17, P, after)]) == []
    kept = [put(5, P, before), put(17, P, {**before, "isr": ["n1"]})]
    [violation] = checker.check_restarts(history, kept)
    assert violation.kind == "restart-kept-leadership"


def test_a_key_not_written_during_the_restart_is_judged_by_its_next_change() -> None:
    """Seed 2005: n2 was killed and healthy again before its old lease ended, so etcd
    still named its old incarnation as leader; n1 took over (epoch + 1) a few revisions
    later. Only a next change that keeps leader, epoch and incarnation is a kept
    leadership."""
    history = History()
    history.faults.append(Fault("kill", "n2", 10.0, 15.0, "", (30, 40)))
    before = {**state("n2", 10, ["n2", "n3", "n1"]), "incarnations": {"n2": 4, "n1": 3}}
    stale = [put(20, P, before)]
    taken_over = [*stale, put(44, P, {**state("n1", 11, ["n1"]), "incarnations": {"n1": 3}})]
    assert checker.check_restarts(history, taken_over) == []
    kept = [*stale, put(44, P, {**before, "isr": ["n2"]})]
    [violation] = checker.check_restarts(history, kept)
    assert violation.kind == "restart-kept-leadership"


def test_a_read_that_misses_a_record_acked_before_it_began() -> None:
    history = history_with(ack("t/1/a/0", 0), ack("t/1/a/1", 1))  # acked at 2.0
    fresh = history.invoke("read", "reader", "n1", topic="t", partition=0, offset=0)
    fresh.invoked = 2.5
    history.complete(fresh, OK, count=2)
    assert checker.check_stale_reads(history) == []
    stale = history.invoke("read", "reader", "n3", topic="t", partition=0, offset=1)
    stale.invoked = 2.5
    history.complete(stale, OK, count=0)
    early = history.invoke("read", "reader", "n2", topic="t", partition=0, offset=0)
    early.invoked = 1.5  # begun before the answer: may miss it
    history.complete(early, OK, count=0)
    [violation] = checker.check_stale_reads(history)
    assert violation.kind == "stale-read"
    assert [e["node"] for e in violation.examples] == ["n3"]


def test_a_node_refusing_its_final_read_is_unreadable_not_lossy() -> None:
    history = history_with(
        ack("t/1/a/0", 0),
        seen=(shown("final-read", 0, "t/1/a/0"), shown("final-read", 0, "t/1/a/0", node="n3")),
    )
    refused = history.invoke("final-read", "reader", "n2", topic="t", partition=0, offset=0)
    history.complete(refused, "failed", status=503)
    [violation] = checker.check_history(history, TOPICS)
    assert violation.kind == "unreadable-after-heal"
    assert violation.examples[0]["node"] == "n2"


def test_a_cluster_that_did_not_recover_after_a_heal_is_a_violation() -> None:
    history = history_with(ack("t/1/a/0", 0), seen=(shown("final-read", 0, "t/1/a/0"),))
    history.faults.append(Fault("etcd-pause", "etcd-0", 10.0, 25.0))
    assert checker.check_recovery(history) == []
    history.faults.append(Fault("no-recovery", "cluster", 25.0, 85.0, "not all live"))

    (violation,) = checker.check_recovery(history)

    assert violation.kind == "no-recovery"
    assert violation.examples == [
        {"from": 25.0, "to": 85.0, "what": "not all live", "after": "etcd-pause etcd-0"}
    ]
