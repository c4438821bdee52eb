// RMSNorm over the rows of an activation matrix, as py/webslm/cpu/layers.py rms_norm computes it:
//
//   out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight
//
// Entry points (host side and golden tests: py/webslm/kernels/norm.py):
//   rms_norm           reads x, writes out.
//   rms_norm_residual  the residual stream x is updated in place first, x += delta, and out is
//                      the norm of the new x. The engine's "add the sub-layer's output to the
//                      residual, then normalize for the next sub-layer" becomes one kernel: x
//                      and delta are read, x and out written, with no separate add pass.
//   *_vec4             the same for D % 4 == 0 through vec4 loads and stores: a quarter of the
//                      loop trips. At decode (T = 1) one workgroup walks the whole row and each
//                      trip waits for its load, so trips, not bytes, set the time. The vec4
//                      entry points declare their buffers as arrays of vec4 at the same
//                      bindings; each entry point uses only one set, which WGSL allows (a
//                      binding must be unique within one entry point's resource interface).
//
// One workgroup per row (token). Its WG invocations stride over the row, so any D works: odd
// D, D = 1, D smaller than the workgroup (idle lanes contribute 0 to the sum). The sum of
// squares is accumulated in f32 per lane, then added in a tree in workgroup memory. Rows are
// spread over a 2-D grid by the host (T may exceed maxComputeWorkgroupsPerDimension); a
// workgroup past the last row exits as a whole before any barrier, so every
// workgroupBarrier is reached by all of its invocations or by none.
//
// The second loop re-reads the row instead of holding it in registers: a row is at most a
// few KiB, so the re-read comes from cache, and the kernel stays correct for any D without a
// fixed per-lane array. rms_norm_residual recomputes x + delta in the second loop (the same
// f32 add, so the same value) and only then writes x: no invocation reads what it wrote,
// which would stall each trip on the write. Element k belongs to lane k % WG in both loops,
// so no lane reads an element another lane writes.
//
// Domain: the f32 sum of squares of a row must be finite (|x| up to ~1e18 for D = 4096);
// beyond it the result is 0 (x / inf), as in the numpy reference.

override WG: u32 = 64u;   // 64, 128 or 256 (registry allowlist); a power of two for the tree

struct Params {
    tokens: u32,   // T: rows
    dim: u32,      // D: elements per row
    eps: f32,      // added to the mean square (the model's norm_eps, as f32)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weight: array<f32>;           // [D]
// rms_norm: x [T, D] (the activations); rms_norm_residual: delta [T, D] (added into x).
@group(0) @binding(2) var<storage, read> rows_in: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;        // [T, D]
@group(0) @binding(4) var<storage, read_write> residual: array<f32>;   // [T, D], rms_norm_residual only
// The same buffers seen as vec4 by the *_vec4 entry points (D % 4 == 0): [D/4], [T, D/4], ...
@group(0) @binding(1) var<storage, read> weight4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> rows_in4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> residual4: array<vec4<f32>>;

var<workgroup> partial: array<f32, WG>;

// The sum of every lane's `value`, returned to every lane. Call once per workgroup, from
// uniform control flow (it contains barriers).
fn workgroup_sum(lane: u32, value: f32) -> f32 {
    partial[lane] = value;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            partial[lane] += partial[lane + stride];
        }
        workgroupBarrier();
    }
    return partial[0];
}

// sqrt(mean square + eps): the divisor of the row, written as the reference writes it.
fn rms(sum_of_squares: f32) -> f32 {
    return sqrt(sum_of_squares / f32(params.dim) + params.eps);
}

// The row of this workgroup on the host's 2-D grid. A workgroup with row >= params.tokens
// must leave at once: the same for every invocation, so barriers stay uniform.
fn workgroup_row(group: vec3<u32>, groups: vec3<u32>) -> u32 {
    return group.x + group.y * groups.x;
}

// rms_norm_residual's new residual stream at element i: x + delta, one f32 add. Both loops
// call it, so the value normalized is the value written back (see the header).
fn stream(i: u32) -> f32 {
    return residual[i] + rows_in[i];
}

fn stream4(i: u32) -> vec4<f32> {
    return residual4[i] + rows_in4[i];
}

@compute @workgroup_size(WG)
fn rms_norm(@builtin(workgroup_id) group: vec3<u32>,
            @builtin(num_workgroups) groups: vec3<u32>,
            @builtin(local_invocation_index) lane: u32) {
    let row = workgroup_row(group, groups);
    if (row >= params.tokens) {
        return;
    }
    let start = row * params.dim;
    var squares = 0.0;
    for (var k = lane; k < params.dim; k += WG) {
        let v = rows_in[start + k];
        squares += v * v;
    }
    let divisor = rms(workgroup_sum(lane, squares));
    for (var k = lane; k < params.dim; k += WG) {
        out[start + k] = rows_in[start + k] / divisor * weight[k];
    }
}

@compute @workgroup_size(WG)
fn rms_norm_residual(@builtin(workgroup_id) group: vec3<u32>,
                     @builtin(num_workgroups) groups: vec3<u32>,
                     @builtin(local_invocation_index) lane: u32) {
    let row = workgroup_row(group, groups);
    if (row >= params.tokens) {
        return;
    }
    let start = row * params.dim;
    var squares = 0.0;
    for (var k = lane; k < params.dim; k += WG) {
        let v = stream(start + k);
        squares += v * v;
    }
    let divisor = rms(workgroup_sum(lane, squares));
    for (var k = lane; k < params.dim; k += WG) {
        let v = stream(start + k);
        residual[start + k] = v;
        out[start + k] = v / divisor * weight[k];
    }
}

@compute @workgroup_size(WG)
fn rms_norm_vec4(@builtin(workgroup_id) group: vec3<u32>,
                 @builtin(num_workgroups) groups: vec3<u32>,
                 @builtin(local_invocation_index) lane: u32) {
    let row = workgroup_row(group, groups);
    if (row >= params.tokens) {
        return;
    }
    let quads = params.dim / 4u;
    let start = row * quads;
    var squares = 0.0;
    for (var k = lane; k < quads; k += WG) {
        let v = rows_in4[start + k];
        squares += dot(v, v);
    }
    let divisor = rms(workgroup_sum(lane, squares));
    for (var k = lane; k < quads; k += WG) {
        out4[start + k] = rows_in4[start + k] / divisor * weight4[k];
    }
}

@compute @workgroup_size(WG)
fn rms_norm_residual_vec4(@builtin(workgroup_id) group: vec3<u32>,
                          @builtin(num_workgroups) groups: vec3<u32>,
                          @builtin(local_invocation_index) lane: u32) {
    let row = workgroup_row(group, groups);
    if (row >= params.tokens) {
        return;
    }
    let quads = params.dim / 4u;
    let start = row * quads;
    var squares = 0.0;
    for (var k = lane; k < quads; k += WG) {
        let v = stream4(start + k);
        squares += dot(v, v);
    }
    let divisor = rms(workgroup_sum(lane, squares));
    for (var k = lane; k < quads; k += WG) {
        let v = stream4(start + k);
        residual4[start + k] = v;
        out4[start + k] = v / divisor * weight4[k];
    }
}
