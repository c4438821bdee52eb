// Mat-vec input "plain" (INPUT = 0): the weights multiply x itself.
//
//   x  [M][x_stride] f32, read as vec4 (x_stride a multiple of 4, >= cols)
//   y  [M][y_stride] f32 (ACCUMULATE: read, then written)
//
// Bindings follow the encoding's weight parts: X_BINDING (a const of the encoding file).

@group(0) @binding(X_BINDING) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(X_BINDING + 1u) var<storage, read_write> y: array<f32>;
const INPUT_BINDINGS: u32 = 2u;   // x, y: a fused entry point's bindings follow (matvec_rope_kv.wgsl)

// Quad q (activations 4q .. 4q+3) of row m, for quads wholly below cols.
fn x_full(m: u32, q: u32) -> vec4<f32> {
    return x[m * (params.x_stride / 4u) + q];
}

// Activations k0 .. k0+3 of row m; lanes at k >= cols read as 0, so that the padding of a
// last partial block contributes nothing (for q4 "min" a zero code still decodes to `min`,
// so masking the weights alone would not do).
fn x_quad(m: u32, k0: u32) -> vec4<f32> {
    let quad = x_full(m, min(k0, params.cols - 1u) / 4u);
    if (k0 + 4u <= params.cols) {
        return quad;
    }
    let k = vec4<u32>(k0) + vec4<u32>(0u, 1u, 2u, 3u);
    return select(vec4<f32>(0.0), quad, k < vec4<u32>(params.cols));
}

// quantize_x.wgsl: whether the row's header scale needs the whole row (each unit is its own).
const INPUT_WHOLE_ROW: bool = false;

// quantize_x.wgsl UNIT_SQUARES: the squares a unit carries for a norm in the mat-vec (none here).
fn take_squares() -> f32 {
    return 0.0;
}

// Nothing to finish: the row sums are the outputs.
fn input_finish(lane: u32, m: u32) -> f32 {
    return 1.0;
}

fn scaled(total: f32, scale: f32) -> f32 {
    return total;
}
