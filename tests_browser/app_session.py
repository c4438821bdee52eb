"""The served app in one browser row: open the page, wait for the worker, talk to it.

Used by the browser tests (conftest.py) and by bench/boot.py.
"""
from __future__ import annotations

import contextlib
import json
import pathlib
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import drivers
import serve
from offline_proxy import OfflineProxy

BOOT_TIMEOUT_S = 180       # Pyodide + numpy on a 2-core machine under a software GPU
# The page's theme set as its Theme control sets it; resolves once the layout's transitions
# (0.2 s) are over.
_SET_THEME = """(() => {
  const control = document.getElementById('theme');
  control.value = %s;
  control.dispatchEvent(new Event('input', { bubbles: true }));
  control.dispatchEvent(new Event('change', { bubbles: true }));
  return new Promise((done) => setTimeout(done, 300));
})()"""
# What a timed-out wait_for reports of the page: the engine's state, its last state changes and
# how many requests wait for the worker's reply.
WAITED_ON = """(() => { try { const e = window.webslm?.engine; return JSON.stringify({ state: e?.state,
  events: (e?.events ?? []).slice(-6).map(({ from, to, reason, at_ms }) => ({ from, to, reason, at_ms })),
  now_ms: Math.round(performance.now()), requests_waiting: e?.protocol?.pending?.size ?? null }); }
  catch (error) { return String(error); } })()"""
SCREENSHOT_DIR = pathlib.Path(__file__).resolve().parent / "results" / "screenshots"


@contextlib.contextmanager
def static_site(root: pathlib.Path, where: pathlib.Path, path: str = ""):
    """`serve.py --build` into `where`, served by plain `python -m http.server` (as users deploy
    it) on a free loopback port: yields the port; the server is stopped on exit. path ("app"):
    the site is built into that folder of the served directory, so it lives at /app/."""
    served = where / "www"
    site = served / path if path else served
    subprocess.run([sys.executable, str(root / "serve.py"), "--build", str(site)], check=True, stdout=subprocess.DEVNULL)
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(served)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/{path}/" if path else f"http://127.0.0.1:{port}/")
        yield port
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def free_port() -> int:
    """A loopback port that was free a moment ago (fine for a test's own server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_serving(url: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def serve_in_thread(routes):
    """serve.py's server on a free loopback port, in a daemon thread: (server, url)."""
    server = serve.make_server(routes, "127.0.0.1", 0, quiet=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class BootedRow:
    """A browser row with the app open and its worker booted.

    ``proxy`` is the OfflineProxy that ``url`` goes through, where there is one (the browser
    tests' rows; see conftest.py): ``booted.proxy.offline = True`` takes this row offline.
    ``query`` ("?gpu=force") is added to ``url`` each time the page is opened here (boot, reload);
    ``url`` stays the site's address."""

    def __init__(self, row: drivers.BrowserRow, url: str, results_dir: pathlib.Path | None = None,
                 proxy: OfflineProxy | None = None, query: str = "", photograph_start: bool = False):
        self.row, self.url, self.results_dir, self.proxy, self.query = row, url, results_dir, proxy, query
        self.photograph_start = photograph_start
        self.results: dict = {"row": row.name, "launch_s": round(row.launch_s, 2)}
        self.status = self.boot("cold")

    def boot(self, label: str, query: str | None = None) -> dict:
        """Open the URL (with `query`, else the row's), wait for the worker; record the timings
        as results["boot_<label>"] and return the worker's status."""
        started = time.monotonic()
        self.row.open(self.url + (self.query if query is None else query))
        if label == "cold" and self.photograph_start:
            self._photograph_start()
        # the page sets window.webslm at once, and its client once the engine's worker exists
        self.wait_for("window.webslm && window.webslm.client", timeout_s=BOOT_TIMEOUT_S)
        self.row.eval("window.webslm.client.ready", timeout_s=BOOT_TIMEOUT_S)
        status = self.request("status")
        status["page_to_ready_s"] = round(time.monotonic() - started, 2)
        self.results[f"boot_{label}"] = {**status["boot"], "page_to_ready_s": status["page_to_ready_s"]}
        return status

    def _photograph_start(self) -> None:
        """The start card (web/ui-start.mjs: the steps of the worker's boot and the model's
        load, with their bar) while the first boot runs, in both themes at both widths;
        results["start_screenshots"]: per shot, the theme applied, whether the card showed and
        its current step. (test_chat_page.py photographs the page with a conversation.)"""
        shots = {}
        card = "document.getElementById('start')"
        self.results["start_screenshots"] = shots      # empty if the card never showed: its test fails, not the row
        shown = self.row.eval(   # true once the card shows, false after 60 s without it
            f"new Promise((done) => {{ const t0 = Date.now(); const t = setInterval(() => {{"
            f" const on = {card} && !{card}.hidden; if (on || Date.now() - t0 > 60000) {{ clearInterval(t); done(on); }}"
            f" }}, 50); }})", timeout_s=70)
        if not shown:
            return
        try:
            for width, height, size in ((1280, 900, "desktop"), (390, 844, "phone")):
                self.row.set_viewport(width, height)
                for theme in ("light", "dark"):
                    shown = self.row.eval(_SET_THEME % json.dumps(theme) + f"""
                      .then(() => ({{ theme: document.documentElement.dataset.theme ?? null, card: !{card}.hidden,
                                     step: document.getElementById('start-now').textContent }}))""")
                    shots[f"{size}-{theme}"] = {**shown, "path": str(self.screenshot(f"start-{size}-{theme}"))}
        finally:
            self.row.set_viewport(1280, 900)
            self.row.eval(_SET_THEME % json.dumps("system"))

    def reload(self, label: str, query: str | None = None) -> dict:
        """Open the page again in the same browser profile (its HTTP cache, Cache Storage and
        service worker stay) and boot as boot() does; the new page's status becomes ``status``."""
        self.status = self.boot(label, query)
        return self.status

    def screenshot(self, name: str) -> pathlib.Path:
        """Save what the viewport shows to results/screenshots/<row>-<name>.png; return the path."""
        SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOT_DIR / f"{self.row.name}-{name}.png"
        self.row.screenshot(path)
        return path

    def wait_for(self, js_expression: str, timeout_s: float = 240):
        """Poll until the page-side expression is truthy; return its value. A timeout's error
        says what the page's engine was doing then (WAITED_ON: its state and last events)."""
        self.row.eval(
            "new Promise((ok, fail) => { const t = setInterval(() => { if (%s) { clearInterval(t); ok(true); } }, 50);"
            " setTimeout(() => { clearInterval(t); fail(new Error('timed out waiting for: ' + %s + '; the engine: ' + %s)); }, %d); })"
            % (js_expression, json.dumps(js_expression), WAITED_ON, timeout_s * 1000), timeout_s=timeout_s + 10)
        return self.row.eval(js_expression)

    def request(self, type: str, fields: dict | None = None, timeout_s: float = 300):
        return self.row.eval(f"window.webslm.client.request({json.dumps(type)}, {json.dumps(fields or {})})",
                             timeout_s=timeout_s)

    def send_raw(self, js_value: str):
        return self.row.eval(f"window.webslm.client.sendRaw({js_value})")

    def record(self, **items):
        self.results.update(items)
        if self.results_dir is not None:
            self.results_dir.mkdir(exist_ok=True)
            (self.results_dir / f"{self.row.name}.json").write_text(json.dumps(self.results, indent=1, sort_keys=True))
