"""The history of a nemesis run: every operation with its invocation and completion time
(seconds since the run began) and its outcome, every record any reader was shown, and
every fault injected.

Outcomes are Jepsen's: ``ok`` (it happened), ``failed`` (it certainly did not: refused
before anything was sent) and ``unknown`` (it may have happened: a timeout, a lost
connection, a 503 after the write went out). The checker trusts only ``ok``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

OK, FAILED, UNKNOWN = "ok", "failed", "unknown"


@dataclass(slots=True)
class Op:
    kind: str  # "publish", "read", "tail", "consume", "pull", "create", "delete", ...
    process: str  # the client that made it
    invoked: float
    completed: float | None = None
    outcome: str | None = None
    node: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Write:
    """One record a producer sent: its token (the record's value) and where it landed."""

    token: str
    topic: str
    incarnation: int
    acks: str
    invoked: float
    completed: float
    outcome: str
    partition: int | None = None
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class Seen:
    """One record a reader was shown: by HTTP read, tail, consumer or pull."""

    how: str  # "read", "tail", "consume", "pull", "final-read"
    node: str | None
    topic: str
    partition: int
    offset: int
    token: str
    at: float
    invoked: float  # when the read (or the tail) that showed it was started


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    target: str
    started: float
    ended: float
    note: str = ""
    # etcd's revision before the fault and once it was over (None: etcd did not answer)
    revisions: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Incarnation:
    """A topic created (``created`` is when the create was answered) and, later, the
    delete that ended it being invoked (``deleting``; None while it lives)."""

    topic: str
    number: int
    created: float
    deleting: float | None = None


class History:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.ops: list[Op] = []
        self.writes: list[Write] = []
        self.seen: list[Seen] = []
        self.faults: list[Fault] = []
        self.incarnations: list[Incarnation] = []
        self.etcd_events: list[dict[str, Any]] = []  # partition keys as etcd recorded them

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 4)

    def invoke(self, kind: str, process: str, node: str | None = None, **detail: Any) -> Op:
        op = Op(kind, process, self.now(), node=node, detail=detail)
        self.ops.append(op)
        return op

    def complete(self, op: Op, outcome: str, **detail: Any) -> None:
        op.completed, op.outcome = self.now(), outcome
        op.detail.update(detail)

    def to_json(self) -> dict[str, Any]:
        return {
            "ops": [asdict(op) for op in self.ops],
            "writes": [asdict(w) for w in self.writes],
            "faults": [asdict(f) for f in self.faults],
            "incarnations": [asdict(i) for i in self.incarnations],
            "etcd_events": self.etcd_events,
            "seen": len(self.seen),
        }
