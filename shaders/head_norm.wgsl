// Per-head RMSNorm of q and k, in place (Gemma 3's q_norm and k_norm, before RoPE), as
// py/webslm/cpu/layers.py rms_norm computes it over each head's head_dim elements:
//
//   q[t, h, :] = q[t, h, :] / sqrt(mean(q[t, h, :]^2) + eps) * q_weight      h < heads
//   k[t, j, :] = k[t, j, :] / sqrt(mean(k[t, j, :]^2) + eps) * k_weight      j < kv_heads
//
// (host side and golden tests: py/webslm/kernels/head_norm.py). q and k are sections of the
// planar qkv activation at element offsets q_at, k_at ([T][heads * head_dim] and
// [T][kv_heads * head_dim]); the v section and everything else in qkv is left alone. One
// read_write binding for the whole activation: WebGPU refuses one buffer bound both read-only
// and writable in a dispatch, and q, k, v share it.
//
// One workgroup per head row: rows 0 .. T*(heads + kv_heads) - 1, token-major, the q heads of
// a token first. The arithmetic is norm.wgsl's rms_norm step for step (sum of squares per lane,
// tree sum, divisor sqrt(sum / dim + eps), x / divisor * w), so norm.py's error rule holds.
// Each lane reads its elements, the barrier of the sum passes, and it writes the same
// elements: no lane reads what another writes. A workgroup past the last row leaves whole.

override WG: u32 = 64u;   // 64, 128 or 256 (registry allowlist); a power of two for the tree

struct Params {
    tokens: u32,     // T
    heads: u32,      // query heads
    kv_heads: u32,   // KV heads
    head_dim: u32,   // E: elements per normalized row
    q_at: u32,       // element offsets of the q and k sections in qkv
    k_at: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_weight: array<f32>;      // [E]
@group(0) @binding(2) var<storage, read> k_weight: array<f32>;      // [E]
@group(0) @binding(3) var<storage, read_write> qkv: array<f32>;     // the planar activation

var<workgroup> partial: array<f32, WG>;

fn workgroup_sum(lane: u32, value: f32) -> f32 {
    partial[lane] = value;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            partial[lane] += partial[lane + stride];
        }
        workgroupBarrier();
    }
    return partial[0];
}

@compute @workgroup_size(WG)
fn head_norm(@builtin(workgroup_id) group: vec3<u32>,
             @builtin(num_workgroups) groups: vec3<u32>,
             @builtin(local_invocation_index) lane: u32) {
    let row = group.x + group.y * groups.x;
    let per_token = params.heads + params.kv_heads;
    if (row >= params.tokens * per_token) {
        return;
    }
    let t = row / per_token;
    let h = row - t * per_token;
    let is_q = h < params.heads;
    var start = params.k_at + (t * params.kv_heads + h - params.heads) * params.head_dim;
    if (is_q) {
        start = params.q_at + (t * params.heads + h) * params.head_dim;
    }
    var squares = 0.0;
    for (var e = lane; e < params.head_dim; e += WG) {
        let v = qkv[start + e];
        squares += v * v;
    }
    let divisor = sqrt(workgroup_sum(lane, squares) / f32(params.head_dim) + params.eps);
    for (var e = lane; e < params.head_dim; e += WG) {
        let w = select(k_weight[e], q_weight[e], is_q);
        qkv[start + e] = qkv[start + e] / divisor * w;
    }
}
