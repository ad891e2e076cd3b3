"""The server's own settings: where it listens, where its data lives, its limits.

Every field has a default, can be set from a ``HERALD_<FIELD>`` environment
variable, and is overridden by the matching ``herald serve`` flag (cli.py).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIB = 1024 * 1024

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """A setting (flag or environment variable) that cannot be used."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"  # PROTOCOL §6: open servers listen on loopback only
    port: int = 8080
    data_dir: Path = Path("./herald-data")
    auto_create: bool = True  # PROTOCOL §1 Auto-create
    max_request_bytes: int = 64 * MIB  # PROTOCOL §2 payload_too_large
    max_message_bytes: int = 1 * MIB  # PROTOCOL §2 message_too_large
    max_read_bytes: int = 16 * MIB  # soft cap of one read response (>= 1 record always)
    log_format: str = "text"
    log_level: str = "info"
    access_log: bool = False  # one line per request; off so hot paths do not pay for it
    retention_interval_s: float = 60.0  # how often whole expired segments are deleted
    # A partition rolls to a new segment past this size; retention deletes whole closed
    # segments, so it is also the granularity of retention (as Kafka's segment.bytes).
    segment_bytes: int = 128 * MIB
    # acks=1 appends reach the disk within this many seconds even when no acks=all
    # append forces an fsync (as Redis's appendfsync everysec); 0 turns it off.
    flush_interval_s: float = 1.0
    shutdown_timeout_s: float = 10.0  # grace for in-flight requests on SIGTERM
    max_pending_unacked_publishes: int = 256  # acks=0 batches being appended at once
    # PROTOCOL §6 (server/auth.py): without an auth file the server is open.
    auth_file: Path | None = None
    audit_log: Path | None = None  # JSON lines of server/audit.py; None: the server log
    tls_cert: Path | None = None
    tls_key: Path | None = None
    webhook_ca_file: Path | None = None  # extra CA bundle webhook deliveries trust
    # PROTOCOL §6: with an auth file, the non-public ranges webhooks may reach anyway,
    # comma-separated CIDRs (--webhook-allow-cidr, repeatable).
    webhook_allow_cidr: str = ""
    # PROTOCOL §6: topics at most (the whole cluster's, counted in etcd); past it a
    # creation, explicit or automatic, is 409 limit_exceeded.
    max_topics: int = 10_000
    # Descriptors the partitions' segment files may keep open (idle partitions close
    # theirs and open them again on use); 0: half the open-files limit less headroom
    # (server/file_limit.py), the rest is for sockets.
    max_open_files: int = 0
    # Requests + WebSockets at once per client address (server/limits.py); 0 = no cap.
    max_requests_per_client: int = 256
    # Proxies whose X-Forwarded-For names the client (uvicorn's forwarded_allow_ips):
    # comma-separated IP addresses or networks, or "*"; "" trusts no proxy.
    forwarded_allow_ips: str = ""
    # Browser origins allowed to call the HTTP API (CORS), comma-separated
    # ("https://app.example,http://localhost:5173" or "*"); "" allows none.
    cors_origins: str = ""
    body_timeout_s: float = 10.0  # a request body that stalls this long gets 408
    body_deadline_s: float = 60.0  # ... and one not whole this long after it began
    header_timeout_s: float = 10.0  # a connection must send a request's headers within this
    encryption_key_file: Path | None = None  # storage/encryption.py; or HERALD_ENCRYPTION_KEY
    ws_ping_interval: float = 20.0  # PROTOCOL §3: consumers are pinged every 20 s ...
    ws_ping_timeout: float = 20.0  # ... and dropped when the pong is 20 s late
    # CPUs the server's threads are pinned to ("0", "0,2", "1-3"); "" leaves them to the
    # scheduler. See pinned_cpus.
    cpus: str = ""
    # PROTOCOL §7: this node's id in GET /v1/cluster (and, in a cluster, in etcd).
    node_id: str = "local"
    # PROTOCOL §7 cluster mode: etcd's client URLs, comma-separated ("" = a single node).
    cluster: str = ""
    advertise_url: str = ""  # how the other nodes reach this one ("" = base_url)
    cluster_name: str = "herald"
    node_ttl_ms: int = 5000  # this node's etcd lease: how soon a dead leader is replaced
    replica_lag_ms: int = 10000  # a follower this far behind leaves the ISR
    etcd_history_s: float = 300.0  # etcd's history kept; older revisions are compacted
    # With credentials, the token nodes present to each other (env HERALD_CLUSTER_TOKEN
    # only: a flag would show it in `ps`); it needs the admin role.
    cluster_token: str = ""
    # PROTOCOL §7 with a closed etcd (docs/security.md, cluster/etcd_access.py): etcd's
    # user and password (the password from HERALD_ETCD_PASSWORD; never logged), the CA
    # etcd's certificate is verified with, and this node's client certificate.
    etcd_user: str = ""
    etcd_password: str = dataclasses.field(default="", repr=False)
    etcd_ca_file: Path | None = None
    etcd_cert_file: Path | None = None
    etcd_key_file: Path | None = None
    # The key file all nodes share (lines <id>:<base64 32 bytes>, as the encryption key
    # file): seals push secrets in etcd and lets nodes prove themselves to each other
    # (cluster/trust.py). Without it the encryption keys serve.
    cluster_secret_file: Path | None = None
    peer_ca_file: Path | None = None  # the CA other nodes' https:// certificates chain to

    def __post_init__(self) -> None:
        self._check_serving()
        self._check_limits()
        self._check_cluster()

    def _check_serving(self) -> None:
        """Logging, the listening socket, TLS, HTTP timeouts and who may connect."""
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format must be one of {', '.join(LOG_FORMATS)}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}")
        if not 0 <= self.port <= 65535:
            raise ConfigError("port must be in 0..65535")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert and tls_key go together")
        self.trusted_proxies  # noqa: B018 (validates)
        self.allowed_origins  # noqa: B018 (validates)
        if self.body_timeout_s <= 0 or self.body_deadline_s <= 0:
            raise ConfigError("body_timeout_s and body_deadline_s must be positive")
        if self.ws_ping_interval <= 0 or self.ws_ping_timeout <= 0:
            raise ConfigError("ws_ping_interval and ws_ping_timeout must be positive")
        self.pinned_cpus  # noqa: B018 (validates)
        self.webhook_allowed_networks  # noqa: B018 (validates)

    def _check_limits(self) -> None:
        """Sizes, counts and caps (PROTOCOL §6)."""
        if self.max_message_bytes < 1 or self.max_request_bytes < 1:
            raise ConfigError("size limits must be positive")
        if not 64 * 1024 <= self.segment_bytes <= 4 * 1024 * MIB - 1:
            raise ConfigError("segment_bytes must be in 65536..4294967295")
        if self.max_pending_unacked_publishes < 1:
            raise ConfigError("max_pending_unacked_publishes must be positive")
        if self.max_topics < 1:
            raise ConfigError("max_topics must be positive")
        if self.max_open_files < 0:
            raise ConfigError("max_open_files must be 0 (derived from the limit) or more")
        if self.max_requests_per_client < 0:
            raise ConfigError("max_requests_per_client must be 0 (no cap) or more")

    def _check_cluster(self) -> None:
        """This node's name and address, etcd and its credentials."""
        if not NODE_ID.fullmatch(self.node_id):
            raise ConfigError(
                f"node_id must match {NODE_ID.pattern} (letters, digits, '.', '_', '-'), "
                f"not {self.node_id!r}"
            )
        self.etcd_endpoints  # noqa: B018 (validates)
        if not NODE_ID.fullmatch(self.cluster_name):
            raise ConfigError(f"cluster_name must match {NODE_ID.pattern}")
        if not 1000 <= self.node_ttl_ms <= 600_000:
            raise ConfigError("node_ttl_ms must be in 1000..600000")
        if not 100 <= self.replica_lag_ms <= 3_600_000:
            raise ConfigError("replica_lag_ms must be in 100..3600000")
        if not 1 <= self.etcd_history_s <= 86_400:
            raise ConfigError("etcd_history_s must be in 1..86400")
        if (self.etcd_cert_file is None) != (self.etcd_key_file is None):
            raise ConfigError("etcd_cert_file and etcd_key_file go together")
        if self.etcd_password and not self.etcd_user:
            raise ConfigError("an etcd password needs an etcd user (--etcd-user)")
        if self.advertise_url and not re.fullmatch(r"https?://[^/\s]+", self.advertise_url):
            raise ConfigError(
                f"advertise_url must be http(s)://host:port, not {self.advertise_url!r}"
            )

    @property
    def etcd_endpoints(self) -> list[str]:
        """``cluster`` as a list of etcd client URLs (empty: a single node)."""
        urls = [u.strip().rstrip("/") for u in self.cluster.split(",") if u.strip()]
        for url in urls:
            if not re.fullmatch(r"https?://[^/\s]+", url):
                raise ConfigError(
                    f"--cluster takes etcd URLs such as http://127.0.0.1:2379, not {url!r}"
                )
        return urls

    @property
    def clustered(self) -> bool:
        return bool(self.cluster.strip())

    @property
    def node_url(self) -> str:
        """The URL the other nodes use for this one: https:// when it serves TLS."""
        if self.advertise_url:
            return self.advertise_url
        if self.tls_cert is not None:
            return self.base_url.replace("http://", "https://", 1)
        return self.base_url

    @property
    def pinned_cpus(self) -> frozenset[int] | None:
        """``cpus`` as a set of CPU numbers (None: not pinned).

        With the GIL one thread at a time runs Python, so pinning every thread of the
        server to one CPU costs little parallelism, and on small VMs it halves each hand-off
        between the event loop and a writer thread: a one-record append round trip took
        144-155 us of CPU unpinned and 60-78 us pinned on this project's 2-core VM, where
        a wake-up on another CPU is expensive.
        """
        if not self.cpus.strip():
            return None
        chosen: set[int] = set()
        try:
            for part in self.cpus.split(","):
                low, _, high = part.strip().partition("-")
                first, last = int(low), int(high or low)
                if first < 0 or last < first:
                    raise ValueError
                chosen.update(range(first, last + 1))
        except ValueError:
            raise ConfigError(
                f"cpus must be a list of CPU numbers and ranges such as 0 or 0,2-3, "
                f"not {self.cpus!r}"
            ) from None
        available = os.sched_getaffinity(0)
        if not chosen <= available:
            missing = ",".join(str(c) for c in sorted(chosen - available))
            raise ConfigError(f"cpus {missing} are not available to this process")
        return frozenset(chosen)

    @property
    def trusted_proxies(self) -> list[str]:
        """``forwarded_allow_ips`` as uvicorn takes it: ``[]`` when no proxy is trusted."""
        entries = [e.strip() for e in self.forwarded_allow_ips.split(",") if e.strip()]
        for entry in entries:
            if entry == "*":
                continue
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ConfigError(
                    f"forwarded_allow_ips must list IP addresses or networks (or *), not {entry!r}"
                ) from None
        return entries

    @property
    def webhook_allowed_networks(self) -> tuple[Any, ...]:
        """``webhook_allow_cidr`` as IP networks."""
        from subscribers.destination import parse_networks

        try:
            return parse_networks(e for e in self.webhook_allow_cidr.split(",") if e.strip())
        except ValueError as exc:
            raise ConfigError(f"webhook_allow_cidr: {exc}") from None

    @property
    def allowed_origins(self) -> list[str]:
        """``cors_origins`` as a list: each ``*`` or ``scheme://host[:port]`` (an origin
        as browsers send it: no path, no trailing slash)."""
        entries = [e.strip() for e in self.cors_origins.split(",") if e.strip()]
        for entry in entries:
            if entry != "*" and not _ORIGIN.fullmatch(entry):
                raise ConfigError(
                    f"cors_origins must list origins such as https://app.example or "
                    f"http://localhost:5173 (or *), not {entry!r}"
                )
        return entries

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> ServerConfig:
        """Defaults, then ``HERALD_*`` variables, then ``overrides`` (flags; None = not given)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(f"HERALD_{f.name.upper()}")
            if raw is not None and raw != "":
                values[f.name] = _convert(f.name, raw, cls._field_type(f.name))
        values.update({k: v for k, v in overrides.items() if v is not None})
        for name in _PATH_FIELDS:
            if values.get(name) is not None:
                values[name] = Path(values[name])
        return cls(**values)

    @staticmethod
    def _field_type(name: str) -> type:
        default = getattr(ServerConfig(), name)
        return Path if name in _PATH_FIELDS else type(default)


_PATH_FIELDS = (
    "data_dir",
    "auth_file",
    "audit_log",
    "tls_cert",
    "tls_key",
    "webhook_ca_file",
    "encryption_key_file",
    "etcd_ca_file",
    "etcd_cert_file",
    "etcd_key_file",
    "cluster_secret_file",
    "peer_ca_file",
)


def _convert(name: str, raw: str, kind: type) -> Any:
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ConfigError(f"HERALD_{name.upper()} must be a boolean, not {raw!r}")
    if kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            raise ConfigError(f"HERALD_{name.upper()} must be a number, not {raw!r}") from None
    return kind(raw)
