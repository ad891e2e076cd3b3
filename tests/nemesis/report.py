"""The report of a nemesis run: faults injected by kind, operations by kind and outcome,
records acknowledged, violations with their offending records, and the seed to replay.
Printed at the end and written as JSON (report.json, with history.json beside it)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from tests.nemesis.checker import Violation
from tests.nemesis.history import OK, History


def build(
    history: History, violations: list[Violation], *, seed: int, minutes: float, nodes: int,
    notes: list[str], churn: bool = True,
) -> dict[str, Any]:  # fmt: skip
    ops = Counter(f"{op.kind}:{op.outcome}" for op in history.ops)
    writes = Counter(f"acks={w.acks}:{w.outcome}" for w in history.writes)
    return {
        "seed": seed,
        "minutes": minutes,
        "nodes": nodes,
        "replay": f"python -m tests.nemesis --seed {seed} --minutes {minutes} --nodes {nodes}"
        + ("" if churn else " --no-churn"),
        "replay_note": "the seed replays the faults' kinds, order, durations and choices "
        "(a random node, or a partition's leader); the nodes' timing, and so which node "
        "a choice lands on and the exact history, differ from run to run",
        "ran_s": history.now(),
        "faults": dict(Counter(f.kind for f in history.faults)),
        "fault_sequence": [
            f"{f.started:8.1f}-{f.ended:8.1f} {f.kind} {f.target} {f.note}".rstrip()
            for f in history.faults
        ],
        "operations": dict(sorted(ops.items())),
        "records": dict(sorted(writes.items())),
        "acknowledged_all": sum(1 for w in history.writes if w.outcome == OK and w.acks == "all"),
        "records_seen": Counter(s.how for s in history.seen),
        "incarnations": [asdict(i) for i in history.incarnations],
        "violations": [asdict(v) for v in violations],
        "notes": notes,
    }


def write(out: Path, report: dict[str, Any], history: History) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    (out / "history.json").write_bytes(orjson.dumps(history.to_json()))


def render(report: dict[str, Any]) -> str:
    lines = [
        f"nemesis: seed {report['seed']}, {report['minutes']} min, {report['nodes']} nodes, "
        f"ran {report['ran_s']:.0f} s",
        "faults: " + ", ".join(f"{k} {v}" for k, v in sorted(report["faults"].items())),
        "fault sequence:",
        *(f"  {line}" for line in report["fault_sequence"]),
        "operations: " + ", ".join(f"{k} {v}" for k, v in report["operations"].items()),
        "records: " + ", ".join(f"{k} {v}" for k, v in report["records"].items()),
        f"acknowledged at acks=all: {report['acknowledged_all']}",
        "records shown: " + ", ".join(f"{k} {v}" for k, v in report["records_seen"].items()),
        *(f"note: {n}" for n in report["notes"]),
        f"violations: {len(report['violations'])}",
    ]
    for v in report["violations"]:
        lines.append(f"  [{v['kind']}] {v['what']}")
        for example in v["examples"][:5]:
            lines.append(f"      {orjson.dumps(example).decode()[:400]}")
    lines.append(f"replay: {report['replay']}")
    return "\n".join(lines)
