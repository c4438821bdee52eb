// Activations as int8 for the packed-dot mat-vec variants (matvec_q4_dot4.wgsl,
// matvec_q8_dot4.wgsl): each unit of x (32 or 16 activations) becomes signed bytes q with one
// scale d, x ~ d q, so that the weights' codes and q meet in dot4I8Packed (four byte products
// summed in one instruction where the GPU has one: SPIR-V OpSDot, DP4A). With RESIDUAL the
// rounding left over becomes a second byte r in steps of d / 64, x ~ d (q + r / 64): two dot
// products a word instead of one, and 64 times less error.
//
// d is a power of two, 2^(E - 6) for the unit's largest magnitude amax in [2^E, 2^(E+1)):
// amax / d lies in [64, 128), and where it exceeds 127 (a value could round to 128, which
// int8 cannot hold) d doubles. So |x / d| <= 127 for every x of the unit, x / d is exact
// (a power-of-two scaling), and q = round(x / d) is the only rounding: |x - d q| <= d / 2
// when rounding to nearest (<= d under WGSL's either-neighbour latitude), d <= amax / 64
// (amax / 128 < d when it doubled: 1 in 64 of the range). With RESIDUAL the one rounding is
// Q = round(64 x / d), split into q and r exactly (int8_lanes): |x - d (q + r / 64)| <= d / 128
// (<= d / 64 under the latitude). Exponents are clamped so that 64 / d stays a normal f32
// (amax below 2^-114 all quantizes with d = 2^-120; amax = 0 gives q = 0).
// Domain: finite x; d * q stays exact unless d overflows (|x| near f32's maximum).
//
// The rounding is an fma against 1.5 * 2^23: the sum is 1.5 * 2^23 + q exactly after one
// rounding, with q in the low mantissa bits, so the low byte of its bit pattern is q as a
// two's complement byte, which is what pack4xI8 keeps of each lane (no float-to-int
// conversion, a quarter-rate instruction on common GPUs).

const ROUND_MAGIC: f32 = 12582912.0;   // 1.5 * 2^23
const RESIDUAL_STEPS: f32 = 64.0;      // the second byte counts d / 64

struct Int8Scale {
    scale: f32,      // d
    inverse: f32,    // 1 / d, exactly
}

// The scale of a unit whose largest |x| is amax (>= 0, finite).
fn int8_scale(amax: f32) -> Int8Scale {
    var field = max(bitcast<u32>(amax) >> 23u, 13u);         // biased exponent of amax, >= 13
    if (amax * bitcast<f32>((260u - field) << 23u) > 127.0) {  // amax / 2^(E - 6) > 127
        field += 1u;
    }
    return Int8Scale(bitcast<f32>((field - 6u) << 23u), bitcast<f32>((260u - field) << 23u));
}

// Four activations as bytes: q = round(v / d) and, with RESIDUAL, r, such that v / d ~ q + r / 64;
// each lane's low byte holds the signed byte (r is 0 without RESIDUAL).
struct Int8Lanes {
    q: vec4<i32>,
    r: vec4<i32>,
}

fn int8_lanes(v: vec4<f32>, inverse: f32) -> Int8Lanes {
    let magic = vec4<f32>(ROUND_MAGIC);
    if (!RESIDUAL) {
        return Int8Lanes(bitcast<vec4<i32>>(fma(v, vec4<f32>(inverse), magic)), vec4<i32>(0));
    }
    // Q = round(64 v / d) (|Q| <= 64 * 127), then q = round(Q / 64) and r = Q - 64 q in
    // integers: |q| <= 127, -32 <= r < 32, and d (q + r / 64) = d Q / 64 exactly. The
    // magic's bits are subtracted as integers: a compiler may simplify (a + magic) - magic
    // in floats to a, which would lose the rounding (Mesa's lavapipe does).
    let steps = bitcast<vec4<i32>>(fma(v, vec4<f32>(inverse * RESIDUAL_STEPS), magic))
              - bitcast<vec4<i32>>(magic);
    let q = (steps + vec4<i32>(32)) >> vec4<u32>(6u);
    return Int8Lanes(q, steps - (q << vec4<u32>(6u)));
}

// The largest magnitude among quads.
fn quad_max(a: vec4<f32>) -> f32 {
    return max(max(a.x, a.y), max(a.z, a.w));
}
