// Prefill attention: T new tokens at positions start..start+T-1, causal; token t also sees
// every cached position before start (the cache already holds the T new rows: kv_append
// runs first).
//
//   out[t, h, :] = sum_{j <= start+t} softmax_j(scale * q[t, h] . K[kv(h), j]) * V[kv(h), j]
//   kv(h) = h / G, G = n_heads / n_kv_heads
//
// Tiling (FlashAttention-style, online softmax). The query rows of one KV head are the
// (token, head-in-group) pairs, token-major: row r is token r / G, head r % G. A workgroup
// takes a block of `rows` such rows (so the G heads that share K/V share every tile load)
// and walks the keys 0..(last visible key of the block) in tiles of `tile` keys:
//   1. load the K tile into workgroup memory
//   2. scores S[r, c] = q_r . k_c                    (q pre-scaled, kept in workgroup memory)
//   3. per row (one invocation each): tile max over visible keys, new running max m, the
//      rescale factor alpha = exp(m_old - m_new), weights exp(s - m_new), running sum l;
//      meanwhile everyone loads the V tile into the buffer K used
//   4. acc = acc * alpha + sum_c P[r, c] V[c]        (the tile's sum is formed first, so
//      every weight meets few roundings: see the error rule in attention.py)
// Masked keys (j > start + t) get weight exactly 0; a row's running max starts at the first
// tile where it sees a key (without a window: the first tile, which holds key 0). Exponents
// are always <= 0: no overflow at any score range. Accumulation is f32; `kv4` comes from the
// prelude.
//
// Sliding window (Gemma 3's local layers; window 0: none): token t sees keys
// start + t - window + 1 .. start + t only (cpu/layers.attention). The block's walk starts at
// the tile holding the first key its first row sees, and a row's keys before its own window
// get weight exactly 0, like keys past its causal end.
//
// Workgroup memory: q block 8.3 KiB + K/V tile 4.3 KiB + weights 2 KiB + row stats: fits
// the 16 KiB of compatibility devices. Rows of the q block and the K/V tile are padded by one
// vec4 so that invocations reading different rows hit different banks. The host picks
// rows = min(16, 2048 / head_dim) and tile = min(32, 272 / (HD4 + 1), 512 / rows).

override WG: u32 = 64u;          // invocations per workgroup; allowlist 64, 128, 256 (registry)
override HD4: u32 = 16u;         // head_dim / 4, 1..64: a constant, so the loops over a row unroll

const Q_SLOTS = 528u;            // vec4 slots of the query block: rows * (HD4 + 1) <= 528
const KV_SLOTS = 272u;           // vec4 slots of one K or V tile: tile * (HD4 + 1) <= 272
override STRIDE: u32 = HD4 + 1u;  // padded row stride of q_block and kv_tile, in vec4s (derived)
const P_WORDS = 512u;            // rows * tile <= 512
const MAX_ROWS = 16u;
const ACC_SLOTS = 8u;            // Q_SLOTS / 64: output vec4s per invocation at WG = 64

struct Params {
    n_heads: u32,       // H
    n_kv_heads: u32,    // K, divides H
    head_dim: u32,      // E = 4 * HD4 (the kernel uses HD4)
    capacity: u32,      // positions per KV head in the cache buffers
    start: u32,         // position of the first new token
    n_tokens: u32,      // T
    rows: u32,          // query rows per workgroup, <= 16
    tile: u32,          // keys per tile
    row_blocks: u32,    // ceil(T * G / rows)
    n_groups: u32,      // K * row_blocks
    scale: f32,
    window: u32,        // a sliding window's length; 0: every earlier key is visible
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;        // [T][H * E / 4]
@group(0) @binding(2) var<storage, read> k_cache: array<kv4>;        // [K][capacity][E / 4]
@group(0) @binding(3) var<storage, read> v_cache: array<kv4>;        // [K][capacity][E / 4]
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;  // [T][H * E / 4]

var<workgroup> q_block: array<vec4<f32>, Q_SLOTS>;  // [rows][STRIDE], pre-scaled
var<workgroup> kv_tile: array<vec4<f32>, KV_SLOTS>; // [tile][STRIDE]: K, then V
var<workgroup> weights: array<f32, P_WORDS>;        // [rows][tile]: scores, then exp(s - m)
var<workgroup> alpha: array<f32, MAX_ROWS>;         // per row: rescale of the running sums
var<workgroup> row_sum: array<f32, MAX_ROWS>;       // per row: final l

// The first key the query at position `last` sees (its own position is its last key).
fn first_visible(last: u32) -> u32 {
    if (params.window == 0u || last < params.window) {
        return 0u;
    }
    return last + 1u - params.window;
}

@compute @workgroup_size(WG)
fn prefill(@builtin(workgroup_id) group: vec3<u32>,
           @builtin(num_workgroups) groups: vec3<u32>,
           @builtin(local_invocation_index) lane: u32) {
    let wid = group.x + group.y * groups.x;
    if (wid >= params.n_groups) {
        return;  // the whole workgroup leaves together: barriers below stay uniform
    }
    let e4 = HD4;
    let g_size = params.n_heads / params.n_kv_heads;
    let kv_head = wid / params.row_blocks;
    let row0 = (wid % params.row_blocks) * params.rows;     // first row of the block
    let n_rows = params.n_tokens * g_size;
    let rows_here = min(params.rows, n_rows - row0);
    // Keys 0..last_key are visible to some row of the block (rows are token-major).
    let last_key = params.start + (row0 + rows_here - 1u) / g_size;
    let n_tiles = last_key / params.tile + 1u;
    let first_tile = first_visible(params.start + row0 / g_size) / params.tile;   // the block's first row
    let kv_base = kv_head * params.capacity;                // cache row of position 0

    // The query block, scaled once; rows past the end are zeros (never written out).
    for (var i = lane; i < params.rows * e4; i += WG) {
        let r = row0 + i / e4;
        var value = vec4<f32>(0.0);
        if (r < n_rows) {
            let head = kv_head * g_size + r % g_size;
            value = q[((r / g_size) * params.n_heads + head) * e4 + i % e4] * params.scale;
        }
        q_block[(i / e4) * STRIDE + i % e4] = value;
    }

    // Row state, owned by invocation `lane` for row `lane` (lane < rows).
    var m = 0.0;
    var l = 0.0;
    var started = false;                                    // has row `lane` seen a key yet
    let my_row = row0 + lane;
    let my_last_key = params.start + my_row / g_size;       // causal limit of row `lane`
    let my_first_key = first_visible(my_last_key);          // its window's start
    // Output accumulators: invocation owns vec4 slots lane, lane + WG, ... of [rows][E / 4].
    var acc: array<vec4<f32>, ACC_SLOTS>;
    for (var s = 0u; s < ACC_SLOTS; s++) {
        acc[s] = vec4<f32>(0.0);
    }

    for (var t = first_tile; t < n_tiles; t++) {
        let key0 = t * params.tile;
        let keys_here = min(params.tile, last_key + 1u - key0);

        // 1. K tile (keys past the block's last visible key are zeros, never used).
        workgroupBarrier();   // the previous tile's V is no longer read
        for (var i = lane; i < params.tile * e4; i += WG) {
            let c = i / e4;
            var value = vec4<f32>(0.0);
            if (c < keys_here) {
                value = vec4<f32>(k_cache[(kv_base + key0 + c) * e4 + i % e4]);
            }
            kv_tile[c * STRIDE + i % e4] = value;
        }
        workgroupBarrier();

        // 2. Scores.
        for (var i = lane; i < params.rows * params.tile; i += WG) {
            let r = i / params.tile;
            let c = i % params.tile;
            var s = 0.0;
            for (var d = 0u; d < e4; d++) {
                s += dot(q_block[r * STRIDE + d], kv_tile[c * STRIDE + d]);
            }
            weights[i] = s;
        }
        workgroupBarrier();

        // 3a. Online softmax, one invocation per row.
        if (lane < rows_here) {
            // Keys lo .. visible - 1 of the tile are this row's (window start, causal end).
            let visible = min(keys_here, select(0u, my_last_key + 1u - key0, my_last_key >= key0));
            let lo = select(0u, my_first_key - key0, my_first_key > key0);
            var tile_max = -3.402823e38;
            for (var c = lo; c < visible; c++) {
                tile_max = max(tile_max, weights[lane * params.tile + c]);
            }
            var a = 1.0;                       // exact 1 when the max does not move
            if (!started) {
                a = 0.0;                       // acc and l are still 0
                if (lo < visible) {
                    m = tile_max;              // the row's first visible key is in this tile
                    started = true;
                }
            } else if (lo < visible && tile_max > m) {
                a = exp(m - tile_max);
                m = tile_max;
            }
            var tile_l = 0.0;
            for (var c = 0u; c < params.tile; c++) {
                var p = 0.0;
                if (c >= lo && c < visible) {
                    p = exp(weights[lane * params.tile + c] - m);
                }
                weights[lane * params.tile + c] = p;
                tile_l += p;
            }
            l = l * a + tile_l;
            alpha[lane] = a;
        }
        // 3b. V tile into the buffer K used (the scores are done with it).
        for (var i = lane; i < params.tile * e4; i += WG) {
            let c = i / e4;
            var value = vec4<f32>(0.0);
            if (c < keys_here) {
                value = vec4<f32>(v_cache[(kv_base + key0 + c) * e4 + i % e4]);
            }
            kv_tile[c * STRIDE + i % e4] = value;
        }
        workgroupBarrier();

        // 4. acc = acc * alpha + P V for the slots this invocation owns.
        for (var s = 0u; s < ACC_SLOTS; s++) {
            let slot = lane + s * WG;
            if (slot < params.rows * e4) {
                let r = slot / e4;
                let d = slot % e4;
                var tile_acc = vec4<f32>(0.0);
                for (var c = 0u; c < keys_here; c++) {
                    tile_acc += weights[r * params.tile + c] * kv_tile[c * STRIDE + d];
                }
                acc[s] = acc[s] * alpha[r] + tile_acc;
            }
        }
    }

    if (lane < rows_here) {
        row_sum[lane] = l;
    }
    workgroupBarrier();
    for (var s = 0u; s < ACC_SLOTS; s++) {
        let slot = lane + s * WG;
        if (slot < rows_here * e4) {
            let r = row0 + slot / e4;
            let head = kv_head * g_size + r % g_size;
            out[((r / g_size) * params.n_heads + head) * e4 + slot % e4] = acc[s] / row_sum[slot / e4];
        }
    }
}
