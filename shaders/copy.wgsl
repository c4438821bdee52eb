// dst = src, 16 bytes per invocation and step: the bandwidth roofline for the benchmarks.
//
// A kernel that only reads (a mat-vec) cannot beat a copy that reads and writes the same
// number of bytes in total, so bench/kernels.py measures this kernel in the same run and
// quotes every kernel's bandwidth as a ratio to it.
//
//   src [n] vec4<u32>     dst [n] vec4<u32>

override WG: u32 = 256u;   // allowlist: 64, 128, 256

struct Params {
    n: u32,        // vec4 elements
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) id: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {
    let stride = groups.x * WG;
    for (var i = id.x; i < params.n; i += stride) {
        dst[i] = src[i];
    }
}
