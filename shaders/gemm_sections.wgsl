// The interface every prefill GEMM kernel shares (classic gemm_main.wgsl, register-tiled
// gemm_tiled_main.wgsl, outer-product gemm_outer_main.wgsl, and split K's reduce
// gemm_reduce.wgsl): the params block, bindings 0..2 and how a result reaches Y. It precedes the encoding file in every GEMM's source list (the
// decoders read params.k), so its override comes before any override-sized workgroup array
// (see the note at the top of gemm_main.wgsl).
//
//   x  [M][x_stride] f32, read as vec4 (x_stride a multiple of 4, >= K)
//   y  up to three column sections, each [M][stride] at its own offset (see `out_index`);
//      one section (split1 = split2 = N) is plain [M][y_stride]
//   W  [N rows][K cols] in the artifact's own parts (bindings 3.., the encoding file's)

override ACCUMULATE: bool = false;   // Y += X W^T instead of Y = X W^T

struct Params {
    m: u32,          // M, activation rows
    n: u32,          // N, weight rows = output columns
    k: u32,          // K, real elements per weight row
    x_stride: u32,   // floats between activation rows (multiple of 4)
    y_stride: u32,   // floats between output rows of section 0
    tiles_m: u32,    // ceil(M / TM)
    tiles: u32,      // tiles_m * ceil(N / TN): workgroups that have work
    split1: u32,     // first column of section 1 (N when there is one section)
    split2: u32,     // first column of section 2 (N when there are at most two)
    base1: u32,      // float offset of section 1's first element in y
    base2: u32,
    stride1: u32,    // floats between output rows of section 1
    stride2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

// Where Y[m][n] lives: column sections let one product write, e.g., q | k | v into the
// planar qkv activation (each section its own [M][stride] array) in one dispatch.
fn out_index(m: u32, n: u32) -> u32 {
    if (n >= params.split2) {
        return params.base2 + m * params.stride2 + (n - params.split2);
    }
    if (n >= params.split1) {
        return params.base1 + m * params.stride1 + (n - params.split1);
    }
    return m * params.y_stride + n;
}

// Y[m][n] = value (ACCUMULATE: += value). The caller has checked m < M and n < N.
fn store_y(m: u32, n: u32, value: f32) {
    let index = out_index(m, n);
    var v = value;
    if (ACCUMULATE) {
        v = y[index] + v;
    }
    y[index] = v;
}

// Y[m][n .. n + 3] = v, the columns past N and a row m >= M left alone.
fn store_quad(m: u32, n: u32, v: vec4<f32>) {
    if (m >= params.m) {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        if (n + j < params.n) {
            store_y(m, n + j, v[j]);
        }
    }
}
