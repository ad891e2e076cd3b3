"""`python -m bench.topic_publish [OLD_TREE] [--publishes N] [--rounds R] [--acks 1|all]`:
the CPU of one-record publishes made one after another straight into
``Topic.publish`` (no HTTP: the storage half of a publish, the writer thread's share
included), as µs of process CPU per publish, 1 KiB records on one partition.

Given an older source tree, the two alternate round by round (each round a process of
its own, the tree on its PYTHONPATH) and the medians and the median of the pair-by-pair
ratios are printed: CPU time, not wall time, is the figure to compare on a shared host.

    git archive <old-commit> | (mkdir -p /tmp/old && tar -x -C /tmp/old)
    python -m bench.topic_publish /tmp/old --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 2_000


async def cpu_per_publish(publishes: int, acks_all: bool) -> float:
    """In this process, against the storage modules on its path: µs of CPU a publish."""
    from storage.config import TopicConfig
    from storage.engine import Storage
    from storage.record import Acks, NewRecord
    from storage.topic import PublishItem

    acks = Acks.ALL if acks_all else Acks.LEADER
    item = PublishItem(NewRecord(b"x" * 1024))
    with tempfile.TemporaryDirectory(prefix="herald-topic-publish-") as data:
        storage = await Storage.open(Path(data), writer_threads=1)
        try:
            topic = await storage.create_topic("t", TopicConfig(partitions=1))
            for _ in range(WARM_UP):
                await topic.publish([item], acks)
            started = time.process_time()  # every thread of the process
            for _ in range(publishes):
                await topic.publish([item], acks)
            return (time.process_time() - started) / publishes * 1e6
        finally:
            await storage.close()


def one_round(tree: Path, publishes: int, acks_all: bool) -> float:
    # -P: not this script's folder first on the path (bench/storage.py is not storage/)
    command = [sys.executable, "-P", __file__, "--worker", "--publishes", str(publishes)]
    if acks_all:
        command += ["--acks", "all"]
    env = dict(os.environ, PYTHONPATH=str(tree))
    answer = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
    if answer.returncode:
        raise RuntimeError(f"the round against {tree} failed: {answer.stderr[-2000:]}")
    return float(answer.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", nargs="?", type=Path, help="an older tree to compare with")
    parser.add_argument("--publishes", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--acks", choices=("1", "all"), default="1")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    acks_all = args.acks == "all"
    if args.worker:
        print(asyncio.run(cpu_per_publish(args.publishes, acks_all)))
        return
    trees = [ROOT] if args.old is None else [ROOT, args.old.resolve()]
    figures: dict[Path, list[float]] = {tree: [] for tree in trees}
    for round_ in range(args.rounds):
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            figure = one_round(tree, args.publishes, acks_all)
            figures[tree].append(figure)
            print(f"round {round_ + 1} {tree}: {figure:.1f} µs/publish", flush=True)
    for tree, values in figures.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"{tree}: median {statistics.median(values):.1f} µs/publish [{shown}]")
    if args.old is not None:
        ratios = [new / old for new, old in zip(figures[ROOT], figures[trees[1]], strict=True)]
        print(
            f"this tree / old, median of the pair-by-pair ratios: {statistics.median(ratios):.3f}"
        )
    print(f"host load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
