// Scales of the quantized encodings (docs/slm-format.md): flat [rows * blocks] arrays of f16
// pairs in u32 words (SCALE_F16) or of f32 words. Shared by the q4/q8 kernels (registry
// "sources": after common_quant.wgsl, whose f16_element it calls); quant_mins.wgsl adds the
// q4 "min" mins, stored the same way.
//
// A kernel that lists this file declares `override SCALE_F16: bool` and the binding
// `scales: array<u32>`; this file declares neither, so each kernel keeps its own binding
// numbers and override order (gemm: see the source-order note in gemm_main.wgsl).

// The u32 word that holds element `index` of a scales (or mins) array.
fn scale_word(index: u32) -> u32 {
    return select(index, index >> 1u, SCALE_F16);
}

// Element `index` of a scales (or mins) array, from the word scale_word(index) of it. Exact:
// an f16 converts to f32 without rounding, an f32 word is its own bits.
fn scale_value(word: u32, index: u32) -> f32 {
    if (SCALE_F16) {
        return f16_element(word, index);
    }
    return bitcast<f32>(word);
}

// Element `index` of the scales.
fn scale_at(index: u32) -> f32 {
    return scale_value(scales[scale_word(index)], index);
}
