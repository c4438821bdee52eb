// Row sums for the decode mat-vec kernels through workgroup memory (every tier).
//
// Every invocation of a mat-vec workgroup holds partial sums for the same ROWS rows. Here
// they are added in a tree: log2(WG) steps, each behind a barrier that every invocation
// reaches. Afterwards invocation r < ROWS returns row r's sum.

var<workgroup> row_partials: array<f32, ROWS * WG>;   // [ROWS <= 16][WG]

fn row_sums(sums: Partials, lane: u32) -> f32 {
    for (var r = 0u; r < ROWS; r++) {
        row_partials[r * WG + lane] = row_partial(sums, r);
    }
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            for (var r = 0u; r < ROWS; r++) {
                row_partials[r * WG + lane] += row_partials[r * WG + lane + stride];
            }
        }
        workgroupBarrier();
    }
    return row_partials[min(lane, ROWS - 1u) * WG];
}

// The sum of every lane's `value`, returned to every lane (the RMSNorm input's sum of
// squares, matvec_input_norm.wgsl), through its own array of constant size (the largest
// WG), not WG: naga 29 orders declarations by first use and panics on an override (the
// encoding's BLOCK, ...) first used after an override-sized workgroup array, which a call
// before the main loop would cause. Call from uniform control flow.
var<workgroup> total_partials: array<f32, 256>;   // [WG <= 256]

fn workgroup_total(value: f32, lane: u32) -> f32 {
    total_partials[lane] = value;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            total_partials[lane] += total_partials[lane + stride];
        }
        workgroupBarrier();
    }
    return total_partials[0];
}
