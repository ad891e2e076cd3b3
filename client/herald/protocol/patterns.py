"""The string grammars of the protocol that JSON Schema publishes as patterns: strict
base64 (a message's value_b64, a webhook secret's key), webhook secrets ("whsec_" +
base64, Standard Webhooks) and the push URLs /openapi.json describes."""

from __future__ import annotations

# Standard Webhooks: keys of 24..64 bytes; 16 (128 bits) is the least HMAC-SHA256 should get.
SECRET_BYTES = (16, 64)
SECRET_PREFIX = "whsec_"


def base64_pattern(min_bytes: int = 0, max_bytes: int | None = None) -> str:
    """A regex of the strict, padded base64 (RFC 4648 §4) of ``min_bytes..max_bytes`` bytes,
    as ``b64decode_strict`` reads it: what OpenAPI publishes for value_b64 and secrets."""
    # The last character before padding carries pad bits, which must be zero.
    quad = "(?:[A-Za-z0-9+/]{4})"
    tails = ("", "[A-Za-z0-9+/][AQgw]==", "[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=")
    if max_bytes is None:
        return f"{quad}*(?:{tails[1]}|{tails[2]})?"
    branches = []
    for rest, tail in enumerate(tails):  # n bytes = 3 * quads + rest
        fewest = max(0, -(-(min_bytes - rest) // 3))
        most = (max_bytes - rest) // 3
        if fewest <= most and (rest or most > 0):
            branches.append(f"{quad}{{{fewest},{most}}}{tail}")
    return "(?:" + "|".join(branches) + ")"


_HOST_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_IPV4_PART = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_PORT = "(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
_URL_CHARS = "[A-Za-z0-9._~!$&'()*+,;=:@%/-]"
# The push URLs OpenAPI describes: http(s), a DNS name (its last label starting with a
# letter) or an IPv4 address, an optional port 1..65535, a path and query without spaces.
# A subset of what check_push_url (subscriptions.py) accepts: it also takes IPv6 and IDNA hosts.
PUSH_URL_PATTERN = (
    f"^https?://(?:(?:{_HOST_LABEL}\\.)*[A-Za-z](?:[A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?"
    f"|{_IPV4_PART}(?:\\.{_IPV4_PART}){{3}})(?::{_PORT})?"
    f"(?:/{_URL_CHARS}*)?(?:\\?{_URL_CHARS.replace('-]', '?-]')}*)?$"
)


SECRET_PATTERN = f"^{SECRET_PREFIX}{base64_pattern(*SECRET_BYTES)}$"
