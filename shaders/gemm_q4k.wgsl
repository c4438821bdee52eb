// Prefill GEMM weights in q4k (GGUF's Q4_K; docs/slm-format.md) for both GEMM kinds:
// gemm_main.wgsl calls decode_unit, gemm_tiled_main.wgsl fetch_w and decode_w.
//
//   codes       [N][K / 16] vec2<u32>   16 codes per vec2, low nibble first
//   scales      [N * K / 256] f16 pairs in u32 words: each super-block's scale d
//   mins        [N * K / 256] f16 pairs: each super-block's min dmin
//   sub_scales  [N * K / 32] bytes (u6) in u32 words: each sub-block's sc
//   sub_mins    [N * K / 32] bytes (u6): each sub-block's m
//
// A unit is 16 weights inside one sub-block of 32: w = fma(c, d sc, -(dmin m)). d sc and
// dmin m are exact in f32 and so is c (d sc), so this is one rounding, the same one the CPU
// decoder's subtraction makes.
//
// Source order: this file comes before the main file (naga, see gemm_main.wgsl).

const UNIT: u32 = 16u;            // weights per item (tiled) and per decode_unit call (classic)
const UNIT_QUADS: u32 = 4u;
const W_ITEMS_MAX: u32 = 2u;      // RN * BK / (UNIT * WG_Y) at most

@group(0) @binding(3) var<storage, read> codes: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> scales: array<u32>;
@group(0) @binding(5) var<storage, read> mins: array<u32>;
@group(0) @binding(6) var<storage, read> sub_scales: array<u32>;
@group(0) @binding(7) var<storage, read> sub_mins: array<u32>;

struct WRaw {
    codes: vec2<u32>,
    s: f32,           // d sc
    m: f32,           // -(dmin m)
}

// Weights k .. k + 15 of row n (k a multiple of 16, k < K), not yet decoded.
fn fetch_w(n: u32, k: u32) -> WRaw {
    let block = n * (params.k / 256u) + k / 256u;      // per row: N K may pass 2^32
    let sub = n * (params.k / 32u) + k / 32u;
    return WRaw(codes[n * (params.k / 16u) + k / 16u],
                f16_element(scales[block / 2u], block) * u8_element(sub_scales[sub / 4u], sub),
                -(f16_element(mins[block / 2u], block) * u8_element(sub_mins[sub / 4u], sub)));
}

fn decode_w(raw: WRaw) -> array<vec4<f32>, 4> {
    let s = vec4<f32>(raw.s);
    let m = vec4<f32>(raw.m);
    return array<vec4<f32>, 4>(fma(q4_low(raw.codes.x), s, m), fma(q4_high(raw.codes.x), s, m),
                               fma(q4_low(raw.codes.y), s, m), fma(q4_high(raw.codes.y), s, m));
}

fn decode_unit(n: u32, k: u32) -> array<vec4<f32>, UNIT_QUADS> {
    return decode_w(fetch_w(n, k));
}
