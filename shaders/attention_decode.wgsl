// Decode attention: one new token at position p attends to cache positions 0..p.
//
//   out[h, :] = sum_j softmax_j(scale * q[h] . K[kv(h), j]) * V[kv(h), j]     j = 0..p
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

override WG: u32 = 64u;   // invocations per workgroup; allowlist 64, 128, 256 (registry)
override GW: u32 = 1u;    // query heads per workgroup, 1..8, GW * HD4 <= 256; the host picks it
override HD4: u32 = 16u;  // head_dim / 4, 1..64: a constant, so the loops over a row unroll

const SCORE_WORDS = 2048u;   // scores of one chunk: GW * chunk <= 2048 (8 KiB)
const QV_SLOTS = 256u;       // vec4 slots: GW * head_dim / 4 <= 256 (4 KiB)

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
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;        // [H * E / 4]: the token's queries
@group(0) @binding(2) var<storage, read> k_cache: array<kv4>;        // [K][capacity][E / 4]
@group(0) @binding(3) var<storage, read> v_cache: array<kv4>;        // [K][capacity][E / 4]
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;     // [H * E / 4]
@group(0) @binding(5) var<storage, read_write> part_acc: array<vec4<f32>>; // [H][n_chunks][E / 4]: unnormalized sums
@group(0) @binding(6) var<storage, read_write> part_ml: array<vec2<f32>>;  // [H][n_chunks]: (max m, sum l)

// q rows (pre-scaled) during the score phase; afterwards the per-slice partial sums of V.
var<workgroup> qv: array<vec4<f32>, QV_SLOTS>;
var<workgroup> part_l: array<f32, QV_SLOTS>;          // per-slice partial sums of weights
var<workgroup> scores: array<f32, SCORE_WORDS>;       // [GW][chunk]: scores, then weights
var<workgroup> max_code: array<atomic<u32>, 8>;       // per head: order-preserving code of the max score

// f32 -> u32 with a < b  <=>  code(a) < code(b) for non-NaN values (flip the sign bit of
// positives, all bits of negatives), so atomicMax on codes is an exact float max.
fn order_code(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    return select(bits | 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);
}

fn from_order_code(code: u32) -> f32 {
    return bitcast<f32>(select(~code, code & 0x7fffffffu, (code & 0x80000000u) != 0u));
}

@compute @workgroup_size(WG)
fn decode_chunk(@builtin(workgroup_id) group: vec3<u32>,
                @builtin(num_workgroups) groups: vec3<u32>,
                @builtin(local_invocation_index) lane: u32) {
    let wid = group.x + group.y * groups.x;
    if (wid >= params.n_groups) {
        return;  // the whole workgroup leaves together: barriers below stay uniform
    }
    let e4 = HD4;
    let g_size = params.n_heads / params.n_kv_heads;
    let chunk_id = wid % params.n_chunks;
    let block = (wid / params.n_chunks) % params.head_blocks;
    let kv_head = wid / (params.n_chunks * params.head_blocks);
    let head0 = kv_head * g_size + block * GW;            // first query head of this workgroup
    let n_heads_here = min(GW, g_size - block * GW);      // the last block may hold fewer
    let key0 = chunk_id * params.chunk;
    let n_here = min(params.chunk, params.n_keys - key0);  // >= 1: chunks are never empty
    let row0 = kv_head * params.capacity + key0;          // cache row of position key0

    // Phase 1: queries into workgroup memory, scaled once here instead of per score.
    for (var i = lane; i < GW * e4; i += WG) {
        let g = i / e4;
        var value = vec4<f32>(0.0);
        if (g < n_heads_here) {
            value = q[(head0 + g) * e4 + i % e4] * params.scale;
        }
        qv[i] = value;
    }
    if (lane < 8u) {
        atomicStore(&max_code[lane], 0u);   // below the code of every float
    }
    workgroupBarrier();

    // Phase 2: one position per invocation, all GW heads at once (each K row is read once).
    // The row is read as vec4s; consecutive invocations read consecutive rows.
    var thread_max: array<f32, 8>;
    for (var g = 0u; g < GW; g++) {
        thread_max[g] = -3.402823e38;
    }
    for (var j = lane; j < n_here; j += WG) {
        var s: array<f32, 8>;
        for (var g = 0u; g < GW; g++) {
            s[g] = 0.0;
        }
        let row = (row0 + j) * e4;
        for (var c = 0u; c < e4; c++) {
            let k = vec4<f32>(k_cache[row + c]);
            for (var g = 0u; g < GW; g++) {
                s[g] += dot(qv[g * e4 + c], k);
            }
        }
        for (var g = 0u; g < GW; g++) {
            scores[g * params.chunk + j] = s[g];
            thread_max[g] = max(thread_max[g], s[g]);
        }
    }
    for (var g = 0u; g < GW; g++) {
        if (lane < n_here) {  // invocations without a position have no score to offer
            atomicMax(&max_code[g], order_code(thread_max[g]));
        }
    }
    workgroupBarrier();

    // Phase 3: weights exp(s - m) <= 1, each invocation on the scores it wrote.
    for (var g = 0u; g < GW; g++) {
        let m = from_order_code(atomicLoad(&max_code[g]));
        for (var j = lane; j < n_here; j += WG) {
            scores[g * params.chunk + j] = exp(scores[g * params.chunk + j] - m);
        }
    }
    workgroupBarrier();

    // Phase 4: weighted sum of V rows. A work item is (slice, head g, column c): the
    // positions are dealt round-robin to `slices` slices so that small heads still keep
    // the workgroup busy. Consecutive invocations read consecutive vec4s of one V row;
    // four rows per step keep four loads in flight.
    let pairs = n_heads_here * e4;
    let slices = max(1u, WG / pairs);
    for (var item = lane; item < slices * pairs; item += WG) {
        let pair = item % pairs;
        let g = pair / e4;
        let c = pair % e4;
        let w = g * params.chunk;
        var acc = vec4<f32>(0.0);
        var l = 0.0;
        var j = item / pairs;
        for (; j + 3u * slices < n_here; j += 4u * slices) {
            let p = vec4<f32>(scores[w + j], scores[w + j + slices],
                              scores[w + j + 2u * slices], scores[w + j + 3u * slices]);
            let at = (row0 + j) * e4 + c;
            let v0 = vec4<f32>(v_cache[at]);
            let v1 = vec4<f32>(v_cache[at + slices * e4]);
            let v2 = vec4<f32>(v_cache[at + 2u * slices * e4]);
            let v3 = vec4<f32>(v_cache[at + 3u * slices * e4]);
            acc += (p.x * v0 + p.y * v1) + (p.z * v2 + p.w * v3);
            l += (p.x + p.y) + (p.z + p.w);
        }
        for (; j < n_here; j += slices) {
            let p = scores[w + j];
            acc += p * vec4<f32>(v_cache[(row0 + j) * e4 + c]);
            l += p;
        }
        qv[item] = acc;     // q is no longer needed: the barrier above ended phase 2
        part_l[item] = l;
    }
    workgroupBarrier();

    // Phase 5: add the slices and write, normalized when this chunk is the whole context.
    for (var pair = lane; pair < pairs; pair += WG) {
        var acc = qv[pair];
        var l = part_l[pair];
        for (var slice = 1u; slice < slices; slice++) {
            acc += qv[pair + slice * pairs];
            l += part_l[pair + slice * pairs];
        }
        let g = pair / e4;
        let c = pair % e4;
        let head = head0 + g;
        if (params.n_chunks == 1u) {
            out[head * e4 + c] = acc / l;
        } else {
            let slot = head * params.n_chunks + chunk_id;
            part_acc[slot * e4 + c] = acc;
            if (c == 0u) {
                part_ml[slot] = vec2<f32>(from_order_code(atomicLoad(&max_code[g])), l);
            }
        }
    }
}

// Second pass (only when n_chunks > 1): one invocation per (head, 4 output elements).
// No barriers, so invocations past the end simply return.
@compute @workgroup_size(WG)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) groups: vec3<u32>) {
    let e4 = HD4;
    let item = gid.x + gid.y * groups.x * WG;
    if (item >= params.n_heads * e4) {
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
