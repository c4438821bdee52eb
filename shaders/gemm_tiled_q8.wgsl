// Register-tiled GEMM weights in q8 (docs/slm-format.md): what gemm_tiled_main.wgsl fetches
// and decodes.
//
//   codes  [N][blocks * BLOCK / 16] vec4<u32>   16 signed codes per vec4; a row is
//          blocks * BLOCK bytes, a multiple of 32, so every vec4 is aligned
//   scales [N * blocks] f16 pairs in u32 words (SCALE_F16) or f32 words (quant_scales.wgsl)
//
// A unit is 16 weights of one row inside one block: one 16-byte load and the block's scale
// into a WRaw, decoded later as w = c * s (one rounding; exact for f16 scales). A zero WRaw
// decodes to zeros; codes past K exist (as zeros) and are masked by the caller.
//
// Source order: this file comes before gemm_tiled_main.wgsl (naga, see gemm_main.wgsl).

override BLOCK: u32 = 32u;        // codes per scale block: 32, 64, 128, 256
override SCALE_F16: bool = true;  // scales stored as f16, else f32

const UNIT: u32 = 16u;            // weights per item
const W_ITEMS_MAX: u32 = 2u;      // RN * BK / (UNIT * WG_Y) at most

@group(0) @binding(3) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> scales: array<u32>;

struct WRaw {
    codes: vec4<u32>,
    s: f32,
}

// Weights k .. k + 15 of row n (k a multiple of 16, k < K), not yet decoded.
fn fetch_w(n: u32, k: u32) -> WRaw {
    let blocks = (params.k + BLOCK - 1u) / BLOCK;
    return WRaw(codes[n * (blocks * BLOCK / 16u) + k / 16u], scale_at(n * blocks + k / BLOCK));
}

fn decode_w(raw: WRaw) -> array<vec4<f32>, 4> {
    let s = vec4<f32>(raw.s);
    return array<vec4<f32>, 4>(q8_values(raw.codes.x) * s, q8_values(raw.codes.y) * s,
                               q8_values(raw.codes.z) * s, q8_values(raw.codes.w) * s);
}
