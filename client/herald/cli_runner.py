"""How a client subcommand of the `herald` CLI runs: the options every command takes
(`--url`, `--token`, `--ca-file`, also before the subcommand), the environment's
defaults for them, TLS, one JSON document per line on stdout and the exit status
(0 done, 1 the server refused or cannot be reached, 2 a bad --ca-file, 130 ^C)."""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeAlias

import httpx
import orjson
import websockets

from herald._http import DEFAULT_URL
from herald.errors import HeraldClientError

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, Any]]
# A string: argparse's action class is generic for type checkers only.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def common_options(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: a subcommand's parser leaves the value alone unless it is given there,
    # so `herald --url U topics list` keeps U; the defaults are applied in runner.
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


def leaf(parent: Subparsers, name: str, help: str, run: Handler) -> argparse.ArgumentParser:
    parser = parent.add_parser(name, help=help, description=help)
    common_options(parser)
    parser.set_defaults(func=runner(run))
    return parser


def runner(run: Handler) -> Callable[[argparse.Namespace], int]:
    def main(args: argparse.Namespace) -> int:
        if getattr(args, "url", None) is None:
            args.url = [os.environ.get("HERALD_URL", DEFAULT_URL)]
        args.url = node_urls(args.url)
        if getattr(args, "token", None) is None:
            args.token = os.environ.get("HERALD_TOKEN")
        if getattr(args, "ca_file", None) is None:
            args.ca_file = os.environ.get("HERALD_CA_FILE") or None
        try:
            args.ssl_context = ssl_context(args.ca_file)
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
            print_json(result)
        return 0

    return main


def ssl_context(ca_file: str | None) -> ssl.SSLContext | None:
    """The system's CAs and, with --ca-file, a private one's (the SDK's ssl_context=)."""
    if ca_file is None:
        return None
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=ca_file)
    return context


def node_urls(given: list[str]) -> list[str]:
    """`--url a --url b,c` → [a, b, c]: the nodes of a cluster, tried in turn."""
    urls = [url.strip() for value in given for url in value.split(",") if url.strip()]
    return urls or [DEFAULT_URL]


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value).decode() + "\n")
    sys.stdout.flush()
