// Register-tiled prefill GEMM, the part shared by every weight encoding:
//
//   Y[M, N] = X[M, K] W[N, K]^T            (ACCUMULATE: Y += X W^T, e.g. a residual add)
//
//   x  [M][x_stride] f32, read as vec4 (x_stride a multiple of 4, >= K)
//   y  up to three column sections, each [M][stride] at its own offset
//   W  [N rows][K cols] in the artifact's own parts (bindings 3..)
//
// The params, bindings 0..2, the sections (`out_index`) and the store (`store_y`) are
// gemm_sections.wgsl's.
//
// Sources before this file: the tile element type (gemm_tiled_full.wgsl: `alias tile4 =
// vec4<f32>`, or enable_f16.wgsl + gemm_tiled_half.wgsl: vec4<f16>), common_quant.wgsl,
// gemm_sections.wgsl, the encoding file (gemm_tiled_<encoding>.wgsl: weight bindings,
// `WRaw`, `fetch_w`, `decode_w`) and its scale helpers. The encoding file comes first for
// naga's sake (see gemm_main.wgsl).
//
// Tiling. A workgroup of WG_X * WG_Y invocations owns a TM x TN tile of Y (TM = RM * WG_Y
// activation rows, TN = RN * WG_X weight rows) and walks K in steps of BK. Invocation
// (tx, ty) keeps a RM x RN block of Y in registers: rows ty + WG_Y i (i < RM) and columns
// tx + WG_X j (j < RN). Both workgroup tiles are k-contiguous, each row padded by one vec4:
//   xs [TM][BK / 4 + 1] tile4     ws [TN][BK / 4 + 1] tile4     (per stage)
// Per 4 k, an invocation loads RM + RN vec4s and does 4 RM RN FMAs. A quarter warp's loads of
// xs share one row (a broadcast); of ws they hit rows 1 apart, which the padding moves by 4
// banks, so neither conflicts. Weights are dequantized ONCE per step into ws (every one of the
// TM rows reuses them) and masked to 0 at k >= K, as is x (x's row padding may be anything;
// a q4 "min" padding code decodes to `min`, a huge "offset" scale to -inf).
//
// Pipeline (STAGES = 2): the global loads of step s + 1 go to registers (x as vec4s, weights
// as raw codes and scales: `WRaw`) before the multiply of step s, and are decoded into the
// other stage after it, so memory latency hides behind the FMAs; one barrier a step. With
// STAGES = 1 the registers are still loaded early, but two barriers a step guard the tile.
//
// Split K step (KSPLIT = 2 or 4): the workgroup has KSPLIT slices of WG_X * WG_Y invocations
// sharing the tiles; slice s multiplies kq s BK / (4 KSPLIT) .. of each step into its own
// registers, and after the K loop the slices' blocks are added into slice 0's through
// workgroup memory (`red`, one slice at a time), which stores. More invocations per tile:
// for shapes with fewer tiles than the GPU has multiprocessors.
//
// Barriers: the K loop runs ceil(K / BK) times in every invocation and a workgroup past the
// last tile leaves as a whole before the loop, so every barrier is reached uniformly.
// Accumulation is f32 (one fma per k, in k order); rows m >= M and columns n >= N are
// computed from whatever their tiles hold but never stored.

override WG_X: u32 = 16u;   // invocations along N. Allowlist 16
override WG_Y: u32 = 16u;   // invocations along M. Allowlist 8, 16
override RM: u32 = 4u;      // Y rows (tokens) per invocation. Allowlist 4, 8
override RN: u32 = 4u;      // Y columns (weight rows) per invocation. Allowlist 4, 8
override BK: u32 = 32u;     // K step. Allowlist 16, 32
override STAGES: u32 = 2u;  // workgroup tile buffers. Allowlist 1, 2
override KSPLIT: u32 = 1u;  // slices of each K step (see above). Allowlist 1, 2, 4

const RM_MAX: u32 = 8u;     // the register arrays are sized for the largest block
const RN_MAX: u32 = 8u;
const X_ITEMS_MAX: u32 = 4u;   // ceil(RM * BK / (4 WG_X KSPLIT)) vec4s of x per invocation and step

// Workgroup tiles, STAGES of each, rows padded by one vec4 (see above).
var<workgroup> xs: array<tile4, STAGES * RM * WG_Y * (BK / 4u + 1u)>;
var<workgroup> ws: array<tile4, STAGES * RN * WG_X * (BK / 4u + 1u)>;
// One slice's register blocks, [RM RN / 4][WG_X WG_Y] vec4s, when KSPLIT > 1 ((KSPLIT + 2) / 4
// is 0 for KSPLIT 1 and 1 for 2 and 4; the + 1 keeps the array non-empty).
var<workgroup> red: array<vec4<f32>, (KSPLIT + 2u) / 4u * RM * RN * WG_X * WG_Y / 4u + 1u>;

fn threads() -> u32 {
    return WG_X * WG_Y * KSPLIT;
}

fn row_quads() -> u32 {
    return BK / 4u + 1u;
}

// vec4 item r of this invocation's share of the X tile rows m0.., columns k0..k0+BK. Items
// run k fastest, so adjacent invocations read adjacent 16 bytes of a row.
fn x_items() -> u32 {
    return RM * WG_Y * (BK / 4u);
}

fn fetch_x(m0: u32, k0: u32, lane: u32, r: u32) -> vec4<f32> {
    let item = lane + r * threads();
    let m = m0 + item / (BK / 4u);
    let k = k0 + 4u * (item % (BK / 4u));
    if (item >= x_items() || m >= params.m || k >= params.k) {
        return vec4<f32>(0.0);
    }
    let ks = vec4<u32>(k) + vec4<u32>(0u, 1u, 2u, 3u);
    return select(vec4<f32>(0.0), x[(m * params.x_stride + k) / 4u], ks < vec4<u32>(params.k));
}

fn store_x(stage: u32, lane: u32, r: u32, v: vec4<f32>) {
    let item = lane + r * threads();
    if (item >= x_items()) {
        return;
    }
    let row = item / (BK / 4u);
    xs[(stage * RM * WG_Y + row) * row_quads() + item % (BK / 4u)] = tile4(v);
}

// Weight item r of this invocation: UNIT weights of one tile row (raw codes and scales,
// decoded after the multiply). Items run unit fastest within a row.
fn w_items() -> u32 {
    return RN * WG_X * (BK / UNIT);
}

fn fetch_w_item(n0: u32, k0: u32, lane: u32, r: u32) -> WRaw {
    let item = lane + r * threads();
    let n = n0 + item / (BK / UNIT);
    let k = k0 + UNIT * (item % (BK / UNIT));
    if (item >= w_items() || n >= params.n || k >= params.k) {
        return WRaw();   // decodes to zeros
    }
    return fetch_w(n, k);
}

fn store_w(stage: u32, k0: u32, lane: u32, r: u32, raw: WRaw) {
    let item = lane + r * threads();
    if (item >= w_items()) {
        return;
    }
    let row = item / (BK / UNIT);
    let unit = item % (BK / UNIT);
    var values = decode_w(raw);
    let at = (stage * RN * WG_X + row) * row_quads() + unit * (UNIT / 4u);
    for (var q = 0u; q < UNIT / 4u; q++) {
        let ks = vec4<u32>(k0 + unit * UNIT + 4u * q) + vec4<u32>(0u, 1u, 2u, 3u);
        ws[at + q] = tile4(select(vec4<f32>(0.0), values[q], ks < vec4<u32>(params.k)));
    }
}

@compute @workgroup_size(WG_X * WG_Y * KSPLIT)
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
    let n0 = (tile / params.tiles_m) * (RN * WG_X);
    let slice = lane / (WG_X * WG_Y);
    let local = lane % (WG_X * WG_Y);
    let tx = local % WG_X;
    let ty = local / WG_X;
    let x_rounds = (x_items() + threads() - 1u) / threads();
    let w_rounds = (w_items() + threads() - 1u) / threads();
    let kq_slice = BK / 4u / KSPLIT;   // this slice multiplies kq slice * kq_slice ..

    var acc: array<vec4<f32>, RM_MAX * RN_MAX / 4u>;   // [i][jq]: columns 4 jq .. 4 jq + 3 of row i
    var x_next: array<vec4<f32>, X_ITEMS_MAX>;
    var w_next: array<WRaw, W_ITEMS_MAX>;

    // Step 0 goes straight into stage 0.
    for (var r = 0u; r < x_rounds; r++) {
        store_x(0u, lane, r, fetch_x(m0, 0u, lane, r));
    }
    for (var r = 0u; r < w_rounds; r++) {
        store_w(0u, 0u, lane, r, fetch_w_item(n0, 0u, lane, r));
    }
    workgroupBarrier();

    let steps = (params.k + BK - 1u) / BK;
    for (var s = 0u; s < steps; s++) {
        let stage = select(0u, s % 2u, STAGES == 2u);
        let k_next = (s + 1u) * BK;
        let more = s + 1u < steps;
        if (more) {   // issue the next step's loads now; they land while we multiply
            for (var r = 0u; r < x_rounds; r++) {
                x_next[r] = fetch_x(m0, k_next, lane, r);
            }
            for (var r = 0u; r < w_rounds; r++) {
                w_next[r] = fetch_w_item(n0, k_next, lane, r);
            }
        }

        let xb = stage * RM * WG_Y * row_quads();
        let wb = stage * RN * WG_X * row_quads();
        for (var kq = slice * kq_slice; kq < (slice + 1u) * kq_slice; kq++) {
            var a: array<vec4<f32>, RM_MAX>;
            var b: array<vec4<f32>, RN_MAX>;
            for (var i = 0u; i < RM; i++) {
                a[i] = vec4<f32>(xs[xb + (ty + WG_Y * i) * row_quads() + kq]);
            }
            for (var j = 0u; j < RN; j++) {
                b[j] = vec4<f32>(ws[wb + (tx + WG_X * j) * row_quads() + kq]);
            }
            for (var i = 0u; i < RM; i++) {
                for (var jq = 0u; jq < RN / 4u; jq++) {
                    let b0 = b[4u * jq];
                    let b1 = b[4u * jq + 1u];
                    let b2 = b[4u * jq + 2u];
                    let b3 = b[4u * jq + 3u];
                    var c = acc[i * (RN_MAX / 4u) + jq];
                    c = fma(vec4<f32>(a[i].x), vec4<f32>(b0.x, b1.x, b2.x, b3.x), c);
                    c = fma(vec4<f32>(a[i].y), vec4<f32>(b0.y, b1.y, b2.y, b3.y), c);
                    c = fma(vec4<f32>(a[i].z), vec4<f32>(b0.z, b1.z, b2.z, b3.z), c);
                    c = fma(vec4<f32>(a[i].w), vec4<f32>(b0.w, b1.w, b2.w, b3.w), c);
                    acc[i * (RN_MAX / 4u) + jq] = c;
                }
            }
        }

        if (more) {
            if (STAGES == 1u) {
                workgroupBarrier();   // everyone is done reading the only stage
            }
            let next = select(0u, (s + 1u) % 2u, STAGES == 2u);
            for (var r = 0u; r < x_rounds; r++) {
                store_x(next, lane, r, x_next[r]);
            }
            for (var r = 0u; r < w_rounds; r++) {
                store_w(next, k_next, lane, r, w_next[r]);
            }
        }
        workgroupBarrier();   // the next step's tile is complete (and, 2 stages: this one is free)
    }

    // Split K: add the other slices' blocks into slice 0's, one slice at a time.
    for (var other = 1u; other < KSPLIT; other++) {
        if (slice == other) {
            for (var idx = 0u; idx < RM * RN / 4u; idx++) {
                red[idx * WG_X * WG_Y + local] = acc[idx / (RN / 4u) * (RN_MAX / 4u) + idx % (RN / 4u)];
            }
        }
        workgroupBarrier();
        if (slice == 0u) {
            for (var idx = 0u; idx < RM * RN / 4u; idx++) {
                let at = idx / (RN / 4u) * (RN_MAX / 4u) + idx % (RN / 4u);
                acc[at] = acc[at] + red[idx * WG_X * WG_Y + local];
            }
        }
        workgroupBarrier();
    }
    if (slice != 0u) {
        return;
    }

    for (var i = 0u; i < RM; i++) {
        let m = m0 + ty + WG_Y * i;
        if (m < params.m) {
            for (var j = 0u; j < RN; j++) {
                let n = n0 + tx + WG_X * j;
                if (n < params.n) {
                    store_y(m, n, acc[i * (RN_MAX / 4u) + j / 4u][j % 4u]);
                }
            }
        }
    }
}
