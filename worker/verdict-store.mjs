// The engine choice kept across visits: "on this adapter the GPU answered slower than the CPU
// path" (py/webslm/engine/verdict.py), as the JSON text Python hands over in the admit reply
// (`verdicts_text`), in Cache Storage under a URL this site never serves. Without it every
// visit paid the whole GPU admission (minutes on SwiftShader) before the engine chose the CPU
// path again. Nothing read from here is trusted: Python parses it with a size cap and keeps
// only records of the exact shape. A store that cannot be read or written costs a measurement
// next time, never an error.

import { openCache } from "./model-cache.mjs";

const CACHE_NAME = "webslm-verdict-v1";
const KEY = () => new URL("/.webslm-verdict/verdicts.json", self.location.origin).href;
const MAX_CHARS = 64 << 10;             // py verdict.MAX_TEXT_CHARS: longer text is not kept
const open = () => openCache(CACHE_NAME);

// The kept text, or null.
export async function read() {
  try {
    const response = await (await open())?.match(KEY());
    const text = response ? await response.text() : null;
    return text !== null && text.length <= MAX_CHARS ? text : null;
  } catch {
    return null;
  }
}

// Keep `text` (the whole store, replacing what was kept); false when it could not be.
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
