"""`python -m bench.publish_parse [--iterations N] [--messages M] [--value json|string|bytes]`:
the CPU a publish body's parse costs, as the server reads one (server/validation.py:
the one-pass decode into the declared model, herald/protocol/publish.py, then the
checks no type states), turning the body into the records it appends. Time it
whole-process (``/usr/bin/time -v``, user + system), in alternating pairs against an
older tree's script:

    git archive <old-commit> | (mkdir -p /tmp/old && tar -x -C /tmp/old)
    /usr/bin/time -v .venv/bin/python -m bench.publish_parse
    env PYTHONPATH=/tmp/old/client /usr/bin/time -v .venv/bin/python /tmp/old/bench/publish_parse.py hand

(``--iterations 0`` gives the import cost alone, to subtract). Until 2026-11-27 the
server parsed with a hand-written ladder over orjson's objects (``hand`` in older
trees); the model decode takes less CPU (README.md, "Publish parsing").
"""

from __future__ import annotations

import argparse
import base64

import orjson

from server.validation import decode_publish, parse_publish
from storage.topic import PublishItem

MAX_MESSAGE_BYTES = 1_048_576


def body(messages: int, value: str) -> bytes:
    """A batch of 1 KiB values, as bench/herald_bench.py publishes them."""
    if value == "bytes":  # value_b64 of 1 KiB of bytes, fixed so that runs compare
        payload = bytes(range(256)) * 4
        return orjson.dumps(
            {"messages": [{"value_b64": base64.b64encode(payload).decode()}] * messages}
        )
    if value == "string":
        one: object = "x" * 1000
    else:
        one = {"id": 12345, "name": "y" * 900, "tags": ["a", "b"], "price": 12.5, "ok": True}
    return orjson.dumps({"messages": [{"value": one} for _ in range(messages)]})


def parse(raw: bytes) -> int:
    """What server/publish.py does with a body that decodes (every well-formed one)."""
    request = decode_publish(raw)
    assert request is not None
    return len(parse_publish(request, MAX_MESSAGE_BYTES, PublishItem).items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--value", choices=["json", "string", "bytes"], default="json")
    args = parser.parse_args()
    raw = body(args.messages, args.value)
    assert parse(raw) == args.messages
    for _ in range(args.iterations):
        parse(raw)


if __name__ == "__main__":
    main()
