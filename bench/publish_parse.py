"""`python bench/publish_parse.py {hand,model} [--iterations N] [--messages M] [--value json|string]`:
the CPU a publish body's parse costs, the server's hand-tuned parser against decoding
into the declared models (herald/protocol/publish.py), each turning the body into the
records it appends. Time it whole-process and paired with farm-bench:

    farm-bench -n 7 -- .venv/bin/python bench/publish_parse.py model \\
        --vs '.venv/bin/python bench/publish_parse.py hand'

(``--iterations 0`` gives the import cost alone, to subtract).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec
import orjson

# Run as `python bench/publish_parse.py`, this file's folder comes first on sys.path and
# bench/storage.py would hide the storage package: look in the repository instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from herald.protocol.errors import MessageTooLarge  # noqa: E402
from herald.protocol.publish import PublishRequest  # noqa: E402
from server.validation import encode_value, parse_publish  # noqa: E402
from storage.record import ValueKind, new_record  # noqa: E402
from storage.topic import PublishItem  # noqa: E402

MAX_MESSAGE_BYTES = 1_048_576
_EMPTY: dict[str, str] = {}


def body(messages: int, value: str) -> bytes:
    """A batch of 1 KiB values, as bench/herald_bench.py publishes them."""
    if value == "string":
        one: object = "x" * 1000
    else:
        one = {"id": 12345, "name": "y" * 900, "tags": ["a", "b"], "price": 12.5, "ok": True}
    return orjson.dumps({"messages": [{"value": one} for _ in range(messages)]})


def hand(raw: bytes) -> int:
    return len(parse_publish(orjson.loads(raw), MAX_MESSAGE_BYTES, PublishItem).items)


def model(raw: bytes) -> int:
    """The least a model-based parser does for these bodies (each message a value)."""
    request = msgspec.json.decode(raw, type=PublishRequest)
    items = []
    for message in request.messages:
        value = encode_value(message.value, False)
        if len(value) > MAX_MESSAGE_BYTES:
            raise MessageTooLarge("too large")
        items.append(PublishItem(new_record(value, ValueKind.JSON, None, _EMPTY, None, 0), None))
    return len(items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("parser", choices=["hand", "model"])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--value", choices=["json", "string"], default="json")
    args = parser.parse_args()
    raw = body(args.messages, args.value)
    parse = hand if args.parser == "hand" else model
    assert hand(raw) == model(raw) == args.messages
    for _ in range(args.iterations):
        parse(raw)


if __name__ == "__main__":
    main()
