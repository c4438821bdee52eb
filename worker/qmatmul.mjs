// The CPU path's quantized matrix kernel (py/webslm/cpu/qmatmul.c built for wasm32 with
// simd128 by tools/build_kernels.py), instantiated on Pyodide's own memory: the kernel reads
// numpy arrays where they lie, and Python calls it with their addresses through the JS
// module "webslm_qmatmul" (py/webslm/cpu/kernels.py). Without it the CPU path uses numpy.
//
// The module imports its memory and has neither data nor a stack (the build checks), so it
// writes only where Python points it. Its bytes are checked against the manifest's sha256.

// Pyodide 0.27 does not expose its WebAssembly.Memory as such; its dynamic linker keeps
// the main module's imports, memory among them. Accepted only if it is the very memory
// the heap views use.
function pyodideMemory(pyodide) {
  const module = pyodide._module;
  const candidates = [module.wasmMemory, module.LDSO?.loadedLibsByName?.__main__?.exports?.memory];
  return candidates.find((m) => m instanceof WebAssembly.Memory && m.buffer === module.HEAPU8.buffer) ?? null;
}

async function sha256Hex(buffer) {
  const digest = await crypto.subtle.digest("SHA-256", buffer);
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

// Registers "webslm_qmatmul" and returns { kernel: "wasm simd128" }, or { kernel: null,
// reason } when the site has no kernel, it cannot be fetched, this browser lacks Wasm SIMD,
// or the memory is not found. Throws only when the file is there but corrupt.
export async function loadQmatmul(pyodide, manifest, assets) {
  const entry = manifest.kernels?.qmatmul;
  if (!entry) return { kernel: null, reason: "the site has no kernel (built without clang)" };
  const memory = pyodideMemory(pyodide);
  if (!memory) return { kernel: null, reason: "Pyodide's Wasm memory was not found" };
  const url = new URL(entry.file, assets);
  let bytes;
  try {                      // unreachable (offline without a copy): the CPU path runs in numpy
    const response = await fetch(url);
    if (!response.ok) return { kernel: null, reason: `${url.pathname}: HTTP ${response.status}` };
    bytes = await response.arrayBuffer();
  } catch (error) {
    return { kernel: null, reason: `${url.pathname}: ${error?.message ?? error}` };
  }
  const actual = await sha256Hex(bytes);
  if (actual !== entry.sha256) throw new Error(`${url.pathname}: sha256 ${actual} does not match the manifest's ${entry.sha256}`);
  if (!WebAssembly.validate(bytes)) return { kernel: null, reason: "this browser cannot run Wasm SIMD" };
  const { instance } = await WebAssembly.instantiate(bytes, { env: { memory } });
  pyodide.registerJsModule("webslm_qmatmul", instance.exports);
  return { kernel: "wasm simd128" };
}
