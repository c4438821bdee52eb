// The unit of activations the packed-dot mat-vecs multiply (matvec_q4_dot4.wgsl, and on
// activations quantized once matvec_q4k_xq.wgsl and matvec_q8_xq.wgsl), made by int8_pack.wgsl's
// quantize_unit in the mat-vec or in quantize_x.wgsl, or read back from what quantize_x wrote
// (matvec_input_int8.wgsl).

// A unit of 32 activations of x as bytes, in one of two orders (int8_pack.wgsl):
//   nibble order (the q4 family: q4, q4k): word j of `even` holds q at 8j, 8j+2, 8j+4, 8j+6
//     (low byte first), word j of `odd` q at 8j+1, 8j+3, 8j+5, 8j+7, the order in which a
//     word of 8 nibble codes splits into two words of bytes (byte_dot below);
//   natural order (q8, whose codes are bytes already): word j of `even` holds q at 8j .. 8j+3,
//     word j of `odd` q at 8j+4 .. 8j+7;
// `even_r`, `odd_r` the residual bytes r likewise (RESIDUAL only); and the f32 sum of the unit's x.
// vec4 words a unit takes in xq (quantize_x.wgsl, matvec_input_int8.wgsl): even, odd, (d, sum),
// and with RESIDUAL (declared by the including kernel) even_r, odd_r.
fn xq_unit_words() -> u32 {
    return select(3u, 5u, RESIDUAL);
}

struct UnitX {
    even: vec4<u32>,
    odd: vec4<u32>,
    even_r: vec4<u32>,
    odd_r: vec4<u32>,
    scale: f32,       // d
    total: f32,
}


// sum_k c_k b_k over a unit for the bytes b of (even, odd) and a row's 4 code words of 8
// nibbles split in low (codes 0,2,4,6 of each word) and high (1,3,5,7) nibbles: in nibble
// order each low word meets an even word and each high word an odd one.
fn byte_dot(low: vec4<u32>, high: vec4<u32>, even: vec4<u32>, odd: vec4<u32>) -> i32 {
    return (dot4I8Packed(low.x, even.x) + dot4I8Packed(high.x, odd.x))
         + (dot4I8Packed(low.y, even.y) + dot4I8Packed(high.y, odd.y))
         + (dot4I8Packed(low.z, even.z) + dot4I8Packed(high.z, odd.z))
         + (dot4I8Packed(low.w, even.w) + dot4I8Packed(high.w, odd.w));
}
