// The q4 packed-dot mat-vec's activations quantized in the mat-vec itself (matvec_q4_dot4.wgsl,
// input modes plain, norm, swiglu): each workgroup quantizes the units its lanes walk, once,
// and uses them for its ROWS rows.

fn load_x(u: u32, m: u32) -> UnitX {
    return quantize_unit(unit_quads(u, m), false);
}
