// Register-tiled GEMM weights in f16 (docs/slm-format.md): what gemm_tiled_main.wgsl fetches
// and decodes.
//
//   data  [N][row_words] u32   two f16 per word, row_words = ceil(K / 2); a row starts only
//         4-byte aligned, so weights are read as single words
//
// A unit is 8 weights (four words), decoded by unpack2x16float (exact; no shader-f16
// needed). No word past the row's end is read (indices are clamped to the row's last word);
// the caller masks weights at k >= K. A zero WRaw decodes to zeros.
//
// Source order: this file comes before gemm_tiled_main.wgsl (naga, see gemm_main.wgsl).

const UNIT: u32 = 8u;             // weights per item
const W_ITEMS_MAX: u32 = 4u;      // RN * BK / (UNIT * WG_Y) at most

@group(0) @binding(3) var<storage, read> data: array<u32>;

struct WRaw {
    words: vec4<u32>,
}

// Weights k .. k + 7 of row n (k a multiple of 8, k < K), not yet decoded.
fn fetch_w(n: u32, k: u32) -> WRaw {
    let row_words = (params.k + 1u) / 2u;
    let word = n * row_words + k / 2u;
    let last = n * row_words + row_words - 1u;
    return WRaw(vec4<u32>(data[word], data[min(word + 1u, last)], data[min(word + 2u, last)],
                          data[min(word + 3u, last)]));
}

fn decode_w(raw: WRaw) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(vec4<f32>(unpack2x16float(raw.words.x), unpack2x16float(raw.words.y)),
                               vec4<f32>(unpack2x16float(raw.words.z), unpack2x16float(raw.words.w)));
}
