// Decode mat-vec weights in q6k (GGUF's Q6_K; docs/slm-format.md), for matvec_main.wgsl with
// matvec_unit32.wgsl.
//
//   codes       [rows][units] vec4<u32>   low 4 bits; a unit is 32 codes: two sub-blocks of 16
//   high_bits   [rows][units] vec2<u32>    bits 4-5 of the unit's codes, element j at bits 2j
//                                          of .x (j < 16) or 2(j - 16) of .y
//   scales      [rows * blocks] f16 pairs in u32 words: each super-block's scale d
//   sub_scales  [rows * 2 units] int8 in u32 words: each sub-block's sc (signed)
//   then the activations and y from X_BINDING on (matvec_input_*.wgsl)
//
// value = (d sc) (c - 32); d sc is exact in f32. Per sub-block half h of the unit:
//   sum_k (d sc_h) (c_k - 32) x_k = (d sc_h) * (sum_k c_k x_k - 32 * sum_k x_k)
// The unit's two sub-scales are bytes 2 unit and 2 unit + 1: one half of the u32 word unit / 2.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> high_bits: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> sub_scales: array<u32>;
const X_BINDING: u32 = 5u;        // the first binding of the input file

// Row `row`'s share of unit u.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let unit = row * params.units + u;
    let c = codes[unit];
    let h = high_bits[unit];
    let first = (dot(q6_quad(c.x, 0u, h.x, 0u), xu.q[0]) + dot(q6_quad(c.x, 16u, h.x, 8u), xu.q[1]))
              + (dot(q6_quad(c.y, 0u, h.x, 16u), xu.q[2]) + dot(q6_quad(c.y, 16u, h.x, 24u), xu.q[3]));
    let second = (dot(q6_quad(c.z, 0u, h.y, 0u), xu.q[4]) + dot(q6_quad(c.z, 16u, h.y, 8u), xu.q[5]))
               + (dot(q6_quad(c.w, 0u, h.y, 16u), xu.q[6]) + dot(q6_quad(c.w, 16u, h.y, 24u), xu.q[7]));
    let b = row * params.blocks + u / 8u;
    let d = f16_element(scales[b / 2u], b);
    let pair = sub_scales[unit / 2u];
    let at = 2u * unit;
    return (d * i8_element(pair, at)) * (first - 32.0 * xu.halves.x)
         + (d * i8_element(pair, at + 1u)) * (second - 32.0 * xu.halves.y);
}
