"""Client subcommands of the `herald` CLI: topics, subscriptions, publish, consume, tail.

`server/cli.py` calls `add_global_options(parser)` (`--url`, `--token` before the
subcommand) and `add_commands(subparsers)`; each subcommand sets `func`, which takes
the parsed arguments and returns the exit status. `--url`/`--token` are accepted
after the subcommand too (there they win). `--url` names a cluster's nodes when
repeated or comma-separated (PROTOCOL §7: any node serves every command).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import ssl
import sys
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import httpx
import orjson
import websockets

from herald._http import DEFAULT_URL
from herald.admin import Admin
from herald.consumer import Consumer
from herald.errors import HeraldClientError
from herald.producer import Producer
from herald.puller import Puller
from herald.tail import Tail

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, Any]]
PUBLISH_CHUNK = 10_000
_ABSENT: Any = object()  # "not given": `--retention-ms none` means unlimited (null) instead


def add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _topics(subparsers)
    _subscriptions(subparsers)
    _publish(subparsers)
    _consume(subparsers)
    _tail(subparsers)


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """`herald --url U --token T COMMAND …`: the top-level parser's own flags."""
    _common(parser)


# -- parsers ----------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: a subcommand's parser leaves the value alone unless it is given there,
    # so `herald --url U topics list` keeps U; the defaults are applied in _runner.
    parser.add_argument(
        "--url",
        action="append",
        default=argparse.SUPPRESS,
        help=(
            f"server URL (env HERALD_URL; default {DEFAULT_URL}); a cluster's nodes "
            "repeated or comma-separated"
        ),
    )
    parser.add_argument(
        "--token", default=argparse.SUPPRESS, help="bearer token (env HERALD_TOKEN)"
    )
    parser.add_argument(
        "--ca-file",
        default=argparse.SUPPRESS,
        metavar="PEM",
        help="trust this CA (PEM) for https:// and wss:// servers (env HERALD_CA_FILE)",
    )


def _leaf(
    parent: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, run: Handler
) -> argparse.ArgumentParser:
    parser = parent.add_parser(name, help=help, description=help)
    _common(parser)
    parser.set_defaults(func=_runner(run))
    return parser


def _topics(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topics = subparsers.add_parser("topics", help="list, create, show and delete topics")
    actions = topics.add_subparsers(dest="action", required=True, metavar="ACTION")
    _leaf(actions, "list", "list topics", _topics_list)
    create = _leaf(actions, "create", "create a topic (200 if it exists alike)", _topics_create)
    create.add_argument("topic")
    create.add_argument("--partitions", type=int, help="partition count (default 1)")
    create.add_argument(
        "--retention-ms", type=_int_or_none, default=_ABSENT, help="ms, or 'none' for unlimited"
    )
    create.add_argument(
        "--retention-bytes",
        type=_int_or_none,
        default=_ABSENT,
        help="bytes per partition, or 'none' for unlimited",
    )
    create.add_argument("--dedup-window-ms", type=int, help="producer id dedup window")
    get = _leaf(actions, "get", "show a topic's config and partitions", _topics_get)
    get.add_argument("topic")
    delete = _leaf(actions, "delete", "delete a topic and its subscriptions", _topics_delete)
    delete.add_argument("topic")


def _subscriptions(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    subs = subparsers.add_parser(
        "subscriptions", help="list, create, show, update, delete and seek"
    )
    actions = subs.add_subparsers(dest="action", required=True, metavar="ACTION")
    _leaf(actions, "list", "list subscriptions", _subs_list)
    create = _leaf(actions, "create", "create a subscription on a topic", _subs_create)
    create.add_argument("subscription")
    create.add_argument("--topic", required=True)
    create.add_argument("--start", help="earliest, latest (default) or a timestamp in ms")
    create.add_argument("--delivery", choices=["at_least_once", "at_most_once"])
    create.add_argument("--ack-deadline-ms", type=int)
    create.add_argument("--max-in-flight", type=int)
    create.add_argument("--max-deliveries", type=int, help="0 = never dead-letter")
    create.add_argument("--dead-letter-topic")
    create.add_argument("--ordered-by-key", action="store_true", default=None)
    push = create.add_argument_group("push (a webhook endpoint, PROTOCOL §4)")
    push.add_argument("--push-url", help="POST each record to this URL")
    push.add_argument(
        "--push-secret",
        help="whsec_<base64 of 16..64 bytes>; or env HERALD_PUSH_SECRET, which ps does not show",
    )
    push.add_argument("--push-max-in-flight", type=int, help="concurrent requests (1..1000)")
    push.add_argument("--push-timeout-ms", type=int, help="answer deadline (100..60000)")
    push.add_argument(
        "--push-breaker-failures", type=int, help="consecutive failures that open the breaker"
    )
    _push_body_arguments(push)
    create.add_argument(
        "--config", type=orjson.loads, help="more fields as a JSON object, e.g. retry_backoff"
    )
    _update_parser(actions)
    get = _leaf(actions, "get", "show a subscription's config and stats", _subs_get)
    get.add_argument("subscription")
    delete = _leaf(actions, "delete", "delete a subscription", _subs_delete)
    delete.add_argument("subscription")
    seek = _leaf(actions, "seek", "move a subscription's cursor", _subs_seek)
    seek.add_argument("subscription")
    where = seek.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", choices=["earliest", "latest"])
    where.add_argument("--timestamp", type=int, help="ms since the epoch")
    where.add_argument(
        "--offset",
        action="append",
        metavar="PARTITION=OFFSET",
        type=_partition_offset,
        help="repeatable",
    )
    redrive = _leaf(
        actions,
        "redrive",
        "republish the records of a subscription's dead-letter topic to its topic",
        _subs_redrive,
    )
    redrive.add_argument("subscription")
    redrive.add_argument("--rate", type=int, help="records per second (1..10000)")
    redrive.add_argument("--max-records", type=int, help="at most this many (1..1000000)")
    redrive.add_argument(
        "--reason",
        help="only the dead letters whose herald-source-last-error is exactly this "
        "(e.g. 'http 500', 'timeout', a nack's reason)",
    )


def _publish(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    publish = _leaf(
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
        choices=["0", "1", "all"],
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


def _update_parser(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    update = _leaf(
        actions,
        "update",
        "change a subscription in place (PROTOCOL §8): only the fields given change; "
        "'default' sets one back to its default",
        _subs_update,
    )
    update.add_argument("subscription")
    for flag in ("--ack-deadline-ms", "--max-in-flight", "--max-deliveries"):
        update.add_argument(flag, type=_int_or_default, default=_ABSENT, help="or 'default'")
    update.add_argument(
        "--dead-letter-topic", type=_str_or_none, default=_ABSENT, help="a topic, or 'none'"
    )
    push = update.add_argument_group(
        "push (replaced whole; without a secret the current one is kept)"
    )
    push.add_argument("--push-url", help="POST each record to this URL (starts pushing)")
    push.add_argument("--push-secret", help="whsec_…; or env HERALD_PUSH_SECRET")
    push.add_argument("--push-max-in-flight", type=int, help="concurrent requests (1..1000)")
    push.add_argument("--push-timeout-ms", type=int, help="answer deadline (100..60000)")
    push.add_argument(
        "--push-breaker-failures", type=int, help="consecutive failures that open the breaker"
    )
    _push_body_arguments(push)
    push.add_argument(
        "--no-push", action="store_true", help="stop pushing: WebSocket and pull consumers drain it"
    )
    update.add_argument(
        "--config", type=orjson.loads, help="more changes as a JSON merge patch, e.g. retry_backoff"
    )


def _push_body_arguments(push: argparse._ArgumentGroup) -> None:
    """PROTOCOL §8 `push.batch` and `push.payload`."""
    push.add_argument(
        "--push-batch-max-records",
        type=int,
        help='records per request (1..1000, default 1); over 1 the body is {"messages":[…]}',
    )
    push.add_argument(
        "--push-batch-max-wait-ms",
        type=int,
        help="send a batch that is not full this long after its first record (0..10000)",
    )
    push.add_argument(
        "--push-payload",
        choices=["envelope", "raw"],
        help="raw: the body is the record's value, the rest in herald-* headers",
    )


def _consume(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    consume = _leaf(
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


def _tail(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tail = _leaf(
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


async def _topics_list(args: argparse.Namespace) -> Any:
    async with Admin(args.url, args.token, ssl_context=args.ssl_context) as admin:
        return await admin.list_topics()


async def _topics_create(args: argparse.Namespace) -> Any:
    extra: dict[str, Any] = {}
    if args.retention_ms is not _ABSENT:
        extra["retention_ms"] = args.retention_ms
    if args.retention_bytes is not _ABSENT:
        extra["retention_bytes"] = args.retention_bytes
    async with Admin(args.url, args.token, ssl_context=args.ssl_context) as admin:
        return await admin.create_topic(
            args.topic,
            partitions=args.partitions,
            dedup_window_ms=args.dedup_window_ms,
            **extra,
        )


async def _topics_get(args: argparse.Namespace) -> Any:
    async with Admin(args.url, args.token, ssl_context=args.ssl_context) as admin:
        return await admin.get_topic(args.topic)


async def _topics_delete(args: argparse.Namespace) -> None:
    async with Admin(args.url, args.token, ssl_context=args.ssl_context) as admin:
        await admin.delete_topic(args.topic)


async def _subs_list(args: argparse.Namespace) -> Any:
    async with Admin(args.url, args.token, ssl_context=args.ssl_context) as admin:
        return await admin.list_subscriptions()


async def _subs_create(args: argparse.Namespace) -> Any:
    config: dict[str, Any] = dict(args.config or {})
    if args.start is not None:
        config["start"] = {"timestamp": int(args.start)} if args.start.isdigit() else args.start
    for name in (
        "delivery",
        "ack_deadline_ms",
        "max_in_flight",
        "max_deliveries",
        "dead_letter_topic",
        "ordered_by_key",
    ):
        value = getattr(args, name)
        if value is not None:
            config[name] = value
    push = _push_config(args)
    if push:
        config["push"] = {**(config.get("push") or {}), **push}
    async with Admin(args.url, args.token, ssl_context=args.ssl_context) as admin:
        return await admin.create_subscription(args.subscription, args.topic, **config)


def _push_config(args: argparse.Namespace) -> dict[str, Any]:
    push: dict[str, Any] = {}
    for flag, field in (
        ("push_url", "url"),
        ("push_max_in_flight", "max_in_flight"),
        ("push_timeout_ms", "timeout_ms"),
    ):
        if getattr(args, flag) is not None:
            push[field] = getattr(args, flag)
    if args.push_breaker_failures is not None:
        push["breaker"] = {"failures": args.push_breaker_failures}
    batch = {
        field: getattr(args, flag)
        for flag, field in (
            ("push_batch_max_records", "max_records"),
            ("push_batch_max_wait_ms", "max_wait_ms"),
        )
        if getattr(args, flag) is not None
    }
    if batch:
        push["batch"] = batch
    if args.push_payload is not None:
        push["payload"] = args.push_payload
    if args.push_secret is not None and not push:
        raise HeraldClientError("bad_request", 0, "--push-secret needs --push-url")
    secret = args.push_secret or os.environ.get("HERALD_PUSH_SECRET")
    if push and secret:
        push["secret"] = secret
    return push


async def _subs_update(args: argparse.Namespace) -> Any:
    changes: dict[str, Any] = dict(args.config or {})
    for name in ("ack_deadline_ms", "max_in_flight", "max_deliveries", "dead_letter_topic"):
        value = getattr(args, name)
        if value is not _ABSENT:
            changes[name] = value
    if args.no_push:
        if args.push_url is not None:
            raise HeraldClientError("bad_request", 0, "--no-push and --push-url contradict")
        changes["push"] = None
    elif args.push_url is not None:
        changes["push"] = _push_config(args)
    elif any(
        getattr(args, flag) is not None
        for flag in (
            "push_secret",
            "push_max_in_flight",
            "push_timeout_ms",
            "push_breaker_failures",
            "push_batch_max_records",
            "push_batch_max_wait_ms",
            "push_payload",
        )
    ):
        raise HeraldClientError(
            "bad_request", 0, "push settings need --push-url (push is replaced whole)"
        )
    async with Admin(args.url, args.token, ssl_context=args.ssl_context) as admin:
        return await admin.update_subscription(args.subscription, **changes)


async def _subs_redrive(args: argparse.Namespace) -> Any:
    async with Admin(args.url, args.token, ssl_context=args.ssl_context) as admin:
        return await admin.redrive(
            args.subscription, rate=args.rate, max_records=args.max_records, reason=args.reason
        )


async def _subs_get(args: argparse.Namespace) -> Any:
    async with Admin(args.url, args.token, ssl_context=args.ssl_context) as admin:
        return await admin.get_subscription(args.subscription)


async def _subs_delete(args: argparse.Namespace) -> None:
    async with Admin(args.url, args.token, ssl_context=args.ssl_context) as admin:
        await admin.delete_subscription(args.subscription)


async def _subs_seek(args: argparse.Namespace) -> Any:
    offsets = dict(args.offset) if args.offset else None
    async with Admin(args.url, args.token, ssl_context=args.ssl_context) as admin:
        return await admin.seek(
            args.subscription, to=args.to, timestamp=args.timestamp, offsets=offsets
        )


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
                _print(
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
                _print(pulled.to_json())
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
            _print(message.to_json())
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
            _print(record)


# -- plumbing -----------------------------------------------------------------------------


def _runner(run: Handler) -> Callable[[argparse.Namespace], int]:
    def main(args: argparse.Namespace) -> int:
        if getattr(args, "url", None) is None:
            args.url = [os.environ.get("HERALD_URL", DEFAULT_URL)]
        args.url = _node_urls(args.url)
        if getattr(args, "token", None) is None:
            args.token = os.environ.get("HERALD_TOKEN")
        if getattr(args, "ca_file", None) is None:
            args.ca_file = os.environ.get("HERALD_CA_FILE") or None
        try:
            args.ssl_context = _ssl_context(args.ca_file)
        except (OSError, ssl.SSLError) as exc:
            print(f"herald: --ca-file {args.ca_file}: {exc}", file=sys.stderr)
            return 2
        try:
            result = asyncio.run(run(args))
        except HeraldClientError as exc:
            status = f" ({exc.status})" if exc.status else ""
            print(f"herald: {exc.code}{status}: {exc.detail}", file=sys.stderr)
            return 1
        except (OSError, httpx.HTTPError, websockets.WebSocketException) as exc:
            print(f"herald: cannot reach {','.join(args.url)}: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        if result is not None:
            _print(result)
        return 0

    return main


def _ssl_context(ca_file: str | None) -> ssl.SSLContext | None:
    """The system's CAs and, with --ca-file, a private one's (the SDK's ssl_context=)."""
    if ca_file is None:
        return None
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=ca_file)
    return context


def _node_urls(given: list[str]) -> list[str]:
    """`--url a --url b,c` → [a, b, c]: the nodes of a cluster, tried in turn."""
    urls = [url.strip() for value in given for url in value.split(",") if url.strip()]
    return urls or [DEFAULT_URL]


def _print(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value).decode() + "\n")
    sys.stdout.flush()


def _json_or_string(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _int_or_default(text: str) -> int | None:
    """A PATCH value: 'default' (or 'null') is null, the field's default (PROTOCOL §8)."""
    return None if text.lower() in ("default", "null") else int(text)


def _str_or_none(text: str) -> str | None:
    return None if text.lower() in ("none", "null") else text


def _int_or_none(text: str) -> int | None:
    return None if text.lower() in ("none", "null", "unlimited") else int(text)


def _partition_offset(text: str) -> tuple[int, int]:
    partition, sep, offset = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError("expected PARTITION=OFFSET")
    return int(partition), int(offset)


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError("expected NAME=VALUE")
    return name, value
