// Prefill GEMM weights in q5 (docs/slm-format.md) for both GEMM kinds: gemm_main.wgsl calls
// decode_unit, gemm_tiled_main.wgsl fetch_w and decode_w.
//
//   codes      [N][blocks * BLOCK / 16] vec2<u32>   low 4 bits, 16 codes per vec2
//   high_bits  [N][blocks * BLOCK / 32] u32          bit 4, element 32w + j at bit j of word w
//   scales     [N * blocks] f16 pairs in u32 words (SCALE_F16) or f32 words
//   mins       [N * blocks] like scales; read only when ZERO_MIN ("offset" binds scales again)
// (scale_at / min_at: quant_scales.wgsl, quant_mins.wgsl)
//
// A unit is 16 weights of one row inside one block (q5 rows hold whole blocks: K % BLOCK == 0):
//   min:     w = fma(c, s, m)     offset:  w = (c - 16) * s      (one rounding each)
//
// Source order: this file comes before the main file (naga, see gemm_main.wgsl).

override BLOCK: u32 = 32u;        // codes per scale block: 32, 64, 128, 256
override ZERO_MIN: bool = true;   // zero "min" (affine) or "offset" (code - 16)
override SCALE_F16: bool = true;  // scales and mins stored as f16, else f32

const UNIT: u32 = 16u;            // weights per item (tiled) and per decode_unit call (classic)
const UNIT_QUADS: u32 = 4u;
const W_ITEMS_MAX: u32 = 2u;      // RN * BK / (UNIT * WG_Y) at most

@group(0) @binding(3) var<storage, read> codes: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> high_bits: array<u32>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;
@group(0) @binding(6) var<storage, read> mins: array<u32>;

struct WRaw {
    codes: vec2<u32>,
    high: u32,        // the unit's 16 fifth bits at bits 0..15
    s: f32,
    m: f32,
}

// Weights k .. k + 15 of row n (k a multiple of 16, k < K), not yet decoded.
fn fetch_w(n: u32, k: u32) -> WRaw {
    let blocks = params.k / BLOCK;
    let block = n * blocks + k / BLOCK;
    var raw = WRaw();
    raw.codes = codes[n * (params.k / 16u) + k / 16u];
    raw.high = high_bits[n * (params.k / 32u) + k / 32u] >> (k & 16u);
    raw.s = scale_at(block);
    if (ZERO_MIN) {
        raw.m = min_at(block);
    }
    return raw;
}

fn decode_w(raw: WRaw) -> array<vec4<f32>, 4> {
    let c = array<vec4<f32>, 4>(q5_quad(raw.codes.x, 0u, raw.high, 0u), q5_quad(raw.codes.x, 16u, raw.high, 4u),
                                q5_quad(raw.codes.y, 0u, raw.high, 8u), q5_quad(raw.codes.y, 16u, raw.high, 12u));
    let s = vec4<f32>(raw.s);
    if (ZERO_MIN) {
        let m = vec4<f32>(raw.m);
        return array<vec4<f32>, 4>(fma(c[0], s, m), fma(c[1], s, m), fma(c[2], s, m), fma(c[3], s, m));
    }
    return array<vec4<f32>, 4>((c[0] - 16.0) * s, (c[1] - 16.0) * s, (c[2] - 16.0) * s, (c[3] - 16.0) * s);
}

fn decode_unit(n: u32, k: u32) -> array<vec4<f32>, UNIT_QUADS> {
    return decode_w(fetch_w(n, k));
}
