"""A TCP link the test can cut: ``Link(target_port).start()`` listens on a free loopback
port and pipes every connection to the target; ``cut()`` drops every byte both ways
(connections stay open, unanswered — a partition, not a refusal), ``heal()`` closes the
held connections so clients reconnect through a working link. Used to cut one node off
from etcd while the others still reach it. ``freeze_watches()`` holds back only what etcd
sends on its watch streams (``/v3/watch``) until ``thaw_watches()``: the node's view of
etcd lags while its lease renewals and reads still pass."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.conftest import free_port


class Link:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target = (host, target_port)
        self.port = free_port()
        self._cut = threading.Event()
        self._thawed = threading.Event()
        self._thawed.set()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._server: socket.socket | None = None
        self._closed = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Link:
        server = socket.create_server((self.host, self.port), reuse_port=False)
        self._server = server
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def cut(self) -> None:
        self._cut.set()

    def freeze_watches(self) -> None:
        self._thawed.clear()

    def thaw_watches(self) -> None:
        self._thawed.set()

    def heal(self) -> None:
        self._cut.clear()
        self._close_all()

    def close(self) -> None:
        self._closed = True
        self._thawed.set()
        if self._server is not None:
            self._server.close()
        self._close_all()

    def _close_all(self) -> None:
        with self._lock:
            held, self._sockets = self._sockets, set()
        for s in held:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _accept(self) -> None:
        assert self._server is not None
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, upstream}
            watch = threading.Event()  # set once the client asked for a watch stream
            threading.Thread(target=self._pump, args=(client, upstream, watch), daemon=True).start()
            threading.Thread(
                target=self._pump, args=(upstream, client, watch, True), daemon=True
            ).start()

    def _pump(
        self,
        source: socket.socket,
        sink: socket.socket,
        watch: threading.Event,
        from_upstream: bool = False,
    ) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if not from_upstream and b"/v3/watch" in data:
                    watch.set()
                if self._cut.is_set():
                    continue  # dropped: nothing reaches the other side
                if from_upstream and watch.is_set():
                    self._thawed.wait()  # held back while watches are frozen
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._sockets -= {source, sink}
