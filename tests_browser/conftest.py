"""Fixtures for the browser matrix: the served app, and one booted worker per engine row.

Each row's browser is launched once per session and the app page opened once; every test
of that row talks to that one booted worker. Measurements (boot times, adapter features
and limits, kernel results) are printed and written to tests_browser/results/<row>.json.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import threading
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import drivers  # noqa: E402
import serve  # noqa: E402

RESULTS = HERE / "results"
BOOT_TIMEOUT_S = 180       # Pyodide + numpy on a 2-core machine under a software GPU


def _serve_in_thread(routes):
    server = serve.make_server(routes, "127.0.0.1", 0, quiet=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


@pytest.fixture(scope="session")
def app_url():
    if not (ROOT / serve.MANIFEST).is_file():
        pytest.fail("assets missing: run `python tools/assets.py` (./dev test does)")
    server, url = _serve_in_thread(serve.url_map(ROOT))
    yield url
    server.shutdown()


@pytest.fixture(scope="session")
def built_site_url(tmp_path_factory):
    """`serve.py --build` output, served by plain `python -m http.server`."""
    site = tmp_path_factory.mktemp("site") / "www"
    subprocess.run([sys.executable, str(ROOT / "serve.py"), "--build", str(site)], check=True,
                   stdout=subprocess.DEVNULL)
    with socket_port() as port:
        pass
    process = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                "-d", str(site)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    _wait_until_serving(url)
    yield url
    process.terminate()
    process.wait(10)


class socket_port:
    """A free loopback port (closed again before use; fine for a test's own server)."""
    def __enter__(self):
        import socket
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return self.sock.getsockname()[1]

    def __exit__(self, *exc):
        self.sock.close()


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


class BootedRow:
    """A browser row with the app open and its worker booted."""

    def __init__(self, row: drivers.BrowserRow, url: str):
        self.row, self.url = row, url
        self.results: dict = {"row": row.name, "launch_s": round(row.launch_s, 2)}
        self.status = self.boot("cold")

    def boot(self, label: str) -> dict:
        started = time.monotonic()
        self.row.open(self.url)
        self.wait_for("window.webslm", timeout_s=30)
        self.row.eval("window.webslm.client.ready", timeout_s=BOOT_TIMEOUT_S)
        status = self.request("status")
        status["page_to_ready_s"] = round(time.monotonic() - started, 2)
        self.results[f"boot_{label}"] = {**status["boot"], "page_to_ready_s": status["page_to_ready_s"]}
        return status

    def wait_for(self, js_expression: str, timeout_s: float = 240):
        """Poll until the page-side expression is truthy; return its value."""
        self.row.eval(
            "new Promise((ok, fail) => { const t = setInterval(() => { if (%s) { clearInterval(t); ok(true); } }, 50);"
            " setTimeout(() => { clearInterval(t); fail(new Error('timed out waiting for: ' + %s)); }, %d); })"
            % (js_expression, json.dumps(js_expression), timeout_s * 1000), timeout_s=timeout_s + 10)
        return self.row.eval(js_expression)

    def request(self, type: str, fields: dict | None = None, timeout_s: float = 300):
        return self.row.eval(f"window.webslm.client.request({json.dumps(type)}, {json.dumps(fields or {})})",
                             timeout_s=timeout_s)

    def send_raw(self, js_value: str):
        return self.row.eval(f"window.webslm.client.sendRaw({js_value})")

    def record(self, **items):
        self.results.update(items)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{self.row.name}.json").write_text(json.dumps(self.results, indent=1, sort_keys=True))


@pytest.fixture(scope="session", params=drivers.ROW_NAMES)
def booted(request, app_url):
    name = request.param
    missing = drivers.missing_binaries(name)
    if missing:
        pytest.skip(f"{name}: not installed: {', '.join(missing)} (./dev test installs them as root)")
    row = drivers.launch(name)
    try:
        yield BootedRow(row, app_url)
    finally:
        row.close()
