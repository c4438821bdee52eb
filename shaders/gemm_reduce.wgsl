// Split K's second launch (kernels/gemm_split.py): the prefill GEMM ran with KPARTS
// workgroups a tile, each writing the partial sums of its run of K steps; this adds them:
//
//   Y[m][n] = sum over p of P[p][m][n]       (ACCUMULATE: Y[m][n] += that sum)
//
//   P  [KPARTS][M][N4] f32, read as vec4 (N4 = N rounded up to 4; lanes past N are ignored),
//      bound where the GEMM binds x (binding 1: gemm_sections.wgsl's `x`)
//   y  up to three column sections, each [M][stride] at its own offset (`out_index`)
//
// It reads the GEMM's own params block (the same slot): M, N and the sections. The params,
// bindings 0..2, ACCUMULATE and the store (`store_quad`) are gemm_sections.wgsl's. The parts are
// added in part order, one rounding each: the GEMM's error bound (gamma(K) sum |terms|, any
// order of the same additions) still holds. One invocation per 4 columns of a row.

override KPARTS: u32 = 2u;           // Allowlist 2, 4, 8
override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let quads = (params.n + 3u) / 4u;
    let id = (group.x + group.y * groups.x) * WG + lane;
    if (id >= params.m * quads) {
        return;
    }
    let m = id / quads;
    let q = id % quads;
    var sum = x[m * quads + q];   // x: the partial sums P
    for (var p = 1u; p < KPARTS; p++) {
        sum += x[(p * params.m + m) * quads + q];
    }
    store_quad(m, 4u * q, sum);
}
