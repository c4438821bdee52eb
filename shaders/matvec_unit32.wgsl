// The unit of x the q5 and super-block mat-vecs (matvec_q5.wgsl, matvec_q4k.wgsl,
// matvec_q5k.wgsl, matvec_q6k.wgsl) multiply: 32 activations, one 16-byte load of their low
// nibbles. Their sums, of the whole unit and of each half of 16 (q6k's sub-blocks), feed the
// zero part of the factored forms, sum_k (s c_k + z) x_k = s sum_k c_k x_k + z sum_k x_k.

struct UnitX {
    q: array<vec4<f32>, 8>,
    halves: vec2<f32>,   // sum of activations 0..15 and 16..31
    total: f32,          // halves.x + halves.y
}

fn load_x(u: u32, m: u32) -> UnitX {
    var xu: UnitX;
    let k0 = u * 32u;
    if (k0 + 32u <= params.cols) {      // every unit but a partial last one: plain loads
        for (var j = 0u; j < 8u; j++) {
            xu.q[j] = x_full(m, u * 8u + j);
        }
    } else {
        for (var j = 0u; j < 8u; j++) {
            xu.q[j] = x_quad(m, k0 + 4u * j);
        }
    }
    let q = xu.q;
    let first = (q[0] + q[1]) + (q[2] + q[3]);
    let second = (q[4] + q[5]) + (q[6] + q[7]);
    xu.halves = vec2<f32>(dot(first, vec4<f32>(1.0)), dot(second, vec4<f32>(1.0)));
    xu.total = xu.halves.x + xu.halves.y;
    return xu;
}
