"""Descriptors per topic: a real ``herald serve`` gets publishes to N new topics (each
auto-created, one partition) and this prints the server's open descriptors as it goes.

    python -m bench.open_files [--topics 10000] [--nofile 20000] [--step 1000]

The server runs under ``prlimit --nofile=N:N``; half of N bounds the partitions' open
files (PROTOCOL §6), so the count levels off there however many topics exist. Prints
topics, open descriptors, descriptors per topic and creations per second; then reads
every topic once. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import time

import httpx

from bench.common import SERVE, herald_server


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--nofile", type=int, default=20_000)
    parser.add_argument("--step", type=int, default=1000)
    args = parser.parse_args()
    serve = ("prlimit", f"--nofile={args.nofile}:{args.nofile}", "--", *SERVE)
    limits = ("--max-topics", str(args.topics), "--log-level", "warning")
    with herald_server(*limits, serve=serve) as (url, pid):
        base = descriptors(pid)
        print(f"limit {args.nofile}; at start {base} descriptors")
        print(f"{'topics':>8} {'open fds':>9} {'fds/topic':>10} {'topics/s':>9}")
        started = time.monotonic()
        with httpx.Client(base_url=url, timeout=120) as client:
            for i in range(args.topics):
                response = client.post(
                    f"/v1/topics/b{i}/messages", json={"messages": [{"value": i}]}
                )
                if response.status_code != 200:
                    print(f"topic {i}: {response.status_code} {response.text}")
                    break
                if (i + 1) % args.step == 0:
                    fds = descriptors(pid)
                    rate = (i + 1) / (time.monotonic() - started)
                    print(f"{i + 1:>8} {fds:>9} {(fds - base) / (i + 1):>10.3f} {rate:>9.1f}")
            started = time.monotonic()
            wrong = 0
            for i in range(args.topics):
                read = client.get(f"/v1/topics/b{i}/partitions/0/messages", params={"offset": 0})
                wrong += [m["value"] for m in read.json()["messages"]] != [i]
            took = time.monotonic() - started
            print(f"read every topic: {took:.1f} s, {wrong} wrong; open fds now {descriptors(pid)}")


if __name__ == "__main__":
    main()
