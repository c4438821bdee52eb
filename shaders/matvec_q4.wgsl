// Decode mat-vec weights in q4 (docs/slm-format.md), for matvec_main.wgsl.
//
//   codes  [rows][units] vec4<u32>   a unit is 32 codes (4 words of 8), low nibble first
//   scales [rows * blocks] f16 pairs in u32 words (SCALE_F16) or f32 words
//   mins   [rows * blocks] like scales; read only when ZERO_MIN
//   x      [M][x_stride] f32, read as vec4     y  [M][y_stride] f32
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
@group(0) @binding(4) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

fn scale_at(index: u32) -> f32 {
    if (SCALE_F16) {
        return f16_element(scales[index >> 1u], index);
    }
    return bitcast<f32>(scales[index]);
}

fn min_at(index: u32) -> f32 {
    if (SCALE_F16) {
        return f16_element(mins[index >> 1u], index);
    }
    return bitcast<f32>(mins[index]);
}

fn unit_dot(u: u32, m: u32, first_row: u32) -> vec4<f32> {
    let k0 = u * 32u;
    var xs: array<vec4<f32>, 8>;
    for (var j = 0u; j < 8u; j++) {
        xs[j] = x_quad(m, k0 + 4u * j);
    }
    let x_total = dot((xs[0] + xs[1]) + (xs[2] + xs[3]) + (xs[4] + xs[5]) + (xs[6] + xs[7]), vec4<f32>(1.0));
    let block = k0 / BLOCK;

    var out = vec4<f32>(0.0);
    for (var r = 0u; r < ROWS; r++) {
        let row = first_row + r;
        if (row < params.rows) {
            let c = codes[row * params.units + u];
            let cx = (dot(q4_low(c.x), xs[0]) + dot(q4_high(c.x), xs[1]))
                   + (dot(q4_low(c.y), xs[2]) + dot(q4_high(c.y), xs[3]))
                   + (dot(q4_low(c.z), xs[4]) + dot(q4_high(c.z), xs[5]))
                   + (dot(q4_low(c.w), xs[6]) + dot(q4_high(c.w), xs[7]));
            let b = row * params.blocks + block;
            if (ZERO_MIN) {
                out[r] = scale_at(b) * cx + min_at(b) * x_total;
            } else {
                out[r] = scale_at(b) * (cx - 8.0 * x_total);
            }
        }
    }
    return out;
}
