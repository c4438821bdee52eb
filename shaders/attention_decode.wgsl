// Decode attention: one new token at position p attends to cache positions first_key..p.
//
//   out[h, :] = sum_j softmax_j(scale * q[h] . K[kv(h), j]) * V[kv(h), j]     j = first_key..p
//
// first_key is 0, or for a sliding-window layer (Gemma 3) max(0, p + 1 - window): the host
// sets it with n_keys = p + 1 - first_key, so the chunks cover exactly the window.
//   kv(h) = h / G, G = n_heads / n_kv_heads (grouped-query attention)
//
// Split-K ("flash decoding"): the p + 1 positions are cut into chunks of `chunk`
// positions, and one workgroup handles one chunk for one KV head and up to GW of the query
// heads that read it, so K and V rows are loaded once for all of them and many
// workgroups are in flight even for a single token. Entry points:
//   decode_chunk  per (KV head, head block, chunk): the chunk's max score m, sum of
//                 exp(s - m) l and unnormalized output sum exp(s - m) v. With a single
//                 chunk it writes the normalized output directly (no second pass).
//   combine       per (query head, 4 output elements): rescales the chunks to their
//                 common max and normalizes:  out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c.
// Both use the same bindings, so the engine binds one bind group to both pipelines.
// The chunk pass's phases 2..5 live in attention_decode_core.wgsl (listed before this file),
// shared with attention_decode_rope.wgsl.
//
// Within a chunk the softmax is stable without an online rescale: the workgroup first
// computes every score of the chunk (kept in workgroup memory), takes the exact max with
// an atomic max on order-preserving integer codes, then exponentiates once per score.
// Scores never overflow: every exponent is s - max <= 0.
//
// Accumulation is f32. The cache element type comes from the prelude (attention_kv_f32 or
// attention_kv_f16), which defines `kv4`. Cache layout (py/webslm/kernels/kv_cache.py):
// [n_kv_heads][capacity][head_dim], head-major. head_dim is a multiple of 4 (vec4 rows).
// The host validates every size before a dispatch (position < capacity, H % K == 0, u32
// offsets, GW * chunk <= SCORE_WORDS), so indices here never leave their buffers.

struct Params {
    n_heads: u32,       // H
    n_kv_heads: u32,    // K, divides H
    head_dim: u32,      // E = 4 * HD4 (the kernels use HD4)
    capacity: u32,      // positions per KV head in the cache buffers
    n_keys: u32,        // p + 1
    chunk: u32,         // positions per workgroup, GW * chunk <= SCORE_WORDS
    n_chunks: u32,      // ceil(n_keys / chunk)
    head_blocks: u32,   // ceil(G / GW)
    n_groups: u32,      // K * head_blocks * n_chunks: workgroups with work
    scale: f32,         // usually 1 / sqrt(head_dim)
    first_key: u32,     // position of key 0 (a sliding window's start; 0 without a window)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;        // [H * E / 4]: the token's queries
@group(0) @binding(2) var<storage, read> k_cache: array<kv4>;        // [K][capacity][E / 4]
@group(0) @binding(3) var<storage, read> v_cache: array<kv4>;        // [K][capacity][E / 4]
// Bindings 4..6 (out, part_acc, part_ml), the overrides WG, GW, HD4, the workgroup memory and
// the phases are in attention_decode_core.wgsl.

fn first_key() -> u32 {
    return params.first_key;
}

fn cached_key(at: u32) -> vec4<f32> {
    return vec4<f32>(k_cache[at]);
}

fn cached_value(at: u32) -> vec4<f32> {
    return vec4<f32>(v_cache[at]);
}

@compute @workgroup_size(WG)
fn decode_chunk(@builtin(workgroup_id) group: vec3<u32>,
                @builtin(num_workgroups) groups: vec3<u32>,
                @builtin(local_invocation_index) lane: u32) {
    let wid = group.x + group.y * groups.x;
    if (wid >= params.n_groups) {
        return;  // the whole workgroup leaves together: barriers below stay uniform
    }
    chunk_phases(wid, lane);
}

// Phases 1..5 of workgroup `wid` (< n_groups), for decode_chunk and attention_decode_xq.wgsl's
// decode_chunk_xq. Called in uniform control flow: the barriers stay uniform.
fn chunk_phases(wid: u32, lane: u32) {
    let e4 = HD4;
    let w = chunk_work(wid);

    // Phase 1: queries into workgroup memory, scaled once here instead of per score.
    for (var i = lane; i < GW * e4; i += WG) {
        let g = i / e4;
        var value = vec4<f32>(0.0);
        if (g < w.n_heads_here) {
            value = q[(w.head0 + g) * e4 + i % e4] * params.scale;
        }
        qv[i] = value;
    }
    if (lane < 8u) {
        atomicStore(&max_code[lane], 0u);   // below the code of every float
    }
    workgroupBarrier();

    score_rows(lane, w, w.n_here);          // phase 2: scores and their max
    workgroupBarrier();
    weigh_scores(lane, w.n_here);           // phase 3: exp(s - m)
    workgroupBarrier();
    let pairs = w.n_heads_here * e4;
    let slices = max(1u, WG / pairs);
    sum_values(lane, w, w.n_here, pairs, slices);   // phase 4: weighted V sums per slice
    workgroupBarrier();
    write_chunk(lane, w, pairs, slices);    // phase 5: output or the chunk's partials
}

// Second pass (only when n_chunks > 1): one invocation per (head, 4 output elements).
// No barriers, so invocations past the end simply return.
@compute @workgroup_size(WG)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) groups: vec3<u32>) {
    let e4 = HD4;
    let item = gid.x + gid.y * groups.x * WG;
    // One chunk: the chunk pass wrote the output itself (a sliding-window layer's few keys in
    // a step whose other layers need two passes).
    if (item >= params.n_heads * e4 || params.n_chunks == 1u) {
        return;
    }
    let head = item / e4;
    let c = item % e4;
    let first = head * params.n_chunks;
    var m = part_ml[first].x;
    for (var i = 1u; i < params.n_chunks; i++) {
        m = max(m, part_ml[first + i].x);
    }
    var acc = vec4<f32>(0.0);
    var l = 0.0;
    for (var i = 0u; i < params.n_chunks; i++) {
        let ml = part_ml[first + i];
        let w = exp(ml.x - m);             // <= 1: the chunk's share at the common max
        acc += w * part_acc[(first + i) * e4 + c];
        l += w * ml.y;
    }
    out[head * e4 + c] = acc / l;
}
