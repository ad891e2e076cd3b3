"""``python -m tests.nemesis --seed S --minutes M [--nodes 3|5] [--out DIR]``: a
Jepsen-style run against a real cluster (tests/nemesis/run.py). Needs root for the
partitions (iptables) and the nodes' own group ids. Exits 1 on any violation."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from tests.nemesis import report
from tests.nemesis.run import run, terminate_as_interrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.nemesis", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--no-churn",
        action="store_true",
        help="leave out the topic deleted and created again (its finding masks others)",
    )
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix=f"nemesis-{args.seed}-"))
    out.mkdir(parents=True, exist_ok=True)
    terminate_as_interrupt()
    result = asyncio.run(run(args.seed, args.minutes, args.nodes, out, churn=not args.no_churn))
    print(report.render(result))
    print(f"report: {out / 'report.json'}")
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
