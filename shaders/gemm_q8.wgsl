// Prefill GEMM weights in q8 (docs/slm-format.md): the decoder gemm_main.wgsl calls.
//
//   codes  [N][blocks * BLOCK / 16] vec4<u32>   16 signed codes per vec4; a row is
//          blocks * BLOCK bytes, a multiple of 32, so every vec4 is aligned
//   scales [N * blocks] f16 pairs in u32 words (SCALE_F16) or f32 words (scale_at: quant_scales.wgsl)
//
// A unit is 16 weights of one row, one vec4 of codes inside one block: w = c * s (exact
// for f16 scales, one rounding for f32). Codes past K in the last block are read (they
// exist, as zeros) and masked by the caller.
//
// Source order: this file comes before gemm_main.wgsl (see the note there).

override BLOCK: u32 = 32u;        // codes per scale block: 32, 64, 128, 256
override SCALE_F16: bool = true;  // scales stored as f16, else f32

const UNIT: u32 = 16u;            // weights per decode_unit call
const UNIT_QUADS: u32 = 4u;       // UNIT / 4

@group(0) @binding(3) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> scales: array<u32>;

// Weights k .. k + 15 of row n (k a multiple of 16, k < K).
fn decode_unit(n: u32, k: u32) -> array<vec4<f32>, UNIT_QUADS> {
    let blocks = (params.k + BLOCK - 1u) / BLOCK;
    let words = codes[n * (blocks * BLOCK / 16u) + k / 16u];
    let s = vec4<f32>(scale_at(n * blocks + k / BLOCK));
    var out: array<vec4<f32>, UNIT_QUADS>;
    for (var i = 0u; i < 4u; i++) {
        out[i] = q8_values(words[i]) * s;
    }
    return out;
}
