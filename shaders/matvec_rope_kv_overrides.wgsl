// The overrides of matvec_rope_kv.wgsl, listed before every other file of its kernel but the
// enable directives (naga 29 panics on overrides declared after an override-sized workgroup
// array: matvec_quantize_out_overrides.wgsl).

override ADJACENT: u32 = 0u;    // 0: rotate-half, 1: adjacent-pair (rope.wgsl)
override KV_F16: bool = false;  // the caches hold two f16 a word (else f32 bits)
