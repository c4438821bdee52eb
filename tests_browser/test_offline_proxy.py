"""tests_browser/offline_proxy.py without a browser: bytes pass through intact while online;
offline, every connection fails as a network error (never an HTTP status); online again works.

Run:  .venv/bin/python -m pytest tests_browser/test_offline_proxy.py -v
"""
from __future__ import annotations

import functools
import hashlib
import http.client
import http.server
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offline_proxy import OfflineProxy

BIG = 50 * 1024 * 1024
NETWORK_FAILURES = (urllib.error.URLError, ConnectionError, http.client.IncompleteRead)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    """An http.server over a directory with a small and a 50 MB file: (port, sha256 of the big one)."""
    root = tmp_path_factory.mktemp("backend")
    (root / "hello.txt").write_text("hello through the proxy\n")
    big = bytes(range(256)) * (BIG // 256)
    (root / "big.bin").write_bytes(big)
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], hashlib.sha256(big).hexdigest()
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(backend):
    p = OfflineProxy(backend[0])
    try:
        yield p
    finally:
        p.close()


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def assert_network_failure(url: str) -> None:
    with pytest.raises(NETWORK_FAILURES) as failure:
        fetch(url)
    assert not isinstance(failure.value, urllib.error.HTTPError), "an HTTP status, not a network failure"


def test_online_forwards_and_offline_fails_as_a_network_error(proxy):
    assert proxy.url.startswith("http://127.0.0.1:")
    assert fetch(proxy.url + "hello.txt") == b"hello through the proxy\n"
    proxy.offline = True
    assert proxy.offline
    for _ in range(3):  # every new connection, not just the first
        assert_network_failure(proxy.url + "hello.txt")
    proxy.offline = False
    assert fetch(proxy.url + "hello.txt") == b"hello through the proxy\n"
    # the backend's own statuses still come through as they are
    with pytest.raises(urllib.error.HTTPError) as missing:
        fetch(proxy.url + "missing.txt")
    assert missing.value.code == 404


def test_a_large_body_arrives_intact(proxy, backend):
    body = fetch(proxy.url + "big.bin")
    assert len(body) == BIG
    assert hashlib.sha256(body).hexdigest() == backend[1]


def test_going_offline_breaks_a_download_in_flight(proxy):
    response = urllib.request.urlopen(proxy.url + "big.bin", timeout=10)
    try:
        assert len(response.read(1024 * 1024)) == 1024 * 1024
        proxy.offline = True
        with pytest.raises((ConnectionError, http.client.IncompleteRead)):
            response.read()  # the rest: far more than the socket buffers held when it went offline
    finally:
        response.close()
    proxy.offline = False
    assert len(fetch(proxy.url + "big.bin")) == BIG


def test_each_proxy_has_its_own_origin_and_switch(backend):
    first, second = OfflineProxy(backend[0]), OfflineProxy(backend[0])
    try:
        assert first.url != second.url
        first.offline = True
        assert_network_failure(first.url + "hello.txt")
        assert fetch(second.url + "hello.txt") == b"hello through the proxy\n"
    finally:
        first.close()
        second.close()


def test_close_stops_listening(backend):
    p = OfflineProxy(backend[0])
    url = p.url
    p.close()
    with pytest.raises(urllib.error.URLError) as failure:
        fetch(url + "hello.txt")
    assert isinstance(failure.value.reason, ConnectionRefusedError)
