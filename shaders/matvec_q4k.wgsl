// Decode mat-vec weights in q4k (GGUF's Q4_K; docs/slm-format.md), for matvec_main.wgsl with
// matvec_unit32.wgsl.
//
//   codes       [rows][units] vec4<u32>   a unit is 32 codes: exactly one sub-block
//   scales      [rows * blocks] f16 pairs in u32 words: each super-block's scale d
//   mins        [rows * blocks] f16 pairs: each super-block's min dmin
//   sub_scales  [rows * units] bytes (u6) in u32 words: each sub-block's sc
//   sub_mins    [rows * units] bytes (u6): each sub-block's m
//   then the activations and y from X_BINDING on (matvec_input_*.wgsl)
//
// value = (d sc) c - dmin m. Both products are exact in f32 (an f16 significand times a 6-bit
// integer), so a unit is q4 "min" with scale d sc and min -(dmin m):
//   sum_k ((d sc) c_k - dmin m) x_k = (d sc) * sum_k c_k x_k - (dmin m) * sum_k x_k
// The sub-block index of unit u of a row is row * units + u (8 units a super-block).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read> mins: array<u32>;
@group(0) @binding(4) var<storage, read> sub_scales: array<u32>;
@group(0) @binding(5) var<storage, read> sub_mins: array<u32>;
const X_BINDING: u32 = 6u;        // the first binding of the input file

// Row `row`'s share of unit u.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let unit = row * params.units + u;
    let c = codes[unit];
    let cx = (dot(q4_low(c.x), xu.q[0]) + dot(q4_high(c.x), xu.q[1]))
           + (dot(q4_low(c.y), xu.q[2]) + dot(q4_high(c.y), xu.q[3]))
           + (dot(q4_low(c.z), xu.q[4]) + dot(q4_high(c.z), xu.q[5]))
           + (dot(q4_low(c.w), xu.q[6]) + dot(q4_high(c.w), xu.q[7]));
    let b = row * params.blocks + u / 8u;
    let scale = f16_element(scales[b / 2u], b) * u8_element(sub_scales[unit / 4u], unit);
    let offset = f16_element(mins[b / 2u], b) * u8_element(sub_mins[unit / 4u], unit);
    return scale * cx - offset * xu.total;
}
