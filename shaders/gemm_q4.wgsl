// Prefill GEMM weights in q4 (docs/slm-format.md): the decoder gemm_main.wgsl calls.
//
//   codes  [N][blocks * BLOCK / 32] vec4<u32>   32 codes per vec4, low nibble first; a row
//          is blocks * BLOCK / 2 bytes, a multiple of 16, so every vec4 is aligned
//   scales [N * blocks] f16 pairs in u32 words (SCALE_F16) or f32 words
//   mins   [N * blocks] like scales; read only when ZERO_MIN ("offset" binds scales again)
// (scale_at / min_at: quant_scales.wgsl, quant_mins.wgsl)
//
// A unit is 32 weights of one row: one vec4 of codes inside one block (BLOCK >= 32), so
// the block's scale (and min) is looked up once per unit:
//   min:     w = fma(c, s, m)     offset:  w = (c - 8) * s
// (one rounding each; exact for f16 scales when no min is added). Codes past K in the
// last block are read (they exist, as zeros) and masked by the caller.
//
// Source order: this file comes before gemm_main.wgsl (see the note there).

override BLOCK: u32 = 32u;        // codes per scale block: 32, 64, 128, 256
override ZERO_MIN: bool = true;   // zero "min" (affine) or "offset" (code - 8)
override SCALE_F16: bool = true;  // scales and mins stored as f16, else f32

const UNIT: u32 = 32u;            // weights per decode_unit call
const UNIT_QUADS: u32 = 8u;       // UNIT / 4

@group(0) @binding(3) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> scales: array<u32>;
@group(0) @binding(5) var<storage, read> mins: array<u32>;

// Weights k .. k + 31 of row n (k a multiple of 32, k < K).
fn decode_unit(n: u32, k: u32) -> array<vec4<f32>, UNIT_QUADS> {
    let blocks = (params.k + BLOCK - 1u) / BLOCK;
    let words = codes[n * (blocks * BLOCK / 32u) + k / 32u];
    let block = n * blocks + k / BLOCK;
    let s = vec4<f32>(scale_at(block));
    var out: array<vec4<f32>, UNIT_QUADS>;
    if (ZERO_MIN) {
        let m = vec4<f32>(min_at(block));
        for (var i = 0u; i < 4u; i++) {
            out[2u * i] = fma(q4_low(words[i]), s, m);
            out[2u * i + 1u] = fma(q4_high(words[i]), s, m);
        }
    } else {
        for (var i = 0u; i < 4u; i++) {
            out[2u * i] = (q4_low(words[i]) - 8.0) * s;
            out[2u * i + 1u] = (q4_high(words[i]) - 8.0) * s;
        }
    }
    return out;
}
