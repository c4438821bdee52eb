// Prelude of attention_decode_rope.wgsl for an f32 KV cache: listed first in the registry's
// `sources`. The cache is bound read_write as u32 words (so the appended row keeps the exact
// bits rope_kv_append writes), one vec4<u32> per 4 elements.
alias kv_words = vec4<u32>;

// The f32 values of 4 cached elements (the bits as stored).
fn kv_widen(w: kv_words) -> vec4<f32> {
    return bitcast<vec4<f32>>(w);
}

// The cache words of 4 elements given as f32 bits: stored as they are.
fn kv_narrow(bits: vec4<u32>) -> kv_words {
    return bits;
}
