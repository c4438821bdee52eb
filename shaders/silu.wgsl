// silu(g) = g * sigmoid(g), shared by swiglu.wgsl and the mat-vec SwiGLU input
// (matvec_input_swiglu.wgsl), so both evaluate it with the same operations and one error
// rule (py/webslm/kernels/swiglu.py swiglu_oracle).
//
// e = exp(-|g|) <= 1 and sigmoid = 1 / (1 + e) for g >= 0, e / (1 + e) for g < 0: exp never
// overflows and the divisor stays in [1, 2], where WGSL guarantees division to 2.5 ULP.

fn silu(g: f32) -> f32 {
    let e = exp(-abs(g));                // in [0, 1]
    let r = 1.0 / (1.0 + e);
    return g * select(e * r, r, g >= 0.0);
}

fn silu4(g: vec4<f32>) -> vec4<f32> {
    let e = exp(-abs(g));
    let r = 1.0 / (1.0 + e);
    return g * select(e * r, r, g >= vec4<f32>(0.0));
}
