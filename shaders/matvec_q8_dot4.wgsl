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
// straight into dot4I8Packed: per unit s * d * C, C = sum_k c_k q_k, or with RESIDUAL
// C = sum_k c_k (64 q_k + r_k) / 64; the integer sums exact (|.| <= 16 * 128 * (64 * 127 + 64)
// = 2^24, exact as f32 too) and d * C exact. The error against W x:
// sum_k |s c_k| |x_k - d (q_k + r_k / 64)| (docs/kernels.md).

override BLOCK: u32 = 32u;        // codes per scale block: 32, 64, 128, 256
override SCALE_F16: bool = true;  // scales stored as f16, else f32
override RESIDUAL: bool = false;  // a second byte per activation for the rounding left over

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
const X_BINDING: u32 = 3u;        // the first binding of the input file

// A unit of x as bytes: word j holds q at 4j .. 4j+3, low byte first; `r` the residual bytes
// likewise (RESIDUAL only).
struct UnitX {
    q: vec4<u32>,
    r: vec4<u32>,
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
    let l0 = int8_lanes(x[0], d.inverse);
    let l1 = int8_lanes(x[1], d.inverse);
    let l2 = int8_lanes(x[2], d.inverse);
    let l3 = int8_lanes(x[3], d.inverse);
    return UnitX(vec4<u32>(pack4xI8(l0.q), pack4xI8(l1.q), pack4xI8(l2.q), pack4xI8(l3.q)),
                 vec4<u32>(pack4xI8(l0.r), pack4xI8(l1.r), pack4xI8(l2.r), pack4xI8(l3.r)), d.scale);
}

// sum_k c_k b_k over the unit for the code words c and the byte words b.
fn byte_dot(c: vec4<u32>, b: vec4<u32>) -> i32 {
    return (dot4I8Packed(c.x, b.x) + dot4I8Packed(c.y, b.y)) + (dot4I8Packed(c.z, b.z) + dot4I8Packed(c.w, b.w));
}

// Row `row`'s share of unit u.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let c = codes[row * params.units + u];
    let c_q = byte_dot(c, xu.q);
    var cx = xu.scale * f32(c_q);
    if (RESIDUAL) {        // d (64 C_q + C_r) / 64: the integer exact, d / 64 a power of two
        cx = (xu.scale / RESIDUAL_STEPS) * f32(64 * c_q + byte_dot(c, xu.r));
    }
    return scale_at(row * params.blocks + u * 16u / BLOCK) * cx;
}
