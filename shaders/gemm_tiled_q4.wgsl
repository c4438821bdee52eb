// Register-tiled GEMM weights in q4 (docs/slm-format.md): what gemm_tiled_main.wgsl fetches
// and decodes.
//
//   codes  [N][blocks * BLOCK / 16] vec2<u32>   16 codes per vec2, low nibble first; a row is
//          blocks * BLOCK / 2 bytes, a multiple of 16, so every vec2 is aligned
//   scales [N * blocks] f16 pairs in u32 words (SCALE_F16) or f32 words
//   mins   [N * blocks] like scales; read only when ZERO_MIN ("offset" binds scales again)
// (scale_at / min_at: quant_scales.wgsl, quant_mins.wgsl)
//
// A unit is 16 weights of one row inside one block (BLOCK >= 32, units aligned), fetched as
// one 8-byte load plus its block's scale (and min) into a WRaw, decoded later:
//   min:     w = fma(c, s, m)     offset:  w = (c - 8) * s
// (one rounding each). A zero WRaw decodes to zeros. Codes past K in the last block exist
// (as zeros) and are masked by the caller.
//
// Source order: this file comes before gemm_tiled_main.wgsl (naga, see gemm_main.wgsl).

override BLOCK: u32 = 32u;        // codes per scale block: 32, 64, 128, 256
override ZERO_MIN: bool = true;   // zero "min" (affine) or "offset" (code - 8)
override SCALE_F16: bool = true;  // scales and mins stored as f16, else f32

const UNIT: u32 = 16u;            // weights per item
const W_ITEMS_MAX: u32 = 2u;      // RN * BK / (UNIT * WG_Y) at most

@group(0) @binding(3) var<storage, read> codes: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> scales: array<u32>;
@group(0) @binding(5) var<storage, read> mins: array<u32>;

struct WRaw {
    codes: vec2<u32>,
    s: f32,
    m: f32,
}

// Weights k .. k + 15 of row n (k a multiple of 16, k < K), not yet decoded.
fn fetch_w(n: u32, k: u32) -> WRaw {
    let blocks = (params.k + BLOCK - 1u) / BLOCK;
    let block = n * blocks + k / BLOCK;
    var raw = WRaw();
    raw.codes = codes[n * (blocks * BLOCK / 16u) + k / 16u];
    raw.s = scale_at(block);
    if (ZERO_MIN) {
        raw.m = min_at(block);
    }
    return raw;
}

fn decode_w(raw: WRaw) -> array<vec4<f32>, 4> {
    let s = vec4<f32>(raw.s);
    if (ZERO_MIN) {
        let m = vec4<f32>(raw.m);
        return array<vec4<f32>, 4>(fma(q4_low(raw.codes.x), s, m), fma(q4_high(raw.codes.x), s, m),
                                   fma(q4_low(raw.codes.y), s, m), fma(q4_high(raw.codes.y), s, m));
    }
    return array<vec4<f32>, 4>((q4_low(raw.codes.x) - 8.0) * s, (q4_high(raw.codes.x) - 8.0) * s,
                               (q4_low(raw.codes.y) - 8.0) * s, (q4_high(raw.codes.y) - 8.0) * s);
}
