"""`python -m bench.frame_codec [--records 300] [--size 1024] [--repeat 7]`: what a `deliver`
frame costs per record in each encoding a consumer socket speaks (docs/protocol.md
"MessagePack"), with the code that runs: the server's encoders (subscribers/wire.py for
JSON, subscribers/packed.py for msgpack) and the SDK's reading of the frame into
`Message`s with each record's `value` read (herald/consumer.py), for a bytes record and
for a JSON value (a string of ``--size`` characters). Prints µs per record, the best of
``--repeat`` timings (timeit's way: the least disturbed by other work).

Where bench/binary_codec.py times the codec alone, this is the whole of a record's
encoding on each side of a socket, so it also shows what msgpack costs a JSON record.
"""

from __future__ import annotations

import argparse
import os
import timeit
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import orjson

from herald.consumer import _WIRES
from herald.protocol.encodings import MSGPACK_SUBPROTOCOL
from storage.record import Record, ValueKind
from subscribers import packed, wire


def cases(records: int, size: int) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """Each step and record kind: (JSON, msgpack)."""
    json_wire, packed_wire = _WIRES[None], _WIRES[MSGPACK_SUBPROTOCOL]
    out: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {}
    for kind, value in (
        (ValueKind.BYTES, os.urandom(size)),
        (ValueKind.JSON, orjson.dumps("x" * size)),
    ):
        deliveries: list[Any] = [
            SimpleNamespace(record=Record(0, i, 1_700_000_000_000 + i, value, kind), attempt=1)
            for i in range(records)
        ]

        def encode_json(deliveries: list[Any] = deliveries) -> bytes:
            return wire.deliver_frame(wire.deliveries_json("topic", deliveries, "sub"))

        def encode_packed(deliveries: list[Any] = deliveries) -> bytes:
            return packed.packed_deliver_frame(packed.packed_deliveries("topic", deliveries, "sub"))

        json_frame, packed_frame = encode_json().decode(), encode_packed()

        def decode_json(frame: str = json_frame) -> list[Any]:
            read = json_wire.read(frame)
            return [json_wire.message(m).value for m in read.messages]

        def decode_packed(frame: bytes = packed_frame) -> list[Any]:
            read = packed_wire.read(frame)
            return [packed_wire.message(m).value for m in read.messages]

        assert (
            decode_json()
            == decode_packed()
            == [value if kind is ValueKind.BYTES else "x" * size] * records
        )
        name = "bytes record" if kind is ValueKind.BYTES else "JSON record"
        out[f"{name}: server encodes"] = (encode_json, encode_packed)
        out[f"{name}: SDK reads"] = (decode_json, decode_packed)
    return out


def best_us(fn: Callable[[], object], records: int, repeat: int) -> float:
    number = max(1, 20_000 // records)
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / (number * records) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--records",
        type=int,
        default=300,
        help="records per frame (300 of 1 KiB: under the 512 KiB a server frame is cut at)",
    )
    parser.add_argument("--size", type=int, default=1024, help="bytes (characters) per value")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"a deliver frame of {args.records} records, values of {args.size} bytes (µs per record)")
    print(f"{'step':<30} {'JSON':>7} {'msgpack':>8}")
    for step, (json_form, packed_form) in cases(args.records, args.size).items():
        a = best_us(json_form, args.records, args.repeat)
        b = best_us(packed_form, args.records, args.repeat)
        print(f"{step:<30} {a:>7.2f} {b:>8.2f}")


if __name__ == "__main__":
    main()
