// Logits reductions for decode: argmax and top-k over the f32 logits [V], so the host reads
// back a few bytes instead of the whole vocabulary. Host side: py/webslm/kernels/logits.py.
//
// Both reductions run as two dispatches of one submit:
//   pass 1  "partial"  G = params.groups workgroups; workgroup g reduces the chunk
//                      [g * chunk, min((g + 1) * chunk, V)) to its best k entries
//   pass 2  "merge"    one workgroup reduces the G * k partial entries to the best k
// so a large vocabulary keeps many workgroups busy, and only pass 2 is serial.
//
// THE ORDER (the sampler's canonical order, py/webslm/semantic/sampler.py canonical_top_k):
// value descending, then index ascending; -0.0 equals +0.0; NaN ranks below everything,
// -inf included (so NaN is chosen only when fewer than k entries are not NaN); +inf ranks
// first. Comparisons never touch floating point: each logit is read as its u32 bit pattern
// and mapped to an unsigned key (order_key) whose integer order is that order. So denormals
// are never flushed, NaN is detected from its bits (not x != x, which compilers may fold),
// and no compiler's fast-math assumption can change a result.
//
// Bindings (group 0), by entry point:
//   argmax_partial, topk_partial           argmax_merge, topk_merge
//   0 params: Params (uniform)             0 params: Params (uniform)
//   1 logits: [V] u32 (f32 bits)           1 logits: [V] u32 (f32 bits)
//   2 partials_out: [2 G k + G] u32        2 partials_in: [2 G k + G] u32
//                                          3 result: [2 k + 1] u32
// partials (per pass-1 workgroup g, entry j < k, in rank order):
//   [2 (g k + j)] = key, [2 (g k + j) + 1] = index;   [2 G k + g] = NaN count of chunk g
// result:
//   [j] = index of rank j (j < k),   [k + j] = its logit's bits, exactly as read,
//   [2 k] = number of NaN logits (any non-zero count means the model is broken)
// Argmax is the same layout with k = 1.
//
// Uniformity: every workgroupBarrier is reached by the whole workgroup. Loops that contain
// barriers have bounds computed from params, overrides and workgroupUniformLoad values only;
// per-invocation work inside them is masked by `if`s that contain no barrier.

override WG: u32 = 256u;     // invocations per workgroup: 64, 128 or 256 (host: device limits)
override KMAX: u32 = 64u;    // top-k capacity: 64, 128 or 256 (host: smallest >= k)

const NONE: u32 = 0xffffffffu;   // index of "no entry"; with key 0 it ranks below every logit
const TILE: u32 = 1024u;         // top-k working set in workgroup memory: 1024 x 8 bytes
const LOAD: u32 = 512u;          // logits (or partial entries) a top-k workgroup reads per step

struct Params {
    vocab: u32,    // V: 1 <= V < 2^32
    k: u32,        // entries wanted: argmax 1; top-k 1 <= k <= min(V, KMAX)
    chunk: u32,    // logits per pass-1 workgroup: a multiple of WG (argmax) or LOAD (top-k)
    groups: u32,   // G = ceil(V / chunk): pass-1 workgroups, partial lists of pass 2
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> logits: array<u32>;
@group(0) @binding(2) var<storage, read_write> partials_out: array<u32>;   // pass 1 only
@group(0) @binding(2) var<storage, read> partials_in: array<u32>;          // pass 2 only
@group(0) @binding(3) var<storage, read_write> result: array<u32>;         // pass 2 only

// -- the order -------------------------------------------------------------------------------

fn is_nan_bits(bits: u32) -> bool {
    return (bits & 0x7fffffffu) > 0x7f800000u;   // exponent all ones, mantissa non-zero
}

// A key whose unsigned order is the logits' order: NaN -> 0 (below -inf, whose key is
// 0x007fffff); -0 -> the key of +0; negatives -> the complement of their bits (a larger
// magnitude gives a smaller key); positives -> their bits with the top bit set.
fn order_key(bits: u32) -> u32 {
    if (is_nan_bits(bits)) {
        return 0u;
    }
    if ((bits & 0x7fffffffu) == 0u) {
        return 0x80000000u;
    }
    if (bits >= 0x80000000u) {
        return ~bits;
    }
    return bits | 0x80000000u;
}

// Whether entry a ranks before entry b: higher key first, then lower index. Entries are never
// equal in both (indices are distinct), so this is a strict total order.
fn ranks_before(key_a: u32, index_a: u32, key_b: u32, index_b: u32) -> bool {
    return key_a > key_b || (key_a == key_b && index_a < index_b);
}

fn nan_offset() -> u32 {
    return 2u * params.groups * params.k;
}

// -- argmax: each invocation scans, then the workgroup keeps the best ----------------------

struct Best {
    key: u32,
    index: u32,
    nans: u32,     // NaN logits seen
}

fn no_best() -> Best {
    return Best(0u, NONE, 0u);
}

fn better(a: Best, key: u32, index: u32) -> Best {
    if (ranks_before(key, index, a.key, a.index)) {
        return Best(key, index, a.nans);
    }
    return a;
}

// Pass 1, per invocation: a coalesced stride over this workgroup's chunk.
fn scan_logits(group: u32, lane: u32) -> Best {
    let start = group * params.chunk;                 // < V: group < groups = ceil(V / chunk)
    let count = min(params.chunk, params.vocab - start);
    var best = no_best();
    for (var o = lane; o < count; o += WG) {          // o + WG cannot wrap: count <= chunk < 2^31
        let bits = logits[start + o];
        best = better(best, order_key(bits), start + o);
        best.nans += select(0u, 1u, is_nan_bits(bits));
    }
    return best;
}

// Pass 2, per invocation: a stride over the G partial results.
fn scan_partials(lane: u32) -> Best {
    var best = no_best();
    for (var g = lane; g < params.groups; g += WG) {
        best = better(best, partials_in[2u * g], partials_in[2u * g + 1u]);
        best.nans += partials_in[nan_offset() + g];
    }
    return best;
}

fn store_partial(group: u32, best: Best) {
    partials_out[2u * group] = best.key;
    partials_out[2u * group + 1u] = best.index;
    partials_out[nan_offset() + group] = best.nans;
}

fn store_result(best: Best) {
    result[0] = best.index;
    result[1] = logits[best.index];   // index < V: there is at least one logit
    result[2] = best.nans;
}

var<workgroup> tree_key: array<u32, WG>;
var<workgroup> tree_index: array<u32, WG>;
var<workgroup> tree_nans: array<u32, WG>;

// The workgroup's best entry and NaN total, by a tree in workgroup memory (log2 WG barriers).
// Call from uniform control flow; every invocation gets the result.
fn workgroup_best(lane: u32, mine: Best) -> Best {
    tree_key[lane] = mine.key;
    tree_index[lane] = mine.index;
    tree_nans[lane] = mine.nans;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            let other = lane + stride;
            if (ranks_before(tree_key[other], tree_index[other], tree_key[lane], tree_index[lane])) {
                tree_key[lane] = tree_key[other];
                tree_index[lane] = tree_index[other];
            }
            tree_nans[lane] += tree_nans[other];
        }
        workgroupBarrier();
    }
    return Best(tree_key[0], tree_index[0], tree_nans[0]);
}

// Workgroup ids past the last group return before any barrier; the group id is the same for
// the whole workgroup, so the return is uniform.
@compute @workgroup_size(WG)
fn argmax_partial(@builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) grid: vec3<u32>,
                  @builtin(local_invocation_index) lane: u32) {
    let group = wid.x + wid.y * grid.x;
    if (group >= params.groups) {
        return;
    }
    let best = workgroup_best(lane, scan_logits(group, lane));
    if (lane == 0u) {
        store_partial(group, best);
    }
}

@compute @workgroup_size(WG)
fn argmax_merge(@builtin(local_invocation_index) lane: u32) {
    let best = workgroup_best(lane, scan_partials(lane));
    if (lane == 0u) {
        store_result(best);
    }
}

// -- top-k: a filtered stream into a sorted working set --------------------------------------
//
// Workgroup memory holds up to TILE entries (key, index): [0, kept) the best KMAX entries so
// far, in rank order (kept = 0 until the first sort, then KMAX), then `appended` candidates.
// A candidate is appended only if it ranks before the current k-th best (the threshold),
// which only rises, so a rejected one can never be in the answer. Candidates arrive LOAD per
// step (each invocation fetches its next step's share before the step's barrier, so memory
// latency overlaps the barrier and any sort). The workgroup sorts kept + appended entries
// (bitonic, padded with "no entry" to a power of two >= KMAX) after the first step (to get a
// threshold early), after the last, and whenever the next step might not fit
// (kept + appended + LOAD > TILE); it keeps the first KMAX and reads the new threshold.
// On random logits the threshold soon rejects almost everything, so a step costs a read and
// a barrier; on ascending logits (the worst case) every step sorts. The append order depends
// on atomics, but the sort makes the result exact.

var<workgroup> tile: array<vec2<u32>, TILE>;   // (key, index)
var<workgroup> appended: atomic<u32>;           // candidates at [kept, kept + appended)
var<workgroup> appended_now: u32;               // its value after a step, for workgroupUniformLoad
var<workgroup> nan_total: atomic<u32>;

const NO_ENTRY = vec2<u32>(0u, NONE);
const MAX_HELD = 8u;                            // LOAD / WG for the smallest WG (64)

fn entry_before(a: vec2<u32>, b: vec2<u32>) -> bool {
    return ranks_before(a.x, a.y, b.x, b.y);
}

fn topk_begin(lane: u32) {
    if (lane == 0u) {
        atomicStore(&appended, 0u);
        atomicStore(&nan_total, 0u);
    }
    workgroupBarrier();
}

fn offer(entry: vec2<u32>, bar: vec2<u32>, kept: u32) {
    if (entry_before(entry, bar)) {
        tile[kept + atomicAdd(&appended, 1u)] = entry;   // < TILE: see must_sort
    }
}

// After a step's offers: how many candidates are appended (the same in every invocation).
fn step_count(lane: u32) -> u32 {
    workgroupBarrier();                                  // every offer of the step is stored
    if (lane == 0u) {
        appended_now = atomicLoad(&appended);
    }
    return workgroupUniformLoad(&appended_now);
}

fn must_sort(kept: u32, count: u32, last: bool) -> bool {
    return count > 0u && (last || kept == 0u || kept + count + LOAD > TILE);
}

// One compare-exchange in registers: (first, second) in rank order, or reversed.
struct Pair {
    first: vec2<u32>,
    second: vec2<u32>,
}

fn exchange(a: vec2<u32>, b: vec2<u32>, rank_order: bool) -> Pair {
    let keep = entry_before(a, b) == rank_order;
    return Pair(select(b, a, keep), select(a, b, keep));
}

// Sorts tile[0, n) into rank order; n is a power of two in [4, TILE], the same in every
// invocation. Two strides (2h, h) share one barrier: invocation q takes the four entries
// i, i + h, i + 2h, i + 3h (i = q with zero bits inserted at h and 2h), which those two
// strides only exchange among themselves. Blocks with (i & size) == 0 go into rank order,
// the others reversed; the last size (= n) is all rank order.
fn bitonic_sort(lane: u32, n: u32) {
    for (var size = 2u; size <= n; size *= 2u) {
        var stride = size / 2u;
        while (stride > 0u) {
            if (stride >= 2u) {
                let h = stride / 2u;
                for (var q = lane; q < n / 4u; q += WG) {
                    let i = (q / h) * 4u * h + q % h;
                    let rank_order = (i & size) == 0u;
                    let far0 = exchange(tile[i], tile[i + 2u * h], rank_order);
                    let far1 = exchange(tile[i + h], tile[i + 3u * h], rank_order);
                    let near0 = exchange(far0.first, far1.first, rank_order);
                    let near1 = exchange(far0.second, far1.second, rank_order);
                    tile[i] = near0.first;
                    tile[i + h] = near0.second;
                    tile[i + 2u * h] = near1.first;
                    tile[i + 3u * h] = near1.second;
                }
                stride /= 4u;
            } else {
                for (var p = lane; p < n / 2u; p += WG) {
                    let i = 2u * p;
                    let pair = exchange(tile[i], tile[i + 1u], (i & size) == 0u);
                    tile[i] = pair.first;
                    tile[i + 1u] = pair.second;
                }
                stride = 0u;
            }
            workgroupBarrier();
        }
    }
}

// Sorts the kept and appended entries and empties the append area.
fn sort_working_set(lane: u32, kept: u32, count: u32) {
    if (lane == 0u) {
        atomicStore(&appended, 0u);                      // before the next offers: barriers below
    }
    let used = kept + count;
    var n = KMAX;
    while (n < used) {
        n *= 2u;
    }
    for (var i = used + lane; i < n; i += WG) {
        tile[i] = NO_ENTRY;
    }
    workgroupBarrier();
    bitonic_sort(lane, n);
}

// The NaN total of the workgroup, once every invocation has added its count.
fn topk_nans(lane: u32, mine: u32) -> u32 {
    atomicAdd(&nan_total, mine);
    workgroupBarrier();
    return atomicLoad(&nan_total);
}

fn fetch_logits(held: ptr<function, array<u32, MAX_HELD>>, start: u32, count: u32, base: u32, lane: u32) {
    for (var j = 0u; j < LOAD / WG; j++) {
        let o = base + j * WG + lane;
        if (o < count) {
            (*held)[j] = logits[start + o];
        }
    }
}

@compute @workgroup_size(WG)
fn topk_partial(@builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) grid: vec3<u32>,
                @builtin(local_invocation_index) lane: u32) {
    let group = wid.x + wid.y * grid.x;
    if (group >= params.groups) {
        return;                                          // uniform: see argmax_partial
    }
    let start = group * params.chunk;
    let count = min(params.chunk, params.vocab - start);
    topk_begin(lane);
    var kept = 0u;
    var bar = NO_ENTRY;
    var nans = 0u;
    var held: array<u32, MAX_HELD>;
    fetch_logits(&held, start, count, 0u, lane);
    for (var base = 0u; base < count; base += LOAD) {
        for (var j = 0u; j < LOAD / WG; j++) {
            let o = base + j * WG + lane;
            if (o < count) {
                nans += select(0u, 1u, is_nan_bits(held[j]));
                offer(vec2<u32>(order_key(held[j]), start + o), bar, kept);
            }
        }
        fetch_logits(&held, start, count, base + LOAD, lane);   // the next step's, early
        let appended_count = step_count(lane);
        if (must_sort(kept, appended_count, base + LOAD >= count)) {
            sort_working_set(lane, kept, appended_count);
            kept = KMAX;
            bar = tile[params.k - 1u];
        }
    }
    let nan_count = topk_nans(lane, nans);
    for (var j = lane; j < params.k; j += WG) {
        let at = 2u * (group * params.k + j);
        partials_out[at] = tile[j].x;
        partials_out[at + 1u] = tile[j].y;
    }
    if (lane == 0u) {
        partials_out[nan_offset() + group] = nan_count;
    }
}

fn fetch_partials(held: ptr<function, array<vec2<u32>, MAX_HELD>>, count: u32, base: u32, lane: u32) {
    for (var j = 0u; j < LOAD / WG; j++) {
        let c = base + j * WG + lane;
        if (c < count) {
            (*held)[j] = vec2<u32>(partials_in[2u * c], partials_in[2u * c + 1u]);
        }
    }
}

@compute @workgroup_size(WG)
fn topk_merge(@builtin(local_invocation_index) lane: u32) {
    let count = params.groups * params.k;                // partial entries
    topk_begin(lane);
    var kept = 0u;
    var bar = NO_ENTRY;
    var held: array<vec2<u32>, MAX_HELD>;
    fetch_partials(&held, count, 0u, lane);
    for (var base = 0u; base < count; base += LOAD) {
        for (var j = 0u; j < LOAD / WG; j++) {
            if (base + j * WG + lane < count) {
                offer(held[j], bar, kept);
            }
        }
        fetch_partials(&held, count, base + LOAD, lane);
        let appended_count = step_count(lane);
        if (must_sort(kept, appended_count, base + LOAD >= count)) {
            sort_working_set(lane, kept, appended_count);
            kept = KMAX;
            bar = tile[params.k - 1u];
        }
    }
    var nans = 0u;
    for (var g = lane; g < params.groups; g += WG) {
        nans += partials_in[nan_offset() + g];
    }
    let nan_count = topk_nans(lane, nans);
    let k = params.k;
    for (var j = lane; j < k; j += WG) {
        let index = tile[j].y;
        result[j] = index;
        result[k + j] = logits[index];                   // index < V: k <= V real entries
    }
    if (lane == 0u) {
        result[2u * k] = nan_count;
    }
}
