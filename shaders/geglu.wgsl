// GeGLU activation (Gemma 3's feed-forward), laid out as swiglu.wgsl (same params, bindings,
// grid; host side py/webslm/kernels/swiglu.py):
//
//   out[t, j] = gelu_tanh(h[t, j]) * h[t, F + j]      h = [gate | up], j < F
//
// gelu_tanh comes from gelu.wgsl (listed first in the registry sources).

override WG: u32 = 64u;   // 64, 128 or 256 (registry allowlist)

struct Params {
    tokens: u32,   // T
    ffn: u32,      // F: outputs per token (h has 2F columns)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> h: array<f32>;                 // [T, 2F]   geglu
@group(0) @binding(1) var<storage, read> h4: array<vec4<f32>>;          // [T, 2F/4] geglu_vec4
@group(0) @binding(2) var<storage, read_write> out: array<f32>;         // [T, F]   geglu
@group(0) @binding(2) var<storage, read_write> out4: array<vec4<f32>>;  // [T, F/4] geglu_vec4

@compute @workgroup_size(WG)
fn geglu(@builtin(workgroup_id) group: vec3<u32>,
         @builtin(num_workgroups) groups: vec3<u32>,
         @builtin(local_invocation_index) lane: u32) {
    let index = (group.x + group.y * groups.x) * WG + lane;   // into out [T, F]
    if (index >= params.tokens * params.ffn) {
        return;
    }
    let token = index / params.ffn;
    let j = index - token * params.ffn;
    out[index] = gelu_tanh(h[token * 2u * params.ffn + j]) * h[token * 2u * params.ffn + params.ffn + j];
}

@compute @workgroup_size(WG)
fn geglu_vec4(@builtin(workgroup_id) group: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>,
              @builtin(local_invocation_index) lane: u32) {
    let quarter = params.ffn / 4u;
    let index = (group.x + group.y * groups.x) * WG + lane;   // into out4 [T, F/4]
    if (index >= params.tokens * quarter) {
        return;
    }
    let token = index / quarter;
    let j = index - token * quarter;
    out4[index] = gelu_tanh4(h4[token * 2u * quarter + j]) * h4[token * 2u * quarter + quarter + j];
}
