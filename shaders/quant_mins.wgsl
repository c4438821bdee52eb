// The mins of q4 "min" (docs/slm-format.md), stored like the scales: listed after
// quant_scales.wgsl by the kernels that declare the binding `mins: array<u32>` (q4, and
// embed.wgsl, which declares every encoding's bindings).

// Element `index` of the mins.
fn min_at(index: u32) -> f32 {
    return scale_value(mins[scale_word(index)], index);
}
