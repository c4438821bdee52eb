// Mat-vec input "int8" (INPUT = 3, q4 packed-dot only): the activations were quantized once,
// before this mat-vec, by quantize_x.wgsl (in the input mode the op has: plain, norm or
// swiglu), instead of by every workgroup. Every workgroup of a mat-vec reads the whole x,
// so quantizing it there costs as much as the rest of the arithmetic; measured on the H200
// (bench/matvec_ceiling.py) reading bytes prepared once halves the mat-vec's time.
//
//   xq [M][1 + 3 units] vec4<u32> (RESIDUAL: [M][1 + 5 units]): per row a header (x: the
//      row's output scale as f32 bits: 1/rms for the norm mode, else 1; unused with ROW_NORM),
//      then per unit its even and odd byte words, (d, sum of x, sum of x^2 with ROW_NORM, else
//      0) as f32 bits (int8_pack.wgsl, int8_store.wgsl) and, with RESIDUAL, the even and odd
//      words of the residual bytes
//   y  [M][y_stride] f32 (ACCUMULATE: read, then written)
//
// ROW_NORM (the op's mode was norm, its quantizer quantize_x UNIT_SQUARES): y = (W (x * g)) /
// rms(x), rms(x) = sqrt(mean(x^2) + eps), eps = params.aux, from the squares each unit carries
// (the z of its third word) instead of the header: the loop loads every unit of the row exactly
// once (each by one invocation), so each invocation adds the squares of the units it loads and
// input_finish adds them over the workgroup, as matvec_input_norm.wgsl does with its quads'.

override ROW_NORM: bool = false;

@group(0) @binding(X_BINDING) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(X_BINDING + 1u) var<storage, read_write> y: array<f32>;
const INPUT_BINDINGS: u32 = 2u;   // xq, y: a fused entry point's bindings follow (matvec_rope_kv.wgsl)

var<private> row_squares: f32 = 0.0;   // ROW_NORM: this invocation's share of sum(x^2)

fn load_x(u: u32, m: u32) -> UnitX {
    let words = xq_unit_words();
    let at = m * (1u + words * params.units) + 1u + words * u;
    let sums = xq[at + 2u];
    if (ROW_NORM) {
        row_squares += bitcast<f32>(sums.z);
    }
    var unit = UnitX(xq[at], xq[at + 1u], vec4<u32>(0u), vec4<u32>(0u), bitcast<f32>(sums.x), bitcast<f32>(sums.y));
    if (RESIDUAL) {
        unit.even_r = xq[at + 3u];
        unit.odd_r = xq[at + 4u];
    }
    return unit;
}

// The row's output scale, the same in every lane: from its header, or with ROW_NORM
// 1 / sqrt(mean(x^2) + eps) from the units' squares. Uniform control flow (workgroup_total has
// barriers; ROW_NORM is a pipeline constant).
fn input_finish(lane: u32, m: u32) -> f32 {
    if (ROW_NORM) {
        let total = workgroup_total(row_squares, lane);
        row_squares = 0.0;          // a workgroup with several blocks of rows (matvec_quantize_out.wgsl) walks x again
        return inverseSqrt(total / f32(params.cols) + bitcast<f32>(params.aux));
    }
    return bitcast<f32>(xq[m * (1u + xq_unit_words() * params.units)].x);
}

fn scaled(total: f32, scale: f32) -> f32 {
    return total * scale;
}
