// The engine choice kept across visits: "on this adapter the GPU answered slower than the CPU
// path" (py/webslm/engine/verdict.py), as the JSON text Python hands over in the admit reply
// (`verdicts_text`), in Cache Storage under a URL this site never serves. Without it every
// visit paid the whole GPU admission (minutes on SwiftShader) before the engine chose the CPU
// path again. Nothing read from here is trusted: Python parses it with a size cap and keeps
// only records of the exact shape. A store that cannot be read or written costs a measurement
// next time, never an error.

import { keptText } from "./kept-text.mjs";

const MAX_CHARS = 64 << 10;             // py verdict.MAX_TEXT_CHARS: longer text is not kept

export const { read, write } = keptText("webslm-verdict-v1", "/.webslm-verdict/verdicts.json", MAX_CHARS);
