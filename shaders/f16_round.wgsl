// f32 -> IEEE binary16 bits in integer arithmetic, shared by the KV cache writers
// (kv_append.wgsl, rope_kv_append.wgsl): round to nearest, ties to even, overflow to
// infinity, gradual underflow, exactly as IEEE-754 and numpy's astype(float16) do, so the
// result does not rest on WGSL's rounding latitude and needs no shader-f16.

// IEEE binary16 bits of an f32 given by its bits, rounded to nearest, ties to even.
fn f16_bits(x: u32) -> u32 {
    let sign = (x >> 16u) & 0x8000u;
    let a = x & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return sign | 0x7e00u | ((a >> 13u) & 0x3ffu);     // NaN stays NaN (quiet)
    }
    if (a >= 0x47800000u) {
        return sign | 0x7c00u;                              // >= 2^16 (and infinity): infinity
    }
    if (a >= 0x38800000u) {
        // Normal half: rebias the exponent (127 - 15 = 112), then round 23 -> 10 mantissa
        // bits. A carry out of the mantissa bumps the exponent, up to infinity (65520 and up).
        let rebiased = a - 0x38000000u;
        return sign | ((rebiased + 0xfffu + ((rebiased >> 13u) & 1u)) >> 13u);
    }
    if (a < 0x33000000u) {
        return sign;                                        // below 2^-25: rounds to zero
    }
    // Subnormal half (units of 2^-24): significand with its hidden bit, shifted right by
    // 126 - exponent in 14..24, rounded to nearest even (a carry gives the smallest normal).
    let significand = (a & 0x7fffffu) | 0x800000u;
    let shift = 126u - (a >> 23u);
    let half_ulp = 1u << (shift - 1u);
    let odd = (significand >> shift) & 1u;
    return sign | ((significand + half_ulp - 1u + odd) >> shift);
}
