// x *= scale, in place, over a whole activation (py/webslm/kernels/scale.py): Gemma 3's
// embedding rows times sqrt(hidden), as the CPU path's `x * embedding_scale` (one f32
// multiply per element, so the result is exact: the same rounding as numpy's f32 product).
// One invocation per vec4 (the host requires a multiple of 4 elements); no barriers, so
// invocations past the end return.

override WG: u32 = 64u;   // 64, 128 or 256 (registry allowlist)

struct Params {
    quads: u32,     // elements / 4
    scale: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn scale_rows(@builtin(workgroup_id) group: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>,
              @builtin(local_invocation_index) lane: u32) {
    let i = (group.x + group.y * groups.x) * WG + lane;
    if (i < params.quads) {
        x[i] = x[i] * params.scale;
    }
}
