// Decode mat-vec weights in q8 on activations quantized once (quantize_x.wgsl, NATURAL),
// for matvec_main.wgsl with matvec_input_int8.wgsl (registry variant "xq"; needs the WGSL
// language feature packed_4x8_integer_dot_product). Same bindings and overrides as
// matvec_q8.wgsl, but the main loop walks units of 32 activations (params.units counts
// them), two of the row's 16-code vec4 a unit:
//
//   codes  [rows][2 units] vec4<u32>   16 signed codes each (4 words of 4)
//   scales [rows * blocks] (quant_scales.wgsl)
//   then xq and y from X_BINDING on (matvec_input_int8.wgsl)
//
// The unit's bytes are in natural order (int8_unit.wgsl): a code word meets the byte word of
// the same 4 activations, and a unit never straddles two blocks (blocks are 32..256 codes).
// Per unit s * d * C, C = sum_k c_k q_k, exact (|C| <= 32 * 128 * 127 < 2^24: exact as f32
// too) and d * C exact (d a power of two); the error against W x: sum_k |s c_k| |x_k - d q_k|,
// q8_dot4's with units of 32 (docs/kernels.md). With RESIDUAL (a second byte r per activation,
// x ~ d (q + r / 64)) each half unit's 64 C_q + C_r (|.| < 16 * 128 * 127 * 65 < 2^24) is
// exact, the halves added in f32.

override BLOCK: u32 = 32u;        // codes per scale block: 32, 64, 128, 256
override SCALE_F16: bool = true;  // scales stored as f16, else f32
override RESIDUAL: bool = false;  // xq holds a second byte per activation (quantize_x.wgsl)

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
const X_BINDING: u32 = 3u;        // the first binding of the input file

// sum_k c_k b_k over 16 codes (4 words) and their bytes b: words x, z meet `even`, y, w `odd`.
fn half_dot(c: vec4<u32>, even: vec2<u32>, odd: vec2<u32>) -> i32 {
    return (dot4I8Packed(c.x, even.x) + dot4I8Packed(c.y, odd.x)) + (dot4I8Packed(c.z, even.y) + dot4I8Packed(c.w, odd.y));
}

// Row `row`'s share of unit u: codes 32u .. 32u+31 of the row.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let at = 2u * (row * params.units + u);
    let first = codes[at];         // codes 0..15 of the unit: bytes of even.x, odd.x, even.y, odd.y
    let second = codes[at + 1u];   // codes 16..31: even.z, odd.z, even.w, odd.w
    let c_q = half_dot(first, xu.even.xy, xu.odd.xy) + half_dot(second, xu.even.zw, xu.odd.zw);
    var cx = xu.scale * f32(c_q);
    if (RESIDUAL) {        // d / 64 a power of two: each half's integer exact, one f32 add
        let low = 64 * half_dot(first, xu.even.xy, xu.odd.xy) + half_dot(first, xu.even_r.xy, xu.odd_r.xy);
        let high = 64 * half_dot(second, xu.even.zw, xu.odd.zw) + half_dot(second, xu.even_r.zw, xu.odd_r.zw);
        cx = (xu.scale / RESIDUAL_STEPS) * (f32(low) + f32(high));
    }
    return scale_at(row * params.blocks + u * 32u / BLOCK) * cx;
}
