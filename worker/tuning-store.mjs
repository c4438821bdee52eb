// The tuning cache kept across visits: what admission measured on this device (launch shapes
// of the decode mat-vecs, the prefill attention variant; py/webslm/backends/gpu/tuning.py),
// as the JSON text Python hands over (worker_api.tuning_cache_text), in Cache Storage under a
// URL this site never serves. Without it every visit measured again (2-7 s of admission on
// the H200). Nothing read from here is trusted: Python parses it with a size cap and checks
// every entry where it is used. A store that cannot be read or written costs a measurement
// next time, never an error.

import { openCache } from "./model-cache.mjs";

const CACHE_NAME = "webslm-tuning-v1";
const KEY = () => new URL("/.webslm-tuning/tuning.json", self.location.origin).href;
const MAX_CHARS = 4 << 20;              // py tuning_cache.MAX_CACHE_CHARS: longer text is not kept
const open = () => openCache(CACHE_NAME);

// The kept text, or null.
export async function read() {
  try {
    const response = await (await open())?.match(KEY());
    return response ? await response.text() : null;
  } catch {
    return null;
  }
}

// Keep `text` (the whole cache, replacing what was kept); false when it could not be.
export async function write(text) {
  if (typeof text !== "string" || text.length > MAX_CHARS) return false;
  try {
    const cache = await open();
    if (!cache) return false;
    await cache.put(KEY(), new Response(text, { headers: { "content-type": "application/json" } }));
    return true;
  } catch {
    return false;
  }
}
