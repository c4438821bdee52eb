// Row sums for the decode mat-vec kernels through workgroup memory (every tier).
//
// Every invocation of a mat-vec workgroup holds partial sums for the same ROWS rows (one
// per component of `acc`). Here they are added in a tree: log2(WG) steps, each behind a
// barrier that every invocation reaches. Afterwards invocation r < ROWS returns row r's sum.

var<workgroup> row_partials: array<f32, 4 * WG>;   // [ROWS <= 4][WG]

fn row_sums(acc: vec4<f32>, lane: u32) -> f32 {
    for (var r = 0u; r < ROWS; r++) {
        row_partials[r * WG + lane] = acc[r];
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
