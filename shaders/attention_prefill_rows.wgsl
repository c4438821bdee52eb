// Prefill attention, one query row per invocation: T new tokens at positions
// start..start+T-1, causal, as attention_prefill.wgsl computes it (same params, bindings,
// row order and error rule), for head_dim <= 64.
//
//   out[t, h, :] = sum_{j <= start+t} softmax_j(scale * q[t, h] . K[kv(h), j]) * V[kv(h), j]
//
// Query rows of one KV head are the (token, head-in-group) pairs, token-major. A workgroup of
// ROWS invocations takes ROWS consecutive rows; invocation i keeps row i's pre-scaled q and its
// output accumulator in registers (2 HD4 vec4s) and walks the keys 0..(the block's last
// visible key) in tiles of TILE keys. Per tile, every invocation reads the same K and V rows
// from workgroup memory (broadcasts: no bank conflicts), so per key and row it does E FMAs
// for the score and E for P V. Online softmax per tile as in attention_prefill.wgsl: the
// tile's max, the rescale alpha = exp(m_old - m_new) only when the max moves (exactly 1
// otherwise), weights exp(s - m), and the tile's sums formed before they are added, so every
// weight meets tile + 2 tiles + 2 roundings and tiles + 1 exps (attention.py's rule).
//
// Pipeline: K and V tiles are double-buffered; the next tile's rows are loaded into registers
// before this tile's scores and stored into the other buffer after its P V, one barrier a
// tile. Blocks run longest first (the last rows see the most keys), so the short ones fill
// the tail. Masked keys (past a row's causal end) get weight exactly 0; keys past the block's
// last visible key are never read (the cache rows past the context may hold anything).
// Sliding window (window > 0) as in attention_prefill.wgsl: the walk starts at the tile of the
// block's first visible key, and keys before a row's window get weight exactly 0.
//
// Workgroup memory: 2 stages x (K + V) x TILE x HD4 vec4s = 16 KiB at head_dim 64.

override HD4: u32 = 16u;          // head_dim / 4: 1..16

const ROWS: u32 = 64u;            // query rows per workgroup = invocations
const TILE: u32 = 16u;            // keys per tile
const HD4_MAX: u32 = 16u;         // the register arrays are sized for head_dim 64
const FETCH_MAX: u32 = 4u;        // TILE * HD4 / ROWS vec4s of K (and of V) per invocation and tile

struct Params {
    n_heads: u32,       // H
    n_kv_heads: u32,    // K, divides H
    head_dim: u32,      // E = 4 * HD4 (the kernel uses HD4)
    capacity: u32,      // positions per KV head in the cache buffers
    start: u32,         // position of the first new token
    n_tokens: u32,      // T
    rows: u32,          // query rows per workgroup (ROWS)
    tile: u32,          // keys per tile (TILE)
    row_blocks: u32,    // ceil(T * G / ROWS)
    n_groups: u32,      // K * row_blocks
    scale: f32,
    window: u32,        // a sliding window's length; 0: every earlier key is visible
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;        // [T][H * E / 4]
@group(0) @binding(2) var<storage, read> k_cache: array<kv4>;        // [K][capacity][E / 4]
@group(0) @binding(3) var<storage, read> v_cache: array<kv4>;        // [K][capacity][E / 4]
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;  // [T][H * E / 4]

var<workgroup> k_tile: array<vec4<f32>, 2u * TILE * HD4>;   // [stage][key][HD4]
var<workgroup> v_tile: array<vec4<f32>, 2u * TILE * HD4>;

// The first key the query at position `last` sees (its own position is its last key).
fn first_visible(last: u32) -> u32 {
    if (params.window == 0u || last < params.window) {
        return 0u;
    }
    return last + 1u - params.window;
}

fn fetch_items() -> u32 {
    return (TILE * HD4 + ROWS - 1u) / ROWS;
}

// Item r of this invocation's share of a tile: (key c, quad d), zero past the last key.
fn cache_index(kv_base: u32, key0: u32, last_key: u32, lane: u32, r: u32) -> i32 {
    let item = lane + r * ROWS;
    let c = item / HD4;
    if (item >= TILE * HD4 || key0 + c > last_key) {
        return -1;
    }
    return i32((kv_base + key0 + c) * HD4 + item % HD4);
}

fn fetch_k(index: i32) -> vec4<f32> {
    return select(vec4<f32>(0.0), vec4<f32>(k_cache[max(index, 0)]), index >= 0);
}

fn fetch_v(index: i32) -> vec4<f32> {
    return select(vec4<f32>(0.0), vec4<f32>(v_cache[max(index, 0)]), index >= 0);
}

fn store_kv(stage: u32, lane: u32, r: u32, k: vec4<f32>, v: vec4<f32>) {
    let item = lane + r * ROWS;
    if (item < TILE * HD4) {
        k_tile[stage * TILE * HD4 + item] = k;
        v_tile[stage * TILE * HD4 + item] = v;
    }
}

@compute @workgroup_size(ROWS)
fn prefill_rows(@builtin(workgroup_id) group: vec3<u32>,
                @builtin(num_workgroups) groups: vec3<u32>,
                @builtin(local_invocation_index) lane: u32) {
    let wid = group.x + group.y * groups.x;
    if (wid >= params.n_groups) {
        return;  // the whole workgroup leaves together: barriers below stay uniform
    }
    let g_size = params.n_heads / params.n_kv_heads;
    let kv_head = wid / params.row_blocks;
    let block = params.row_blocks - 1u - wid % params.row_blocks;   // longest first
    let row0 = block * ROWS;
    let n_rows = params.n_tokens * g_size;
    let rows_here = min(ROWS, n_rows - row0);
    let last_key = params.start + (row0 + rows_here - 1u) / g_size;   // the block's last visible key
    let n_tiles = last_key / TILE + 1u;
    let first_tile = first_visible(params.start + row0 / g_size) / TILE;   // the block's first row
    let kv_base = kv_head * params.capacity;

    let my_row = row0 + lane;
    let live = my_row < n_rows;
    let row = min(my_row, n_rows - 1u);                  // rows past the end compute row n_rows - 1
    let head = kv_head * g_size + row % g_size;
    let out_base = ((row / g_size) * params.n_heads + head) * HD4;
    let my_last_key = params.start + row / g_size;       // causal limit of this row
    let my_first_key = first_visible(my_last_key);       // its window's start

    var qr: array<vec4<f32>, HD4_MAX>;
    var o: array<vec4<f32>, HD4_MAX>;
    for (var d = 0u; d < HD4; d++) {
        qr[d] = q[out_base + d] * params.scale;
    }

    for (var r = 0u; r < fetch_items(); r++) {           // the first tile straight into stage 0
        let index = cache_index(kv_base, first_tile * TILE, last_key, lane, r);
        store_kv(0u, lane, r, fetch_k(index), fetch_v(index));
    }
    workgroupBarrier();

    var m = 0.0;
    var l = 0.0;
    var started = false;                                 // has this row seen a key yet
    var k_next: array<vec4<f32>, FETCH_MAX>;
    var v_next: array<vec4<f32>, FETCH_MAX>;
    for (var t = first_tile; t < n_tiles; t++) {
        let key0 = t * TILE;
        let base = ((t - first_tile) % 2u) * TILE * HD4;
        let more = t + 1u < n_tiles;
        if (more) {   // the next tile's loads land while this one is computed
            for (var r = 0u; r < fetch_items(); r++) {
                let index = cache_index(kv_base, key0 + TILE, last_key, lane, r);
                k_next[r] = fetch_k(index);
                v_next[r] = fetch_v(index);
            }
        }

        var s = array<f32, TILE>();   // explicitly zero: naga would not re-zero a loop's plain `var`
        for (var d = 0u; d < HD4; d++) {
            let qd = qr[d];
            for (var c = 0u; c < TILE; c++) {
                s[c] += dot(qd, k_tile[base + c * HD4 + d]);
            }
        }
        // Keys lo .. visible - 1 of the tile are this row's (window start, causal end).
        let visible = select(0u, min(TILE, my_last_key + 1u - key0), my_last_key >= key0);
        let lo = select(0u, my_first_key - key0, my_first_key > key0);
        var tile_max = -3.402823e38;
        for (var c = 0u; c < TILE; c++) {
            if (c >= lo && c < visible) {
                tile_max = max(tile_max, s[c]);
            }
        }
        var a = 1.0;                       // exact 1 when the max does not move
        if (!started) {
            a = 0.0;                       // o and l are still 0
            if (lo < visible) {
                m = tile_max;              // the row's first visible key is in this tile
                started = true;
            }
        } else if (lo < visible && tile_max > m) {
            a = exp(m - tile_max);
            m = tile_max;
        }
        var tile_l = 0.0;
        for (var c = 0u; c < TILE; c++) {
            s[c] = select(0.0, exp(s[c] - m), c >= lo && c < visible);   // now the weight p_c
            tile_l += s[c];
        }
        l = l * a + tile_l;
        for (var d = 0u; d < HD4; d++) {
            var tile_acc = vec4<f32>(0.0);
            for (var c = 0u; c < TILE; c++) {
                tile_acc += s[c] * v_tile[base + c * HD4 + d];
            }
            o[d] = o[d] * a + tile_acc;
        }

        if (more) {
            for (var r = 0u; r < fetch_items(); r++) {
                store_kv((t + 1u - first_tile) % 2u, lane, r, k_next[r], v_next[r]);
            }
        }
        workgroupBarrier();   // the next tile is complete; this one may be overwritten after it
    }

    if (live) {
        for (var d = 0u; d < HD4; d++) {
            out[out_base + d] = o[d] / l;
        }
    }
}
