// Embedding gather for q5 and the super-block encodings (q4k, q5k, q6k): entry points added to
// embed.wgsl (listed after it; they use its Slot helpers and its bindings 0..5) with three more
// bindings. Host side: py/webslm/kernels/embed.py.
//
//   3 words       codes: the low 4 bits, 8 per word, row_words = E / 8 words a row
//   4 scales      [vocab * blocks] f16 pairs (q5 may have f32 words: SCALE_F16 = 0)
//   5 mins        [vocab * blocks] q5 "min", q4k and q5k; other encodings bind scales again
//   6 high_bits   q5, q5k: bit 4 of each code, E / 32 words a row (element 32w + j at bit j);
//                 q6k: bits 4-5, E / 16 words a row (element 16w + j at bits 2j);
//                 q4k binds codes again
//   7 sub_scales  q4k, q5k: [vocab * E / 32] u6 bytes; q6k: [vocab * E / 16] int8 bytes;
//                 q5 binds scales again
//   8 sub_mins    q4k, q5k: [vocab * E / 32] u6 bytes; the others bind sub_scales (or scales) again
//
// Values, exactly as artifact/quant.py dequantize computes them:
//   embed_q5_offset  scale (code - 16)             embed_q5_min  scale code + min
//   embed_q4k, embed_q5k   (d sc) code - dmin m    embed_q6k     (d sc) (code - 32)
// d sc, dmin m and (d sc) code are exact in f32 (f16 significands times small integers), so
// the one rounding is q4k/q5k's subtraction, the same in numpy and here (fused or not). q5
// is q4's case: exact for f16 scales and "offset"; "min" with f32 scales has embed.py's FMA
// allowance. Rows hold whole blocks (no tail): E = D.

@group(0) @binding(6) var<storage, read> high_bits: array<u32>;
@group(0) @binding(7) var<storage, read> sub_scales: array<u32>;
@group(0) @binding(8) var<storage, read> sub_mins: array<u32>;

// This column's 5-bit code (q5, q5k) as a float 0..31.
fn q5_code(s: Slot) -> f32 {
    let high = high_bits[s.id * (params.row_words / 4u) + s.column / 32u] >> (s.column % 32u);
    return q4_code(s) + 16.0 * f32(high & 1u);
}

// This column's 6-bit code (q6k) as a float 0..63.
fn q6_code(s: Slot) -> f32 {
    let high = high_bits[s.id * (params.row_words / 2u) + s.column / 16u] >> (2u * (s.column % 16u));
    return q4_code(s) + 16.0 * f32(high & 3u);
}

// The index of this column's sub-block (of `size` elements) among all sub-blocks of the table.
fn sub_block(s: Slot, size: u32) -> u32 {
    return s.id * (params.row_words * 8u / size) + s.column / size;
}

@compute @workgroup_size(WG)
fn embed_q5_offset(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                   @builtin(local_invocation_index) lane: u32) {
    let s = slot(group, groups, lane);
    if (decodes(s)) {
        store(s, scale_at(block_index(s)) * (q5_code(s) - 16.0));     // code - 16 is exact in f32
    }
}

@compute @workgroup_size(WG)
fn embed_q5_min(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                @builtin(local_invocation_index) lane: u32) {
    let s = slot(group, groups, lane);
    if (decodes(s)) {
        let block = block_index(s);
        store(s, scale_at(block) * q5_code(s) + min_at(block));       // may become one FMA: see embed.wgsl
    }
}

// (d sc) code - dmin m for a q4k/q5k code (BLOCK = 256, sub-blocks of 32).
fn k_value(s: Slot, code: f32) -> f32 {
    let block = block_index(s);
    let sub = sub_block(s, 32u);
    let scale = scale_at(block) * u8_element(sub_scales[sub / 4u], sub);
    let offset = min_at(block) * u8_element(sub_mins[sub / 4u], sub);
    return scale * code - offset;
}

@compute @workgroup_size(WG)
fn embed_q4k(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
             @builtin(local_invocation_index) lane: u32) {
    let s = slot(group, groups, lane);
    if (decodes(s)) {
        store(s, k_value(s, q4_code(s)));
    }
}

@compute @workgroup_size(WG)
fn embed_q5k(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
             @builtin(local_invocation_index) lane: u32) {
    let s = slot(group, groups, lane);
    if (decodes(s)) {
        store(s, k_value(s, q5_code(s)));
    }
}

@compute @workgroup_size(WG)
fn embed_q6k(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
             @builtin(local_invocation_index) lane: u32) {
    let s = slot(group, groups, lane);
    if (decodes(s)) {
        let sub = sub_block(s, 16u);
        store(s, (scale_at(block_index(s)) * i8_element(sub_scales[sub / 4u], sub)) * (q6_code(s) - 32.0));
    }
}
