// Decode mat-vec, the part shared by every weight encoding: y[m] = W x[m] for a few
// activation rows m (grid z), f32 accumulation.
//
// Work split: a workgroup owns ROWS consecutive output rows; its WG invocations stride
// over the row's "units" together (a unit is a run of weights one 16-byte load brings in:
// 32 q4 codes, 16 q8 codes; 8 f16 or 4 f32 values), each invocation accumulating all ROWS
// rows. So each unit of x is loaded once into registers and reused for ROWS rows, adjacent
// invocations read adjacent weights (coalesced), and an invocation never mixes partial sums
// of different row sets -- which lets the subgroup reduction be correct for any subgroup
// layout (matvec_reduce_subgroup.wgsl). The host picks WG so that each invocation gets
// several units: the reduction after the loop costs about as much as a few units.
//
// The encoding file (matvec_q4.wgsl, ...) concatenated with this one provides the weight
// bindings, `x`, `y`, `UnitX`, `load_x(u, m)` (a unit of x in registers, masked past cols)
// and `row_dot(xu, u, row)`: unit u's contribution to one row. A reduction
// file provides `row_sums` (workgroup memory or subgroups).

override WG: u32 = 64u;      // invocations per workgroup; allowlist 32, 64, 128, 256
override ROWS: u32 = 4u;     // output rows per workgroup; allowlist 1, 2, 4, 8

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

    var rows_0_3 = vec4<f32>(0.0);
    var rows_4_7 = vec4<f32>(0.0);
    for (var u = lane; u < params.units; u += WG) {
        let xu = load_x(u, m);
        rows_0_3 += unit_dot(xu, u, first_row, first_row);
        if (ROWS > 4u) {
            rows_4_7 += unit_dot(xu, u, first_row + 4u, first_row);
        }
    }

    let total = row_sums(rows_0_3, rows_4_7, lane);
    if (lane < ROWS && first_row + lane < params.rows) {
        y[m * params.y_stride + first_row + lane] = total;
    }
}

// Row r's partial sum out of the two accumulators.
fn row_partial(rows_0_3: vec4<f32>, rows_4_7: vec4<f32>, r: u32) -> f32 {
    if (r < 4u) {
        return rows_0_3[r];
    }
    return rows_4_7[r - 4u];
}

// Unit u's contribution to rows first .. first+3 (0 for rows outside the workgroup).
fn unit_dot(xu: UnitX, u: u32, first: u32, group_first: u32) -> vec4<f32> {
    var out = vec4<f32>(0.0);
    if (row_in_group(first, 0u, group_first)) { out.x = row_dot(xu, u, first); }
    if (row_in_group(first, 1u, group_first)) { out.y = row_dot(xu, u, first + 1u); }
    if (row_in_group(first, 2u, group_first)) { out.z = row_dot(xu, u, first + 2u); }
    if (row_in_group(first, 3u, group_first)) { out.w = row_dot(xu, u, first + 3u); }
    return out;
}

// Whether row `first + r` (r < 4) belongs to this workgroup and exists. Callers spell out
// r = 0..3 as constants rather than looping: a loop with a runtime bound that indexes a
// vector can put the vector in local memory (on the H200 this form was 3-12% faster).
fn row_in_group(first: u32, r: u32, group_first: u32) -> bool {
    return (first - group_first) + r < ROWS && first + r < params.rows;
}

// Activations k0 .. k0+3 of row m; lanes at k >= cols read as 0, so that the padding of a
// last partial block contributes nothing (for q4 "min" a zero code still decodes to `min`,
// so masking the weights alone would not do).
fn x_quad(m: u32, k0: u32) -> vec4<f32> {
    let quad = x[m * (params.x_stride / 4u) + min(k0, params.cols - 1u) / 4u];
    if (k0 + 4u <= params.cols) {
        return quad;
    }
    let k = vec4<u32>(k0) + vec4<u32>(0u, 1u, 2u, 3u);
    return select(vec4<f32>(0.0), quad, k < vec4<u32>(params.cols));
}
