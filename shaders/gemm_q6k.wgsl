// Prefill GEMM weights in q6k (GGUF's Q6_K; docs/slm-format.md) for both GEMM kinds:
// gemm_main.wgsl calls decode_unit, gemm_tiled_main.wgsl fetch_w and decode_w.
//
//   codes       [N][K / 16] vec2<u32>   low 4 bits, 16 codes per vec2
//   high_bits   [N][K / 16] u32          bits 4-5, element 16w + j at bits 2j of word w
//   scales      [N * K / 256] f16 pairs in u32 words: each super-block's scale d
//   sub_scales  [N * K / 16] int8 in u32 words: each sub-block's sc (signed)
//
// A unit is 16 weights: exactly one sub-block. w = (c - 32) (d sc): every factor and the
// product are exact in f32 (at most 11 + 8 + 6 significant bits), as in the CPU decoder.
//
// Source order: this file comes before the main file (naga, see gemm_main.wgsl).

const UNIT: u32 = 16u;            // weights per item (tiled) and per decode_unit call (classic)
const UNIT_QUADS: u32 = 4u;
const W_ITEMS_MAX: u32 = 2u;      // RN * BK / (UNIT * WG_Y) at most

@group(0) @binding(3) var<storage, read> codes: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> high_bits: array<u32>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;
@group(0) @binding(6) var<storage, read> sub_scales: array<u32>;

struct WRaw {
    codes: vec2<u32>,
    high: u32,
    s: f32,           // d sc
}

// Weights k .. k + 15 of row n (k a multiple of 16, k < K), not yet decoded.
fn fetch_w(n: u32, k: u32) -> WRaw {
    let block = n * (params.k / 256u) + k / 256u;      // per row: N K may pass 2^32
    let sub = n * (params.k / 16u) + k / 16u;
    return WRaw(codes[sub], high_bits[sub],
                f16_element(scales[block / 2u], block) * i8_element(sub_scales[sub / 4u], sub));
}

fn decode_w(raw: WRaw) -> array<vec4<f32>, 4> {
    let s = vec4<f32>(raw.s);
    return array<vec4<f32>, 4>((q6_quad(raw.codes.x, 0u, raw.high, 0u) - 32.0) * s,
                               (q6_quad(raw.codes.x, 16u, raw.high, 8u) - 32.0) * s,
                               (q6_quad(raw.codes.y, 0u, raw.high, 16u) - 32.0) * s,
                               (q6_quad(raw.codes.y, 16u, raw.high, 24u) - 32.0) * s);
}

fn decode_unit(n: u32, k: u32) -> array<vec4<f32>, UNIT_QUADS> {
    return decode_w(fetch_w(n, k));
}
