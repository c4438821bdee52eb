// A unit's words into `xq` at vec4 index `at`, in the layout matvec_input_int8.wgsl reads: even
// and odd byte words, (d, sum of x), and with RESIDUAL the residual words. For the kernels that
// write quantized activations (quantize_x.wgsl, attention_decode_xq.wgsl), which declare `xq`
// and RESIDUAL.
fn store_unit_at(at: u32, unit: UnitX) {
    xq[at] = unit.even;
    xq[at + 1u] = unit.odd;
    xq[at + 2u] = vec4<u32>(bitcast<u32>(unit.scale), bitcast<u32>(unit.total), 0u, 0u);
    if (RESIDUAL) {
        xq[at + 3u] = unit.even_r;
        xq[at + 4u] = unit.odd_r;
    }
}
