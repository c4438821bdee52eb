// Prefill GEMM, the part shared by every weight encoding:
//
//   Y[M, N] = X[M, K] W[N, K]^T            (ACCUMULATE: Y += X W^T, e.g. a residual add)
//
//   x  [M][x_stride] f32, read as vec4 (x_stride a multiple of 4, >= K)
//   y  [M][y_stride] f32 (y_stride >= N; the host gives this kernel one column section)
//   W  [N rows][K cols] in the artifact's own parts (bindings 3..)
//
// The params, bindings 0..2 and the store (`store_quad`) are gemm_sections.wgsl's.
//
// The encoding file (gemm_q4.wgsl, ...) concatenated BEFORE this one declares the weight
// bindings and `decode_unit(n, k)`: UNIT consecutive weights of row n from k, as UNIT_QUADS
// vec4s. (It must come first: naga 29 panics when an override is declared after a
// workgroup array whose size depends on overrides, and it orders declarations by first
// use, so the encoding's overrides must precede this file's arrays in the source.)
//
// Tiling. A workgroup owns a TM x TN tile of Y (TM = RM * WG_Y rows, TN = 4 * WG_X
// columns) and walks K in steps of KT = 32. Each step
//   1. copies the X tile [TM][KT] into workgroup memory (masked: rows >= M, k >= K read 0),
//   2. dequantizes the W tile [TN][KT] into workgroup memory ONCE, stored k-major
//      [KT][TN] (load_w_tile): every one of the TM rows reuses it,
//   3. after a barrier, each invocation multiplies its RM x 4 register block: for each k,
//      one vec4 of W (its 4 columns) times RM scalars of X, as f32 FMAs.
// KT = 32 divides every block size (32..256), so one step never straddles two scale
// blocks, and the step's codes of one row are one aligned 16-byte run for q4 (two for q8).
//
// Workgroup memory: (TM + TN) * KT * 4 bytes: 8 KiB for 32x32, 16 KiB for 64x64 (fits the
// 16 KiB every device has), 24 KiB for 128x64 (only where the device admits it; the host
// function chooses). Bank behavior: the X tile is written as contiguous vec4s and read as
// one broadcast vec4 per row; the W tile is written by adjacent invocations at adjacent
// columns and read as adjacent vec4s, so neither access strides across banks.
//
// Barriers: the K loop runs ceil(K / KT) times in every invocation and a workgroup past the
// last tile leaves as a whole before the loop, so every barrier is reached uniformly.
// Accumulation is f32; bounds: rows m >= M and columns n >= N are never stored, k >= K is
// zero in both tiles (a q4 "min" padding code still decodes to `min`, so both are masked).

override WG_X: u32 = 16u;   // invocations along N; TN = 4 * WG_X. Allowlist 8, 16
override WG_Y: u32 = 8u;    // invocations along M. Allowlist 8, 16
override RM: u32 = 8u;      // Y rows per invocation; TM = RM * WG_Y. Allowlist 4, 8

const KT: u32 = 32u;        // K step
const RM_MAX: u32 = 8u;     // register block rows the accumulator array is sized for

// X tile [TM rows][KT / 4] vec4 (row-major, k contiguous).
var<workgroup> x_tile: array<vec4<f32>, RM * WG_Y * KT / 4u>;
// W tile [KT][TN / 4] vec4: the 4 adjacent columns one invocation multiplies, per k.
var<workgroup> w_tile: array<vec4<f32>, KT * WG_X>;

fn tile_n() -> u32 {
    return 4u * WG_X;
}

// Four decoded weights of tile column r (0..TN) into the W tile, at step-local k .. k+3.
// Weights at k0 + k >= K (a row's padding) are stored as 0. Adjacent invocations handle
// adjacent columns r, so each of the four stores hits adjacent words (no bank conflicts).
fn put_w4(r: u32, k0: u32, k: u32, values: vec4<f32>) {
    let ks = vec4<u32>(k0 + k) + vec4<u32>(0u, 1u, 2u, 3u);
    let v = select(vec4<f32>(0.0), values, ks < vec4<u32>(params.k));
    let column = r / 4u;
    let lane4 = r % 4u;
    w_tile[k * WG_X + column][lane4] = v.x;
    w_tile[(k + 1u) * WG_X + column][lane4] = v.y;
    w_tile[(k + 2u) * WG_X + column][lane4] = v.z;
    w_tile[(k + 3u) * WG_X + column][lane4] = v.w;
}

// Rows m0.. of X, columns k0..k0+KT, as vec4s (x_stride % 4 == 0 makes each aligned).
fn load_x_tile(m0: u32, k0: u32, lane: u32) {
    let quads = KT / 4u;
    for (var i = lane; i < RM * WG_Y * quads; i += WG_X * WG_Y) {
        let m = m0 + i / quads;
        let k = k0 + 4u * (i % quads);
        var v = vec4<f32>(0.0);
        if (m < params.m && k < params.k) {
            let ks = vec4<u32>(k) + vec4<u32>(0u, 1u, 2u, 3u);
            v = select(vec4<f32>(0.0), x[(m * params.x_stride + k) / 4u], ks < vec4<u32>(params.k));
        }
        x_tile[i] = v;   // adjacent invocations write adjacent vec4s
    }
}

// Rows n0.. of W, columns k0..k0+KT, decoded into the W tile. Work items are (unit,
// column) pairs, column fastest; columns past N store zeros and read nothing.
fn load_w_tile(n0: u32, k0: u32, lane: u32) {
    let units = KT / UNIT;
    for (var item = lane; item < units * tile_n(); item += WG_X * WG_Y) {
        let r = item % tile_n();
        let k = (item / tile_n()) * UNIT;
        let n = n0 + r;
        var values: array<vec4<f32>, UNIT_QUADS>;   // zeros unless decoded
        if (n < params.n && k0 + k < params.k) {
            values = decode_unit(n, k0 + k);
        }
        for (var q = 0u; q < UNIT_QUADS; q++) {
            put_w4(r, k0, k + 4u * q, values[q]);
        }
    }
}

@compute @workgroup_size(WG_X * WG_Y)
fn main(@builtin(workgroup_id) group: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    // Tiles are numbered M-fastest, so workgroups that run together share a W tile (the
    // larger operand) in cache. The host spreads them over a 2-D grid when needed.
    let tile = group.x + group.y * groups.x;
    if (tile >= params.tiles) {
        return;  // the whole workgroup leaves together, before any barrier
    }
    let m0 = (tile % params.tiles_m) * (RM * WG_Y);
    let n0 = (tile / params.tiles_m) * tile_n();
    let tx = lane % WG_X;      // this invocation's 4 columns: n0 + 4 tx ..
    let ty = lane / WG_X;      // its RM rows: m0 + RM ty ..

    var acc: array<vec4<f32>, RM_MAX>;   // zero-initialized; rows i >= RM stay unused

    for (var k0 = 0u; k0 < params.k; k0 += KT) {
        load_x_tile(m0, k0, lane);
        load_w_tile(n0, k0, lane);
        workgroupBarrier();
        for (var kq = 0u; kq < KT / 4u; kq++) {
            let b0 = w_tile[(4u * kq) * WG_X + tx];
            let b1 = w_tile[(4u * kq + 1u) * WG_X + tx];
            let b2 = w_tile[(4u * kq + 2u) * WG_X + tx];
            let b3 = w_tile[(4u * kq + 3u) * WG_X + tx];
            for (var i = 0u; i < RM; i++) {
                let a = x_tile[(ty * RM + i) * (KT / 4u) + kq];
                var c = acc[i];
                c = fma(vec4<f32>(a.x), b0, c);
                c = fma(vec4<f32>(a.y), b1, c);
                c = fma(vec4<f32>(a.z), b2, c);
                c = fma(vec4<f32>(a.w), b3, c);
                acc[i] = c;
            }
        }
        workgroupBarrier();   // the next step overwrites both tiles
    }

    for (var i = 0u; i < RM; i++) {
        store_quad(m0 + ty * RM + i, n0 + 4u * tx, acc[i]);
    }
}
