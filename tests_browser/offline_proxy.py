"""A TCP proxy with an offline switch: what a page does when the network goes away.

    proxy = OfflineProxy(backend_port)   # listens on 127.0.0.1:<free port>, forwards to the backend
    row.open(proxy.url)
    proxy.offline = True                 # live connections are reset, new ones are reset at once
    proxy.offline = False                # connections go through again
    proxy.close()

    OfflineProxy(backend_port, bytes_per_second=10e6)   # also a link of that speed (bench/page.py)

Offline must look to the browser like a network failure, not like an HTTP error status: a
navigation fails (net::ERR_CONNECTION_RESET in Chromium) and fetch() rejects with a TypeError,
exactly as with the network unplugged. So while offline the proxy accepts each connection and
resets it (SO_LINGER 0, then close: an RST instead of an orderly FIN); it knows nothing about HTTP.
Each proxy is its own origin (its own port), hence its own HTTP cache, Cache Storage and service
worker in the browser.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

_LINGER_0 = struct.pack("ii", 1, 0)  # SO_LINGER on with 0 s: close() sends RST, drops unsent data


class OfflineProxy:
    def __init__(self, backend_port: int, backend_host: str = "127.0.0.1", bytes_per_second: float | None = None):
        self._backend = (backend_host, backend_port)
        self._rate = _Rate(bytes_per_second) if bytes_per_second else None
        self._offline = False
        self._links: set[_Link] = set()
        self._lock = threading.Lock()  # guards _offline and _links, and orders kills and closes
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/"
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"offline-proxy {self.url}",
                                          daemon=True)
        self._acceptor.start()

    @property
    def offline(self) -> bool:
        return self._offline

    @offline.setter
    def offline(self, value: bool) -> None:
        with self._lock:
            self._offline = bool(value)
            if self._offline:
                for link in self._links:
                    link.kill()

    def close(self) -> None:
        self.offline = True  # resets every live connection
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone would not
        except OSError:
            pass
        self._acceptor.join(10)
        self._listener.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # close() shut the listener down
            try:
                backend = None if self._offline else socket.create_connection(self._backend, timeout=10)
            except OSError:
                backend = None  # backend down: the browser sees a failed connection, as offline
            with self._lock:
                if backend is None or self._offline:
                    for sock in (client, backend):
                        if sock is not None:
                            _reset(sock)
                    continue
                backend.settimeout(None)
                link = _Link(client, backend, self._rate)
                self._links.add(link)
            threading.Thread(target=self._run, args=(link,), daemon=True).start()

    def _run(self, link: _Link) -> None:
        link.pump_both_ways()
        with self._lock:  # not while the offline setter is killing this link's sockets
            self._links.discard(link)
            link.client.close()
            link.backend.close()


class _Link:
    """One browser connection and its backend connection."""

    def __init__(self, client: socket.socket, backend: socket.socket, rate: _Rate | None = None):
        self.client, self.backend = client, backend
        self.killed = False
        self.rate = rate

    def pump_both_ways(self) -> None:
        upstream = threading.Thread(target=self._pump, args=(self.client, self.backend), daemon=True)
        upstream.start()
        self._pump(self.backend, self.client)
        upstream.join()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(1 << 16):
                if self.rate is not None and src is self.backend:
                    self.rate.take(len(chunk))        # the responses share one link of that speed
                dst.sendall(chunk)
            if not self.killed:
                dst.shutdown(socket.SHUT_WR)  # pass the end of the stream on (HTTP/1.0 responses end so)
        except OSError:
            self.kill()  # one side failed (the browser aborted a download...): end the other side too

    def kill(self) -> None:
        """Make both connections fail. shutdown() wakes the pump threads blocked in recv() or
        sendall() (close() from another thread would not); the browser may get a FIN just before
        the RST that closing with SO_LINGER 0 then sends: either way a request in flight fails
        with a network error (a truncated body, or no response at all)."""
        self.killed = True
        for sock in (self.client, self.backend):
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its peer or by us


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset: the peer sees a connection error, not an orderly end."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
    except OSError:
        pass
    sock.close()


class _Rate:
    """One link's speed, shared by every connection: each chunk waits for its turn."""

    def __init__(self, bytes_per_second: float):
        self.bytes_per_second = bytes_per_second
        self._lock = threading.Lock()
        self._free_at = time.monotonic()    # when the link has sent everything taken so far

    def take(self, size: int) -> None:
        with self._lock:
            now = time.monotonic()
            self._free_at = max(now, self._free_at) + size / self.bytes_per_second
            wait = self._free_at - now
        time.sleep(wait)
