// Outer-product prefill GEMM, for weight encodings decoded 16 weights at a time (q4, q8, q5
// and the K-quants: their gemm_tiled_<enc>.wgsl / gemm_<enc>.wgsl provide `WRaw`,
// `fetch_w(n, k)` and `decode_w(raw)`, UNIT = 16):
//
//   Y[M, N] = X[M, K] W[N, K]^T            (ACCUMULATE: Y += X W^T, e.g. a residual add)
//
//   x  [M][x_stride] f32, read as vec4 (x_stride a multiple of 4, >= K)
//   y  up to three column sections, each [M][stride] at its own offset
//   W  [N rows][K cols] in the artifact's own parts (bindings 3..)
//
// The params, bindings 0..2, the sections (`out_index`) and the store (`store_quad`, wrapped by
// `store_result` for split K) are gemm_sections.wgsl's.
//
// Why another kernel: every invocation keeps an 8 x 8 block of Y in sixteen named vec4
// registers (no arrays: an array indexed in a loop may live in local memory, and then every
// multiply-add is a memory round trip), and each k costs two 16-byte workgroup loads of W
// for 64 FMAs. Sixteen registers spelled out is long but it is the point of the file.
//
// Tiling. A workgroup of WG_X * WG_Y invocations owns a TM x TN tile of Y, TM = 8 WG_Y
// activation rows by TN = 8 WG_X weight rows, and walks K in steps of BK (16 or 32: one or
// two decoded units of every tile row; 32 halves the steps, which is what a long K at few
// workgroups waits on, for more registers in flight) through two workgroup stages (the next step's loads sit in registers during this step's multiply,
// one barrier a step):
//   xs [stage][TM][BK / 4] vec4    X rows, k contiguous (as loaded: coalesced, no transpose)
//   ws [stage][BK][TN / 4] vec4    W transposed, n contiguous: the four adjacent columns an
//                                  invocation multiplies are one vec4 per k
// Invocation (tx, ty) owns rows ty + WG_Y i (i < 8) and columns 4 tx + j and
// 4 (tx + WG_X) + j (j < 4). Per 4 k it loads 8 vec4s of X (a broadcast: a quarter warp
// shares ty) and 2 vec4s of W per k (adjacent invocations, adjacent vec4s), then 256 FMAs.
//
// Split K across workgroups (KPARTS = 2, 4 or 8; kernels/gemm_split.py): when the shape has
// too few tiles to fill the GPU, KPARTS workgroups share each tile, part p walking its own
// run of K steps, and each writes its partial sums, not Y: P[p][m][n4] in the binding `y`
// (n4 = N rounded up to 4; no sections, no ACCUMULATE). gemm_reduce.wgsl then adds the parts,
// in part order, into Y. Workgroup `id` is part id / tiles of tile id % tiles.
//
// Weights are decoded ONCE per step into ws (each of the TM rows reuses them) and masked to
// 0 at k >= K, as is x (x's row padding may be anything; a q4 "min" padding code decodes to
// `min`). Accumulation is f32, one fma per k in k order, the classic kernel's rule (its
// error bound holds). Rows m >= M and columns n >= N are computed from whatever their tiles
// hold but never stored. Barriers: the K loop runs ceil(K / BK) times in every invocation
// and a workgroup past the last tile leaves as a whole before any barrier.

override WG_X: u32 = 16u;   // invocations along N; TN = 8 WG_X. Allowlist 8, 16
override WG_Y: u32 = 8u;    // invocations along M; TM = 8 WG_Y. Allowlist 4, 8, 16
override BK: u32 = 16u;     // K step. Allowlist 16, 32
override KPARTS: u32 = 1u;  // K ranges a tile is split into (see above). Allowlist 1, 2, 4, 8

var<workgroup> xs: array<vec4<f32>, 2u * 8u * WG_Y * (BK / 4u)>;   // [stage][TM][BK / 4]
var<workgroup> ws: array<vec4<f32>, 2u * BK * 2u * WG_X>;         // [stage][BK][TN / 4]

// The 8 x 8 block of Y an invocation owns: row i's columns 4 tx .. (a) and 4 (tx + WG_X) .. (b).
struct Block {
    r0a: vec4<f32>, r0b: vec4<f32>, r1a: vec4<f32>, r1b: vec4<f32>,
    r2a: vec4<f32>, r2b: vec4<f32>, r3a: vec4<f32>, r3b: vec4<f32>,
    r4a: vec4<f32>, r4b: vec4<f32>, r5a: vec4<f32>, r5b: vec4<f32>,
    r6a: vec4<f32>, r6b: vec4<f32>, r7a: vec4<f32>, r7b: vec4<f32>,
}

// One k: the block plus X's column (rows 0..3 in lo, 4..7 in hi) times W's row (a, b).
fn rank1(c: Block, lo: vec4<f32>, hi: vec4<f32>, a: vec4<f32>, b: vec4<f32>) -> Block {
    return Block(fma(vec4<f32>(lo.x), a, c.r0a), fma(vec4<f32>(lo.x), b, c.r0b),
                 fma(vec4<f32>(lo.y), a, c.r1a), fma(vec4<f32>(lo.y), b, c.r1b),
                 fma(vec4<f32>(lo.z), a, c.r2a), fma(vec4<f32>(lo.z), b, c.r2b),
                 fma(vec4<f32>(lo.w), a, c.r3a), fma(vec4<f32>(lo.w), b, c.r3b),
                 fma(vec4<f32>(hi.x), a, c.r4a), fma(vec4<f32>(hi.x), b, c.r4b),
                 fma(vec4<f32>(hi.y), a, c.r5a), fma(vec4<f32>(hi.y), b, c.r5b),
                 fma(vec4<f32>(hi.z), a, c.r6a), fma(vec4<f32>(hi.z), b, c.r6b),
                 fma(vec4<f32>(hi.w), a, c.r7a), fma(vec4<f32>(hi.w), b, c.r7b));
}

fn threads() -> u32 {
    return WG_X * WG_Y;
}

// X item r of this invocation: a vec4 of row m0 + item / (BK / 4) at k0 + 4 (item % (BK / 4));
// items run k fastest, so adjacent invocations read a row's contiguous bytes. TM * BK / 4 =
// 2 BK WG_Y items a step: 2 BK / WG_X (2 to 8) per invocation.
fn x_rounds() -> u32 {
    return 2u * BK / WG_X;
}

fn fetch_x(m0: u32, k0: u32, lane: u32, r: u32) -> vec4<f32> {
    let item = lane + r * threads();
    let m = m0 + item / (BK / 4u);
    let k = k0 + 4u * (item % (BK / 4u));
    if (m >= params.m || k >= params.k) {
        return vec4<f32>(0.0);
    }
    let ks = vec4<u32>(k) + vec4<u32>(0u, 1u, 2u, 3u);
    return select(vec4<f32>(0.0), x[(m * params.x_stride + k) / 4u], ks < vec4<u32>(params.k));
}

fn store_x(stage: u32, lane: u32, r: u32, v: vec4<f32>) {
    xs[stage * 8u * WG_Y * (BK / 4u) + lane + r * threads()] = v;
}

// W item r: unit item % (BK / 16) (16 weights) of tile row item / (BK / 16); TN BK / 16 =
// BK WG_X / 2 items a step: BK / (2 WG_Y) per invocation (4 to 1, or every other invocation
// for BK = 16 and WG_Y = 16).
fn w_rounds() -> u32 {
    return max(BK / (2u * WG_Y), 1u);
}

fn w_item(lane: u32, r: u32) -> u32 {
    return lane + r * threads();
}

fn fetch_w_item(n0: u32, k0: u32, item: u32) -> WRaw {
    let n = n0 + item / (BK / 16u);
    let k = k0 + 16u * (item % (BK / 16u));
    if (item >= 8u * WG_X * (BK / 16u) || n >= params.n || k >= params.k) {
        return WRaw();   // decodes to zeros
    }
    return fetch_w(n, k);
}

// Decoded into the transposed tile: ws[stage][k][column] (adjacent invocations write
// adjacent floats of a k row, so the 16 scalar stores do not conflict).
fn store_w(stage: u32, k0: u32, item: u32, raw: WRaw) {
    if (item >= 8u * WG_X * (BK / 16u)) {
        return;
    }
    var values = decode_w(raw);   // a var: indexed below by a loop variable
    let row = item / (BK / 16u);
    let unit = item % (BK / 16u);
    let column = row / 4u;
    let lane4 = row % 4u;
    for (var q = 0u; q < 4u; q++) {
        let ks = vec4<u32>(k0 + 16u * unit + 4u * q) + vec4<u32>(0u, 1u, 2u, 3u);
        let v = select(vec4<f32>(0.0), values[q], ks < vec4<u32>(params.k));
        let at = (stage * BK + 16u * unit + 4u * q) * 2u * WG_X + column;
        ws[at][lane4] = v.x;
        ws[at + 2u * WG_X][lane4] = v.y;
        ws[at + 4u * WG_X][lane4] = v.z;
        ws[at + 6u * WG_X][lane4] = v.w;
    }
}

var<private> part: u32;   // this workgroup's K range (split K); 0 otherwise

// Y[m][n .. n + 3] = v (gemm_sections.wgsl `store_quad`), or with split K this part's partial
// sums: P[part][m][n4], whole quads (n is a multiple of 4).
fn store_result(m: u32, n: u32, v: vec4<f32>) {
    if (KPARTS == 1u) {
        store_quad(m, n, v);
        return;
    }
    if (m >= params.m) {
        return;
    }
    let quads = (params.n + 3u) / 4u;
    if (n < params.n) {
        let at = ((part * params.m + m) * quads + n / 4u) * 4u;
        y[at] = v.x;
        y[at + 1u] = v.y;
        y[at + 2u] = v.z;
        y[at + 3u] = v.w;
    }
}

// The loads of one step, held in registers while the previous step multiplies: x_rounds()
// X items (2 to 8) and w_rounds() W items (1 to 4) per invocation, named, not an array (see
// the top). The rounds are constants, so the `if`s fold away.
struct Loads {
    x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>,
    x4: vec4<f32>, x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>,
    w0: WRaw, w1: WRaw, w2: WRaw, w3: WRaw,
}

fn fetch_step(m0: u32, n0: u32, k0: u32, lane: u32) -> Loads {
    var l: Loads;
    l.x0 = fetch_x(m0, k0, lane, 0u);
    l.x1 = fetch_x(m0, k0, lane, 1u);
    if (x_rounds() > 2u) {
        l.x2 = fetch_x(m0, k0, lane, 2u);
        l.x3 = fetch_x(m0, k0, lane, 3u);
    }
    if (x_rounds() > 4u) {
        l.x4 = fetch_x(m0, k0, lane, 4u);
        l.x5 = fetch_x(m0, k0, lane, 5u);
        l.x6 = fetch_x(m0, k0, lane, 6u);
        l.x7 = fetch_x(m0, k0, lane, 7u);
    }
    l.w0 = fetch_w_item(n0, k0, w_item(lane, 0u));
    if (w_rounds() > 1u) {
        l.w1 = fetch_w_item(n0, k0, w_item(lane, 1u));
    }
    if (w_rounds() > 2u) {
        l.w2 = fetch_w_item(n0, k0, w_item(lane, 2u));
        l.w3 = fetch_w_item(n0, k0, w_item(lane, 3u));
    }
    return l;
}

fn store_step(stage: u32, k0: u32, lane: u32, l: Loads) {
    store_x(stage, lane, 0u, l.x0);
    store_x(stage, lane, 1u, l.x1);
    if (x_rounds() > 2u) {
        store_x(stage, lane, 2u, l.x2);
        store_x(stage, lane, 3u, l.x3);
    }
    if (x_rounds() > 4u) {
        store_x(stage, lane, 4u, l.x4);
        store_x(stage, lane, 5u, l.x5);
        store_x(stage, lane, 6u, l.x6);
        store_x(stage, lane, 7u, l.x7);
    }
    store_w(stage, k0, w_item(lane, 0u), l.w0);
    if (w_rounds() > 1u) {
        store_w(stage, k0, w_item(lane, 1u), l.w1);
    }
    if (w_rounds() > 2u) {
        store_w(stage, k0, w_item(lane, 2u), l.w2);
        store_w(stage, k0, w_item(lane, 3u), l.w3);
    }
}

@compute @workgroup_size(WG_X * WG_Y)
fn main(@builtin(workgroup_id) group: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    // Tiles are numbered M-fastest, so workgroups that run together share a W tile (the
    // larger operand) in cache. The host spreads them over a 2-D grid when needed.
    let id = group.x + group.y * groups.x;
    if (id >= params.tiles * KPARTS) {
        return;  // the whole workgroup leaves together, before any barrier
    }
    let tile = id % params.tiles;
    let k_part = id / params.tiles;   // a let: uniform for the barriers below (a private var is not)
    part = k_part;                    // (for store_quad)
    let m0 = (tile % params.tiles_m) * (8u * WG_Y);
    let n0 = (tile / params.tiles_m) * (8u * WG_X);
    let tx = lane % WG_X;
    let ty = lane / WG_X;

    // This part's run of K steps (all of them without split K); a part past the end has
    // none and writes zeros. Uniform in the workgroup, so every barrier is reached.
    let all_steps = (params.k + BK - 1u) / BK;
    let per_part = (all_steps + KPARTS - 1u) / KPARTS;
    let first = min(k_part * per_part, all_steps);
    let steps = min(first + per_part, all_steps) - first;
    let k_first = first * BK;

    var c: Block;
    store_step(0u, k_first, lane, fetch_step(m0, n0, k_first, lane));
    workgroupBarrier();

    for (var s = 0u; s < steps; s++) {
        let stage = s % 2u;
        let more = s + 1u < steps;
        var next: Loads;
        if (more) {   // the next step's loads land while this one multiplies
            next = fetch_step(m0, n0, k_first + (s + 1u) * BK, lane);
        }
        let xb = stage * 8u * WG_Y * (BK / 4u);
        for (var kq = 0u; kq < BK / 4u; kq++) {
            let row = BK / 4u;
            let a0 = xs[xb + ty * row + kq];
            let a1 = xs[xb + (ty + WG_Y) * row + kq];
            let a2 = xs[xb + (ty + 2u * WG_Y) * row + kq];
            let a3 = xs[xb + (ty + 3u * WG_Y) * row + kq];
            let a4 = xs[xb + (ty + 4u * WG_Y) * row + kq];
            let a5 = xs[xb + (ty + 5u * WG_Y) * row + kq];
            let a6 = xs[xb + (ty + 6u * WG_Y) * row + kq];
            let a7 = xs[xb + (ty + 7u * WG_Y) * row + kq];
            let wb = (stage * BK + 4u * kq) * 2u * WG_X + tx;
            c = rank1(c, vec4<f32>(a0.x, a1.x, a2.x, a3.x), vec4<f32>(a4.x, a5.x, a6.x, a7.x),
                      ws[wb], ws[wb + WG_X]);
            c = rank1(c, vec4<f32>(a0.y, a1.y, a2.y, a3.y), vec4<f32>(a4.y, a5.y, a6.y, a7.y),
                      ws[wb + 2u * WG_X], ws[wb + 3u * WG_X]);
            c = rank1(c, vec4<f32>(a0.z, a1.z, a2.z, a3.z), vec4<f32>(a4.z, a5.z, a6.z, a7.z),
                      ws[wb + 4u * WG_X], ws[wb + 5u * WG_X]);
            c = rank1(c, vec4<f32>(a0.w, a1.w, a2.w, a3.w), vec4<f32>(a4.w, a5.w, a6.w, a7.w),
                      ws[wb + 6u * WG_X], ws[wb + 7u * WG_X]);
        }
        if (more) {
            store_step((s + 1u) % 2u, k_first + (s + 1u) * BK, lane, next);
        }
        workgroupBarrier();   // the next stage is complete, and this one free to overwrite
    }

    let na = n0 + 4u * tx;
    let nb = n0 + 4u * (tx + WG_X);
    store_result(m0 + ty, na, c.r0a);
    store_result(m0 + ty, nb, c.r0b);
    store_result(m0 + ty + WG_Y, na, c.r1a);
    store_result(m0 + ty + WG_Y, nb, c.r1b);
    store_result(m0 + ty + 2u * WG_Y, na, c.r2a);
    store_result(m0 + ty + 2u * WG_Y, nb, c.r2b);
    store_result(m0 + ty + 3u * WG_Y, na, c.r3a);
    store_result(m0 + ty + 3u * WG_Y, nb, c.r3b);
    store_result(m0 + ty + 4u * WG_Y, na, c.r4a);
    store_result(m0 + ty + 4u * WG_Y, nb, c.r4b);
    store_result(m0 + ty + 5u * WG_Y, na, c.r5a);
    store_result(m0 + ty + 5u * WG_Y, nb, c.r5b);
    store_result(m0 + ty + 6u * WG_Y, na, c.r6a);
    store_result(m0 + ty + 6u * WG_Y, nb, c.r6b);
    store_result(m0 + ty + 7u * WG_Y, na, c.r7a);
    store_result(m0 + ty + 7u * WG_Y, nb, c.r7b);
}
