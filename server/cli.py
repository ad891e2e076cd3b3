"""The ``herald`` command: ``herald serve`` and ``herald token`` here; the client
subcommands (topics, subscriptions, publish, consume, tail) come from the SDK's
``herald.cli.add_commands`` (client/herald/cli.py).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import importlib.metadata
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

import uvicorn

from herald.cli import add_commands as add_client_commands
from herald.cli import add_global_options as add_client_options
from server.cluster_cli import TRUST_FIELDS, add_trust_flags
from server.config import LOG_FORMATS, LOG_LEVELS, ConfigError, ServerConfig
from server.file_limit import raise_open_files_limit
from server.security_cli import (
    SECURITY_FIELDS,
    add_security_flags,
    add_token_command,
    configure_encryption,
    missing_encryption_keys,
    uvicorn_security_options,
)
from storage.lock import DataDirLock, DataDirLocked

# The hot paths allocate several GC-tracked objects per record (parsed request dicts,
# Records, in-flight entries); reference counting frees them, but with CPython's default
# thresholds (700, 10, 10) their allocation rate set off a full collection about every
# second under load, each scanning every live object for ~50 ms: about 5 us of server CPU
# per message (1.2 s of 200,000 messages) and the p99 latency spikes. Once started, the
# server freezes what startup created (modules, the app) out of the collector's sight and
# collects young objects far less often (then 0.12 s of collection for the same run).
# A young collection walks every object allocated since the last one that is still alive
# (cached Records, in-flight entries): at 50,000 that was a 20-36 ms stall of the loop
# (traced at 2,000 publishes/s); at 10,000 the passes take <= 4 ms for the same total
# collection CPU (middle collections: every 500,000 allocations instead of 1,000,000).
GC_THRESHOLDS = (10_000, 50, 20)


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


_SIGNAL_NAMES = {int(s): s.name for s in signal.Signals}
_log = logging.getLogger("herald.server")


class HeraldServer(uvicorn.Server):
    """uvicorn's server with Herald's SIGTERM order (PROTOCOL §3).

    uvicorn itself would close WebSockets with 1012 before the lifespan runs;
    Herald must close consumers with 1001 after persisting their cursors. So on
    shutdown: stop accepting, drain the app (pending appends, cursors, 1001),
    then let uvicorn finish the HTTP requests still running and run the
    lifespan shutdown, which closes Storage.
    """

    def __init__(self, config: uvicorn.Config, herald: ServerConfig) -> None:
        super().__init__(config)
        self.herald = herald

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Which signal, in the server's own log ("Shutting down" alone does not say
        # whether an operator, a supervisor or a terminal asked), logged from the loop:
        # written from the handler, it could interrupt a write to the same stream.
        again = " again: exiting now" if self.should_exit else ": shutting down"
        name = _SIGNAL_NAMES.get(sig, str(sig))
        try:
            asyncio.get_running_loop().call_soon_threadsafe(_log.info, "%s received%s", name, again)
        except RuntimeError:  # no loop running (yet)
            _log.info("%s received%s", name, again)
        super().handle_exit(sig, frame)
        # uvicorn re-raises a captured signal once shut down, so the process would die
        # "by SIGTERM". Herald's shutdown is complete and graceful then: exit 0.
        self._captured_signals = [
            s for s in self._captured_signals if s not in (signal.SIGTERM, signal.SIGINT)
        ]

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            tune_gc()
            # server/direct_publish.py: said once, so that a lost fast path shows.
            if getattr(self.config.loaded_app, "direct_route", None) is not None:
                _log.info("publishes are served below ASGI")
            else:
                _log.info(
                    "publishes go through the ASGI layers (a trusted proxy, or a layer "
                    "the direct route does not know)"
                )
            port = self.herald.port
            if port == 0 and self.servers and self.servers[0].sockets:
                port = self.servers[0].sockets[0].getsockname()[1]
            base = ServerConfig(host=self.herald.host, port=port).base_url
            if self.herald.tls_cert is not None:
                base = base.replace("http://", "https://", 1)
            print(f"Herald console: {base}/console", flush=True)
            print(f"Herald API:     {base}/v1  (OpenAPI: {base}/openapi.json)", flush=True)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # stop accepting before anything else
        app = _starlette_app(self.config.loaded_app)
        runtime = getattr(app.state, "runtime", None) if app is not None else None
        if runtime is not None and not self.force_exit:
            await runtime.drain()
            await self._wait_for_websockets(seconds=2.0)
        await super().shutdown(sockets)

    async def _wait_for_websockets(self, seconds: float) -> None:
        """Give the 1001 close frames a moment to leave before uvicorn sends its own."""
        ws_class = self.config.ws_protocol_class
        if ws_class is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            if not any(isinstance(c, ws_class) for c in self.server_state.connections):
                return
            await asyncio.sleep(0.02)


def _starlette_app(app: Any) -> Any:
    """The Starlette app under uvicorn's wrappers (proxy headers, message logger)."""
    for _ in range(8):
        if hasattr(app, "state"):
            return app
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None


# ------------------------------------------------------------------ serve


def add_serve_command(subparsers: argparse._SubParsersAction) -> None:
    defaults = ServerConfig()
    p = subparsers.add_parser("serve", help="run the Herald server")
    p.add_argument(
        "--host", help=f"interface to listen on (default {defaults.host}; env HERALD_HOST)"
    )
    p.add_argument("--port", type=int, help=f"TCP port (default {defaults.port}; env HERALD_PORT)")
    p.add_argument(
        "--data-dir", help=f"data directory (default {defaults.data_dir}; env HERALD_DATA_DIR)"
    )
    p.add_argument(
        "--no-auto-create",
        dest="auto_create",
        action="store_const",
        const=False,
        help="publishing to or subscribing on a missing topic answers 404 (env HERALD_AUTO_CREATE=0)",
    )
    p.add_argument("--max-request-bytes", type=int, help=f"default {defaults.max_request_bytes}")
    p.add_argument("--max-message-bytes", type=int, help=f"default {defaults.max_message_bytes}")
    p.add_argument(
        "--log-format", choices=LOG_FORMATS, help="text (default) or json, one object per line"
    )
    p.add_argument("--log-level", choices=LOG_LEVELS, help="default info")
    p.add_argument(
        "--access-log", action="store_const", const=True, help="log one line per request"
    )
    p.add_argument(
        "--retention-interval",
        dest="retention_interval_s",
        type=float,
        help="seconds between retention passes",
    )
    p.add_argument(
        "--segment-bytes",
        type=int,
        help=f"roll a partition to a new segment past this size; retention deletes whole "
        f"segments (default {defaults.segment_bytes}; env HERALD_SEGMENT_BYTES)",
    )
    p.add_argument(
        "--flush-interval",
        dest="flush_interval_s",
        type=float,
        help="seconds between fsyncs of acks=1 data (default 1; 0 = only when needed)",
    )
    p.add_argument(
        "--shutdown-timeout",
        dest="shutdown_timeout_s",
        type=float,
        help="grace for running requests on SIGTERM",
    )
    p.add_argument(
        "--ws-ping-interval",
        type=float,
        help=f"seconds between WebSocket pings (default {defaults.ws_ping_interval:g}; "
        "env HERALD_WS_PING_INTERVAL)",
    )
    p.add_argument(
        "--ws-ping-timeout",
        type=float,
        help=f"seconds a WebSocket peer has to answer a ping (default "
        f"{defaults.ws_ping_timeout:g}; env HERALD_WS_PING_TIMEOUT)",
    )
    p.add_argument(
        "--cpus",
        help="pin the server's threads to these CPUs, e.g. 0 or 0,2-3 (env HERALD_CPUS; "
        "default: not pinned). The event loop and the writer threads then hand off "
        "without waking another CPU; see docs/protocol.md",
    )
    p.add_argument(
        "--node-id",
        help=f"this node's id in GET /v1/cluster (default {defaults.node_id}; env HERALD_NODE_ID)",
    )
    p.add_argument(
        "--max-topics",
        type=int,
        help=f"topics at most, the whole cluster's; one more is 409 limit_exceeded "
        f"(default {defaults.max_topics}; env HERALD_MAX_TOPICS)",
    )
    p.add_argument(
        "--max-open-files",
        type=int,
        help="descriptors the partitions' files may keep open; idle partitions close "
        "theirs (default 0: half the open-files limit, less headroom; env "
        "HERALD_MAX_OPEN_FILES)",
    )
    cluster = p.add_argument_group("cluster (PROTOCOL §7; without --cluster: one node)")
    cluster.add_argument(
        "--cluster",
        metavar="URL[,URL...]",
        help="join the cluster whose state is in etcd at these client URLs (env HERALD_CLUSTER)",
    )
    cluster.add_argument(
        "--advertise-url",
        help="how the other nodes reach this one (default http://HOST:PORT, https:// "
        "with --tls-cert; env HERALD_ADVERTISE_URL)",
    )
    cluster.add_argument(
        "--cluster-name",
        help=f"the cluster's name in etcd (default {defaults.cluster_name}; env HERALD_CLUSTER_NAME)",
    )
    cluster.add_argument(
        "--node-ttl-ms",
        type=int,
        help=f"this node's etcd lease: a dead leader is replaced within it + 2 s "
        f"(default {defaults.node_ttl_ms}; env HERALD_NODE_TTL_MS)",
    )
    cluster.add_argument(
        "--replica-lag-ms",
        type=int,
        help=f"a follower this far behind leaves the in-sync replicas "
        f"(default {defaults.replica_lag_ms}; env HERALD_REPLICA_LAG_MS)",
    )
    cluster.add_argument(
        "--etcd-history-s",
        type=float,
        help=f"seconds of etcd history kept; older revisions are compacted "
        f"(default {defaults.etcd_history_s:g}; env HERALD_ETCD_HISTORY_S)",
    )
    add_trust_flags(cluster)
    add_security_flags(p)
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from server.audit import configure_audit  # imported here so client commands start fast
    from server.logging import configure_logging

    overrides = {
        name: getattr(args, name, None)
        for name in (
            "host",
            "port",
            "data_dir",
            "auto_create",
            "max_request_bytes",
            "max_message_bytes",
            "log_format",
            "log_level",
            "access_log",
            "retention_interval_s",
            "segment_bytes",
            "flush_interval_s",
            "shutdown_timeout_s",
            "ws_ping_interval",
            "ws_ping_timeout",
            "cpus",
            "node_id",
            "cluster",
            "advertise_url",
            "cluster_name",
            "node_ttl_ms",
            "replica_lag_ms",
            "etcd_history_s",
            "max_topics",
            "max_open_files",
            *SECURITY_FIELDS,
            *TRUST_FIELDS,
        )
    }
    allow_cidrs: list[str] | None = overrides.get("webhook_allow_cidr")
    if allow_cidrs is not None:  # repeatable: one string
        overrides["webhook_allow_cidr"] = ",".join(allow_cidrs)
    try:
        config = ServerConfig.from_env(**overrides)
    except (ConfigError, TypeError, ValueError) as exc:
        print(f"herald serve: {exc}", file=sys.stderr)
        return 2
    if (cpus := config.pinned_cpus) is not None:
        # Before any thread starts: the writers, executors and uvicorn inherit it.
        os.sched_setaffinity(0, cpus)
    configure_logging(config.log_format, config.log_level)
    configure_audit(config.audit_log)
    if (problem := configure_encryption(config)) is not None:
        print(f"herald serve: {problem}", file=sys.stderr)
        return 2
    if config.clustered:
        from server.cluster_trust import etcd_access, trust_problem
        from server.etcd_check import unreachable

        if (problem := trust_problem(config)) is not None:
            print(f"herald serve: {problem}", file=sys.stderr)
            return 2
        if (problem := unreachable(config.etcd_endpoints, etcd_access(config))) is not None:
            print(f"herald serve: {problem}", file=sys.stderr)
            return 1
    # The port first, then the data directory's lock, then recovery (in the lifespan): a
    # start on a busy port touches no data, and a second server on a directory in use
    # exits having read nothing of it.
    try:
        listener = listen(config.host, config.port)
    except OSError as exc:
        print(f"herald serve: {exc}", file=sys.stderr)
        return 1
    try:
        data_lock = DataDirLock.acquire(config.data_dir)
    except DataDirLocked as exc:
        listener.close()
        print(f"herald serve: {exc}", file=sys.stderr)
        return 1
    try:
        # Before recovery: a key the log needs and the configured keys lack would only
        # show at read time, as 503s (storage/key_check.py).
        if (problem := missing_encryption_keys(config)) is not None:
            listener.close()
            print(f"herald serve: {problem}", file=sys.stderr)
            return 2
        # PROTOCOL §6: before recovery opens the partitions' files and clients connect.
        raise_open_files_limit()
        return _serve(config, listener, data_lock)
    finally:
        data_lock.release()


def _serve(config: ServerConfig, listener: socket.socket, data_lock: DataDirLock) -> int:
    from server.app import create_app
    from server.auth import AuthFileError
    from server.websocket_protocol import LeanWebSocketProtocol

    try:
        app = create_app(config, data_lock=data_lock)
    except AuthFileError as exc:
        listener.close()
        print(f"herald serve: auth file: {exc}", file=sys.stderr)
        return 2
    uv_config = uvicorn.Config(
        app,
        # Said, not guessed: the app's __call__ returns its layers' call instead of being a
        # coroutine function (server/app.py), which uvicorn would take for ASGI 2.
        interface="asgi3",
        host=config.host,
        port=config.port,
        loop="uvloop",
        # The websockets library through its sans-I/O protocol (uvicorn deprecated its
        # legacy `websockets` implementation), holding less per idle connection.
        ws=LeanWebSocketProtocol,
        lifespan="on",
        log_config=None,  # configure_logging already routed uvicorn's loggers
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=int(config.shutdown_timeout_s),
        ws_ping_interval=config.ws_ping_interval,  # PROTOCOL §3: a consumer missing pings
        ws_ping_timeout=config.ws_ping_timeout,  # is dropped and its in-flight given back
        **uvicorn_security_options(config),  # TLS, frame and idle caps (PROTOCOL §6)
    )
    server = HeraldServer(uv_config, config)
    server.run(sockets=[listener])
    # uvicorn leaves a failed startup (data dir unusable) with started False.
    return 0 if server.started else 1


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before recovery starts (as uvicorn would bind
    it, after). Raises OSError with a message that says what to change."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise OSError(
                exc.errno,
                f"cannot listen on {host}:{port}: address already in use (another server "
                "has that port); choose another with --port or HERALD_PORT, e.g. "
                f"`herald serve --port {port + 1}`",
            ) from None
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


# ------------------------------------------------------------------ parser


def _version() -> str:
    """The installed application's version and the SDK's (they ship apart)."""
    import herald

    try:
        server = importlib.metadata.version("herald")
    except importlib.metadata.PackageNotFoundError:
        server = "unknown (not installed)"
    return f"{server} (herald-client {herald.__version__})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="herald", description="Herald push-delivery pub/sub")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    add_client_options(parser)  # --url, --token before the subcommand
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_command(subparsers)
    add_token_command(subparsers)
    add_client_commands(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
