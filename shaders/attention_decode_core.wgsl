// The shared body of the decode attention chunk passes (attention_decode.wgsl: decode_chunk
// and combine; attention_decode_rope.wgsl: decode_chunk_rope, RoPE and the KV append fused in).
// Listed in the registry's `sources` after the cache prelude and before the file with the
// entry points, which must declare:
//   params                 a uniform struct whose first ten fields are those of attention_decode's
//                          Params (n_heads .. scale, same names and meaning)
//   cached_key(at), cached_value(at) -> vec4<f32>
//                          the cache's vec4 at index `at` ((kv_head * capacity + pos) * HD4 + c),
//                          widened exactly to f32
//   first_key() -> u32     the position of key 0 of the chunks: 0, or where a sliding window
//                          starts (the n_keys keys are positions first_key() .. first_key() + n_keys - 1)
// The algorithm (phases 2..5 of one chunk: scores, exact max, weights, weighted V sum, write)
// is described in attention_decode.wgsl. The functions here hold no barriers: the entry
// points call them between their workgroupBarrier()s, so barriers stay in uniform control flow.

override WG: u32 = 64u;   // invocations per workgroup; allowlist 64, 128, 256 (registry)
override GW: u32 = 1u;    // query heads per workgroup, 1..8, GW * HD4 <= 256; the host picks it
override HD4: u32 = 16u;  // head_dim / 4, 1..64: a constant, so the loops over a row unroll

const SCORE_WORDS = 2048u;   // scores of one chunk: GW * chunk <= 2048 (8 KiB)
const QV_SLOTS = 256u;       // vec4 slots: GW * head_dim / 4 <= 256 (4 KiB)

@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;     // [H * E / 4]
@group(0) @binding(5) var<storage, read_write> part_acc: array<vec4<f32>>; // [H][n_chunks][E / 4]: unnormalized sums
@group(0) @binding(6) var<storage, read_write> part_ml: array<vec2<f32>>;  // [H][n_chunks]: (max m, sum l)

// q rows (pre-scaled) during the score phase; afterwards the per-slice partial sums of V.
var<workgroup> qv: array<vec4<f32>, QV_SLOTS>;
var<workgroup> part_l: array<f32, QV_SLOTS>;          // per-slice partial sums of weights
var<workgroup> scores: array<f32, SCORE_WORDS>;       // [GW][chunk]: scores, then weights
var<workgroup> max_code: array<atomic<u32>, 8>;       // per head: order-preserving code of the max score

// f32 -> u32 with a < b  <=>  code(a) < code(b) for non-NaN values (flip the sign bit of
// positives, all bits of negatives), so atomicMax on codes is an exact float max.
fn order_code(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    return select(bits | 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);
}

fn from_order_code(code: u32) -> f32 {
    return bitcast<f32>(select(~code, code & 0x7fffffffu, (code & 0x80000000u) != 0u));
}

// What one workgroup of the chunk pass owns: (KV head, block of its query heads, chunk).
struct ChunkWork {
    chunk_id: u32,
    block: u32,
    kv_head: u32,
    head0: u32,          // first query head of this workgroup
    n_heads_here: u32,   // GW, or fewer in the last block
    key0: u32,           // first key of the chunk, counted from first_key()
    n_here: u32,         // positions in the chunk, >= 1: chunks are never empty
    row0: u32,           // cache row of key key0 (position first_key() + key0)
}

fn chunk_work(wid: u32) -> ChunkWork {
    var w: ChunkWork;
    let g_size = params.n_heads / params.n_kv_heads;
    w.chunk_id = wid % params.n_chunks;
    w.block = (wid / params.n_chunks) % params.head_blocks;
    w.kv_head = wid / (params.n_chunks * params.head_blocks);
    w.head0 = w.kv_head * g_size + w.block * GW;
    w.n_heads_here = min(GW, g_size - w.block * GW);
    w.key0 = w.chunk_id * params.chunk;
    w.n_here = min(params.chunk, params.n_keys - w.key0);
    w.row0 = w.kv_head * params.capacity + first_key() + w.key0;
    return w;
}

// Phase 2: the scores of the chunk's first n_rows positions, read from the cache: one position
// per invocation, all GW heads at once (each K row is read once, as vec4s; consecutive
// invocations read consecutive rows). Each invocation offers its max to max_code.
fn score_rows(lane: u32, w: ChunkWork, n_rows: u32) {
    let e4 = HD4;
    var thread_max: array<f32, 8>;
    for (var g = 0u; g < GW; g++) {
        thread_max[g] = -3.402823e38;
    }
    for (var j = lane; j < n_rows; j += WG) {
        var s: array<f32, 8>;
        for (var g = 0u; g < GW; g++) {
            s[g] = 0.0;
        }
        let row = (w.row0 + j) * e4;
        for (var c = 0u; c < e4; c++) {
            let k = cached_key(row + c);
            for (var g = 0u; g < GW; g++) {
                s[g] += dot(qv[g * e4 + c], k);
            }
        }
        for (var g = 0u; g < GW; g++) {
            scores[g * params.chunk + j] = s[g];
            thread_max[g] = max(thread_max[g], s[g]);
        }
    }
    for (var g = 0u; g < GW; g++) {
        if (lane < n_rows) {  // invocations without a position have no score to offer
            atomicMax(&max_code[g], order_code(thread_max[g]));
        }
    }
}

// Phase 3: weights exp(s - m) <= 1, each invocation on the scores it wrote.
fn weigh_scores(lane: u32, n_here: u32) {
    for (var g = 0u; g < GW; g++) {
        let m = from_order_code(atomicLoad(&max_code[g]));
        for (var j = lane; j < n_here; j += WG) {
            scores[g * params.chunk + j] = exp(scores[g * params.chunk + j] - m);
        }
    }
}

// Phase 4: weighted sum of the V rows of the chunk's first n_rows positions, read from the
// cache. A work item is (slice, head g, column c): the positions are dealt round-robin to
// `slices` slices so that small heads still keep the workgroup busy. Consecutive invocations
// read consecutive vec4s of one V row; four rows per step keep four loads in flight. Item
// `item` leaves its sums in qv[item] and part_l[item] (q is no longer needed: the barrier
// before phase 3 ended phase 2); its invocation is lane + k WG.
fn sum_values(lane: u32, w: ChunkWork, n_rows: u32, pairs: u32, slices: u32) {
    let e4 = HD4;
    for (var item = lane; item < slices * pairs; item += WG) {
        let pair = item % pairs;
        let g = pair / e4;
        let c = pair % e4;
        let s = g * params.chunk;
        var acc = vec4<f32>(0.0);
        var l = 0.0;
        var j = item / pairs;
        for (; j + 3u * slices < n_rows; j += 4u * slices) {
            let p = vec4<f32>(scores[s + j], scores[s + j + slices],
                              scores[s + j + 2u * slices], scores[s + j + 3u * slices]);
            let at = (w.row0 + j) * e4 + c;
            let v0 = cached_value(at);
            let v1 = cached_value(at + slices * e4);
            let v2 = cached_value(at + 2u * slices * e4);
            let v3 = cached_value(at + 3u * slices * e4);
            acc += (p.x * v0 + p.y * v1) + (p.z * v2 + p.w * v3);
            l += (p.x + p.y) + (p.z + p.w);
        }
        for (; j < n_rows; j += slices) {
            let p = scores[s + j];
            acc += p * cached_value((w.row0 + j) * e4 + c);
            l += p;
        }
        qv[item] = acc;
        part_l[item] = l;
    }
}

// Phase 5: add the slices and write, normalized when this chunk is the whole context;
// otherwise the chunk's partials (unnormalized sum, and (m, l)) for the combine pass.
fn write_chunk(lane: u32, w: ChunkWork, pairs: u32, slices: u32) {
    let e4 = HD4;
    for (var pair = lane; pair < pairs; pair += WG) {
        var acc = qv[pair];
        var l = part_l[pair];
        for (var slice = 1u; slice < slices; slice++) {
            acc += qv[pair + slice * pairs];
            l += part_l[pair + slice * pairs];
        }
        let g = pair / e4;
        let c = pair % e4;
        let head = w.head0 + g;
        if (params.n_chunks == 1u) {
            let value = acc / l;
            out[head * e4 + c] = value;
            qv[pair] = value;      // for attention_decode_xq.wgsl (qv[pair] is this lane's alone)
        } else {
            let slot = head * params.n_chunks + w.chunk_id;
            part_acc[slot * e4 + c] = acc;
            if (c == 0u) {
                part_ml[slot] = vec2<f32>(from_order_code(atomicLoad(&max_code[g])), l);
            }
        }
    }
}
