// Decode mat-vec, the part shared by every weight encoding: y[m] = W x[m] for a few
// activation rows m (grid z), f32 accumulation.
//
// Work split: a workgroup owns ROWS consecutive output rows; its WG invocations stride
// over the row's "units" together (a unit is a run of weights one load brings in: 32 q4
// codes, 16 q8 codes, 8 f16 or 4 f32 values), each invocation accumulating all ROWS rows.
// So each unit of x is loaded once into registers and reused for ROWS rows, adjacent
// invocations read adjacent weights (coalesced), and an invocation never mixes partial
// sums of different row sets -- which is what lets the subgroup reduction be correct for
// any subgroup layout (matvec_reduce_subgroup.wgsl).
//
// The encoding file (matvec_q4.wgsl, ...) concatenated with this one provides the weight
// bindings, `x`, `y`, and `unit_dot(u, m, first_row)`: unit u's contribution to each of
// the ROWS rows. A reduction file provides `row_sums` (workgroup memory or subgroups).

override WG: u32 = 128u;     // invocations per workgroup; allowlist 64, 128, 256
override ROWS: u32 = 4u;     // output rows per workgroup; allowlist 1, 2, 4

struct Params {
    rows: u32,       // N, output rows
    cols: u32,       // K, real elements per row
    blocks: u32,     // scale blocks per row (quantized encodings)
    units: u32,      // units per weight row
    row_words: u32,  // u32 words per weight row (f16 and f32 encodings)
    x_stride: u32,   // floats between activation rows; a multiple of 4
    y_stride: u32,   // floats between output rows
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let first_row = (group.x + group.y * groups.x) * ROWS;
    if (first_row >= params.rows) {
        return;  // the whole workgroup leaves together: the barriers in row_sums stay uniform
    }
    let m = group.z;

    var acc = vec4<f32>(0.0);
    for (var u = lane; u < params.units; u += WG) {
        acc += unit_dot(u, m, first_row);
    }

    let total = row_sums(acc, lane);
    if (lane < ROWS && first_row + lane < params.rows) {
        y[m * params.y_stride + first_row + lane] = total;
    }
}

// Activations k0 .. k0 + 4n of row m as n vec4s; lanes at k >= cols read as 0, so that
// the padding of a last partial block contributes nothing (for q4 "min" a zero code still
// decodes to `min`, so masking the weights alone would not do).
fn x_quad(m: u32, k0: u32) -> vec4<f32> {
    let k = vec4<u32>(k0) + vec4<u32>(0u, 1u, 2u, 3u);
    let quad = min(k0, params.cols - 1u) / 4u;
    return select(vec4<f32>(0.0), x[m * (params.x_stride / 4u) + quad], k < vec4<u32>(params.cols));
}
