// A unit's words into `xq` at vec4 index `at`, in the layout matvec_input_int8.wgsl reads: even
// and odd byte words, (d, sum of x, `squares`: the sum of the unit's x squared where a norm in the
// mat-vec adds them, quantize_x UNIT_SQUARES, else 0), and with RESIDUAL the residual words. For the kernels that
// write quantized activations (quantize_x.wgsl, attention_decode_xq.wgsl), which declare `xq`
// and RESIDUAL.
fn store_unit_at(at: u32, unit: UnitX, squares: f32) {
    xq[at] = unit.even;
    xq[at + 1u] = unit.odd;
    xq[at + 2u] = vec4<u32>(bitcast<u32>(unit.scale), bitcast<u32>(unit.total), bitcast<u32>(squares), 0u);
    if (RESIDUAL) {
        xq[at + 3u] = unit.even_r;
        xq[at + 4u] = unit.odd_r;
    }
}
