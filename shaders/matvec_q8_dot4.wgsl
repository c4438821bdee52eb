// Decode mat-vec weights in q8 with int8 activations and packed dot products, for
// matvec_main.wgsl (registry variant "q8_dot4"; needs the WGSL language feature
// packed_4x8_integer_dot_product). Same bindings and overrides as matvec_q8.wgsl:
//
//   codes  [rows][units] vec4<u32>   a unit is 16 signed codes (4 words of 4)
//   scales [rows * blocks] (quant_scales.wgsl)
//   then the activations and y from X_BINDING on (matvec_input_*.wgsl)
//
// load_x quantizes the unit's 16 activations to bytes q with one power-of-two scale d
// (matvec_int8_x.wgsl), packed 4 to a word in code order, so a row's code words go
// straight into dot4I8Packed: per unit s * d * sum_k c_k q_k, the integer sum exact
// (|.| <= 16 * 128 * 127 < 2^24) and d * it exact. The error against W x:
// sum_k |s c_k| |x_k - d q_k| (docs/kernels.md).

override BLOCK: u32 = 32u;        // codes per scale block: 32, 64, 128, 256
override SCALE_F16: bool = true;  // scales stored as f16, else f32

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
const X_BINDING: u32 = 3u;        // the first binding of the input file

// A unit of x as bytes: word j holds q at 4j .. 4j+3, low byte first.
struct UnitX {
    q: vec4<u32>,
    scale: f32,       // d
}

fn load_x(u: u32, m: u32) -> UnitX {
    var x: array<vec4<f32>, 4>;
    let k0 = u * 16u;
    if (k0 + 16u <= params.cols) {
        for (var j = 0u; j < 4u; j++) {
            x[j] = x_full(m, u * 4u + j);
        }
    } else {
        for (var j = 0u; j < 4u; j++) {
            x[j] = x_quad(m, k0 + 4u * j);
        }
    }
    let d = int8_scale(quad_max(max(max(abs(x[0]), abs(x[1])), max(abs(x[2]), abs(x[3])))));
    return UnitX(vec4<u32>(pack4xI8(int8_lanes(x[0], d.inverse)), pack4xI8(int8_lanes(x[1], d.inverse)),
                           pack4xI8(int8_lanes(x[2], d.inverse)), pack4xI8(int8_lanes(x[3], d.inverse))),
                 d.scale);
}

// Row `row`'s share of unit u.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let c = codes[row * params.units + u];
    let cq = (dot4I8Packed(c.x, xu.q.x) + dot4I8Packed(c.y, xu.q.y))
           + (dot4I8Packed(c.z, xu.q.z) + dot4I8Packed(c.w, xu.q.w));
    return scale_at(row * params.blocks + u * 16u / BLOCK) * (xu.scale * f32(cq));
}
