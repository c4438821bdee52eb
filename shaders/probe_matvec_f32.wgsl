// y = W x for an f32 matrix: the GPU probe's reference mat-vec (kernels/probe.py).
//
//   W: [rows, cols] row-major f32     x: [cols] f32     y: [rows] f32
//
// One workgroup computes one output row. Its WG invocations stride over the row (any
// cols, odd tails included), then add their partial sums in a tree in workgroup memory.
// Rows are spread over a 2-D grid so that rows > maxComputeWorkgroupsPerDimension works;
// the host picks the grid, and workgroups past the last row exit before any barrier
// (the whole workgroup exits together, so barriers stay uniform).
//
// Accumulation is f32. The summation order differs from numpy's, so results match the
// oracle within a tolerance, not bit for bit.

override WG: u32 = 64u;   // allowlist in py/webslm/kernels/probe.py: 64, 128, 256

struct Params {
    rows: u32,
    cols: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let row = group.x + group.y * groups.x;
    if (row >= params.rows) {
        return;  // uniform for the workgroup: every lane has the same row
    }

    let row_start = row * params.cols;
    var sum = 0.0;
    for (var k = lane; k < params.cols; k += WG) {
        sum += w[row_start + k] * x[k];
    }
    partial[lane] = sum;
    workgroupBarrier();

    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            partial[lane] += partial[lane + stride];
        }
        workgroupBarrier();
    }
    if (lane == 0u) {
        y[row] = partial[0];
    }
}
