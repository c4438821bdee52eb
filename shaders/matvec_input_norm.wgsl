// Mat-vec input "norm" (INPUT = 1): the weights multiply RMSNorm(x) = x / rms(x) * g, the
// normalization of the layer's residual stream fused into the projection that reads it.
//
//   x  [M][x_stride] f32, read as vec4 (the residual stream; x_stride a multiple of 4)
//   g  [K] f32, the norm weight, read as vec4: its binding holds K rounded up to 4 floats
//   y  [M][y_stride] f32 (ACCUMULATE: read, then written)
//   params.aux: eps as f32 bits
//
// rms(x) = sqrt(mean(x[0..K)^2) + eps). The loop multiplies W by x * g, and the 1/rms factor
// is applied once per output after the row sums: y = (sum_k w_k (x_k g_k)) * inverseSqrt(mean
// + eps). The sum of squares needs no pass of its own: the workgroup's loop loads every quad
// of x's row exactly once (each unit by one invocation), so each invocation adds the squares
// of the quads it loads (norm_squares) and input_finish adds them over the workgroup
// (workgroup_total) after the loop. Quads past cols read as 0 (x's and g's padding are never
// used). Domain as rms_norm: the f32 sum of squares must be finite.

@group(0) @binding(X_BINDING) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(X_BINDING + 1u) var<storage, read> norm_weight: array<vec4<f32>>;
@group(0) @binding(X_BINDING + 2u) var<storage, read_write> y: array<f32>;
const INPUT_BINDINGS: u32 = 3u;   // x, g, y: a fused entry point's bindings follow (matvec_rope_kv.wgsl)

var<private> norm_squares: f32 = 0.0;   // this invocation's share of sum(x^2)

// x * g at quad q of row m; adds the quad's squares to norm_squares.
fn x_normed(m: u32, q: u32, quad: vec4<f32>) -> vec4<f32> {
    norm_squares += dot(quad, quad);
    return quad * norm_weight[q];
}

// Quad q (activations 4q .. 4q+3) of x * g, for quads wholly below cols.
fn x_full(m: u32, q: u32) -> vec4<f32> {
    return x_normed(m, q, x[m * (params.x_stride / 4u) + q]);
}

// x * g at k0 .. k0+3 of row m; lanes at k >= cols read as 0 (and add no square).
fn x_quad(m: u32, k0: u32) -> vec4<f32> {
    let q = min(k0, params.cols - 1u) / 4u;
    let quad = x[m * (params.x_stride / 4u) + q];
    if (k0 + 4u <= params.cols) {
        return x_normed(m, q, quad);
    }
    let k = vec4<u32>(k0) + vec4<u32>(0u, 1u, 2u, 3u);
    let inside = k < vec4<u32>(params.cols);
    return select(vec4<f32>(0.0), x_normed(m, q, select(vec4<f32>(0.0), quad, inside)), inside);
}

// quantize_x.wgsl: whether the row's header scale needs the whole row (1/rms needs every square of the row).
const INPUT_WHOLE_ROW: bool = true;

// quantize_x.wgsl UNIT_SQUARES: the squares of x (not x * g) added since the last call, then
// zeroed: one unit's, stored with its bytes, so that the mat-vec reading them adds the row's
// squares as it walks the units (matvec_input_int8.wgsl ROW_NORM) and no pass reads the whole row.
fn take_squares() -> f32 {
    let squares = norm_squares;
    norm_squares = 0.0;
    return squares;
}

// After the loop: 1 / sqrt(mean(x^2) + eps) of the row, the same in every lane. Uniform
// control flow (workgroup_total has barriers). Clears this lane's squares: an entry point that
// runs row_block twice (matvec_rope_kv.wgsl) starts the second block's row from zero.
fn input_finish(lane: u32, m: u32) -> f32 {
    let total = workgroup_total(norm_squares, lane);
    norm_squares = 0.0;
    return inverseSqrt(total / f32(params.cols) + bitcast<f32>(params.aux));
}

fn scaled(total: f32, scale: f32) -> f32 {
    return total * scale;
}
