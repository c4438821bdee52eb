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

// -- q5 and the super-block encodings (q5, q4k, q5k, q6k) ---------------------------------
//
//   high_bits  q5, q5k: 1 bit per element, element 32w + j at bit j of u32 word w of a row
//              q6k:     2 bits per element, element 16w + j at bits 2j, 2j+1 of word w
//   sub_scales, sub_mins  one byte per sub-block, read as u32 words (4 bytes each)
//
// code = low nibble | high bits << 4, built in integers and converted through MAGIC_BITS like
// q4_low: exact, and the same instructions for every element (no per-element branches).

// Four 5-bit codes: the nibbles at bits `nibble`, +4, +8, +12 of `word` (nibble 0: elements
// 0..3 of the word, 16: elements 4..7), their fifth bits at bits `bit` .. `bit`+3 of `high`.
fn q5_quad(word: u32, nibble: u32, high: u32, bit: u32) -> vec4<f32> {
    let low = (vec4<u32>(word) >> (vec4<u32>(0u, 4u, 8u, 12u) + nibble)) & vec4<u32>(15u);
    let top = ((vec4<u32>(high) >> (vec4<u32>(0u, 1u, 2u, 3u) + bit)) & vec4<u32>(1u)) << vec4<u32>(4u);
    return bitcast<vec4<f32>>(low | top | vec4<u32>(MAGIC_BITS)) - vec4<f32>(MAGIC);
}

// Four 6-bit codes (q6k, 0..63): as q5_quad with two high bits each, at bits `bit` .. `bit`+7.
fn q6_quad(word: u32, nibble: u32, high: u32, bit: u32) -> vec4<f32> {
    let low = (vec4<u32>(word) >> (vec4<u32>(0u, 4u, 8u, 12u) + nibble)) & vec4<u32>(15u);
    let top = ((vec4<u32>(high) >> (vec4<u32>(0u, 2u, 4u, 6u) + bit)) & vec4<u32>(3u)) << vec4<u32>(4u);
    return bitcast<vec4<f32>>(low | top | vec4<u32>(MAGIC_BITS)) - vec4<f32>(MAGIC);
}

// Byte `index` of a byte array stored as u32 words, unsigned (u6 sub-scales and sub-mins);
// `word` = words[index / 4].
fn u8_element(word: u32, index: u32) -> f32 {
    return f32((word >> (8u * (index & 3u))) & 255u);
}

// The same byte as a signed int8 (q6k's sub-scales, -128..127): moved to the top, then an
// arithmetic shift back down sign-extends it.
fn i8_element(word: u32, index: u32) -> f32 {
    return f32(bitcast<i32>(word << (24u - 8u * (index & 3u))) >> 24u);
}
