// Decode mat-vec weights in q6k (GGUF's Q6_K) on activations quantized once (quantize_x.wgsl,
// nibble order), for matvec_main.wgsl with matvec_input_int8.wgsl (registry variant "xq";
// needs the WGSL language feature packed_4x8_integer_dot_product). Same bindings as
// matvec_q6k.wgsl:
//
//   codes       [rows][units] vec4<u32>   low 4 bits; a unit is 32 codes: two sub-blocks of 16
//   high_bits   [rows][units] vec2<u32>    bits 4-5 of the unit's codes, element j at bits 2j
//                                          of .x (j < 16) or 2(j - 16) of .y
//   scales      [rows * blocks] f16 pairs in u32 words: each super-block's scale d
//   sub_scales  [rows * 2 units] int8 in u32 words: each sub-block's sc (signed)
//   then xq and y from X_BINDING on (matvec_input_int8.wgsl)
//
// value = (d sc) (c - 32), and c - 32 lies in -32..31: a signed byte. So each code word
// becomes two words of signed bytes in the unit's nibble order (codes 0,2,4,6 and 1,3,5,7 of
// the word, their two high bits moved in beside the nibbles, then 32 taken off), and the
// whole weight, zero part included, meets the activation bytes in dot4I8Packed: per half h
// of the unit (its sub-blocks) C_h = sum_k (c_k - 32) q_k, and the unit gives
//   d * d_x * (sc_0 C_0 + sc_1 C_1)
// with every integer exact (|C_h| <= 16 * 32 * 127, |sc| <= 128: the sum < 2^24, exact as
// f32 too; with RESIDUAL, x ~ d_x (q + r / 64), C_h = sum_k (c_k - 32) (64 q_k + r_k) stays
// exact, sc C_h is one f32 rounding). The error against W x: sum_k |w_k| |x_k - d_x q_k| (the weight has no separate
// zero part here).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> high_bits: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> sub_scales: array<u32>;
const X_BINDING: u32 = 5u;        // the first binding of the input file
override RESIDUAL: bool = false;  // xq holds a second byte per activation (quantize_x.wgsl)

// 4 codes as signed bytes c - 32: `nibbles` the low 4 bits in bytes (0..15 each), `top` the
// two high bits already at bits 4-5 of each byte. c ^ 32 flips bit 5, leaving c - 32 as a
// 6-bit two's complement number; multiplying its sign bit (0x20 a byte) by 6 sets bits 6-7
// (0xC0) where it is set: the sign extended to 8 bits, byte by byte with no carries.
fn centred_bytes(nibbles: u32, top: u32) -> u32 {
    let flipped = (nibbles | top) ^ 0x20202020u;
    return flipped | ((flipped & 0x20202020u) * 6u);
}

// sum_k (c_k - 32) q_k over the 8 codes of code word `word` (nibbles) and their 16 high bits
// `high` (element k at bits 2k), against the unit's even and odd byte words.
fn word_dot(word: u32, high: u32, even: u32, odd: u32) -> i32 {
    // even elements 0,2,4,6: high bits at 0,4,8,12 -> byte b's bits 4-5 (bit 8b + 4)
    let top_even = ((high & 0x3u) << 4u) | ((high & 0x30u) << 8u) | ((high & 0x300u) << 12u)
                 | ((high & 0x3000u) << 16u);
    // odd elements 1,3,5,7: high bits at 2,6,10,14 -> bit 8b + 4
    let top_odd = ((high & 0xCu) << 2u) | ((high & 0xC0u) << 6u) | ((high & 0xC00u) << 10u)
                | ((high & 0xC000u) << 14u);
    return dot4I8Packed(centred_bytes(word & 0x0F0F0F0Fu, top_even), even)
         + dot4I8Packed(centred_bytes((word >> 4u) & 0x0F0F0F0Fu, top_odd), odd);
}

// Row `row`'s share of unit u.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let unit = row * params.units + u;
    let c = codes[unit];
    let h = high_bits[unit];
    var first = word_dot(c.x, h.x & 0xFFFFu, xu.even.x, xu.odd.x) + word_dot(c.y, h.x >> 16u, xu.even.y, xu.odd.y);
    var second = word_dot(c.z, h.y & 0xFFFFu, xu.even.z, xu.odd.z) + word_dot(c.w, h.y >> 16u, xu.even.w, xu.odd.w);
    var d_x = xu.scale;
    if (RESIDUAL) {        // 64 C_q + C_r per sub-block (|.| < 16 * 32 * 127 * 65 < 2^24): exact
        first = 64 * first + word_dot(c.x, h.x & 0xFFFFu, xu.even_r.x, xu.odd_r.x)
              + word_dot(c.y, h.x >> 16u, xu.even_r.y, xu.odd_r.y);
        second = 64 * second + word_dot(c.z, h.y & 0xFFFFu, xu.even_r.z, xu.odd_r.z)
               + word_dot(c.w, h.y >> 16u, xu.even_r.w, xu.odd_r.w);
        d_x = xu.scale / RESIDUAL_STEPS;
    }
    let pair = sub_scales[unit / 2u];
    let at = 2u * unit;
    let b = row * params.blocks + u / 8u;
    let d = f16_element(scales[b / 2u], b);
    return (d * d_x) * (i8_element(pair, at) * f32(first) + i8_element(pair, at + 1u) * f32(second));
}
