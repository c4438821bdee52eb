// Decode mat-vec, the part shared by every weight encoding: y[m] = W x[m] for a few
// activation rows m (grid z), f32 accumulation.
//
// Work split: a workgroup owns ROWS consecutive output rows; its WG invocations stride
// over the row's "units" together (a unit is a run of weights one 16-byte load brings in:
// 32 q4 codes, 16 q8 codes; 8 f16 or 4 f32 values), each invocation accumulating all ROWS
// rows. So each unit of x is loaded (and, for the int8 variants, quantized) once into
// registers and reused for ROWS rows, adjacent invocations read adjacent weights
// (coalesced), and an invocation never mixes partial sums of different row sets -- which
// lets the subgroup reduction be correct for any subgroup layout
// (matvec_reduce_subgroup.wgsl). The host picks WG so that each invocation gets a few
// units: the reduction after the loop costs about as much as a few units.
//
// Bytes in flight: the ROWS rows of a unit are read unconditionally, the row index clamped
// to the last row (`unit_dot`), so the ROWS 16-byte loads of an iteration are independent
// and the compiler issues them together. A guard per row (as this file had before) puts
// each load behind a branch, and the loads then run one after the other. Rows past the
// last one repeat the last row's work; their sums are never stored.
//
// The encoding file (matvec_q4.wgsl, ...) concatenated with this one provides the weight
// bindings (1 .. X_BINDING - 1), `UnitX`, `load_x(u, m)` (a unit of the activations in
// registers, masked past cols) and `row_dot(xu, u, row)`: unit u's contribution to one row.
// A reduction file provides `row_sums` and `workgroup_total` (workgroup memory or
// subgroups). An input file (matvec_input_{plain,norm,swiglu}.wgsl) provides the activation
// and output bindings (from X_BINDING on), `x_full(m, q)` and `x_quad(m, k0)` (a quad of the
// activations the weights multiply), `input_finish(lane, m)` (after the loop: 1, or the row's
// 1/rms from the squares of the quads the loop loaded) and `scaled(total, scale)`:
//   plain   y = W x                        x [M][x_stride]
//   norm    y = (W (x * g)) / rms(x)       x [M][x_stride], g [K] (read as vec4), eps = aux
//   swiglu  y = W (silu(h_gate) * h_up)    h [M][x_stride]: gate at 0.., up at aux.. (floats)
// ACCUMULATE adds y's previous value (y += ..., one more rounding). The uniform block, Params,
// is matvec_params.wgsl (shared with quantize_x.wgsl, which reads the same block).

override WG: u32 = 64u;      // invocations per workgroup; allowlist 32, 64, 128, 256
override ROWS: u32 = 4u;     // output rows per workgroup; allowlist 1, 2, 4, 8, 16
override ACCUMULATE: bool = false;   // y += W x instead of y = W x (a residual add)

// One invocation's partial sums of the workgroup's rows 0..15 (rows >= ROWS stay 0).
struct Partials {
    rows_0_3: vec4<f32>,
    rows_4_7: vec4<f32>,
    rows_8_11: vec4<f32>,
    rows_12_15: vec4<f32>,
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let first_row = (group.x + group.y * groups.x) * ROWS;
    if (first_row >= params.rows) {
        return;  // the whole workgroup leaves together: the barriers in row_sums stay uniform
    }
    row_block(first_row, group.z, lane);
}

// Rows first_row .. first_row + ROWS - 1 of activation row m: every lane walks its units,
// then the rows are summed over the workgroup and lane r < ROWS stores row r. Returns the
// value stored, in lanes r < ROWS whose row exists (else 0). Called in uniform control flow
// (barriers inside); matvec_quantize_out.wgsl calls it once per block of a unit's rows.
fn row_block(first_row: u32, m: u32, lane: u32) -> f32 {
    var sums = Partials(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var u = lane; u < params.units; u += WG) {
        let xu = load_x(u, m);
        sums.rows_0_3 += unit_dot(xu, u, first_row);
        if (ROWS > 4u) {
            sums.rows_4_7 += unit_dot(xu, u, first_row + 4u);
        }
        if (ROWS > 8u) {
            sums.rows_8_11 += unit_dot(xu, u, first_row + 8u);
            sums.rows_12_15 += unit_dot(xu, u, first_row + 12u);
        }
    }

    let scale = input_finish(lane, m);      // barriers inside: uniform control flow here
    let total = row_sums(sums, lane);
    var value = 0.0;
    if (lane < ROWS && first_row + lane < params.rows) {
        let at = m * params.y_stride + first_row + lane;
        value = scaled(total, scale);
        if (ACCUMULATE) {
            value = y[at] + value;
        }
        y[at] = value;
    }
    return value;
}

// Row r's partial sum (r < 16), r a constant after unrolling or a loop index below ROWS.
fn row_partial(sums: Partials, r: u32) -> f32 {
    if (r < 4u) {
        return sums.rows_0_3[r];
    }
    if (r < 8u) {
        return sums.rows_4_7[r - 4u];
    }
    if (r < 12u) {
        return sums.rows_8_11[r - 8u];
    }
    return sums.rows_12_15[r - 12u];
}

// Unit u's contribution to rows first .. first+3 (to `first` alone when ROWS = 1, to two
// rows when ROWS = 2). Every row index is clamped to the last row, so no load sits behind a
// branch (see the file comment); ROWS is a constant, so the `if`s fold away. Spelled out
// rather than looped: a loop with a runtime bound that indexes a vector can put the vector
// in local memory (on the H200 this form was 3-12% faster).
fn unit_dot(xu: UnitX, u: u32, first: u32) -> vec4<f32> {
    let last = params.rows - 1u;
    var out = vec4<f32>(0.0);
    out.x = row_dot(xu, u, min(first, last));
    if (ROWS > 1u) {
        out.y = row_dot(xu, u, min(first + 1u, last));
    }
    if (ROWS > 2u) {
        out.z = row_dot(xu, u, min(first + 2u, last));
        out.w = row_dot(xu, u, min(first + 3u, last));
    }
    return out;
}
