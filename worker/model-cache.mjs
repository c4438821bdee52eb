// Models kept in the browser's Cache Storage, keyed by their artifact sha256.
//
// The worker stores a model once it has validated it, and loads it from here the next time
// (no download). Nothing read from here is trusted: a cached model is validated again as it
// streams in, exactly like a downloaded one, and an entry that fails is removed. The page
// lists and removes entries through the same functions (web/webslm.js: engine.models).
//
// Each entry is a Response whose headers say what it is, so listing needs no separate index:
//   x-webslm-name, x-webslm-bytes, x-webslm-url (where it was downloaded from, if anywhere),
//   x-webslm-cached-at (ISO time).
// Cache Storage (not OPFS): it exists in every engine's workers and pages, including
// WebKitGTK, and stores a Blob or a stream without our having to manage files.

const CACHE_NAME = "webslm-models-v1";
const SHA256 = /^[0-9a-f]{64}$/;

// Keys are URLs that this site never serves, so an entry cannot be mistaken for a page asset.
const keyFor = (sha256) => new URL(`/.webslm-models/${sha256}.slm`, self.location.origin).href;

// A Cache Storage cache by name, or null where there is none to have (also for
// worker/tuning-store.mjs).
export async function openCache(name) {
  if (!self.caches) return null;          // e.g. an insecure context: no Cache Storage at all
  try {
    return await caches.open(name);
  } catch {
    return null;                          // storage refused (private mode, quota policy)
  }
}

const open = () => openCache(CACHE_NAME);

export const available = async () => (await open()) !== null;

function describe(sha256, response) {
  const h = response.headers;
  return {
    sha256,
    name: decodeURIComponent(h.get("x-webslm-name") ?? ""),
    bytes: Number(h.get("x-webslm-bytes")) || 0,
    url: h.get("x-webslm-url") || null,
    cached_at: h.get("x-webslm-cached-at"),
  };
}

// Every cached model: [{sha256, name, bytes, url, cached_at}], newest first.
export async function list() {
  const cache = await open();
  if (!cache) return [];
  const models = [];
  for (const request of await cache.keys()) {
    const sha256 = new URL(request.url).pathname.match(/\/\.webslm-models\/([0-9a-f]{64})\.slm$/)?.[1];
    if (!sha256) continue;
    const response = await cache.match(request);
    if (response) models.push(describe(sha256, response));
  }
  return models.sort((a, b) => String(b.cached_at).localeCompare(String(a.cached_at)));
}

// The cached model with this sha256, or else the one downloaded from this URL:
// {sha256, name, bytes, body (a ReadableStream)} or null.
export async function lookup({ sha256 = null, url = null }) {
  const cache = await open();
  if (!cache) return null;
  let response = sha256 ? await cache.match(keyFor(sha256)) : undefined;
  if (!response && url) {
    const entry = (await list()).find((m) => m.url === url);
    if (entry) {
      sha256 = entry.sha256;
      response = await cache.match(keyFor(sha256));
    }
  }
  if (!response?.body) return null;
  return { ...describe(sha256, response), body: response.body };
}

// Store a validated model (a Blob: the picked File, or the downloaded chunks). False when
// there is no Cache Storage or the origin's quota refuses it; the model still loaded.
export async function store({ sha256, name, url = null }, blob) {
  if (!SHA256.test(sha256)) throw new Error(`not a sha256: ${sha256}`);
  const cache = await open();
  if (!cache) return false;
  const headers = {
    "content-type": "application/octet-stream",
    "x-webslm-name": encodeURIComponent(name ?? ""),
    "x-webslm-bytes": String(blob.size),
    "x-webslm-cached-at": new Date().toISOString(),
  };
  if (url) headers["x-webslm-url"] = url;
  try {
    await cache.put(keyFor(sha256), new Response(blob, { headers }));
    return true;
  } catch {
    return false;                         // QuotaExceededError and the like
  }
}

export async function remove(sha256) {
  const cache = await open();
  return cache ? cache.delete(keyFor(sha256)) : false;
}

// The bytes of cached models, and the origin's storage estimate (usage and quota of
// everything it stores: the offline copy of the site too), where the browser gives one.
export async function usage() {
  const models = await list();
  const estimate = (await navigator.storage?.estimate?.().catch(() => null)) ?? {};
  return {
    models_bytes: models.reduce((sum, m) => sum + m.bytes, 0),
    usage: estimate.usage ?? null,
    quota: estimate.quota ?? null,
  };
}
