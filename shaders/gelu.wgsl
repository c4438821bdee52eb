// GELU, tanh approximation (PyTorch's gelu(approximate="tanh"), Gemma's activation), written
// through the identity 0.5 (1 + tanh(y)) = sigmoid(2 y):
//
//   gelu_tanh(g) = g * sigmoid(z),   z = 2 sqrt(2/pi) (g + 0.044715 g^3)
//
// sigmoid as silu.wgsl computes it (exp of -|z| only, so nothing overflows and there is no
// cancellation for z << 0, where 1 + tanh(y) would lose every digit). g and 0.044715 g^3 have
// the same sign: the sum in z does not cancel either. The error rule is swiglu.py's GEGLU_RULE.

const GELU_2C: f32 = 1.5957691216057308;    // 2 sqrt(2 / pi), rounded to f32
const GELU_K: f32 = 0.044715;

fn gelu_tanh(g: f32) -> f32 {
    let z = GELU_2C * (g + GELU_K * (g * g * g));
    let e = exp(-abs(z));                // in [0, 1]
    let r = 1.0 / (1.0 + e);
    return g * select(e * r, r, z >= 0.0);
}

fn gelu_tanh4(g: vec4<f32>) -> vec4<f32> {
    let z = GELU_2C * (g + GELU_K * (g * g * g));
    let e = exp(-abs(z));
    let r = 1.0 / (1.0 + e);
    return g * select(e * r, r, z >= vec4<f32>(0.0));
}
