"""The security side of the ``herald`` command: serve flags and ``herald token create``.

Kept apart from cli.py so ``herald serve`` reads as the server's settings and
this file as PROTOCOL §6's: credentials, TLS, the audit log.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from server.auth import ROLES, new_signing_key_line, new_token, toml_entry
from server.config import ServerConfig
from server.http_protocol import guarded_protocol
from storage import encryption

SECURITY_FIELDS = (
    "auth_file",
    "audit_log",
    "tls_cert",
    "tls_key",
    "webhook_ca_file",
    "webhook_allow_cidr",
    "encryption_key_file",
    "max_requests_per_client",
    "forwarded_allow_ips",
    "cors_origins",
)

# A WebSocket frame larger than this is refused by uvicorn (close 1009); consumer
# frames (credit, ack, nack, extend) are small, so 1 MiB leaves ample room.
WS_MAX_FRAME_BYTES = 1024 * 1024
# Idle keep-alive connections are closed after this many seconds.
KEEP_ALIVE_TIMEOUT_S = 5


class _JoinOrigins(argparse.Action):
    """``--cors-origin A --cors-origin B`` -> ``"A,B"`` (the config's comma-separated form)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        previous = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, f"{previous},{values}" if previous else str(values))


def add_security_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--auth-file",
        type=Path,
        help="TOML credentials file (PROTOCOL §6); without it the server is open (env HERALD_AUTH_FILE)",
    )
    p.add_argument("--audit-log", type=Path, help="append audit entries (JSON lines) to this file")
    p.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve HTTPS and WSS")
    p.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    p.add_argument(
        "--webhook-ca-file",
        type=Path,
        help="PEM CA bundle webhook deliveries trust besides the system's",
    )
    p.add_argument(
        "--webhook-allow-cidr",
        action="append",
        metavar="CIDR",
        help="with --auth-file, let webhooks reach this non-public range too (repeatable; "
        "env HERALD_WEBHOOK_ALLOW_CIDR, comma-separated), e.g. 10.1.0.0/16",
    )
    p.add_argument(
        "--encryption-key-file",
        type=Path,
        help="encrypt segment payloads at rest with these keys (lines <id>:<base64 32 bytes>; "
        "or env HERALD_ENCRYPTION_KEY)",
    )
    p.add_argument(
        "--max-requests-per-client",
        type=int,
        metavar="N",
        help="requests and WebSockets at once per client address; over it HTTP answers 429 "
        "and a WebSocket is closed 1013 (default 256; 0 = no cap; "
        "env HERALD_MAX_REQUESTS_PER_CLIENT)",
    )
    p.add_argument(
        "--forwarded-allow-ips",
        metavar="LIST",
        help="reverse proxies trusted to name the client in X-Forwarded-For (and the scheme "
        "in X-Forwarded-Proto): comma-separated IP addresses or networks, or *; the "
        "per-client cap, audit log and access log then use the address the proxy names "
        "(default: none trusted; env HERALD_FORWARDED_ALLOW_IPS)",
    )
    p.add_argument(
        "--cors-origin",
        dest="cors_origins",
        action=_JoinOrigins,
        metavar="ORIGIN",
        help="a browser origin allowed to call the HTTP API (CORS), e.g. https://app.example; "
        "repeat for several, or * for any (default: none; env HERALD_CORS_ORIGINS, "
        "comma-separated)",
    )


def configure_encryption(config: ServerConfig) -> str | None:
    """Sets storage's keyring before Storage opens; an error message, or None when fine."""
    try:
        encryption.configure(encryption.Keyring.load(config.encryption_key_file))
    except (OSError, encryption.KeyFileError) as exc:
        return f"encryption key: {exc}"
    return None


def missing_encryption_keys(config: ServerConfig) -> str | None:
    """Once the data directory is ours: a message naming a key the log needs and the
    configured keys lack (a read of its batches would answer 503), or None."""
    from storage.key_check import key_ids_needed

    needed = key_ids_needed(config.data_dir)
    keyring = encryption.current()
    have = set(keyring.keys) if keyring is not None else set()
    missing = sorted(set(needed) - have)
    if not missing:
        return None
    key_id = missing[0]
    configured = (
        f"the configured keys ({', '.join(map(str, sorted(have)))}) do not include it"
        if have
        else "no encryption key is configured"
    )
    return (
        f"encryption key: the log needs key id {key_id} (e.g. {needed[key_id]}) and "
        f"{configured}; add its line (`{key_id}:<base64 key>`) to --encryption-key-file "
        f"or HERALD_ENCRYPTION_KEY (missing: {', '.join(map(str, missing))})"
    )


def uvicorn_security_options(config: ServerConfig) -> dict[str, Any]:
    options: dict[str, Any] = {
        "http": guarded_protocol(config.header_timeout_s),  # httptools + header deadline
        "ws_max_size": WS_MAX_FRAME_BYTES,
        "timeout_keep_alive": KEEP_ALIVE_TIMEOUT_S,
        # X-Forwarded-For / -Proto are read only from proxies the operator trusts
        # (uvicorn's own default would trust 127.0.0.1 without being asked).
        "proxy_headers": bool(config.trusted_proxies),
        "forwarded_allow_ips": config.trusted_proxies or None,
    }
    if config.tls_cert is not None:
        options["ssl_certfile"] = str(config.tls_cert)
        options["ssl_keyfile"] = str(config.tls_key)
    return options


def add_token_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("token", help="manage credentials of the auth file")
    commands = p.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = commands.add_parser(
        "create",
        help="make a new token: the token goes to stderr, the auth-file lines (its hash) "
        "to stdout, so `herald token create … >> auth.toml` writes only the lines",
    )
    create.add_argument(
        "--role",
        action="append",
        choices=ROLES,
        required=True,
        help="repeat for several roles",
    )
    create.add_argument(
        "--topics",
        action="append",
        default=[],
        help="topic name pattern for publish/subscribe (orders.*); repeat or comma-separate",
    )
    create.set_defaults(func=run_token_create)
    signing = commands.add_parser(
        "signing-key",
        help="print a [browser_tokens] section with a new signing key for browser tokens "
        "(`herald token signing-key >> auth.toml`; to rotate, add the key under "
        "browser_tokens.keys by hand and make it active)",
    )
    signing.add_argument("--id", default="k1", help="the key id (1-32 of A-Za-z0-9_-)")
    signing.set_defaults(func=run_signing_key)
    key = subparsers.add_parser("encryption-key", help="print a new encryption key line")
    key.add_argument("--id", type=int, default=1, help="key id 1..65535 (higher than the last)")
    key.set_defaults(func=lambda args: print(encryption.new_key_line(args.id)) or 0)


def run_signing_key(args: argparse.Namespace) -> int:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", args.id):
        print("herald token signing-key: --id is 1-32 of A-Za-z0-9_-", file=sys.stderr)
        return 2
    print(new_signing_key_line(args.id), end="")
    return 0


def run_token_create(args: argparse.Namespace) -> int:
    roles = list(dict.fromkeys(args.role))
    topics = [t.strip() for item in args.topics for t in item.split(",") if t.strip()]
    if {"publish", "subscribe"} & set(roles) and not topics:
        print("herald token create: publish/subscribe need --topics", file=sys.stderr)
        return 2
    token_id, token = new_token()
    # The secret and the file's lines go apart: `… >> auth.toml` must never put the
    # plaintext token into the auth file (it would not parse, and it is the secret).
    print(f"token: {token}", file=sys.stderr)
    print(
        "# shown once, on stderr: hand it to the service through your secret store.\n"
        "# stdout has only the auth-file lines (its hash): append them to the auth file,\n"
        "# e.g. `herald token create … >> auth.toml`; the server reloads it on change.",
        file=sys.stderr,
    )
    sys.stderr.flush()
    print(toml_entry(token_id, token, roles, topics), end="")
    return 0
