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
// q8_dot4's with units of 32 (docs/kernels.md).

override BLOCK: u32 = 32u;        // codes per scale block: 32, 64, 128, 256
override SCALE_F16: bool = true;  // scales stored as f16, else f32

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
const X_BINDING: u32 = 3u;        // the first binding of the input file

// Row `row`'s share of unit u: codes 32u .. 32u+31 of the row.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let at = 2u * (row * params.units + u);
    let first = codes[at];         // codes 0..15 of the unit: bytes of even.x, odd.x, even.y, odd.y
    let second = codes[at + 1u];   // codes 16..31: even.z, odd.z, even.w, odd.w
    let c_q = (dot4I8Packed(first.x, xu.even.x) + dot4I8Packed(first.y, xu.odd.x))
            + (dot4I8Packed(first.z, xu.even.y) + dot4I8Packed(first.w, xu.odd.y))
            + (dot4I8Packed(second.x, xu.even.z) + dot4I8Packed(second.y, xu.odd.z))
            + (dot4I8Packed(second.z, xu.even.w) + dot4I8Packed(second.w, xu.odd.w));
    return scale_at(row * params.blocks + u * 32u / BLOCK) * (xu.scale * f32(c_q));
}
