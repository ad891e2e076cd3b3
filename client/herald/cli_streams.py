"""The record subcommands of the `herald` CLI: `publish` (values or stdin lines),
`consume` (a subscription, over a WebSocket or by pull) and `tail` (an ephemeral tail of
a topic); records are printed one JSON object per line."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from collections.abc import Iterable
from typing import Any

import orjson

from herald.cli_runner import Subparsers, leaf, print_json
from herald.consumer import Consumer
from herald.producer import ACKS, Producer
from herald.puller import Puller
from herald.tail import Tail

PUBLISH_CHUNK = 10_000


def add_publish(subparsers: Subparsers) -> None:
    publish = leaf(
        subparsers,
        "publish",
        "publish records: each VALUE (or each stdin line) is sent as JSON if it parses, "
        "else as a string",
        _run_publish,
    )
    publish.add_argument("topic", help="the topic (created if auto-create is on)")
    publish.add_argument("values", nargs="*", metavar="VALUE", help="default: lines of stdin")
    publish.add_argument("--key", help="record key (same key, same partition)")
    publish.add_argument(
        "--acks",
        choices=ACKS,
        default="all",
        help="all: fsynced (default); 1: written; 0: fire and forget",
    )
    publish.add_argument(
        "--header", action="append", metavar="NAME=VALUE", type=_header, help="repeatable"
    )
    publish.add_argument("--partition", type=int)
    publish.add_argument(
        "--delay-ms",
        type=int,
        metavar="MS",
        help="deliver to subscriptions no earlier than MS after the append (0..2592000000)",
    )


def add_consume(subparsers: Subparsers) -> None:
    consume = leaf(
        subparsers,
        "consume",
        "print a subscription's records, one JSON object per line, acking each",
        _run_consume,
    )
    consume.add_argument("subscription")
    consume.add_argument(
        "--count", type=int, help="take N records (and no credit for more), then stop"
    )
    consume.add_argument("--credit", type=int, default=100, help="records in flight to this client")
    consume.add_argument("--no-ack", action="store_true", help="print without acking")
    consume.add_argument(
        "--pull", action="store_true", help="pull over HTTP (PROTOCOL §8) instead of a WebSocket"
    )
    consume.add_argument(
        "--wait-ms", type=int, default=20_000, help="with --pull: long-poll this long (0..30000)"
    )
    consume.add_argument(
        "--max-messages", type=int, default=100, help="with --pull: records per pull (1..1000)"
    )


def add_tail(subparsers: Subparsers) -> None:
    tail = leaf(
        subparsers,
        "tail",
        "print a topic's records as they are published, one JSON object per line: an "
        "ephemeral tail, at most once, that leaves nothing on the server",
        _run_tail,
    )
    tail.add_argument("topic")
    tail.add_argument(
        "--from",
        dest="start",
        default="latest",
        help="latest (default), earliest, an offset (every partition) or ts:<ms>",
    )
    tail.add_argument("--count", type=int, help="stop after N records (default: never)")
    tail.add_argument("--credit", type=int, default=1000, help="records in flight to this client")


# -- handlers -----------------------------------------------------------------------------


async def _run_publish(args: argparse.Namespace) -> None:
    lines: Iterable[str] = args.values or (line.rstrip("\r\n") for line in sys.stdin)
    headers = dict(args.header) if args.header else None
    async with Producer(
        args.url, args.token, acks=args.acks, ssl_context=args.ssl_context
    ) as producer:
        # Sent concurrently, a chunk at a time, so they share requests and memory stays
        # bounded on a long stdin; results are printed in input order.
        source = iter(lines)
        while chunk := list(itertools.islice(source, PUBLISH_CHUNK)):
            sends = [
                producer.send(
                    args.topic,
                    _json_or_string(line),
                    key=args.key,
                    headers=headers,
                    partition=args.partition,
                    delay_ms=args.delay_ms,
                )
                for line in chunk
            ]
            for result in await asyncio.gather(*sends):
                print_json(
                    None
                    if result is None
                    else {
                        "partition": result.partition,
                        "offset": result.offset,
                        "duplicate": result.duplicate,
                    }
                )


async def _run_consume(args: argparse.Namespace) -> None:
    if args.count is not None and args.count <= 0:
        return
    if args.pull:
        async with Puller(
            args.url,
            args.subscription,
            args.token,
            max_messages=args.max_messages,
            wait_ms=args.wait_ms,
            limit=args.count,
            ssl_context=args.ssl_context,
        ) as puller:
            async for pulled in puller:
                print_json(pulled.to_json())
                if not args.no_ack:
                    await pulled.ack()
        return
    # `limit`: exactly --count records are granted credit, none more that would be sent
    # and then come back later as attempt 2.
    async with Consumer(
        args.url,
        args.subscription,
        args.token,
        credit=max(1, args.credit),
        limit=args.count,
        ssl_context=args.ssl_context,
    ) as consumer:
        async for message in consumer:
            print_json(message.to_json())
            if not args.no_ack:
                await message.ack()


async def _run_tail(args: argparse.Namespace) -> None:
    if args.count is not None and args.count <= 0:
        return
    async with Tail(
        args.url,
        args.topic,
        args.token,
        start=args.start,
        credit=max(1, args.credit),
        limit=args.count,
        ssl_context=args.ssl_context,
    ) as tail:
        async for message in tail:
            record = message.to_json()
            del record["subscription"]  # PROTOCOL §3: a tail's records have none
            print_json(record)


def _json_or_string(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError("expected NAME=VALUE")
    return name, value
