// Embedding gather with dequantization: out[t, :] = token_embd[ids[t], :] decoded to f32
// (host side and tests: py/webslm/kernels/embed.py). Sources: common_quant.wgsl, this file,
// quant_scales.wgsl (scale_at) and quant_mins.wgsl (min_at).
//
//   ids     [T] u32 token ids
//   words   the token_embd data/codes part exactly as the artifact stores it, read as u32
//           words, row_words words per vocabulary row (docs/slm-format.md row_stride / 4):
//             f32  1 value per word      f16  2 values per word (rows padded to 4 bytes)
//             q8   4 signed codes        q4   8 codes, low nibble first
//   scales  q8/q4 scales [vocab, blocks] as f16 pairs (SCALE_F16 = 1) or f32 words
//   mins    q4 "min" only: [vocab, blocks], same type as the scales
//   out     [T, D] f32
//
// One entry point per encoding (they share the declarations above; each uses only the
// bindings its encoding has, so a layout lists just those):
//   embed_f32        value = the stored f32 (a bit copy)
//   embed_f16        value = f16 -> f32
//   embed_q8         value = scale * code
//   embed_q4_offset  value = scale * (code - 8)
//   embed_q4_min     value = scale * code + min
// The first four are exact and equal quant.dequantize bit for bit: an f16 converts exactly,
// and a product of a code with an f16 scale has at most 11 + 8 significant bits, with an f32
// scale it is one correctly rounded multiply, the same one numpy does. For q4 "min" the
// product may be fused with the add into one FMA (compilers may contract a * b + c; nothing in
// WGSL forbids it): with f16 scales the product is exact, so the result is still identical;
// with f32 scales it can differ from numpy's two roundings by about one rounding of the
// product (py/webslm/kernels/embed.py states the bound).
//
// Each invocation writes one value: consecutive invocations write consecutive columns, so
// stores are fully coalesced, and the 2..8 invocations that share a code word (and the
// invocations of one block, which share a scale) load the same address, which GPUs serve
// once. (Decoding a whole word per invocation, 8 scalar stores 32 bytes apart, measured
// 2-4x slower on an H200.) Columns >= D, the tail block's padding, are never written.
// Workgroups cover [T, D] in chunks of WG columns: groups_per_token chunks per token, on a
// 2-D grid. An id >= vocab is refused by the host before dispatch; should one arrive anyway
// the kernel writes zeros for that token instead of reading another row (zero, not clamp: a
// wrong but plausible embedding would go unnoticed).
// No barriers: an invocation past its row's end simply writes nothing.

override WG: u32 = 64u;          // 64, 128 or 256 (registry allowlist)
override BLOCK: u32 = 32u;       // q8/q4 block_elements: 32, 64, 128 or 256
override SCALE_F16: bool = true; // scales and mins are f16 pairs, else f32 words (host: 1 / 0)

struct Params {
    tokens: u32,            // T
    dim: u32,               // D: values per row
    vocab: u32,             // rows of token_embd
    row_words: u32,         // u32 words per row of words
    blocks: u32,            // q8/q4 blocks per row (scales per row)
    groups_per_token: u32,  // ceil(D / WG)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;   // [T, D]
@group(0) @binding(2) var<storage, read> ids: array<u32>;         // [T]
@group(0) @binding(3) var<storage, read> words: array<u32>;       // [vocab, row_words]
@group(0) @binding(4) var<storage, read> scales: array<u32>;      // [vocab * blocks] f16 pairs or f32
@group(0) @binding(5) var<storage, read> mins: array<u32>;        // [vocab * blocks], q4 "min" only

// Which token and which column of its row this invocation writes.
struct Slot {
    token: u32,
    column: u32,
    id: u32,
    valid_id: bool,   // ids[token] < vocab
    in_range: bool,   // token < T and column < D
}

fn slot(group: vec3<u32>, groups: vec3<u32>, lane: u32) -> Slot {
    let linear = group.x + group.y * groups.x;
    let token = linear / params.groups_per_token;
    let column = (linear - token * params.groups_per_token) * WG + lane;
    var s = Slot(token, column, 0u, false, token < params.tokens && column < params.dim);
    if (s.in_range) {
        s.id = ids[token];
        s.valid_id = s.id < params.vocab;
    }
    return s;
}

// Writes the zeros of an id >= vocab; true where this invocation has a value to decode and
// store (its slot is in range and its id valid). Every entry point starts with it.
fn decodes(s: Slot) -> bool {
    if (s.in_range && !s.valid_id) {
        store(s, 0.0);
    }
    return s.valid_id;    // only ever set for an in-range slot
}

fn store(s: Slot, value: f32) {
    out[s.token * params.dim + s.column] = value;
}

// Word `index` of the row of token id s.id (only called for a valid id).
fn row_word(s: Slot, index: u32) -> u32 {
    return words[s.id * params.row_words + index];
}

// The scale (and min) index of this column's block.
fn block_index(s: Slot) -> u32 {
    return s.id * params.blocks + s.column / BLOCK;
}

// This column's q8 code as a float -128..127: the byte moved to the top, then an arithmetic
// shift back down sign-extends it (as q8_values in common_quant.wgsl, one lane).
fn q8_code(s: Slot) -> f32 {
    return f32(bitcast<i32>(row_word(s, s.column / 4u) << (24u - 8u * (s.column % 4u))) >> 24u);
}

// This column's q4 code as a float 0..15, low nibble first.
fn q4_code(s: Slot) -> f32 {
    return f32((row_word(s, s.column / 8u) >> (4u * (s.column % 8u))) & 15u);
}

@compute @workgroup_size(WG)
fn embed_f32(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
             @builtin(local_invocation_index) lane: u32) {
    let s = slot(group, groups, lane);
    if (decodes(s)) {
        store(s, bitcast<f32>(row_word(s, s.column)));   // a bit copy: no arithmetic, no flush
    }
}

@compute @workgroup_size(WG)
fn embed_f16(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
             @builtin(local_invocation_index) lane: u32) {
    let s = slot(group, groups, lane);
    if (decodes(s)) {
        store(s, f16_element(row_word(s, s.column / 2u), s.column));
    }
}

@compute @workgroup_size(WG)
fn embed_q8(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
            @builtin(local_invocation_index) lane: u32) {
    let s = slot(group, groups, lane);
    if (decodes(s)) {
        store(s, scale_at(block_index(s)) * q8_code(s));
    }
}

@compute @workgroup_size(WG)
fn embed_q4_offset(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                   @builtin(local_invocation_index) lane: u32) {
    let s = slot(group, groups, lane);
    if (decodes(s)) {
        store(s, scale_at(block_index(s)) * (q4_code(s) - 8.0));      // code - 8 is exact in f32
    }
}

@compute @workgroup_size(WG)
fn embed_q4_min(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                @builtin(local_invocation_index) lane: u32) {
    let s = slot(group, groups, lane);
    if (decodes(s)) {
        let block = block_index(s);
        store(s, scale_at(block) * q4_code(s) + min_at(block));       // may become one FMA: see the header
    }
}
