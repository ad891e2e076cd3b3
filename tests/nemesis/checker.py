"""The checker over a whole nemesis history (PROTOCOL §7). Each violation names its kind
and the offending records, offsets or etcd revisions.

- ``lost-acked``: a record answered 200 at acks=all (in the topic's last incarnation)
  that a node's final read does not show at its offset, after the faults were healed
  and the ISRs were full again;
- ``unreadable-after-heal``: a node's final read of a partition refused (503) or not
  answered, after every fault was healed (then its records are checked in its files);
- ``replica-files``: tests/cluster/checker.py over every node's partition files (once the
  nodes are stopped): contiguous offsets, epochs never down, the same record at an
  offset on every replica below the high watermark, every acks=all record held;
- ``never-written``: a reader shown a record no producer ever sent;
- ``two-records-at-offset``: two different records at one offset of one topic
  incarnation, shown to any readers (HTTP reads, tails, consumers, pulls, and the
  acks=all answers themselves) on any node;
- ``deleted-topic-served``: a record of an earlier incarnation of a topic shown by a
  read or tail begun after the topic was created again;
- ``stale-read``: an HTTP read begun after a publish was answered 200 at acks=all that
  does not show the publish's records although it started at or below their offset and
  was not cut short by its limit (read-your-writes from every node, PROTOCOL §7);
- ``not-delivered``: a record acked at acks=all never delivered to a subscription's
  consumer (WebSocket, pull) by the end;
- ``epoch``: in etcd's history of a partition key, a change of leader whose epoch is
  not the previous + 1, or an epoch going down or jumping;
- ``leader-not-in-isr``: a partition key naming a leader outside its ISR;
- ``cursor-back``: a cursor key in etcd whose committed offset of a partition went down;
- ``restart-kept-leadership``: a node restarted (kill -9, SIGTERM, wiped) that led a
  partition before and leads it after at the same epoch, no election between (PROTOCOL
  §7 settled 2026-11-26: restarts are new incarnations);
- ``no-recovery``: once a fault was healed, the cluster not back within the bound the
  nemesis waits (every node live, every partition led with its full ISR): a liveness
  failure, not lost data, but a cluster that stays leaderless after every fault is gone
  fails its users all the same (found so: every ISR member registered anew after an etcd
  outage, and a node waited for good for a report its view had lost).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tests.cluster.checker import check_replicas
from tests.nemesis.etcd_log import GAP
from tests.nemesis.history import OK, History, Incarnation, Seen


@dataclass
class Violation:
    kind: str
    what: str
    examples: list[Any] = field(default_factory=list)


def incarnation_at(history: History, topic: str, invoked: float, at: float) -> int | None:
    """The incarnation of ``topic`` a read begun at ``invoked`` and answered at ``at``
    certainly saw; None when it may straddle a delete or a create."""
    for inc in history.incarnations:
        if inc.topic != topic or inc.created > invoked:
            continue
        if inc.deleting is None or at < inc.deleting:
            return inc.number
    return None


def last_incarnation(history: History, topic: str) -> int:
    return max((i.number for i in history.incarnations if i.topic == topic), default=1)


def token_incarnation(token: str) -> tuple[str, int] | None:
    parts = token.split("/")
    if len(parts) != 4 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def check_history(history: History, topics: Mapping[str, int]) -> list[Violation]:
    violations: list[Violation] = []
    written = {w.token for w in history.writes}
    acked_all = [w for w in history.writes if w.outcome == OK and w.acks == "all"]

    never = [s for s in history.seen if s.token not in written]
    if never:
        violations.append(
            Violation("never-written", f"{len(never)} records read that no one sent", _ex(never))
        )

    # offset -> the tokens shown there, per (topic, incarnation, partition)
    shown: dict[tuple[str, int, int, int], dict[str, list[str]]] = defaultdict(dict)
    stale: list[Seen] = []
    for s in history.seen:
        if s.how == "final-read":
            continue  # checked against the acknowledgements below
        inc = incarnation_at(history, s.topic, s.invoked, s.at)
        if inc is None:
            continue
        origin = token_incarnation(s.token)
        if origin is not None and origin[1] < inc and s.how in ("read", "tail"):
            stale.append(s)
        where = shown[(s.topic, inc, s.partition, s.offset)]
        where.setdefault(s.token, []).append(f"{s.how}@{s.node or 'sub'}@{s.at}")
    for w in acked_all:
        assert w.partition is not None and w.offset is not None
        where = shown[(w.topic, w.incarnation, w.partition, w.offset)]
        where.setdefault(w.token, []).append(f"ack@{w.completed}")
    doubled = [
        {"topic": t, "incarnation": i, "partition": p, "offset": o, "shown": tokens}
        for (t, i, p, o), tokens in sorted(shown.items())
        if len(tokens) > 1
    ]
    if doubled:
        violations.append(
            Violation(
                "two-records-at-offset",
                f"{len(doubled)} offsets showed two different records",
                doubled[:10],
            )
        )
    if stale:
        violations.append(
            Violation(
                "deleted-topic-served",
                f"{len(stale)} records of a deleted incarnation served after it was re-created",
                _ex(stale),
            )
        )

    final = {
        (s.node, s.topic, s.partition, s.offset): s.token
        for s in history.seen
        if s.how == "final-read"
    }
    nodes = sorted({s.node for s in history.seen if s.how == "final-read" and s.node})
    # (node, topic, partition) whose final read was refused or unanswered somewhere
    unreadable = {
        (op.node, op.detail["topic"], op.detail["partition"]): op.detail
        for op in history.ops
        if op.kind == "final-read" and op.outcome != OK
    }
    if unreadable:
        violations.append(
            Violation(
                "unreadable-after-heal",
                f"{len(unreadable)} partitions a node would not serve once every fault was "
                "healed (PROTOCOL §7: any node serves everything)",
                [
                    {"node": n, "topic": t, "partition": p, **d}
                    for (n, t, p), d in unreadable.items()
                ],
            )
        )
    lost: list[dict[str, Any]] = []
    for w in acked_all:
        if w.incarnation != last_incarnation(history, w.topic):
            continue
        assert w.partition is not None and w.offset is not None
        missing = [
            n
            for n in nodes
            if final.get((n, w.topic, w.partition, w.offset)) != w.token
            and (n, w.topic, w.partition) not in unreadable
        ]
        if missing:
            lost.append(
                {
                    "token": w.token,
                    "partition": w.partition,
                    "offset": w.offset,
                    "acked_at": w.completed,
                    "missing_on": missing,
                    "there_instead": {
                        n: final.get((n, w.topic, w.partition, w.offset)) for n in missing
                    },
                }
            )
    if lost:
        violations.append(
            Violation(
                "lost-acked",
                f"{len(lost)} of {len(acked_all)} records acked at acks=all missing from "
                "a node's final read",
                lost[:10],
            )
        )
    return violations


def check_stale_reads(history: History, limit: int = 1000) -> list[Violation]:
    acked: dict[tuple[str, int, int], list[tuple[float, int]]] = defaultdict(list)
    for w in history.writes:
        if w.outcome == OK and w.acks == "all" and w.partition is not None and w.offset is not None:
            acked[(w.topic, w.incarnation, w.partition)].append((w.completed, w.offset))
    highest: dict[tuple[str, int, int], tuple[list[float], list[int]]] = {}
    for key, marks in acked.items():
        marks.sort()
        times, running, top = [], [], -1
        for completed, offset in marks:
            top = max(top, offset)
            times.append(completed)
            running.append(top)
        highest[key] = (times, running)
    stale = []
    for op in history.ops:
        if op.kind != "read" or op.outcome != OK or op.completed is None:
            continue
        topic, partition = op.detail["topic"], op.detail["partition"]
        start, count = op.detail["offset"], op.detail["count"]
        inc = incarnation_at(history, topic, op.invoked, op.completed)
        if inc is None or count >= limit or (topic, inc, partition) not in highest:
            continue
        times, running = highest[(topic, inc, partition)]
        i = bisect.bisect_left(times, op.invoked)  # acks answered before the read began
        if i == 0:
            continue
        top = running[i - 1]
        if top >= start + count:
            stale.append(
                {
                    "node": op.node,
                    "topic": topic,
                    "partition": partition,
                    "offset": start,
                    "shown_up_to": start + count - 1,
                    "acked_up_to": top,
                    "read_at": op.invoked,
                }
            )
    if not stale:
        return []
    return [
        Violation(
            "stale-read",
            f"{len(stale)} reads missed records acked at acks=all before they began",
            stale[:10],
        )
    ]


def check_delivery(history: History, topic: str) -> list[Violation]:
    acked = {
        w.token for w in history.writes if w.outcome == OK and w.acks == "all" and w.topic == topic
    }
    out = []
    for how in ("consume", "pull"):
        delivered = {s.token for s in history.seen if s.how == how}
        missing = sorted(acked - delivered)
        if missing:
            out.append(
                Violation(
                    "not-delivered",
                    f"{len(missing)} records acked at acks=all never delivered to the {how} "
                    "subscription",
                    missing[:10],
                )
            )
    return out


def check_files(
    history: History,
    data_dirs: Mapping[str, Path],
    topics: Mapping[str, int],
    high_watermarks: Mapping[tuple[str, int], int],
    replicas: Mapping[tuple[str, int], list[str]],
) -> list[Violation]:
    """tests/cluster/checker.py over each partition's files on each of its replicas
    (the nodes stopped; a node that is not a replica may keep a directory of its own)."""
    out = []
    for topic, partitions in topics.items():
        inc = last_incarnation(history, topic)
        for p in range(partitions):
            acked = [
                (w.offset, w.token.encode())
                for w in history.writes
                if w.topic == topic
                and w.incarnation == inc
                and w.partition == p
                and w.acks == "all"
                and w.outcome == OK
                and w.offset is not None
            ]
            holders = replicas.get((topic, p), list(data_dirs))
            dirs = {
                name: d / "topics" / topic / str(p)
                for name, d in data_dirs.items()
                if name in holders and (d / "topics" / topic / str(p)).is_dir()
            }
            hw = high_watermarks.get((topic, p))
            if hw is None:
                out.append(Violation("replica-files", f"{topic}/{p}: no high watermark known"))
                continue
            try:
                check_replicas(dirs, high_watermark=hw, acknowledged=acked, partition=p)
            except AssertionError as exc:
                problems = str(exc).splitlines()[1:]
                out.append(
                    Violation(
                        "replica-files",
                        f"{topic}/{p} (HW {hw}, replicas {sorted(dirs)}): {len(problems)} problems",
                        [line.strip() for line in problems[:10]],
                    )
                )
            except Exception as exc:  # a log the checker cannot open is a finding
                where = "".join(f" ({note})" for note in getattr(exc, "__notes__", ()))
                out.append(Violation("replica-files", f"{topic}/{p}: {exc!r}{where}"))
    return out


def check_etcd(events: Iterable[dict[str, Any]]) -> list[Violation]:
    """Partition keys: epoch +1 exactly at each change of leader, leader in the ISR.
    Cursor keys: no offset goes down (per key life: a delete starts afresh). No rule is
    read across a gap in the recorded history (tests/nemesis/etcd_log.py): what it hid
    may have changed every key."""
    epoch_bad: list[dict[str, Any]] = []
    not_in_isr: list[dict[str, Any]] = []
    cursor_back: list[dict[str, Any]] = []
    previous: dict[str, Any] = {}
    for event in events:
        key = event["key"]
        if event["type"] == GAP:
            previous.clear()
            continue
        if event["type"] == "DELETE":
            previous.pop(key, None)
            continue
        value = _json(event["value"])
        if value is None:
            continue
        before = previous.get(key)
        previous[key] = value
        if "/partitions/" in key and isinstance(value, dict):
            leader, isr = value.get("leader"), value.get("isr") or []
            if leader is not None and leader not in isr:
                not_in_isr.append({"key": key, "revision": event["revision"], "state": value})
            if isinstance(before, dict):
                e0, e1 = before.get("epoch", 0), value.get("epoch", 0)
                changed = before.get("leader") != leader
                if (changed and e1 != e0 + 1) or e1 < e0 or e1 > e0 + 1:
                    epoch_bad.append(
                        {
                            "key": key,
                            "revision": event["revision"],
                            "before": before,
                            "after": value,
                        }
                    )
        elif "/cursors/" in key and before is not None:
            old, new = _cursor(before), _cursor(value)
            went_back = {p: (old[p], v) for p, v in new.items() if p in old and v < old[p]}
            if went_back:
                cursor_back.append(
                    {"key": key, "revision": event["revision"], "went_back": went_back}
                )
    out = []
    if epoch_bad:
        out.append(Violation("epoch", f"{len(epoch_bad)} partition-key changes", epoch_bad[:10]))
    if not_in_isr:
        out.append(Violation("leader-not-in-isr", f"{len(not_in_isr)} states", not_in_isr[:10]))
    if cursor_back:
        out.append(Violation("cursor-back", f"{len(cursor_back)} cursor writes", cursor_back[:10]))
    return out


def _json(raw: str) -> Any:
    """A key's value as JSON; a cursor's after its binary header (``HCUR``…)."""
    start = raw.find("{")
    if start < 0:
        return None
    try:
        return orjson.loads(raw[start:])
    except orjson.JSONDecodeError:
        return None


def _cursor(value: Any) -> dict[str, int]:
    """A cursor's committed offset per partition: ``{"p": {"0": [offset, [...]]}}``."""
    partitions = value.get("p") if isinstance(value, dict) else None
    if not isinstance(partitions, dict):
        return {}
    return {
        p: v[0]
        for p, v in partitions.items()
        if isinstance(v, list) and v and isinstance(v[0], int)
    }


def _ex(seen: list[Seen]) -> list[dict[str, Any]]:
    return [
        {
            "how": s.how,
            "node": s.node,
            "topic": s.topic,
            "partition": s.partition,
            "offset": s.offset,
            "token": s.token,
            "at": s.at,
        }
        for s in seen[:10]
    ]


__all__ = ["Incarnation", "Violation", "check_delivery", "check_etcd", "check_files"]


def check_recovery(history: History) -> list[Violation]:
    """The faults after which the cluster did not recover (the nemesis notes each as a
    ``no-recovery`` fault, and so does the run's final heal)."""
    examples: list[dict[str, Any]] = []
    for k, fault in enumerate(history.faults):
        if fault.kind != "no-recovery":
            continue
        before = next((f for f in reversed(history.faults[:k]) if f.kind != "no-recovery"), None)
        examples.append(
            {
                "from": round(fault.started, 1),
                "to": round(fault.ended, 1),
                "what": fault.note,
                "after": f"{before.kind} {before.target}" if before is not None else None,
            }
        )
    if not examples:
        return []
    return [
        Violation(
            "no-recovery",
            f"{len(examples)} time(s) not every node live with every partition led and its "
            "ISR full within the bound after the faults were healed",
            examples,
        )
    ]


def check_restarts(history: History, events: list[dict[str, Any]]) -> list[Violation]:
    """For each node restart, with the etcd revisions just before the process was
    stopped and just after it was healthy again: a partition the node led at epoch e
    before that it still leads at epoch e after. A restart whose revisions a gap in the
    recorded history precedes is not read."""
    restarting = {"kill", "kill-later", "restart", "wipe", "power-loss"}
    found: list[dict[str, Any]] = []
    partition_events = [e for e in events if "/partitions/" in e["key"]]
    gaps = [e["revision"] for e in events if e["type"] == GAP]
    for fault in history.faults:
        if fault.kind not in restarting or fault.revisions is None:
            continue
        before_rev, after_rev = fault.revisions
        if any(gap <= after_rev for gap in gaps):
            continue  # the states it would compare may be older than they look
        for key in sorted({e["key"] for e in partition_events}):
            if any(
                e["key"] == key
                and e["type"] == "DELETE"
                and before_rev < e["revision"] <= after_rev
                for e in partition_events
            ):
                continue  # the topic was deleted and created again meanwhile: another thing
            before = _state_at(partition_events, key, before_rev)
            after = _state_at(partition_events, key, after_rev)
            if _last_write(partition_events, key, after_rev) <= before_rev:
                # Not written while the node restarted: the key still says what it said
                # before (the restarted node, a new incarnation, does not lead by it; seed
                # 2005 read it so while another node's takeover was still to come). What
                # counts is the key's next state: another election, or leadership kept.
                after = _next_state(partition_events, key, after_rev)
            if (
                before is not None and after is not None
                and before.get("leader") == fault.target == after.get("leader")
                and before.get("epoch") == after.get("epoch")
                # The same leadership, not a new one: the leader holds it as the same
                # incarnation (PROTOCOL §7: a restart leads only through an election).
                and _incarnation(before, fault.target) == _incarnation(after, fault.target)
            ):  # fmt: skip
                found.append(
                    {
                        "fault": f"{fault.kind} {fault.target} at {fault.started}",
                        "key": key,
                        "epoch": after.get("epoch"),
                        "revisions": [before_rev, after_rev],
                    }
                )
    if not found:
        return []
    return [Violation("restart-kept-leadership", f"{len(found)} partitions", found[:10])]


def _incarnation(state: Any, node: str) -> Any:
    incarnations = state.get("incarnations") if isinstance(state, dict) else None
    return incarnations.get(node) if isinstance(incarnations, dict) else None


def _last_write(events: list[dict[str, Any]], key: str, revision: int) -> int:
    """The revision of the last change of ``key`` at or before ``revision`` (0: none)."""
    last = 0
    for event in events:
        if event["revision"] > revision:
            break
        if event["key"] == key:
            last = event["revision"]
    return last


def _next_state(events: list[dict[str, Any]], key: str, revision: int) -> Any:
    """``key``'s state as its first change after ``revision`` left it (None: no change
    recorded, or a delete)."""
    for event in events:
        if event["revision"] > revision and event["key"] == key:
            return None if event["type"] == "DELETE" else _json(event["value"])
    return None


def _state_at(events: list[dict[str, Any]], key: str, revision: int) -> Any:
    state = None
    for event in events:
        if event["revision"] > revision:
            break
        if event["key"] == key:
            state = None if event["type"] == "DELETE" else _json(event["value"])
    return state
