// Prefill GEMM weights in f32 (docs/slm-format.md): the decoder gemm_main.wgsl calls.
//
//   data  [N][K] f32, row-major; a row starts only 4-byte aligned, so weights are read as
//         scalars
//
// A unit is 4 weights. No element past the row's end is read (indices are clamped to the
// row's last one; the caller masks weights at k >= K).
//
// Source order: this file comes before gemm_main.wgsl (see the note there).

const UNIT: u32 = 4u;             // weights per decode_unit call
const UNIT_QUADS: u32 = 1u;

@group(0) @binding(3) var<storage, read> data: array<f32>;

// Weights k .. k + 3 of row n (k a multiple of 4, k < K).
fn decode_unit(n: u32, k: u32) -> array<vec4<f32>, UNIT_QUADS> {
    let base = n * params.k;
    let last = base + params.k - 1u;
    return array<vec4<f32>, UNIT_QUADS>(vec4<f32>(data[base + k], data[min(base + k + 1u, last)],
                                                  data[min(base + k + 2u, last)], data[min(base + k + 3u, last)]));
}
