// Prelude of the attention kernels for an f16 KV cache (tier B, device feature shader-f16):
// listed in the registry's `sources` after enable_f16.wgsl (`enable` must open the module).
// Cache rows are read as vec4<f16> (one 8-byte load per 4 elements) and widened exactly to
// f32 with vec4<f32>(...); all arithmetic stays f32.
alias kv4 = vec4<f16>;
