"""Storage benchmark: partition append and read throughput against the raw disk.

    python -m bench.storage [--seconds 1.0] [--runs 3] [--dir /tmp]

For 1 KiB records in batches of 100: append throughput through the Partition facade
at acks=1 and acks=all with 1, 4 and 16 concurrent appenders; the raw disk doing the
same (plain os.write, plus os.fsync for acks=all, of the same bytes in the same batch
sizes from as many threads); cold read throughput from offset 0. Prints the median of
``--runs`` runs of each figure. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from storage.partition import Partition
from storage.record import Acks, NewRecord, ValueKind
from storage.writer import WriterPool

RECORD_BYTES = 1024
BATCH_RECORDS = 100
CONCURRENCY = (1, 4, 16)
MB = 1e6

BATCH = [NewRecord(os.urandom(RECORD_BYTES), ValueKind.BYTES) for _ in range(BATCH_RECORDS)]
BATCH_BYTES = RECORD_BYTES * BATCH_RECORDS


async def append_run(directory: Path, acks: Acks, appenders: int, seconds: float) -> float:
    """MB/s of record values appended by `appenders` concurrent loops for `seconds`."""
    pool = WriterPool(4)
    partition = await Partition.open(directory, "bench", 0, writers=pool)
    loop = asyncio.get_running_loop()
    appended = 0

    async def appender(stop_at: float) -> None:
        nonlocal appended
        while loop.time() < stop_at:
            await partition.append(BATCH, acks)
            appended += BATCH_BYTES

    started = loop.time()
    await asyncio.gather(*(appender(started + seconds) for _ in range(appenders)))
    elapsed = loop.time() - started
    await partition.close()
    await asyncio.to_thread(pool.close)
    return appended / elapsed / MB


def raw_run(directory: Path, fsync: bool, writers: int, seconds: float) -> float:
    """MB/s of `writers` threads each doing os.write (+ os.fsync) of one batch's bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    data = b"".join(r.value for r in BATCH) + bytes(64 * BATCH_RECORDS)  # ~ framed size
    fd = os.open(directory / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    written = [0] * writers
    stop_at = time.perf_counter() + seconds

    def writer(i: int) -> None:
        while time.perf_counter() < stop_at:
            os.write(fd, data)
            if fsync:
                os.fdatasync(fd)
            written[i] += BATCH_BYTES

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    os.close(fd)
    return sum(written) / elapsed / MB


async def read_run(directory: Path) -> tuple[float, int]:
    """MB/s of a cold read of the whole partition from offset 0 (files, reader thread)."""
    partition = await Partition.open(directory, "bench", 0)
    offset, read_bytes = 0, 0
    started = time.perf_counter()
    while offset < partition.end_offset:
        records = await partition.read(offset, 1000, 1 << 20)
        read_bytes += sum(len(r.value) for r in records)
        offset = records[-1].offset + 1
    elapsed = time.perf_counter() - started
    await partition.close()
    return read_bytes / elapsed / MB, read_bytes


def median_of(runs: int, fn: Callable[[int], float]) -> tuple[float, list[float]]:
    figures = [fn(i) for i in range(runs)]
    return statistics.median(figures), figures


def fresh(root: Path, name: str) -> Path:
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="length of each run")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--dir", default="/tmp", help="where the temporary data goes")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="herald-bench-", dir=args.dir))
    try:
        run_all(root, args.seconds, args.runs)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_all(root: Path, seconds: float, runs: int) -> None:
    print(
        f"{RECORD_BYTES} B records, {BATCH_RECORDS} per batch, {seconds}s per run, median of {runs}"
    )
    print(f"{'figure':<34}{'MB/s':>10}{'raw MB/s':>11}{'ratio':>8}   runs")
    for acks, fsync in ((Acks.LEADER, False), (Acks.ALL, True)):
        for appenders in CONCURRENCY:
            herald, figures = median_of(
                runs,
                lambda _, a=acks, n=appenders: asyncio.run(
                    append_run(fresh(root, "p"), a, n, seconds)
                ),
            )
            raw, _ = median_of(
                runs, lambda _, f=fsync, n=appenders: raw_run(fresh(root, "raw"), f, n, seconds)
            )
            label = f"append acks={acks.value} x{appenders}"
            print(
                f"{label:<34}{herald:>10.1f}{raw:>11.1f}{herald / raw:>8.2f}   "
                + " ".join(f"{f:.0f}" for f in figures)
            )
    source = fresh(root, "read")
    asyncio.run(append_run(source, Acks.LEADER, 4, seconds * 2))
    reads = [asyncio.run(read_run(source)) for _ in range(runs)]
    read_median = statistics.median(r[0] for r in reads)
    label = f"read from 0 ({reads[0][1] / MB:.0f} MB, cold)"
    print(
        f"{label:<34}{read_median:>10.1f}{'':>11}{'':>8}   "
        + " ".join(f"{r[0]:.0f}" for r in reads)
    )


if __name__ == "__main__":
    main()
