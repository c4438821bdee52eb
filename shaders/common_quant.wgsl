// Decoding the .slm weight encodings (docs/slm-format.md) from u32 words: shared helpers.
//
// Weight parts are uploaded to the GPU exactly as the artifact stores them and read as
// array<u32> (or array<vec4<u32>> where the row stride is a multiple of 16 bytes):
//
//   q4 codes  8 codes per u32: element j of a word is (word >> 4j) & 0xF (low nibble first,
//             little-endian bytes), row stride = blocks * block / 8 words
//   q8 codes  4 codes per u32: element j is the sign-extended byte (word >> 8j) & 0xFF,
//             row stride = blocks * block / 4 words
//   f16       2 values per u32: element j is unpack2x16float(word)[j], rows padded to 4 bytes
//   scales, mins  f16 pairs (as f16 above) or f32 words, flat [rows * blocks]
//
// Decoding is exact: every code and f16 converts to f32 without rounding, so kernels
// differ from the oracle only in how they sum.
//
// This file is prepended to kernels that decode weights (registry "sources"); it declares
// no bindings.

// Small integers become floats through their bit patterns, not int->float conversions
// (which run at a quarter of the FMA rate on common GPUs): for 0 <= n < 2^23,
// bitcast<f32>(0x4B000000 | n) is exactly 2^23 + n, and subtracting 2^23 leaves n exactly.
const MAGIC_BITS: u32 = 0x4B000000u;   // the f32 2^23
const MAGIC: f32 = 8388608.0;          // 2^23

// Codes 0..3 and 4..7 of a q4 word, as floats 0..15.
fn q4_low(word: u32) -> vec4<f32> {
    let codes = (vec4<u32>(word) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u);
    return bitcast<vec4<f32>>(codes | vec4<u32>(MAGIC_BITS)) - vec4<f32>(MAGIC);
}

fn q4_high(word: u32) -> vec4<f32> {
    let codes = (vec4<u32>(word) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u);
    return bitcast<vec4<f32>>(codes | vec4<u32>(MAGIC_BITS)) - vec4<f32>(MAGIC);
}

// The four signed bytes of a q8 word, as floats -128..127: flipping the sign bit maps the
// byte b to b + 128 in 0..255, so 2^23 + b + 128 minus (2^23 + 128) is b, exactly.
fn q8_values(word: u32) -> vec4<f32> {
    let biased = ((vec4<u32>(word) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u)) ^ vec4<u32>(128u);
    return bitcast<vec4<f32>>(biased | vec4<u32>(MAGIC_BITS)) - vec4<f32>(MAGIC + 128.0);
}

// Element `index` of a flat f16 array stored as u32 words; `word` = words[index / 2].
fn f16_element(word: u32, index: u32) -> f32 {
    let pair = unpack2x16float(word);
    return select(pair.x, pair.y, (index & 1u) == 1u);
}
