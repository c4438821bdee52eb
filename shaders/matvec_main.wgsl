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
// bindings (1 .. X_BINDING - 1), `UnitX`, `load_x(u, m)` (a unit of the activations in
// registers, masked past cols) and `row_dot(xu, u, row)`: unit u's contribution to one row.
// A reduction file provides `row_sums` and `workgroup_total` (workgroup memory or
// subgroups). An input file (matvec_input_{plain,norm,swiglu}.wgsl) provides the activation
// and output bindings (from X_BINDING on), `x_full(m, q)` and `x_quad(m, k0)` (a quad of the
// activations the weights multiply), `input_finish(lane)` (after the loop: 1, or the row's
// 1/rms from the squares of the quads the loop loaded) and `scaled(total, scale)`:
//   plain   y = W x                        x [M][x_stride]
//   norm    y = (W (x * g)) / rms(x)       x [M][x_stride], g [K] (read as vec4), eps = aux
//   swiglu  y = W (silu(h_gate) * h_up)    h [M][x_stride]: gate at 0.., up at aux.. (floats)
// ACCUMULATE adds y's previous value (y += ..., one more rounding).

override WG: u32 = 64u;      // invocations per workgroup; allowlist 32, 64, 128, 256
override ROWS: u32 = 4u;     // output rows per workgroup; allowlist 1, 2, 4, 8
override ACCUMULATE: bool = false;   // y += W x instead of y = W x (a residual add)

struct Params {
    rows: u32,       // N, output rows
    cols: u32,       // K, real elements per row
    blocks: u32,     // scale blocks per row (quantized encodings)
    units: u32,      // units per weight row
    row_words: u32,  // u32 words per weight row (f16 and f32 encodings)
    x_stride: u32,   // floats between activation rows; a multiple of 4
    y_stride: u32,   // floats between output rows
    aux: u32,        // input "norm": eps (f32 bits); "swiglu": floats from a row's gate to its up; else 0
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

    let scale = input_finish(lane);      // barriers inside: uniform control flow here
    let total = row_sums(rows_0_3, rows_4_7, lane);
    if (lane < ROWS && first_row + lane < params.rows) {
        let at = m * params.y_stride + first_row + lane;
        var value = scaled(total, scale);
        if (ACCUMULATE) {
            value = y[at] + value;
        }
        y[at] = value;
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
