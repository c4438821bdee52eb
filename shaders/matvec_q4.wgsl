// Decode mat-vec weights in q4 (docs/slm-format.md), for matvec_main.wgsl.
//
//   codes  [rows][units] vec4<u32>   a unit is 32 codes (4 words of 8), low nibble first
//   scales [rows * blocks] f16 pairs in u32 words (SCALE_F16) or f32 words
//   mins   [rows * blocks] like scales; read only when ZERO_MIN
//   (scale_at / min_at: quant_scales.wgsl, quant_mins.wgsl)
//   then the activations and y from X_BINDING on (matvec_input_*.wgsl)
//
// Dequantization happens in registers, factored per unit (a unit never straddles two
// blocks: blocks are 32..256 codes):
//   min:     sum_k (s c_k + m) x_k = s * sum_k c_k x_k + m * sum_k x_k
//   offset:  sum_k s (c_k - 8) x_k = s * (sum_k c_k x_k - 8 * sum_k x_k)

override BLOCK: u32 = 32u;        // codes per scale block: 32, 64, 128, 256
override ZERO_MIN: bool = true;   // q4 zero "min" (affine) or "offset" (code - 8)
override SCALE_F16: bool = true;  // scales and mins stored as f16, else f32

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read> mins: array<u32>;
const X_BINDING: u32 = 4u;        // the first binding of the input file

// A unit of x: 32 activations, and their sum (for the zero part of the factored form).
struct UnitX {
    q: array<vec4<f32>, 8>,
    total: f32,
}

fn load_x(u: u32, m: u32) -> UnitX {
    var xu: UnitX;
    let k0 = u * 32u;
    if (k0 + 32u <= params.cols) {      // every unit but a partial last one: plain loads
        for (var j = 0u; j < 8u; j++) {
            xu.q[j] = x_full(m, u * 8u + j);
        }
    } else {
        for (var j = 0u; j < 8u; j++) {
            xu.q[j] = x_quad(m, k0 + 4u * j);
        }
    }
    let q = xu.q;
    xu.total = dot(((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7])), vec4<f32>(1.0));
    return xu;
}

// Row `row`'s share of unit u: s * sum(c x) + zero part, for the factored form above.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let c = codes[row * params.units + u];
    let cx = (dot(q4_low(c.x), xu.q[0]) + dot(q4_high(c.x), xu.q[1]))
           + (dot(q4_low(c.y), xu.q[2]) + dot(q4_high(c.y), xu.q[3]))
           + (dot(q4_low(c.z), xu.q[4]) + dot(q4_high(c.z), xu.q[5]))
           + (dot(q4_low(c.w), xu.q[6]) + dot(q4_high(c.w), xu.q[7]));
    let b = row * params.blocks + u * 32u / BLOCK;
    if (ZERO_MIN) {
        return scale_at(b) * cx + min_at(b) * xu.total;
    }
    return scale_at(b) * (cx - 8.0 * xu.total);
}
