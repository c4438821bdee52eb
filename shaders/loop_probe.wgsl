// How many loop iterations one invocation is allowed: a nested loop of outer x inner steps,
// each a step of a 32-bit linear congruential generator (so no compiler can replace the loop
// by its closed form), counted. An adapter that runs every step writes count = outer * inner
// and the generator's value after that many steps; one that stops a shader's loops early
// writes fewer. llvmpipe (Mesa's software rasterizer, lavapipe's Vulkan driver, which the
// Firefox and Chromium "compat" rows use) ends every loop of an invocation once 65535
// iterations have run in all its loops together, and writes whatever the truncated loops left:
// a prefill attention at head_dim 256 walks that many past key 2404 (docs/RESULTS.md).
//
//   params  (outer, inner, seed)        count [2] u32: iterations run, the generator's state

struct Params {
    outer: u32,
    inner: u32,
    seed: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> count: array<u32>;

@compute @workgroup_size(1)
fn main() {
    var n = 0u;
    var state = params.seed;
    for (var i = 0u; i < params.outer; i++) {
        for (var j = 0u; j < params.inner; j++) {
            state = state * 1664525u + 1013904223u;
            n += 1u;
        }
    }
    count[0] = n;
    count[1] = state;
}
