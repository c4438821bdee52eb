// Decode mat-vec weights in f32, for matvec_main.wgsl.
//
//   w  [rows][cols] f32 (row_words = cols), then the activations and y from X_BINDING on
//   (matvec_input_*.wgsl)
//
// A unit is 4 values read as scalars (rows are only 4-byte aligned when cols % 4 != 0);
// values at k >= cols are masked to 0.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> w: array<f32>;
const X_BINDING: u32 = 2u;        // the first binding of the input file

// A unit of x: 4 activations.
struct UnitX {
    q: vec4<f32>,
}

fn load_x(u: u32, m: u32) -> UnitX {
    return UnitX(x_quad(m, u * 4u));
}

// Row `row`'s share of unit u, values past cols masked.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let k0 = u * 4u;
    let inside = (vec4<u32>(k0) + vec4<u32>(0u, 1u, 2u, 3u)) < vec4<u32>(params.cols);
    let base = row * params.cols + k0;
    let last = row * params.cols + params.cols - 1u;
    let wq = vec4<f32>(w[min(base, last)], w[min(base + 1u, last)], w[min(base + 2u, last)], w[min(base + 3u, last)]);
    return dot(select(vec4<f32>(0.0), wq, inside), xu.q);
}
