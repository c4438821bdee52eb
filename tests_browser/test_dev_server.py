"""`./dev serve` (serve.py over the working tree) serves the same site as `serve.py --build`:
the page boots its worker, loads the default model and is ready to chat, every request to the
serving origin, under serve.py's Content-Security-Policy with no violation reported (the
policy allows WebAssembly but no eval and no inline script). (Every browser row runs the built
static site, served by `python -m http.server`: conftest.py; this checks the developer's
server once, in Chromium, on the CPU path so it takes seconds.)"""
from urllib.parse import urlsplit

import pytest

import drivers
from webslm import shader_bundle


@pytest.mark.skipif(bool(drivers.missing_binaries("chromium")), reason="Chromium not installed (/usr/bin/chromium)")
def test_the_dev_server_serves_a_working_page(app_url):
    row = drivers.launch("chromium")
    try:
        row.open(app_url + "?gpu=0")
        row.eval("new Promise((ok, fail) => { const t = setInterval(() => { if (window.webslm && window.webslm.ready) { clearInterval(t); ok(true); } }, 50); setTimeout(() => fail(new Error('page not ready')), 240000); })",
                 timeout_s=260)
        engine = row.eval("window.webslm.engine")
        assert engine["worker"]["shader_bundle_hash"] == shader_bundle.bundle_hash()
        assert engine["backend"] == "cpu" and engine["cpuReason"]["code"] == "gpu-disabled", engine
        assert engine["model"]["artifact_sha256"]
        origin = "{0.scheme}://{0.netloc}/".format(urlsplit(app_url))
        assert [u for u in row.requests() if not u.startswith((origin, "data:", "blob:"))] == []
        policy = row.eval("fetch('./').then((r) => r.headers.get('content-security-policy'))")
        assert policy and "'unsafe-eval'" not in policy and "'unsafe-inline'" not in policy, policy
        violations = [line for line in row.console() if "Content Security Policy" in line]
        assert violations == [], violations
    finally:
        row.close()
