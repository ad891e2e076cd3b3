"""The names of PROTOCOL §2: topics and subscriptions, and the positions a subscription
may start at or a seek may go to."""

from __future__ import annotations

import re
from typing import Annotated

from msgspec import Meta

from herald.protocol.errors import InvalidName

NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,248}$"
Name = Annotated[str, Meta(pattern=NAME_PATTERN)]  # a name in a model the server fills in
NAME_RE = re.compile(NAME_PATTERN[1:-1])
POSITIONS = ("earliest", "latest")  # `start` and seek `to` (PROTOCOL §2)


def check_name(name: str, what: str = "topic") -> str:
    """``name`` if it is a valid topic (or subscription) name, else InvalidName."""
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        raise InvalidName(f"{what} name {name!r} does not match {NAME_PATTERN}")
    return name
