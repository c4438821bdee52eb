// Decode mat-vec weights in q4 with int8 activations and packed dot products, for
// matvec_main.wgsl (registry variant "q4_dot4"; needs the WGSL language feature
// packed_4x8_integer_dot_product). Same bindings and overrides as matvec_q4.wgsl:
//
//   codes  [rows][units] vec4<u32>   a unit is 32 codes (4 words of 8), low nibble first
//   scales [rows * blocks], mins [rows * blocks] (quant_scales.wgsl, quant_mins.wgsl)
//   then the activations and y from X_BINDING on (matvec_input_*.wgsl)
//
// load_x brings the unit's 32 activations as bytes q with one power-of-two scale d
// (int8_pack.wgsl, matvec_int8_x.wgsl): quantized here (matvec_q4_dot4_x.wgsl, per workgroup)
// or once per mat-vec beforehand (matvec_input_int8.wgsl, from quantize_x.wgsl). Each row then needs, per code word, one mask and one shift to
// split the 8 nibbles into two words of 4 bytes (codes 0,2,4,6 and 1,3,5,7: a nibble is a
// non-negative signed byte) and two dot4I8Packed, instead of 8 decodes and 8 multiply-adds.
// The x bytes are packed in that same even/odd order. Per unit (a unit never straddles two
// blocks), with C = sum_k c_k q_k, or with RESIDUAL C = sum_k c_k (64 q_k + r_k) / 64:
//   min:     s * d * C + m * sum_k x_k
//   offset:  s * (d * C - 8 * sum_k x_k)
// The integer sums are exact (|.| <= 32 * 15 * (64 * 127 + 64) < 2^24, so exact as f32 too)
// and d * C is exact; sum_k x_k is the f32 sum of the unquantized x, so the zero part carries
// no quantization error. The error against W x: sum_k |s c_k| |x_k - d (q_k + r_k / 64)|
// (docs/kernels.md).

override BLOCK: u32 = 32u;        // codes per scale block: 32, 64, 128, 256
override ZERO_MIN: bool = true;   // q4 zero "min" (affine) or "offset" (code - 8)
override SCALE_F16: bool = true;  // scales and mins stored as f16, else f32
override RESIDUAL: bool = false;  // a second byte per activation for the rounding left over

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read> mins: array<u32>;
const X_BINDING: u32 = 4u;        // the first binding of the input file

// Row `row`'s share of unit u.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let c = codes[row * params.units + u];
    let low = c & vec4<u32>(0x0F0F0F0Fu);
    let high = (c >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);
    let c_q = byte_dot(low, high, xu.even, xu.odd);
    var cx = xu.scale * f32(c_q);
    if (RESIDUAL) {        // d (64 C_q + C_r) / 64: the integer exact, d / 64 a power of two
        cx = (xu.scale / RESIDUAL_STEPS) * f32(64 * c_q + byte_dot(low, high, xu.even_r, xu.odd_r));
    }
    let b = row * params.blocks + u * 32u / BLOCK;
    if (ZERO_MIN) {
        return scale_at(b) * cx + min_at(b) * xu.total;
    }
    return scale_at(b) * (cx - 8.0 * xu.total);
}
