// Register-tiled GEMM weights in f32 (docs/slm-format.md): what gemm_tiled_main.wgsl fetches
// and decodes.
//
//   data  [N][K] f32, row-major; a row starts only 4-byte aligned, so weights are read as
//         scalars
//
// A unit is 4 weights. No element past the row's end is read (indices are clamped to the
// row's last one); the caller masks weights at k >= K. A zero WRaw decodes to zeros.
//
// Source order: this file comes before gemm_tiled_main.wgsl (naga, see gemm_main.wgsl).

const UNIT: u32 = 4u;             // weights per item
const W_ITEMS_MAX: u32 = 8u;      // RN * BK / (UNIT * WG_Y) at most

@group(0) @binding(3) var<storage, read> data: array<f32>;

struct WRaw {
    w: vec4<f32>,
}

// Weights k .. k + 3 of row n (k a multiple of 4, k < K).
fn fetch_w(n: u32, k: u32) -> WRaw {
    let base = n * params.k;
    let last = base + params.k - 1u;
    return WRaw(vec4<f32>(data[base + k], data[min(base + k + 1u, last)], data[min(base + k + 2u, last)],
                          data[min(base + k + 3u, last)]));
}

fn decode_w(raw: WRaw) -> array<vec4<f32>, 1> {
    return array<vec4<f32>, 1>(raw.w);
}
