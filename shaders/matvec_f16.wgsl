// Decode mat-vec weights in f16 (docs/slm-format.md), for matvec_main.wgsl.
//
//   w  [rows][row_words] u32   two f16 per word; rows padded to whole words
//   then the activations and y from X_BINDING on (matvec_input_*.wgsl)
//
// A unit is 8 values (4 words), read as four scalar words because a row's start is only
// 4-byte aligned. Values at k >= cols (the row's padding, or the next row's first values
// in the last unit) are masked to 0 before the multiply. f16 -> f32 is exact, so this
// needs no shader-f16 feature and runs on every tier.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
const X_BINDING: u32 = 2u;        // the first binding of the input file

// A unit of x: 8 activations.
struct UnitX {
    q: array<vec4<f32>, 2>,
}

fn load_x(u: u32, m: u32) -> UnitX {
    return UnitX(array<vec4<f32>, 2>(x_quad(m, u * 8u), x_quad(m, u * 8u + 4u)));
}

// Row `row`'s share of unit u, values past cols masked.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let k_lo = vec4<u32>(u * 8u) + vec4<u32>(0u, 1u, 2u, 3u);
    let cols = vec4<u32>(params.cols);
    let base = row * params.row_words + u * 4u;
    let last = row * params.row_words + params.row_words - 1u;
    let w0 = vec4<f32>(unpack2x16float(w[min(base, last)]), unpack2x16float(w[min(base + 1u, last)]));
    let w1 = vec4<f32>(unpack2x16float(w[min(base + 2u, last)]), unpack2x16float(w[min(base + 3u, last)]));
    return dot(select(vec4<f32>(0.0), w0, k_lo < cols), xu.q[0])
         + dot(select(vec4<f32>(0.0), w1, k_lo + vec4<u32>(4u) < cols), xu.q[1]);
}
