// Mat-vec input "int8" (INPUT = 3, q4 packed-dot only): the activations were quantized once,
// before this mat-vec, by quantize_x.wgsl (in the input mode the op has: plain, norm or
// swiglu), instead of by every workgroup. Every workgroup of a mat-vec reads the whole x,
// so quantizing it there costs as much as the rest of the arithmetic; measured on the H200
// (bench/matvec_ceiling.py) reading bytes prepared once halves the mat-vec's time.
//
//   xq [M][3 units] vec4<u32> (RESIDUAL: [M][5 units]): per unit its even and odd byte words,
//      (d, sum of the unit's activations, sum of the squares of its x for the norm mode, 0) as
//      f32 bits (int8_pack.wgsl, quantize_x.wgsl) and, with RESIDUAL, the even and odd words of
//      the residual bytes
//   y  [M][y_stride] f32 (ACCUMULATE: read, then written)
//
// ROW_NORM (the op's mode was norm): y = (W (x * g)) / rms(x), rms(x) = sqrt(mean(x^2) + eps),
// eps = params.aux. The loop loads every unit of the row exactly once (each by one invocation),
// so each invocation adds the squares stored with the units it loads and input_finish adds
// them over the workgroup, as matvec_input_norm.wgsl does with the squares of its quads.

override ROW_NORM: bool = false;

@group(0) @binding(X_BINDING) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(X_BINDING + 1u) var<storage, read_write> y: array<f32>;

var<private> row_squares: f32 = 0.0;   // ROW_NORM: this invocation's share of sum(x^2)

fn load_x(u: u32, m: u32) -> UnitX {
    let at = xq_unit_words() * (m * params.units + u);
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

// After the loop: ROW_NORM's 1 / sqrt(mean(x^2) + eps), the same in every lane, else 1.
// Uniform control flow (workgroup_total has barriers; ROW_NORM is a pipeline constant).
fn input_finish(lane: u32, m: u32) -> f32 {
    if (ROW_NORM) {
        let total = workgroup_total(row_squares, lane);
        return inverseSqrt(total / f32(params.cols) + bitcast<f32>(params.aux));
    }
    return 1.0;
}

fn scaled(total: f32, scale: f32) -> f32 {
    return total * scale;
}
