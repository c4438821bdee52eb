// RoPE and KV append in one dispatch, for a layer's new tokens (decode: one token): q is
// rotated in place, and the rotated k rows and the v rows are written into the layer's K and
// V caches (host side and tests: py/webslm/kernels/rope_kv.py). It replaces rope (q and k)
// followed by kv_append.
//
//   qkv     f32 words (read as u32, so copies keep their bits), one binding holding three
//           planar sections at element offsets q_at, k_at, v_at:
//             q [T][heads * head_dim]        rotated in place
//             k [T][kv_heads * head_dim]     read only (left unrotated: attention reads K
//                                            from the cache)
//             v [T][kv_heads * head_dim]     read only
//           One read_write binding for all three: WebGPU refuses one buffer bound both
//           read-only and writable in a dispatch, and the engine's q, k, v share a buffer.
//   table   [table_rows][rotary_dim / 2] (cos, sin) f32, row p = absolute position p, as rope.wgsl
//   k_cache, v_cache  [kv_heads][capacity][head_dim] as u32 words: f32 bits, or two f16 per
//           word (f16_bits, f16_round.wgsl: round to nearest even in integer arithmetic)
//
// Token t sits at position start + t: table row start + t and cache row start + t. Pairs are
// rotated as in rope.wgsl (same expressions: a' = a cos - b sin, b' = b cos + a sin; ADJACENT
// picks rotate-half (i, i + rotary_dim/2) or adjacent-pair (2i, 2i + 1)); elements at or past
// rotary_dim are not rotated (q: untouched; k, v: copied bit for bit, or rounded to f16).
//
// Work items, one invocation each, no barriers (invocations past the last item return):
//   0 .. T*heads*half - 1        one pair of q, rotated in place (reads and writes only its pair)
//   then T*kv_heads*head_dim/4   four consecutive elements of one k row and the same four of
//                                its v row: each k element's rotated value is computed from
//                                the unrotated k section (its own and its partner's element),
//                                which nobody writes, so any rotary_dim works without races,
//                                and f16 words (two elements) are written whole by one invocation.

override WG: u32 = 64u;        // 64, 128 or 256 (registry allowlist)
override ADJACENT: u32 = 0u;   // 0: rotate-half, 1: adjacent-pair

struct Params {
    tokens: u32,     // T
    heads: u32,      // query heads
    kv_heads: u32,   // KV heads
    head_dim: u32,   // E, a multiple of 4
    half: u32,       // rotary_dim / 2
    start: u32,      // position of token 0
    capacity: u32,   // cache positions per KV head
    q_at: u32,       // element offsets of the sections in qkv
    k_at: u32,
    v_at: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> table: array<vec2<f32>>;     // [table_rows * half] (cos, sin)
@group(0) @binding(2) var<storage, read_write> qkv: array<u32>;       // f32 bits
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;

fn element(i: u32) -> f32 {
    return bitcast<f32>(qkv[i]);
}

// Pair i of the head at `head` (element offset in qkv), in place, at table row `row`.
fn rotate_q_pair(head: u32, i: u32, row: u32) {
    let angle = table[row * params.half + i];
    var first = head + i;
    var second = first + params.half;
    if (ADJACENT == 1u) {
        first = head + 2u * i;
        second = first + 1u;
    }
    let a = element(first);
    let b = element(second);
    qkv[first] = bitcast<u32>(a * angle.x - b * angle.y);
    qkv[second] = bitcast<u32>(b * angle.x + a * angle.y);
}

// The cached bits of element e of the k head at `head`: rotated (below rotary_dim) or as is.
fn k_bits(head: u32, e: u32, row: u32) -> u32 {
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
    let own = element(head + e);
    let other = element(head + partner);
    if (second) {
        return bitcast<u32>(own * angle.x + other * angle.y);     // b' = b cos + a sin
    }
    return bitcast<u32>(own * angle.x - other * angle.y);         // a' = a cos - b sin
}

// Item `index` when it is a q pair: rotates it in place and returns true.
fn rotate_q(index: u32) -> bool {
    let per_token = params.heads * params.half;
    if (index >= params.tokens * per_token) {
        return false;
    }
    let t = index / per_token;
    let within = index - t * per_token;
    let head = within / params.half;
    rotate_q_pair(params.q_at + (t * params.heads + head) * params.head_dim, within - head * params.half,
                  params.start + t);
    return true;
}

struct KvItem {
    live: bool,       // false past the last item
    k_head: u32,      // element offset of the k head in qkv
    v_head: u32,      // element offset of the v head in qkv
    e0: u32,          // first of the four elements
    row: u32,         // table row (the position)
    dst: u32,         // cache element index of element e0
}

// k/v item i (counted after the q pairs): four elements of one (token, KV head) row.
fn kv_item(i: u32) -> KvItem {
    var out: KvItem;
    let quads = params.head_dim / 4u;
    let per_token = params.kv_heads * quads;
    out.live = i < params.tokens * per_token;
    let t = i / per_token;
    let kv = (i - t * per_token) / quads;
    let quad = i - t * per_token - kv * quads;
    let head = (t * params.kv_heads + kv) * params.head_dim;
    out.k_head = params.k_at + head;
    out.v_head = params.v_at + head;
    out.e0 = quad * 4u;
    out.row = params.start + t;
    out.dst = (kv * params.capacity + params.start + t) * params.head_dim + quad * 4u;
    return out;
}

// This invocation's k/v item; a q pair is rotated here instead (returned with live = false).
fn work(group: vec3<u32>, groups: vec3<u32>, lane: u32) -> KvItem {
    let index = (group.x + group.y * groups.x) * WG + lane;
    if (rotate_q(index)) {
        var done: KvItem;
        done.live = false;
        return done;
    }
    return kv_item(index - params.tokens * params.heads * params.half);
}

@compute @workgroup_size(WG)
fn rope_kv_append_f32(@builtin(workgroup_id) group: vec3<u32>,
                      @builtin(num_workgroups) groups: vec3<u32>,
                      @builtin(local_invocation_index) lane: u32) {
    let it = work(group, groups, lane);
    if (!it.live) {
        return;
    }
    for (var c = 0u; c < 4u; c++) {
        k_cache[it.dst + c] = k_bits(it.k_head, it.e0 + c, it.row);
        v_cache[it.dst + c] = qkv[it.v_head + it.e0 + c];
    }
}

@compute @workgroup_size(WG)
fn rope_kv_append_f16(@builtin(workgroup_id) group: vec3<u32>,
                      @builtin(num_workgroups) groups: vec3<u32>,
                      @builtin(local_invocation_index) lane: u32) {
    let it = work(group, groups, lane);
    if (!it.live) {
        return;
    }
    let at = it.dst / 2u;     // two halves per word, element 2w in the low half
    for (var c = 0u; c < 2u; c++) {
        let e = it.e0 + 2u * c;
        k_cache[at + c] = f16_bits(k_bits(it.k_head, e, it.row)) | (f16_bits(k_bits(it.k_head, e + 1u, it.row)) << 16u);
        v_cache[at + c] = f16_bits(qkv[it.v_head + e]) | (f16_bits(qkv[it.v_head + e + 1u]) << 16u);
    }
}
