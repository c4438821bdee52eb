// Split K's second launch (kernels/gemm_split.py): the prefill GEMM ran with KPARTS
// workgroups a tile, each writing the partial sums of its run of K steps; this adds them:
//
//   Y[m][n] = sum over p of P[p][m][n]       (ACCUMULATE: Y[m][n] += that sum)
//
//   P  [KPARTS][M][N4] f32, read as vec4 (N4 = N rounded up to 4; lanes past N are ignored)
//   y  up to three column sections, each [M][stride] at its own offset (`out_index`)
//
// It reads the GEMM's own params block (the same slot): M, N and the sections. The parts are
// added in part order, one rounding each: the GEMM's error bound (gamma(K) sum |terms|, any
// order of the same additions) still holds. One invocation per 4 columns of a row.

override KPARTS: u32 = 2u;           // Allowlist 2, 4, 8
override ACCUMULATE: bool = false;   // Y += the sum instead of Y = the sum
override WG: u32 = 256u;

struct Params {
    m: u32,          // M, activation rows
    n: u32,          // N, output columns
    k: u32,
    x_stride: u32,
    y_stride: u32,   // floats between output rows of section 0
    tiles_m: u32,
    tiles: u32,
    split1: u32,     // first column of section 1 (N when there is one section)
    split2: u32,     // first column of section 2 (N when there are at most two)
    base1: u32,      // float offset of section 1's first element in y
    base2: u32,
    stride1: u32,    // floats between output rows of section 1
    stride2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> partials: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

fn out_index(m: u32, n: u32) -> u32 {
    if (n >= params.split2) {
        return params.base2 + m * params.stride2 + (n - params.split2);
    }
    if (n >= params.split1) {
        return params.base1 + m * params.stride1 + (n - params.split1);
    }
    return m * params.y_stride + n;
}

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
    var sum = partials[m * quads + q];
    for (var p = 1u; p < KPARTS; p++) {
        sum += partials[(p * params.m + m) * quads + q];
    }
    for (var j = 0u; j < 4u; j++) {
        let n = 4u * q + j;
        if (n < params.n) {
            let index = out_index(m, n);
            var value = sum[j];
            if (ACCUMULATE) {
                value = y[index] + value;
            }
            y[index] = value;
        }
    }
}
