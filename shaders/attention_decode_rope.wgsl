// Decode attention with RoPE and the KV append fused in: one dispatch instead of
// rope_kv_append followed by attention_decode's chunk pass (host side and tests:
// py/webslm/kernels/attention_rope.py). Sources, in order: the cache prelude
// (attention_rope_kv_f32.wgsl, or f16_round.wgsl + attention_rope_kv_f16.wgsl: `kv_words`,
// kv_widen, kv_narrow), attention_decode_core.wgsl (overrides WG, GW, HD4, bindings 4..6, the
// workgroup memory, phases 2..5), this file.
//
// The new token sits at position p = n_keys - 1. Its q, k and v arrive UN-rotated in the qkv
// binding (f32 words read as u32, sections at element offsets q_at, k_at, v_at, as
// rope_kv_append takes them), with the RoPE (cos, sin) table. Entry point decode_chunk_rope,
// one workgroup per (KV head, block of GW query heads, chunk), as decode_chunk:
//   phase 1   the GW queries are rotated while they are loaded into workgroup memory (q in
//             qkv is not written back: nothing reads it after attention); in the workgroups of
//             the last chunk (the only chunk holding p) the KV head's new k row (rotated) and v
//             row are computed in workgroup memory, rounded to the cache's type. The workgroup
//             of head block 0 of the last chunk, and only it, writes them to cache row p.
//   phases 2..5  as decode_chunk (attention_decode_core.wgsl) over the chunk's positions
//             before p from the cache; position p (last chunk only) is scored and summed from
//             the workgroup's own copy of the row, never read from the cache, so no workgroup
//             depends on another's write. The partials are decode_chunk's: the split-K second
//             pass is attention_combine_* unchanged.
//
// The cached row is what rope_kv_append writes: the same expressions (a' = a cos - b sin,
// b' = b cos + a sin on (own, partner) elements; ADJACENT picks rotate-half (i, i + half) or
// adjacent-pair (2i, 2i + 1)), elements at or past rotary_dim copied bit for bit (f32) or
// rounded by f16_bits (f16), and the scores use exactly the stored value. Each product is
// rounded on its own (`rounded`: an opaque zero OR-ed into its bits), so no compiler can
// contract a cos - b sin into a fused multiply-add: the H200's Vulkan driver did so in this
// kernel (adjacent-pair) though not in rope_kv_append, which rounds each product too wherever
// it is not contracted. The result is fl(fl(a cos) - fl(b sin)), numpy's f32 value.
//
// Bindings: 0 params, 1 qkv (read), 2 k_cache, 3 v_cache (read_write, u32 words), 4 out,
// 5 part_acc, 6 part_ml (core), 7 table (read). Bindings 0..6 are the buffers
// attention_combine_* takes at the same indices. The host validates every size first
// (position < capacity and < table rows, sections inside qkv and disjoint, u32 offsets,
// GW * chunk <= SCORE_WORDS, head_dim = 4 HD4 <= 256).

override ADJACENT: u32 = 0u;   // 0: rotate-half, 1: adjacent-pair

struct Params {
    n_heads: u32,       // words 0..9 as attention_decode's Params (combine reads them too)
    n_kv_heads: u32,
    head_dim: u32,
    capacity: u32,
    n_keys: u32,        // p + 1
    chunk: u32,
    n_chunks: u32,
    head_blocks: u32,
    n_groups: u32,
    scale: f32,
    half: u32,          // rotary_dim / 2
    q_at: u32,          // element offsets of the sections in qkv
    k_at: u32,
    v_at: u32,
    zero: u32,          // 0: see `rounded`
    unused: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> qkv: array<u32>;                  // f32 bits
@group(0) @binding(2) var<storage, read_write> k_cache: array<kv_words>;   // [K][capacity][E / 4]
@group(0) @binding(3) var<storage, read_write> v_cache: array<kv_words>;   // [K][capacity][E / 4]
@group(0) @binding(7) var<storage, read> table: array<vec2<f32>>;          // [table_rows * half] (cos, sin)

// The new row of this workgroup's KV head, as cached (f16-rounded for an f16 cache).
var<workgroup> new_k: array<vec4<f32>, 64>;
var<workgroup> new_v: array<vec4<f32>, 64>;

// No sliding window here: keys start at position 0 (attention_decode_core.wgsl).
fn first_key() -> u32 {
    return 0u;
}

fn cached_key(at: u32) -> vec4<f32> {
    return kv_widen(k_cache[at]);
}

fn cached_value(at: u32) -> vec4<f32> {
    return kv_widen(v_cache[at]);
}

// x, rounded to f32 where it stands: the compiler cannot know params.zero, so it cannot fuse
// the product x into a following addition.
fn rounded(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) | params.zero);
}

// The bits of element e of the head at `head` (element offset in qkv) after RoPE at table row
// `row`: rotated below rotary_dim, else as is. rope_kv_append.wgsl's k_bits, expression for
// expression, with each product rounded on its own.
fn rope_bits(head: u32, e: u32, row: u32) -> u32 {
    if (e >= 2u * params.half) {
        return qkv[head + e];
    }
    var second: bool;
    var pair: u32;
    var partner: u32;
    if (ADJACENT == 1u) {
        second = (e & 1u) == 1u;
        pair = e / 2u;
        partner = e ^ 1u;
    } else {
        second = e >= params.half;
        pair = select(e, e - params.half, second);
        partner = select(e + params.half, e - params.half, second);
    }
    let angle = table[row * params.half + pair];
    let own = bitcast<f32>(qkv[head + e]);
    let other = bitcast<f32>(qkv[head + partner]);
    let own_cos = rounded(own * angle.x);
    let other_sin = rounded(other * angle.y);
    if (second) {
        return bitcast<u32>(own_cos + other_sin);     // b' = b cos + a sin
    }
    return bitcast<u32>(own_cos - other_sin);         // a' = a cos - b sin
}

// Elements 4c .. 4c + 3 of a head after RoPE, as f32 bits.
fn rope_quad(head: u32, c: u32, row: u32) -> vec4<u32> {
    let e = 4u * c;
    return vec4<u32>(rope_bits(head, e, row), rope_bits(head, e + 1u, row),
                     rope_bits(head, e + 2u, row), rope_bits(head, e + 3u, row));
}

@compute @workgroup_size(WG)
fn decode_chunk_rope(@builtin(workgroup_id) group: vec3<u32>,
                     @builtin(num_workgroups) groups: vec3<u32>,
                     @builtin(local_invocation_index) lane: u32) {
    let wid = group.x + group.y * groups.x;
    if (wid >= params.n_groups) {
        return;  // the whole workgroup leaves together: barriers below stay uniform
    }
    let e4 = HD4;
    let w = chunk_work(wid);
    let position = params.n_keys - 1u;                    // the new token's (table row, cache row)
    let has_new = w.chunk_id == params.n_chunks - 1u;     // the chunk holding it: the last one
    let n_cached = select(w.n_here, w.n_here - 1u, has_new);   // positions read from the cache

    // Phase 1: queries rotated into workgroup memory and scaled; the new k and v rows.
    for (var i = lane; i < GW * e4; i += WG) {
        let g = i / e4;
        var value = vec4<f32>(0.0);
        if (g < w.n_heads_here) {
            let head = params.q_at + (w.head0 + g) * params.head_dim;
            value = bitcast<vec4<f32>>(rope_quad(head, i % e4, position)) * params.scale;
        }
        qv[i] = value;
    }
    if (has_new) {
        let k_head = params.k_at + w.kv_head * params.head_dim;
        let v_head = params.v_at + w.kv_head * params.head_dim;
        let row = (w.kv_head * params.capacity + position) * e4;
        for (var c = lane; c < e4; c += WG) {
            let e = 4u * c;
            let k_words = kv_narrow(rope_quad(k_head, c, position));
            let v_words = kv_narrow(vec4<u32>(qkv[v_head + e], qkv[v_head + e + 1u],
                                              qkv[v_head + e + 2u], qkv[v_head + e + 3u]));
            if (w.block == 0u) {          // the one workgroup per KV head that appends the row
                k_cache[row + c] = k_words;
                v_cache[row + c] = v_words;
            }
            new_k[c] = kv_widen(k_words);
            new_v[c] = kv_widen(v_words);
        }
    }
    if (lane < 8u) {
        atomicStore(&max_code[lane], 0u);   // below the code of every float
    }
    workgroupBarrier();

    // Phase 2: scores of the cached positions, then the new one (position n_here - 1 of the
    // last chunk) from new_k, by the invocation that would have read it, in the same order.
    score_rows(lane, w, n_cached);
    if (has_new && lane == n_cached % WG) {
        var s: array<f32, 8>;
        for (var g = 0u; g < GW; g++) {
            s[g] = 0.0;
        }
        for (var c = 0u; c < e4; c++) {
            let k = new_k[c];
            for (var g = 0u; g < GW; g++) {
                s[g] += dot(qv[g * e4 + c], k);
            }
        }
        for (var g = 0u; g < GW; g++) {
            scores[g * params.chunk + n_cached] = s[g];
            atomicMax(&max_code[g], order_code(s[g]));
        }
    }
    workgroupBarrier();

    weigh_scores(lane, w.n_here);           // phase 3: exp(s - m), the new position included
    workgroupBarrier();

    // Phase 4: weighted V sums of the cached positions per slice; the slice that position
    // n_cached falls to (round-robin) adds it from new_v. Each item is updated by the
    // invocation that wrote it, so no barrier is needed in between.
    let pairs = w.n_heads_here * e4;
    let slices = max(1u, WG / pairs);
    sum_values(lane, w, n_cached, pairs, slices);
    if (has_new) {
        for (var item = lane; item < slices * pairs; item += WG) {
            if (item / pairs == n_cached % slices) {
                let pair = item % pairs;
                let p = scores[(pair / e4) * params.chunk + n_cached];
                qv[item] += p * new_v[pair % e4];
                part_l[item] += p;
            }
        }
    }
    workgroupBarrier();
    write_chunk(lane, w, pairs, slices);    // phase 5: output or the chunk's partials
}
