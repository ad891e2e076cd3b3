"""`python -m bench.binary_codec [--messages 100] [--size 1024] [--repeat 7]`: what a binary
encoding (msgpack, through msgspec) would save over today's JSON with base64 for binary
records (issue 27 §2), per record, on each side of each message that carries them:

- a publish body: the SDK encodes it (base64, then JSON), the server decodes it (the
  model's one-pass JSON decode, then base64 back to bytes);
- a deliver frame: the server encodes it, the SDK decodes it.

Each form is timed with msgspec's encoders and decoders into the same shape of Struct
(a list of records with a key and the value), the JSON form carrying ``value_b64`` text
and the msgpack form the bytes themselves. What the server's checks cost is the same
either way and left out: this is the codec's difference alone. Prints µs per record,
the best of ``--repeat`` timings (timeit's way: the least disturbed by other work).
"""

from __future__ import annotations

import argparse
import binascii
import os
import timeit
from collections.abc import Callable

import msgspec


class TextRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    value_b64: str
    key: str | None = None


class BinaryRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    value: bytes
    key: str | None = None


class TextBatch(msgspec.Struct, frozen=True):
    messages: list[TextRecord]


class BinaryBatch(msgspec.Struct, frozen=True):
    messages: list[BinaryRecord]


def cases(messages: int, size: int) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """Each step: (JSON + base64, msgpack)."""
    values = [os.urandom(size) for _ in range(messages)]
    json_encode, msgpack_encode = msgspec.json.Encoder().encode, msgspec.msgpack.Encoder().encode
    json_batch = msgspec.json.Decoder(TextBatch).decode
    msgpack_batch = msgspec.msgpack.Decoder(BinaryBatch).decode
    b64 = [binascii.b2a_base64(v, newline=False).decode("ascii") for v in values]
    as_json = json_encode(TextBatch([TextRecord(value_b64=t, key="k") for t in b64]))
    as_msgpack = msgpack_encode(BinaryBatch([BinaryRecord(value=v, key="k") for v in values]))

    def encode_json() -> bytes:
        return json_encode(
            TextBatch(
                [
                    TextRecord(value_b64=binascii.b2a_base64(v, newline=False).decode(), key="k")
                    for v in values
                ]
            )
        )

    def encode_msgpack() -> bytes:
        return msgpack_encode(BinaryBatch([BinaryRecord(value=v, key="k") for v in values]))

    def decode_json() -> list[bytes]:
        return [binascii.a2b_base64(m.value_b64) for m in json_batch(as_json).messages]

    def decode_msgpack() -> list[bytes]:
        return [m.value for m in msgpack_batch(as_msgpack).messages]

    assert decode_json() == decode_msgpack() == values
    return {
        "encode a batch": (encode_json, encode_msgpack),
        "decode it": (decode_json, decode_msgpack),
    }


def best_us(fn: Callable[[], object], records: int, repeat: int) -> float:
    number = max(1, 20_000 // records)
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / (number * records) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100, help="records per body or frame")
    parser.add_argument("--size", type=int, default=1024, help="bytes per value")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    text = len(msgspec.json.encode(TextRecord(value_b64="A" * (4 * -(-args.size // 3)))))
    binary = len(msgspec.msgpack.encode(BinaryRecord(value=b"\0" * args.size)))
    print(
        f"{args.messages} records of {args.size} random bytes a body or frame; "
        f"{text} bytes a record as JSON + base64, {binary} as msgpack"
    )
    print(f"{'step':<16} {'JSON + base64':>14} {'msgpack':>9} {'saved':>7}  (µs per record)")
    total = 0.0
    for step, (json_form, msgpack_form) in cases(args.messages, args.size).items():
        a = best_us(json_form, args.messages, args.repeat)
        b = best_us(msgpack_form, args.messages, args.repeat)
        total += a - b
        print(f"{step:<16} {a:>14.2f} {b:>9.2f} {a - b:>7.2f}")
    print(f"a record's encode and decode, once each way: {total:.2f} µs saved")


if __name__ == "__main__":
    main()
