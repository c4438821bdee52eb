"""`python serve.py --build DIR`, served by plain `python -m http.server`, boots the worker
and runs the GPU check in Chromium: the built site needs nothing but static hosting."""
import json
from urllib.parse import urlsplit

import pytest

import drivers
from webslm import shader_bundle


@pytest.mark.skipif(bool(drivers.missing_binaries("chromium")), reason="Chromium not installed (/usr/bin/chromium)")
def test_built_site_served_by_http_server_passes_the_smoke_test(built_site_url):
    row = drivers.launch("chromium")
    try:
        row.open(built_site_url)
        row.eval("new Promise((ok, fail) => { const t = setInterval(() => { if (window.webslm && window.webslm.gpu) { clearInterval(t); ok(true); } }, 50); setTimeout(() => fail(new Error('page did not finish')), 240000); })",
                 timeout_s=260)
        status, gpu = row.eval("window.webslm.status"), row.eval("window.webslm.gpu")
        assert status["shader_bundle_hash"] == shader_bundle.bundle_hash()
        assert gpu.get("outcome") == "passed", json.dumps(gpu)[:2000]
        origin = "{0.scheme}://{0.netloc}/".format(urlsplit(built_site_url))
        assert [u for u in row.requests() if not u.startswith((origin, "data:", "blob:"))] == []
    finally:
        row.close()
