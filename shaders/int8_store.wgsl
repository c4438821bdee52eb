// A unit's words at vec4 index `at` of the quantized activations, in the layout
// matvec_input_int8.wgsl reads: even and odd byte words, (d, sum of x, `squares`: the sum of the
// unit's x squared where a norm in the mat-vec adds them, quantize_x UNIT_SQUARES, else 0), and
// with RESIDUAL the residual words. For the kernels that write quantized activations
// (quantize_x.wgsl, attention_decode_xq.wgsl, matvec_quantize_out.wgsl), which declare RESIDUAL
// and `store_xq_word(at, word)`, the write into their own output binding.
fn store_unit_at(at: u32, unit: UnitX, squares: f32) {
    store_xq_word(at, unit.even);
    store_xq_word(at + 1u, unit.odd);
    store_xq_word(at + 2u, vec4<u32>(bitcast<u32>(unit.scale), bitcast<u32>(unit.total), bitcast<u32>(squares), 0u));
    if (RESIDUAL) {
        store_xq_word(at + 3u, unit.even_r);
        store_xq_word(at + 4u, unit.odd_r);
    }
}
