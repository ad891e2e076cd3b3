"""Client subcommands of the `herald` CLI: topics, subscriptions, publish, consume, tail.

`server/cli.py` calls `add_global_options(parser)` (`--url`, `--token` before the
subcommand) and `add_commands(subparsers)`; each subcommand sets `func`, which takes
the parsed arguments and returns the exit status. `--url`/`--token` are accepted
after the subcommand too (there they win). `--url` names a cluster's nodes when
repeated or comma-separated (PROTOCOL §7: any node serves every command).

The commands live by kind: `herald/cli_admin.py` (topics, subscriptions),
`herald/cli_streams.py` (publish, consume, tail); `herald/cli_runner.py` is how any of
them runs (options, environment, TLS, output, exit status).
"""

from __future__ import annotations

import argparse

from herald.cli_admin import add_subscriptions, add_topics
from herald.cli_runner import Subparsers, common_options
from herald.cli_streams import add_consume, add_publish, add_tail


def add_commands(subparsers: Subparsers) -> None:
    add_topics(subparsers)
    add_subscriptions(subparsers)
    add_publish(subparsers)
    add_consume(subparsers)
    add_tail(subparsers)


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """`herald --url U --token T COMMAND …`: the top-level parser's own flags."""
    common_options(parser)
