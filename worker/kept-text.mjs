// One text kept across visits in Cache Storage, under a URL this site never serves: the
// tuning results (tuning-store.mjs) and the engine choices (verdict-store.mjs). Text longer
// than `maxChars` is neither kept nor read back. Nothing read from here is trusted (Python
// parses it with its own size cap), and a store that cannot be read or written is no error:
// read() answers null, write() false, and the caller measures again next time.

import { openCache } from "./model-cache.mjs";

export function keptText(cacheName, path, maxChars) {
  const key = () => new URL(path, self.location.origin).href;
  const open = () => openCache(cacheName);
  return {
    // The kept text, or null.
    async read() {
      try {
        const response = await (await open())?.match(key());
        const text = response ? await response.text() : null;
        return text !== null && text.length <= maxChars ? text : null;
      } catch {
        return null;
      }
    },
    // Keep `text` (replacing what was kept); false when it could not be.
    async write(text) {
      if (typeof text !== "string" || text.length > maxChars) return false;
      try {
        const cache = await open();
        if (!cache) return false;
        await cache.put(key(), new Response(text, { headers: { "content-type": "application/json" } }));
        return true;
      } catch {
        return false;
      }
    },
  };
}
