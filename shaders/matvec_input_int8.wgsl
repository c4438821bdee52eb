// Mat-vec input "int8" (INPUT = 3, q4 packed-dot only): the activations were quantized once,
// before this mat-vec, by quantize_x.wgsl (in the input mode the op has: plain, norm or
// swiglu), instead of by every workgroup. Every workgroup of a mat-vec reads the whole x,
// so quantizing it there costs as much as the rest of the arithmetic; measured on the H200
// (bench/matvec_ceiling.py) reading bytes prepared once halves the mat-vec's time.
//
//   xq [M][1 + 3 units] vec4<u32> (RESIDUAL: [M][1 + 5 units]): per row a header (x: the
//      row's output scale as f32 bits: 1/rms for the norm mode, else 1), then per unit its
//      even and odd byte words, (d, sum of x) as f32 bits (int8_pack.wgsl) and, with
//      RESIDUAL, the even and odd words of the residual bytes
//   y  [M][y_stride] f32 (ACCUMULATE: read, then written)

@group(0) @binding(X_BINDING) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(X_BINDING + 1u) var<storage, read_write> y: array<f32>;

fn load_x(u: u32, m: u32) -> UnitX {
    let words = xq_unit_words();
    let at = m * (1u + words * params.units) + 1u + words * u;
    let sums = xq[at + 2u];
    var unit = UnitX(xq[at], xq[at + 1u], vec4<u32>(0u), vec4<u32>(0u), bitcast<f32>(sums.x), bitcast<f32>(sums.y));
    if (RESIDUAL) {
        unit.even_r = xq[at + 3u];
        unit.odd_r = xq[at + 4u];
    }
    return unit;
}

// The row's output scale, from its header (the same in every lane).
fn input_finish(lane: u32, m: u32) -> f32 {
    return bitcast<f32>(xq[m * (1u + xq_unit_words() * params.units)].x);
}

fn scaled(total: f32, scale: f32) -> f32 {
    return total * scale;
}
