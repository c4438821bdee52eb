// Activations as int8 for the packed-dot mat-vec variants (matvec_q4_dot4.wgsl,
// matvec_q8_dot4.wgsl): each unit of x (32 or 16 activations) becomes signed bytes q with one
// scale d, x ~ d q, so that the weights' codes and q meet in dot4I8Packed (four byte products
// summed in one instruction where the GPU has one: SPIR-V OpSDot, DP4A).
//
// d is a power of two, 2^(E - 6) for the unit's largest magnitude amax in [2^E, 2^(E+1)):
// amax / d lies in [64, 128), and where it exceeds 127 (a value could round to 128, which
// int8 cannot hold) d doubles. So |x / d| <= 127 for every x of the unit, x / d is exact
// (a power-of-two scaling), and q = round(x / d) is the only rounding: |x - d q| <= d / 2
// when rounding to nearest (<= d under WGSL's either-neighbour latitude), d <= amax / 64
// (amax / 128 < d when it doubled: 1 in 64 of the range). Exponents are clamped so that d
// and 1/d stay normal f32 (amax below 2^-114 all quantizes with d = 2^-120, e.g. amax = 0 ->
// q = 0). Domain: finite x; d * q stays exact unless d overflows (|x| near f32's maximum).
//
// The rounding is an fma against 1.5 * 2^23: the sum is 1.5 * 2^23 + q exactly after one
// rounding, with q in the low mantissa bits, so the low byte of its bit pattern is q as a
// two's complement byte, which is what pack4xI8 keeps of each lane (no float-to-int
// conversion, a quarter-rate instruction on common GPUs).

const ROUND_MAGIC: f32 = 12582912.0;   // 1.5 * 2^23

struct Int8Scale {
    scale: f32,      // d
    inverse: f32,    // 1 / d, exactly
}

// The scale of a unit whose largest |x| is amax (>= 0, finite).
fn int8_scale(amax: f32) -> Int8Scale {
    var field = max(bitcast<u32>(amax) >> 23u, 7u);          // biased exponent of amax, >= 7
    if (amax * bitcast<f32>((260u - field) << 23u) > 127.0) {  // amax / 2^(E - 6) > 127
        field += 1u;
    }
    return Int8Scale(bitcast<f32>((field - 6u) << 23u), bitcast<f32>((260u - field) << 23u));
}

// round(v / d) for four activations, each lane's low byte holding the signed byte.
fn int8_lanes(v: vec4<f32>, inverse: f32) -> vec4<i32> {
    return bitcast<vec4<i32>>(fma(v, vec4<f32>(inverse), vec4<f32>(ROUND_MAGIC)));
}

// The largest magnitude among quads.
fn quad_max(a: vec4<f32>) -> f32 {
    return max(max(a.x, a.y), max(a.z, a.w));
}
