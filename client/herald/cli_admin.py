"""The admin subcommands of the `herald` CLI: `topics` and `subscriptions` (list,
create, get, update, delete, seek, redrive), each one call of :class:`herald.Admin`."""

from __future__ import annotations

import argparse
import os
from typing import Any, get_args

import orjson

from herald.admin import Admin
from herald.cli_runner import Subparsers, leaf
from herald.errors import HeraldClientError
from herald.protocol import limits
from herald.protocol.seek import SeekTo
from herald.protocol.subscriptions import DeliveryName, PayloadName

_ABSENT: Any = object()  # "not given": `--retention-ms none` means unlimited (null) instead


def add_topics(subparsers: Subparsers) -> None:
    topics = subparsers.add_parser("topics", help="list, create, show and delete topics")
    actions = topics.add_subparsers(dest="action", required=True, metavar="ACTION")
    leaf(actions, "list", "list topics", _topics_list)
    create = leaf(actions, "create", "create a topic (200 if it exists alike)", _topics_create)
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
    get = leaf(actions, "get", "show a topic's config and partitions", _topics_get)
    get.add_argument("topic")
    delete = leaf(actions, "delete", "delete a topic and its subscriptions", _topics_delete)
    delete.add_argument("topic")


def add_subscriptions(subparsers: Subparsers) -> None:
    subs = subparsers.add_parser(
        "subscriptions", help="list, create, show, update, delete and seek"
    )
    actions = subs.add_subparsers(dest="action", required=True, metavar="ACTION")
    leaf(actions, "list", "list subscriptions", _subs_list)
    create = leaf(actions, "create", "create a subscription on a topic", _subs_create)
    create.add_argument("subscription")
    create.add_argument("--topic", required=True)
    create.add_argument("--start", help="earliest, latest (default) or a timestamp in ms")
    create.add_argument("--delivery", choices=get_args(DeliveryName))
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
    get = leaf(actions, "get", "show a subscription's config and stats", _subs_get)
    get.add_argument("subscription")
    delete = leaf(actions, "delete", "delete a subscription", _subs_delete)
    delete.add_argument("subscription")
    seek = leaf(actions, "seek", "move a subscription's cursor", _subs_seek)
    seek.add_argument("subscription")
    where = seek.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", choices=get_args(SeekTo))
    where.add_argument("--timestamp", type=int, help="ms since the epoch")
    where.add_argument(
        "--offset",
        action="append",
        metavar="PARTITION=OFFSET",
        type=_partition_offset,
        help="repeatable",
    )
    redrive = leaf(
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


def _update_parser(actions: Subparsers) -> None:
    update = leaf(
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
        help=f"records per request ({_range(limits.BATCH_MAX_RECORDS)}, default 1); over 1 "
        'the body is {"messages":[…]}',
    )
    push.add_argument(
        "--push-batch-max-wait-ms",
        type=int,
        help="send a batch that is not full this long after its first record "
        f"({_range(limits.BATCH_MAX_WAIT_MS)})",
    )
    push.add_argument(
        "--push-payload",
        choices=get_args(PayloadName),
        help="raw: the body is the record's value, the rest in herald-* headers",
    )


def _range(allowed: limits.IntRange) -> str:
    return f"{allowed.low}..{allowed.high}"


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
