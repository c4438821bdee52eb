// Prelude of the attention kernels for an f32 KV cache (tier A): listed first in the
// registry's `sources`. The kernels read cache rows as `kv4` and widen them with
// vec4<f32>(...), which is the identity here.
alias kv4 = vec4<f32>;
