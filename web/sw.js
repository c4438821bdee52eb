// The site's service worker: after one visit, the page opens and answers without a network.
//
// It keeps a copy of the page, the worker, Pyodide, numpy, the webslm wheel and the CPU kernel (the files
// SHELL names plus those assets/manifest.json names), and nothing else. Requests go to the
// network first, so a deployed update is seen at once, and the copy answers only when the
// network cannot. Models are never copied here, whatever their URL: the worker keeps them in
// Cache Storage by sha256 and loads them from there before it would fetch them
// (worker/model-cache.mjs), so a model is stored once and Remove removes it.
//
// Paths are relative to this file, which sits at the site root (web/ is served at /).
const CACHE = "webslm-site-v1";

// Every file of web/ and worker/ (tests/test_js_modules.py checks this list against them).
const SHELL = [
  "./", "index.html", "style.css", "theme.js", "app.mjs", "webslm.js", "errors.mjs", "answer.mjs", "worker-client.mjs", "sw.js",
  "ui-chat.mjs", "ui-engine.mjs", "ui-model.mjs", "ui-settings.mjs", "chat-request.mjs", "init-progress.mjs", "webllm.mjs",
  "markdown.mjs", "markdown-blocks.mjs", "markdown-inline.mjs", "ui-start.mjs",
  "worker/worker.mjs", "worker/bridge.mjs", "worker/protocol.mjs", "worker/model-cache.mjs", "worker/qmatmul.mjs", "worker/tuning-store.mjs",
  "worker/verdict-store.mjs", "worker/kept-text.mjs",
];

async function siteFiles() {
  const manifest = await (await fetch("assets/manifest.json", { cache: "no-cache" })).json();
  const pyodide = ["pyodide.mjs", "pyodide.asm.js", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json",
                   manifest.pyodide.packages.numpy.file].map((f) => `assets/pyodide/${f}`);
  const kernel = manifest.kernels?.qmatmul ? [`assets/${manifest.kernels.qmatmul.file}`] : [];   // if built
  return [...SHELL, "assets/manifest.json", ...pyodide, `assets/${manifest.webslm.wheel}`, ...kernel];
}

// Whether a URL is one of the site's files (the copy keeps those only). The list comes from
// the manifest once per worker lifetime; without it (offline), only files already kept are.
let siteUrls = null;
async function isSiteFile(url, cache) {
  const path = url.origin + url.pathname;
  siteUrls ??= siteFiles().then((files) => new Set(files.map((f) => new URL(f, self.location.href).href)),
                                () => { siteUrls = null; return null; });
  const known = await siteUrls;
  return known ? known.has(path) : Boolean(await cache.match(path));
}

self.addEventListener("install", (event) => {
  event.waitUntil((async () => {
    const cache = await caches.open(CACHE);
    const files = await siteFiles();
    // One by one, each failure tolerated: the copy is best effort (a file that fails now is
    // copied on its next successful fetch), and installing must never break the site online.
    await Promise.all(files.map((file) => cache.add(new Request(file, { cache: "no-cache" })).catch(() => {})));
    await self.skipWaiting();
  })());
});

self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

self.addEventListener("fetch", (event) => {
  const request = event.request;
  const url = new URL(request.url);
  if (request.method !== "GET" || url.origin !== self.location.origin || url.pathname.endsWith(".slm")) return;
  event.respondWith(networkFirst(event));
});

// Keep the fresh copy, unless the one kept is the same file (same validator and length):
// Pyodide alone is ~15 MB, not worth writing again on every visit.
async function keep(request, response) {
  const cache = await caches.open(CACHE);
  if (!(await isSiteFile(new URL(request.url), cache))) return;      // a model, or anything else
  const kept = await cache.match(request);
  const validator = (r) => r.headers.get("etag") ?? r.headers.get("last-modified");
  if (kept && validator(response) && validator(kept) === validator(response)
      && kept.headers.get("content-length") === response.headers.get("content-length")) return;
  await cache.put(request, response);
}

async function networkFirst(event) {
  const request = event.request;
  try {
    const response = await fetch(request);
    if (response.ok && response.type === "basic") event.waitUntil(keep(request, response.clone()).catch(() => {}));
    return response;
  } catch (offline) {
    // The page's own URL may carry options (?gpu=0): the copy of the page is the same file.
    const cached = await caches.match(request, { ignoreSearch: request.mode === "navigate" });
    if (cached) return cached;
    throw offline;
  }
}
