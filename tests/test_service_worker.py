"""web/sw.js in Node, with Cache Storage and fetch stood in for: the offline copy keeps the
site's own files and never a model, whatever the model's URL (a same-origin model whose URL
did not end in .slm was stored twice: here and in the worker's model cache, and Remove
cleared only one)."""
import json
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

HARNESS = r"""
import { readFileSync } from "node:fs";
import vm from "node:vm";

const ORIGIN = "https://site.test";
const stored = new Map();                       // the site cache: url -> response
const cache = {
  async match(request) { return stored.get(typeof request === "string" ? request : request.url); },
  async put(request, response) { stored.set(typeof request === "string" ? request : request.url, response); },
  async add(request) { const r = await fetchMock(request); if (r.ok) stored.set(request.url, r); },
};
const manifest = { pyodide: { packages: { numpy: { file: "numpy.whl" } } }, webslm: { wheel: "wheels/webslm.whl" } };
const fetched = [];
function response(url) {
  const body = url.endsWith("manifest.json") ? JSON.stringify(manifest) : "bytes of " + url;
  return { ok: true, type: "basic", url, headers: new Headers({ "content-length": String(body.length) }),
           clone() { return response(url); }, async json() { return JSON.parse(body); } };
}
async function fetchMock(request) {
  const url = new URL(typeof request === "string" ? request : request.url, ORIGIN + "/").href;
  fetched.push(url);
  return response(url);
}
const listeners = {};
const self = { location: new URL(ORIGIN + "/sw.js"), addEventListener: (type, f) => { listeners[type] = f; },
               skipWaiting: async () => {}, clients: { claim: async () => {} } };
class FakeRequest { constructor(url, init = {}) { this.url = new URL(url, ORIGIN + "/").href; this.method = init.method ?? "GET"; this.mode = init.mode ?? "cors"; } }
vm.runInNewContext(readFileSync(process.argv[2], "utf8"),
  { self, caches: { open: async () => cache, match: (r) => cache.match(r) }, fetch: fetchMock, Request: FakeRequest,
    URL, Headers, Set, Promise, Boolean, JSON, console });

async function dispatch(type, request) {
  const pending = [];
  let answered = null;
  listeners[type]({ request, waitUntil: (p) => pending.push(p), respondWith: (p) => { answered = p; } });
  if (answered) pending.push(answered);
  await Promise.all(pending);
  await new Promise((r) => setTimeout(r, 10));   // keep() runs in waitUntil after the answer
  await Promise.all(pending);
  return answered !== null;
}

await dispatch("install");
stored.clear();                                  // start empty: what fetches keep, from here on
const results = {};
for (const path of JSON.parse(process.argv[3])) {
  results[path] = { answered: await dispatch("fetch", new FakeRequest(ORIGIN + path)) };
}
console.log(JSON.stringify({ results, stored: [...stored.keys()].map((u) => new URL(u).pathname) }));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_the_offline_copy_keeps_site_files_and_never_a_model(tmp_path):
    harness = tmp_path / "harness.mjs"
    harness.write_text(HARNESS)
    paths = ["/app.mjs", "/worker/worker.mjs", "/assets/wheels/webslm.whl", "/assets/pyodide/numpy.whl",
             "/models/tiny.bin", "/download?model=tiny", "/assets/models/smollm2.slm", "/other.txt"]
    done = subprocess.run(["node", str(harness), str(ROOT / "web/sw.js"), json.dumps(paths)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert sorted(report["stored"]) == ["/app.mjs", "/assets/pyodide/numpy.whl", "/assets/wheels/webslm.whl",
                                        "/worker/worker.mjs"]
    assert report["results"]["/models/tiny.bin"]["answered"]           # served through, not kept
    assert not report["results"]["/assets/models/smollm2.slm"]["answered"]   # .slm: not even intercepted
