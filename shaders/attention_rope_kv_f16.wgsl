// Prelude of attention_decode_rope.wgsl for an f16 KV cache: listed in the registry's `sources`
// after f16_round.wgsl. The cache is bound read_write as u32 words, two halves per word
// (element 2w in the low half, as rope_kv_append and kv_append write it), one vec2<u32> per 4
// elements. No shader-f16: halves are written by f16_bits (round to nearest even in integer
// arithmetic, exactly rope_kv_append_f16's rounding) and read by unpack2x16float (exact).
alias kv_words = vec2<u32>;

// The f32 values of 4 cached halves (exact: every f16 is an f32).
fn kv_widen(w: kv_words) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

// The cache words of 4 elements given as f32 bits: each rounded to the nearest f16, ties to even.
fn kv_narrow(bits: vec4<u32>) -> kv_words {
    return vec2<u32>(f16_bits(bits.x) | (f16_bits(bits.y) << 16u),
                     f16_bits(bits.z) | (f16_bits(bits.w) << 16u));
}
