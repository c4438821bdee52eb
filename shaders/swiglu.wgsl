// SwiGLU activation: out[t, j] = silu(gate[t, j]) * up[t, j], silu(g) = g / (1 + exp(-g))
// (the middle of py/webslm/cpu/layers.py swiglu; host side and tests: py/webslm/kernels/swiglu.py).
//
//   h    [T, 2F] f32: h[t, :F] the gate projection, h[t, F:] the up projection (the engine
//        computes both with one mat-vec over the gate and up weights stacked)
//   out  [T, F] f32
//
// silu is evaluated as g * sigmoid(g) with e = exp(-|g|) <= 1, sigmoid = 1 / (1 + e) for g >= 0
// and e / (1 + e) for g < 0: exp never overflows and the divisor stays in [1, 2], where WGSL
// guarantees division to 2.5 ULP. (g / (1 + exp(-g)) divides by inf for g < -88.7; WGSL gives
// no accuracy for divisors above 2^126, and g * exp(g) / (1 + exp(g)) is inf / inf = NaN.)
// For finite g the result is finite whenever g * up is, and never NaN: g >= 88 (and +1e30)
// gives g * up to a few ULP; g <= -87.4, where exp(-|g|) is subnormal and GPUs may flush it,
// gives a signed zero or a tiny value within 2^-125 |g * up| of the exact one (lavapipe:
// -0.0 for up > 0 at g = -88, -100, -1e30).
//
// Entry points: swiglu (any F, one element per invocation) and swiglu_vec4 (F % 4 == 0, four
// elements per invocation through vec4 loads and stores). They declare their buffers with
// different element types at the same bindings; each entry point uses only its own pair,
// which WGSL allows (a binding must be unique within one entry point's resource interface).
// No barriers: an invocation past the last element simply returns. silu and silu4 come from
// silu.wgsl (listed first in the registry sources), shared with the mat-vec SwiGLU input.

override WG: u32 = 64u;   // 64, 128 or 256 (registry allowlist)

struct Params {
    tokens: u32,   // T
    ffn: u32,      // F: outputs per token (h has 2F columns)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> h: array<f32>;                 // [T, 2F]   swiglu
@group(0) @binding(1) var<storage, read> h4: array<vec4<f32>>;          // [T, 2F/4] swiglu_vec4
@group(0) @binding(2) var<storage, read_write> out: array<f32>;         // [T, F]   swiglu
@group(0) @binding(2) var<storage, read_write> out4: array<vec4<f32>>;  // [T, F/4] swiglu_vec4

@compute @workgroup_size(WG)
fn swiglu(@builtin(workgroup_id) group: vec3<u32>,
          @builtin(num_workgroups) groups: vec3<u32>,
          @builtin(local_invocation_index) lane: u32) {
    let index = (group.x + group.y * groups.x) * WG + lane;   // into out [T, F]
    if (index >= params.tokens * params.ffn) {
        return;
    }
    let token = index / params.ffn;
    let j = index - token * params.ffn;
    let gate = h[token * 2u * params.ffn + j];
    let up = h[token * 2u * params.ffn + params.ffn + j];
    out[index] = silu(gate) * up;
}

@compute @workgroup_size(WG)
fn swiglu_vec4(@builtin(workgroup_id) group: vec3<u32>,
               @builtin(num_workgroups) groups: vec3<u32>,
               @builtin(local_invocation_index) lane: u32) {
    let quarter = params.ffn / 4u;                              // vec4s per output row
    let index = (group.x + group.y * groups.x) * WG + lane;   // into out4 [T, F/4]
    if (index >= params.tokens * quarter) {
        return;
    }
    let token = index / quarter;
    let j = index - token * quarter;
    let gate = h4[token * 2u * quarter + j];
    let up = h4[token * 2u * quarter + quarter + j];
    out4[index] = silu4(gate) * up;
}
