// Decode mat-vec weights in q5k (GGUF's Q5_K; docs/slm-format.md), for matvec_main.wgsl with
// matvec_unit32.wgsl.
//
//   codes       [rows][units] vec4<u32>   low 4 bits; a unit is 32 codes: exactly one sub-block
//   high_bits   [rows][units] u32          bit 4 of the unit's 32 codes, element j at bit j
//   scales      [rows * blocks] f16 pairs in u32 words: each super-block's scale d
//   mins        [rows * blocks] f16 pairs: each super-block's min dmin
//   sub_scales  [rows * units] bytes (u6) in u32 words: each sub-block's sc
//   sub_mins    [rows * units] bytes (u6): each sub-block's m
//   then the activations and y from X_BINDING on (matvec_input_*.wgsl)
//
// value = (d sc) c - dmin m, factored per unit as q4k (matvec_q4k.wgsl): the products are
// exact in f32, so (d sc) * sum_k c_k x_k - (dmin m) * sum_k x_k.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> high_bits: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> mins: array<u32>;
@group(0) @binding(5) var<storage, read> sub_scales: array<u32>;
@group(0) @binding(6) var<storage, read> sub_mins: array<u32>;
const X_BINDING: u32 = 7u;        // the first binding of the input file

// Row `row`'s share of unit u.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let unit = row * params.units + u;
    let c = codes[unit];
    let h = high_bits[unit];
    let cx = (dot(q5_quad(c.x, 0u, h, 0u), xu.q[0]) + dot(q5_quad(c.x, 16u, h, 4u), xu.q[1]))
           + (dot(q5_quad(c.y, 0u, h, 8u), xu.q[2]) + dot(q5_quad(c.y, 16u, h, 12u), xu.q[3]))
           + (dot(q5_quad(c.z, 0u, h, 16u), xu.q[4]) + dot(q5_quad(c.z, 16u, h, 20u), xu.q[5]))
           + (dot(q5_quad(c.w, 0u, h, 24u), xu.q[6]) + dot(q5_quad(c.w, 16u, h, 28u), xu.q[7]));
    let b = row * params.blocks + u / 8u;
    let scale = f16_element(scales[b / 2u], b) * u8_element(sub_scales[unit / 4u], unit);
    let offset = f16_element(mins[b / 2u], b) * u8_element(sub_mins[unit / 4u], unit);
    return scale * cx - offset * xu.total;
}
