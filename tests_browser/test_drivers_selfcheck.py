"""Self-check of tests_browser/drivers.py: every matrix row can open a page, evaluate JS with the
same semantics, report WebGPU availability inside a module Web Worker, size its viewport, take a
screenshot, forget the requests it recorded, and sees OfflineProxy's offline as a network failure.

Run:  .venv/bin/python -m pytest tests_browser/test_drivers_selfcheck.py -s -v
(-s shows the per-row adapter features/limits.)  Firefox needs `python tools/patch_playwright.py`.
"""
from __future__ import annotations

import base64
import functools
import http.server
import json
import struct
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import drivers
from offline_proxy import OfflineProxy

INDEX_HTML = """<!doctype html>
<meta charset="utf-8"><link rel="icon" href="data:,"><title>webslm driver self-check</title>
<script>console.log("selfcheck page loaded");</script>
<p>driver self-check</p>
"""

# A module worker: it imports a helper module (only possible in a module worker) and answers one
# message with the WebGPU adapter it gets for the given requestAdapter options.
WORKER_MJS = """
import { describeAdapter } from "./gpu_info.mjs";
self.onmessage = async (ev) => {
  try {
    const gpu = self.navigator.gpu;
    if (!gpu) { self.postMessage({has_gpu: false, why: "navigator.gpu is " + gpu}); return; }
    const adapter = await gpu.requestAdapter(ev.data.adapterOptions);
    if (!adapter) { self.postMessage({has_gpu: false, why: "requestAdapter() returned null"}); return; }
    console.log("worker: got adapter");
    self.postMessage(describeAdapter(adapter));
  } catch (e) {
    self.postMessage({has_gpu: false, why: "exception: " + String(e)});
  }
};
"""

GPU_INFO_MJS = """
export function describeAdapter(a) {
  return {
    has_gpu: true,
    features: [...a.features].sort(),
    maxStorageBufferBindingSize: a.limits.maxStorageBufferBindingSize,
    maxBufferSize: a.limits.maxBufferSize,
  };
}
"""

WORKER_PROBE_JS = """
new Promise((resolve, reject) => {
  const w = new Worker("./worker.mjs", {type: "module"});
  w.onmessage = (e) => { w.terminate(); resolve(e.data); };
  w.onerror = (e) => { w.terminate(); reject(new Error("worker error: " + (e.message || e.type))); };
  w.postMessage({adapterOptions: %s});
})
"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".mjs": "text/javascript", ".js": "text/javascript"}

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("site")
    (root / "index.html").write_text(INDEX_HTML)
    (root / "worker.mjs").write_text(WORKER_MJS)
    (root / "gpu_info.mjs").write_text(GPU_INFO_MJS)
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module", params=drivers.ROW_NAMES)
def row(request, site):
    r = drivers.launch_or_skip(request.param)
    print(f"\n[{r.name}] launched in {r.launch_s:.1f} s")
    try:
        r.open(f"{site}/index.html")
        yield r
    finally:
        r.close()


def test_eval_value(row):
    assert row.eval("1+1") == 2
    assert row.eval("({a: [1, 'x', null], b: true})") == {"a": [1, "x", None], "b": True}
    assert row.eval("undefined") is None
    assert row.eval("document.title;") == "webslm driver self-check"


def test_eval_promise(row):
    assert row.eval("new Promise(r => setTimeout(() => r(6 * 7), 50))") == 42
    assert row.eval("(async () => 'async ok')()") == "async ok"


def test_eval_error(row):
    with pytest.raises(drivers.BrowserEvalError, match="Error: boom"):
        row.eval("(() => { throw new Error('boom'); })()")
    with pytest.raises(drivers.BrowserEvalError, match="TypeError: rejected"):
        row.eval("Promise.reject(new TypeError('rejected'))")
    with pytest.raises(drivers.BrowserEvalError, match="SyntaxError"):
        row.eval("1 +")
    with pytest.raises(drivers.BrowserEvalError, match="eval timed out after 0.3 s"):
        row.eval("new Promise(() => {})", timeout_s=0.3)
    assert row.eval("'still alive'") == "still alive"  # the row survives errors


def test_worker_webgpu(row, site):
    info = row.eval(WORKER_PROBE_JS % json.dumps(row.adapter_options), timeout_s=120)
    print(f"\n[{row.name}] worker WebGPU ({json.dumps(row.adapter_options)}): {json.dumps(info)}")
    if row.expects_webgpu is not None:   # None: Playwright's own builds, outcome recorded only
        assert info["has_gpu"] == row.expects_webgpu, info
    if info["has_gpu"]:
        assert isinstance(info["maxStorageBufferBindingSize"], int)
        assert info["maxStorageBufferBindingSize"] >= 128 * 1024 * 1024
    if row.name == "chromium-compat":
        # the GL ES backend can only offer the compatibility tier
        assert "core-features-and-limits" not in info["features"], info
    reqs = row.requests()
    if reqs is not None:
        assert f"{site}/worker.mjs" in reqs, reqs
        assert f"{site}/gpu_info.mjs" in reqs, reqs


def test_console(row):
    row.eval("(console.log('selfcheck console probe'), 1)")
    lines = row.console()
    print(f"\n[{row.name}] console: {lines}")
    assert isinstance(lines, list)
    if row.name != "webkit":
        assert any("selfcheck console probe" in line for line in lines), lines
        # console messages from the module worker reach the page's log (exactly once)
        assert sum("worker: got adapter" in line for line in lines) == 1, lines


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG: its first chunk, IHDR, starts with them (big-endian)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", head
    return struct.unpack(">II", head[16:24])


# The corner pixels of a PNG, decoded by the browser itself (no image library needed here).
CORNERS_JS = """
new Promise((ok, fail) => {
  const img = new Image();
  img.onload = () => {
    const canvas = document.createElement("canvas");
    [canvas.width, canvas.height] = [img.width, img.height];
    const g = canvas.getContext("2d");
    g.drawImage(img, 0, 0);
    const [w, h] = [img.width - 1, img.height - 1];
    ok([[0, 0], [w, 0], [0, h], [w, h]].map(([x, y]) => [...g.getImageData(x, y, 1, 1).data.slice(0, 3)]));
  };
  img.onerror = () => fail(new Error("not an image"));
  img.src = "data:image/png;base64,%s";
})
"""


@pytest.mark.parametrize("width, height", [(390, 844), (1024, 700)])  # a phone, then wider again
def test_set_viewport_and_screenshot(row, tmp_path, width, height):
    # enough on the page that WebKit paints a new size noticeably after the window has it
    row.eval("""(() => { document.documentElement.style.background = "rgb(255, 221, 0)";
      document.body.innerHTML = '<p style="margin: 8px auto; max-width: 600px; border-radius: 8px; box-shadow: 0 1px 3px black">text that wraps</p>'.repeat(200);
    })()""")
    row.set_viewport(width, height)
    shot = tmp_path / f"{row.name}.png"
    row.screenshot(shot)  # right away: set_viewport() returns once the new size is on screen
    assert row.eval("[innerWidth, innerHeight, devicePixelRatio]") == [width, height, 1]
    assert png_size(shot) == (width, height)
    # the page is painted at its new size: no corner is left black (unpainted)
    corners = row.eval(CORNERS_JS % base64.b64encode(shot.read_bytes()).decode())
    assert all(abs(c - want) <= 2 for px in corners for c, want in zip(px, (255, 221, 0))), corners


def test_clear_requests(row, site):
    row.clear_requests()
    assert row.requests() in ([], None)
    row.open(f"{site}/index.html")
    reqs = row.requests()
    if reqs is not None:  # what the reload fetched, and only that
        assert f"{site}/index.html" in reqs, reqs
        assert f"{site}/worker.mjs" not in reqs, reqs


def test_offline_proxy_is_a_network_failure_in_the_browser(row, site):
    proxy = OfflineProxy(urlsplit(site).port)
    probe = "fetch('gpu_info.mjs', {cache: 'no-store'}).then(r => r.status, e => e.name)"
    try:
        row.open(proxy.url + "index.html")
        assert row.eval(probe) == 200
        proxy.offline = True
        assert row.eval(probe) == "TypeError"  # fetch()'s network error, not an HTTP status
        proxy.offline = False
        assert row.eval(probe) == 200
    finally:
        proxy.close()
