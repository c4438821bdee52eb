// Decode mat-vec weights in q4k (GGUF's Q4_K) on activations quantized once (quantize_x.wgsl,
// nibble order), for matvec_main.wgsl with matvec_input_int8.wgsl (registry variant "xq";
// needs the WGSL language feature packed_4x8_integer_dot_product). Same bindings as
// matvec_q4k.wgsl:
//
//   codes       [rows][units] vec4<u32>   a unit is 32 codes (4 words of 8): one sub-block
//   scales      [rows * blocks] f16 pairs in u32 words: each super-block's scale d
//   mins        [rows * blocks] f16 pairs: each super-block's min dmin
//   sub_scales  [rows * units] bytes (u6) in u32 words: each sub-block's sc
//   sub_mins    [rows * units] bytes (u6): each sub-block's m
//   then xq and y from X_BINDING on (matvec_input_int8.wgsl)
//
// A unit is q4 "min" with scale d sc and min -(dmin m), both exact in f32 (matvec_q4k.wgsl),
// so it takes q4_dot4's arithmetic: (d sc) * d_x * C - (dmin m) * sum_k x_k, C = sum_k c_k q_k
// from byte_dot (int8_unit.wgsl), exact. The zero part multiplies the unquantized sum, so
// only the code part carries the activation's rounding: sum_k |d sc c_k| |x_k - d_x q_k|
// (RESIDUAL: |x_k - d_x (q_k + r_k / 64)|, a second byte per activation).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read> mins: array<u32>;
@group(0) @binding(4) var<storage, read> sub_scales: array<u32>;
@group(0) @binding(5) var<storage, read> sub_mins: array<u32>;
const X_BINDING: u32 = 6u;        // the first binding of the input file
override RESIDUAL: bool = false;  // xq holds a second byte per activation (quantize_x.wgsl)

// Row `row`'s share of unit u.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let unit = row * params.units + u;
    let c = codes[unit];
    let low = c & vec4<u32>(0x0F0F0F0Fu);
    let high = (c >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);
    let c_q = byte_dot(low, high, xu.even, xu.odd);
    var cx = xu.scale * f32(c_q);
    if (RESIDUAL) {        // d_x (64 C_q + C_r) / 64 (|.| < 32 * 15 * 127 * 65 < 2^24): exact
        cx = (xu.scale / RESIDUAL_STEPS) * f32(64 * c_q + byte_dot(low, high, xu.even_r, xu.odd_r));
    }
    let b = row * params.blocks + u / 8u;
    let scale = f16_element(scales[b / 2u], b) * u8_element(sub_scales[unit / 4u], unit);
    let offset = f16_element(mins[b / 2u], b) * u8_element(sub_mins[unit / 4u], unit);
    return scale * cx - offset * xu.total;
}
