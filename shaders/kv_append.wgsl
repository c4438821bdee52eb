// KV append: write the keys and values of T new tokens (after RoPE) into a layer's caches.
//
//   k_new, v_new: [T][n_kv_heads * head_dim] f32 (the projections' layout)
//   k_cache, v_cache: [n_kv_heads][capacity][head_dim] (head-major), element type f32 or f16
//   cache[kv][start + t][e] = new[t][kv * head_dim + e]     t < T
//
// Both entry points move bits, never arithmetic, so the result is exact and does not rest
// on WGSL's rounding latitude (WGSL lets a float conversion round either way):
//   append_f32  copies the f32 words unchanged (NaN payloads included);
//   append_f16  converts in integer arithmetic with round-to-nearest-even, overflow to
//               infinity and gradual underflow, exactly as IEEE-754 (and numpy's
//               astype(float16)) do, and stores two halves per u32 word.
// Because the caches are viewed as u32 words, neither entry needs shader-f16: only the
// attention kernels that read an f16 cache do.
//
// One invocation per 4 consecutive elements of a row (head_dim is a multiple of 4); there
// are no barriers, so invocations past the end simply return. f16_bits comes from
// f16_round.wgsl (listed first in the registry sources), shared with rope_kv_append.wgsl.

override WG: u32 = 64u;   // allowlist 64, 128, 256 (registry)

struct Params {
    n_kv_heads: u32,   // K
    head_dim: u32,     // E, multiple of 4
    capacity: u32,     // positions per KV head in the caches
    start: u32,        // cache position of the first new token
    n_tokens: u32,     // T; start + T <= capacity (checked by the host)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k_new: array<vec4<u32>>;     // [T][K * E / 4]: f32 bits
@group(0) @binding(2) var<storage, read> v_new: array<vec4<u32>>;     // [T][K * E / 4]: f32 bits
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;   // f32: [K][capacity][E]; f16: [K][capacity][E / 2] words
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;   // same layout as k_cache

fn destination(i: u32) -> u32 {
    // Index of the first of the 4 elements of input vec4 i, in cache elements.
    let e4 = params.head_dim / 4u;
    let per_token = params.n_kv_heads * e4;
    let t = i / per_token;
    let kv = (i % per_token) / e4;
    return ((kv * params.capacity + params.start + t) * e4 + i % e4) * 4u;
}

fn item_index(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return gid.x + gid.y * groups.x * WG;
}

@compute @workgroup_size(WG)
fn append_f32(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>) {
    let i = item_index(gid, groups);
    if (i >= params.n_tokens * params.n_kv_heads * (params.head_dim / 4u)) {
        return;
    }
    let at = destination(i);
    let k = k_new[i];
    let v = v_new[i];
    for (var c = 0u; c < 4u; c++) {
        k_cache[at + c] = k[c];
        v_cache[at + c] = v[c];
    }
}

@compute @workgroup_size(WG)
fn append_f16(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>) {
    let i = item_index(gid, groups);
    if (i >= params.n_tokens * params.n_kv_heads * (params.head_dim / 4u)) {
        return;
    }
    let at = destination(i) / 2u;     // two halves per word, element 2w in the low half
    let k = k_new[i];
    let v = v_new[i];
    k_cache[at] = f16_bits(k.x) | (f16_bits(k.y) << 16u);
    k_cache[at + 1u] = f16_bits(k.z) | (f16_bits(k.w) << 16u);
    v_cache[at] = f16_bits(v.x) | (f16_bits(v.y) << 16u);
    v_cache[at + 1u] = f16_bits(v.z) | (f16_bits(v.w) << 16u);
}
