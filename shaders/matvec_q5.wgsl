// Decode mat-vec weights in q5 (GGUF's Q5_0 "offset" / Q5_1 "min"; docs/slm-format.md), for
// matvec_main.wgsl with matvec_unit32.wgsl.
//
//   codes      [rows][units] vec4<u32>   low 4 bits, a unit is 32 codes (4 words of 8)
//   high_bits  [rows][units] u32          bit 4 of the unit's 32 codes, element j at bit j
//   scales     [rows * blocks] f16 pairs in u32 words (SCALE_F16) or f32 words
//   mins       [rows * blocks] like scales; read only when ZERO_MIN ("offset" binds scales again)
//   (scale_at / min_at: quant_scales.wgsl, quant_mins.wgsl)
//   then the activations and y from X_BINDING on (matvec_input_*.wgsl)
//
// Per unit (never straddling two blocks: blocks are 32..256 codes), as q4:
//   min:     s * sum_k c_k x_k + m * sum_k x_k
//   offset:  s * (sum_k c_k x_k - 16 * sum_k x_k)

override BLOCK: u32 = 32u;        // codes per scale block: 32, 64, 128, 256
override ZERO_MIN: bool = true;   // zero "min" (affine) or "offset" (code - 16)
override SCALE_F16: bool = true;  // scales and mins stored as f16, else f32

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> high_bits: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> mins: array<u32>;
const X_BINDING: u32 = 5u;        // the first binding of the input file

// Row `row`'s share of unit u.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let unit = row * params.units + u;
    let c = codes[unit];
    let h = high_bits[unit];
    let cx = (dot(q5_quad(c.x, 0u, h, 0u), xu.q[0]) + dot(q5_quad(c.x, 16u, h, 4u), xu.q[1]))
           + (dot(q5_quad(c.y, 0u, h, 8u), xu.q[2]) + dot(q5_quad(c.y, 16u, h, 12u), xu.q[3]))
           + (dot(q5_quad(c.z, 0u, h, 16u), xu.q[4]) + dot(q5_quad(c.z, 16u, h, 20u), xu.q[5]))
           + (dot(q5_quad(c.w, 0u, h, 24u), xu.q[6]) + dot(q5_quad(c.w, 16u, h, 28u), xu.q[7]));
    let b = row * params.blocks + u * 32u / BLOCK;
    if (ZERO_MIN) {
        return scale_at(b) * cx + min_at(b) * xu.total;
    }
    return scale_at(b) * (cx - 16.0 * xu.total);
}
