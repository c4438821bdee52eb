// The tuning cache kept across visits: what admission measured on this device (launch shapes
// of the decode mat-vecs, the prefill attention variant; py/webslm/backends/gpu/tuning.py),
// as the JSON text Python hands over (worker_api.tuning_cache_text), in Cache Storage under a
// URL this site never serves. Without it every visit measured again (2-7 s of admission on
// the H200). Nothing read from here is trusted: Python parses it with a size cap and checks
// every entry where it is used. A store that cannot be read or written costs a measurement
// next time, never an error.

import { keptText } from "./kept-text.mjs";

const MAX_CHARS = 4 << 20;              // py tuning_cache.MAX_CACHE_CHARS: longer text is not kept

export const { read, write } = keptText("webslm-tuning-v1", "/.webslm-tuning/tuning.json", MAX_CHARS);
