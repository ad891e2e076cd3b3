"""The encodings a client may choose besides JSON (docs/protocol.md "MessagePack"): how
each is asked for, declared once for the server and the SDK.

JSON is the protocol's (PROTOCOL §2, §3) and every client's default on the wire. A
client that carries bytes may use msgpack instead, where a bytes record's value travels
as itself rather than as base64 text (a third fewer bytes, no encoding either way):

- a publish body whose ``Content-Type`` is one of ``MSGPACK_MEDIA_TYPES``; the answer,
  and every problem, stay JSON;
- a consumer or tail WebSocket that offers the subprotocol ``MSGPACK_SUBPROTOCOL``: the
  server selects it and then writes every frame as one msgpack map in a binary frame,
  and reads binary frames as msgpack beside text frames as JSON.
"""

from __future__ import annotations

MSGPACK_MEDIA_TYPE = "application/vnd.msgpack"
# The IANA name first; the two spellings in use before it was registered are taken too.
MSGPACK_MEDIA_TYPES = frozenset(
    {MSGPACK_MEDIA_TYPE, "application/msgpack", "application/x-msgpack"}
)
MSGPACK_SUBPROTOCOL = "herald.msgpack"


def is_msgpack(content_type: str | None) -> bool:
    """Whether a request's ``Content-Type`` names msgpack (parameters ignored)."""
    if not content_type:
        return False
    return content_type.partition(";")[0].strip().lower() in MSGPACK_MEDIA_TYPES


def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items (fixarray, array 16 or array 32): a
    body or frame is spliced around items encoded one by one."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")
