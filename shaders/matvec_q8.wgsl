// Decode mat-vec weights in q8 (docs/slm-format.md), for matvec_main.wgsl.
//
//   codes  [rows][units] vec4<u32>   a unit is 16 signed codes (4 words of 4)
//   scales [rows * blocks] f16 pairs in u32 words (SCALE_F16) or f32 words (scale_at: quant_scales.wgsl)
//   then the activations and y from X_BINDING on (matvec_input_*.wgsl)
//
// value = s * code; per unit: s * sum_k c_k x_k (a unit never straddles two blocks).

override BLOCK: u32 = 32u;        // codes per scale block: 32, 64, 128, 256
override SCALE_F16: bool = true;  // scales stored as f16, else f32

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
const X_BINDING: u32 = 3u;        // the first binding of the input file

// A unit of x: 16 activations.
struct UnitX {
    q: array<vec4<f32>, 4>,
}

fn load_x(u: u32, m: u32) -> UnitX {
    var xu: UnitX;
    let k0 = u * 16u;
    if (k0 + 16u <= params.cols) {
        for (var j = 0u; j < 4u; j++) {
            xu.q[j] = x_full(m, u * 4u + j);
        }
    } else {
        for (var j = 0u; j < 4u; j++) {
            xu.q[j] = x_quad(m, k0 + 4u * j);
        }
    }
    return xu;
}

// Row `row`'s share of unit u.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let c = codes[row * params.units + u];
    let cx = (dot(q8_values(c.x), xu.q[0]) + dot(q8_values(c.y), xu.q[1]))
           + (dot(q8_values(c.z), xu.q[2]) + dot(q8_values(c.w), xu.q[3]));
    return scale_at(row * params.blocks + u * 16u / BLOCK) * cx;
}
