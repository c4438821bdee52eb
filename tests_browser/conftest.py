"""Fixtures for the browser matrix: the served app, and one booted worker per engine row.

Each row's browser is launched once per session and the app page opened once; every test
of that row talks to that one booted worker. Measurements (boot times, adapter features
and limits, kernel results) are printed and written to tests_browser/results/<row>.json.
"""
from __future__ import annotations

import pathlib
import socket
import subprocess
import sys
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import drivers  # noqa: E402
import serve  # noqa: E402
from app_session import BootedRow, serve_in_thread  # noqa: E402


@pytest.fixture(scope="session")
def app_url():
    if not (ROOT / serve.MANIFEST).is_file():
        pytest.fail("assets missing: run `python tools/assets.py` (./dev test does)")
    server, url = serve_in_thread(serve.url_map(ROOT))
    yield url
    server.shutdown()


@pytest.fixture(scope="session")
def built_site_url(tmp_path_factory):
    """`serve.py --build` output, served by plain `python -m http.server`."""
    site = tmp_path_factory.mktemp("site") / "www"
    subprocess.run([sys.executable, str(ROOT / "serve.py"), "--build", str(site)], check=True,
                   stdout=subprocess.DEVNULL)
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                "-d", str(site)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    _wait_until_serving(url)
    yield url
    process.terminate()
    process.wait(10)


def free_port() -> int:
    """A loopback port that was free a moment ago (fine for a test's own server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_serving(url, timeout_s=20):
    import urllib.request
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture(scope="session", params=drivers.ROW_NAMES)
def booted(request, app_url):
    row = drivers.launch_or_skip(request.param)
    try:
        yield BootedRow(row, app_url, results_dir=HERE / "results")
    finally:
        row.close()
