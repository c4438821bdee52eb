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
// Biases (Qwen2: q, k and v projections with a bias): the rope_kv_append_bias_* entry points
// add bq, bk, bv to the q, k and v values as they read them, before rotating (q in place, k
// into the cache) and before writing v: x' = rot(x + b), one f32 add per element, as the CPU
// path's `q + bq` then RoPE. The plain entry points read no bias (select(x, x + b, false) is
// x itself), so their results are what they were bit for bit.
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
// rope_kv_append_bias_* only: the projections' biases (one row each, shared by every token).
@group(0) @binding(5) var<storage, read> bias_q: array<f32>;          // [heads * head_dim]
@group(0) @binding(6) var<storage, read> bias_k: array<f32>;          // [kv_heads * head_dim]
@group(0) @binding(7) var<storage, read> bias_v: array<f32>;          // [kv_heads * head_dim]

fn element(i: u32) -> f32 {
    return bitcast<f32>(qkv[i]);
}

// x + b when the entry point adds biases, else x unchanged.
fn biased(x: f32, b: f32, on: bool) -> f32 {
    return select(x, x + b, on);
}

// A q pair: its two elements' offsets in qkv, their offsets in bias_q, and its table row.
struct QPair {
    live: bool,       // false when the item is not a q pair
    first: u32,
    second: u32,
    bias_first: u32,
    bias_second: u32,
    pair: u32,        // which (cos, sin) of the row
    row: u32,
}

// Item `index` as a q pair (items 0 .. T*heads*half - 1).
fn q_pair(index: u32) -> QPair {
    var out: QPair;
    let per_token = params.heads * params.half;
    out.live = index < params.tokens * per_token;
    let t = index / per_token;
    let within = index - t * per_token;
    let head = within / params.half;
    let i = within - head * params.half;
    var a = i;
    var b = i + params.half;
    if (ADJACENT == 1u) {
        a = 2u * i;
        b = a + 1u;
    }
    let head_at = head * params.head_dim;
    out.first = params.q_at + t * params.heads * params.head_dim + head_at + a;
    out.second = out.first + (b - a);
    out.bias_first = head_at + a;
    out.bias_second = head_at + b;
    out.pair = i;
    out.row = params.start + t;
    return out;
}

// Rotate a q pair in place: a' = a cos - b sin, b' = b cos + a sin (a, b with their biases).
fn rotate_q(p: QPair, bias_a: f32, bias_b: f32, on: bool) {
    let angle = table[p.row * params.half + p.pair];
    let a = biased(element(p.first), bias_a, on);
    let b = biased(element(p.second), bias_b, on);
    qkv[p.first] = bitcast<u32>(a * angle.x - b * angle.y);
    qkv[p.second] = bitcast<u32>(b * angle.x + a * angle.y);
}

// The element paired with element e of a head in the rotation (e < rotary_dim).
fn partner(e: u32) -> u32 {
    if (ADJACENT == 1u) {
        return e ^ 1u;
    }
    return select(e + params.half, e - params.half, e >= params.half);
}

// The cached value of element e of the k head at `head` (element offset in qkv): rotated
// below rotary_dim, as is past it; own and other: the element's and its partner's biases.
fn k_value(head: u32, e: u32, row: u32, own_bias: f32, other_bias: f32, on: bool) -> f32 {
    let own = biased(element(head + e), own_bias, on);
    if (e >= 2u * params.half) {
        return own;
    }
    var second: bool;
    var pair: u32;
    if (ADJACENT == 1u) {
        second = (e & 1u) == 1u;
        pair = e / 2u;
    } else {
        second = e >= params.half;
        pair = select(e, e - params.half, second);
    }
    let angle = table[row * params.half + pair];
    let other = biased(element(head + partner(e)), other_bias, on);
    if (second) {
        return own * angle.x + other * angle.y;     // b' = b cos + a sin
    }
    return own * angle.x - other * angle.y;         // a' = a cos - b sin
}

// The plain entry points' k bits: element e unrotated past rotary_dim is copied bit for bit.
fn k_bits(head: u32, e: u32, row: u32) -> u32 {
    if (e >= 2u * params.half) {
        return qkv[head + e];
    }
    return bitcast<u32>(k_value(head, e, row, 0.0, 0.0, false));
}

struct KvItem {
    live: bool,       // false past the last item
    k_head: u32,      // element offset of the k head in qkv
    v_head: u32,      // element offset of the v head in qkv
    bias_head: u32,   // element offset of the head in bias_k and bias_v
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
    out.bias_head = kv * params.head_dim;
    out.e0 = quad * 4u;
    out.row = params.start + t;
    out.dst = (kv * params.capacity + params.start + t) * params.head_dim + quad * 4u;
    return out;
}

fn item_index(group: vec3<u32>, groups: vec3<u32>, lane: u32) -> u32 {
    return (group.x + group.y * groups.x) * WG + lane;
}

fn q_items() -> u32 {
    return params.tokens * params.heads * params.half;
}

@compute @workgroup_size(WG)
fn rope_kv_append_f32(@builtin(workgroup_id) group: vec3<u32>,
                      @builtin(num_workgroups) groups: vec3<u32>,
                      @builtin(local_invocation_index) lane: u32) {
    let index = item_index(group, groups, lane);
    let p = q_pair(index);
    if (p.live) {
        rotate_q(p, 0.0, 0.0, false);
        return;
    }
    let it = kv_item(index - q_items());
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
    let index = item_index(group, groups, lane);
    let p = q_pair(index);
    if (p.live) {
        rotate_q(p, 0.0, 0.0, false);
        return;
    }
    let it = kv_item(index - q_items());
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

// The biased k value of element e of a kv item, and its v value, as f32.
fn k_biased(it: KvItem, e: u32) -> f32 {
    let other = select(0.0, bias_k[it.bias_head + partner(e) % params.head_dim], e < 2u * params.half);
    return k_value(it.k_head, e, it.row, bias_k[it.bias_head + e], other, true);
}

fn v_biased(it: KvItem, e: u32) -> f32 {
    return element(it.v_head + e) + bias_v[it.bias_head + e];
}

fn rotate_q_biased(p: QPair) {
    rotate_q(p, bias_q[p.bias_first], bias_q[p.bias_second], true);
}

@compute @workgroup_size(WG)
fn rope_kv_append_bias_f32(@builtin(workgroup_id) group: vec3<u32>,
                           @builtin(num_workgroups) groups: vec3<u32>,
                           @builtin(local_invocation_index) lane: u32) {
    let index = item_index(group, groups, lane);
    let p = q_pair(index);
    if (p.live) {
        rotate_q_biased(p);
        return;
    }
    let it = kv_item(index - q_items());
    if (!it.live) {
        return;
    }
    for (var c = 0u; c < 4u; c++) {
        k_cache[it.dst + c] = bitcast<u32>(k_biased(it, it.e0 + c));
        v_cache[it.dst + c] = bitcast<u32>(v_biased(it, it.e0 + c));
    }
}

@compute @workgroup_size(WG)
fn rope_kv_append_bias_f16(@builtin(workgroup_id) group: vec3<u32>,
                           @builtin(num_workgroups) groups: vec3<u32>,
                           @builtin(local_invocation_index) lane: u32) {
    let index = item_index(group, groups, lane);
    let p = q_pair(index);
    if (p.live) {
        rotate_q_biased(p);
        return;
    }
    let it = kv_item(index - q_items());
    if (!it.live) {
        return;
    }
    let at = it.dst / 2u;
    for (var c = 0u; c < 2u; c++) {
        let e = it.e0 + 2u * c;
        k_cache[at + c] = f16_bits(bitcast<u32>(k_biased(it, e))) | (f16_bits(bitcast<u32>(k_biased(it, e + 1u))) << 16u);
        v_cache[at + c] = f16_bits(bitcast<u32>(v_biased(it, e))) | (f16_bits(bitcast<u32>(v_biased(it, e + 1u))) << 16u);
    }
}
