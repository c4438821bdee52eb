// Prefill GEMM weights in f16 (docs/slm-format.md): the decoder gemm_main.wgsl calls.
//
//   data  [N][row_words] u32   two f16 per word, row_words = ceil(K / 2); a row starts
//         only 4-byte aligned, so weights are read as single words
//
// A unit is 4 weights (two words). f16 -> f32 (unpack2x16float) is exact and needs no
// shader-f16 feature. No word past the row's end is read: the second word is clamped to
// the row's last one, and the caller masks weights at k >= K.
//
// Source order: this file comes before gemm_main.wgsl (see the note there).

const UNIT: u32 = 4u;             // weights per decode_unit call
const UNIT_QUADS: u32 = 1u;

@group(0) @binding(3) var<storage, read> data: array<u32>;

// Weights k .. k + 3 of row n (k a multiple of 4, k < K).
fn decode_unit(n: u32, k: u32) -> array<vec4<f32>, UNIT_QUADS> {
    let row_words = (params.k + 1u) / 2u;
    let word = n * row_words + k / 2u;
    let last = n * row_words + row_words - 1u;
    return array<vec4<f32>, UNIT_QUADS>(
        vec4<f32>(unpack2x16float(data[word]), unpack2x16float(data[min(word + 1u, last)])));
}
