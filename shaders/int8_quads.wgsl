// A unit's 32 activations read through a mat-vec input file (matvec_input_{plain,norm,swiglu}.wgsl:
// x_full, x_quad, and the Params block's cols), for int8_pack.wgsl's quantize_unit. Apart from
// int8_pack.wgsl so that a kernel with activations of its own (attention_decode_xq.wgsl) can
// quantize them without an input file.

// Unit u's 8 quads of activation row m through the input file's x_full / x_quad (the input
// mode's activations: x, x * g, silu(gate) * up); past cols they read as 0.
fn unit_quads(u: u32, m: u32) -> array<vec4<f32>, 8> {
    var q: array<vec4<f32>, 8>;
    let k0 = u * 32u;
    if (k0 + 32u <= params.cols) {      // every unit but a partial last one: plain loads
        for (var j = 0u; j < 8u; j++) {
            q[j] = x_full(m, u * 8u + j);
        }
    } else {
        for (var j = 0u; j < 8u; j++) {
            q[j] = x_quad(m, k0 + 4u * j);
        }
    }
    return q;
}
