// The stacked q|k|v mat-vec of a decode step (matvec_main.wgsl with its encoding and input
// files, listed before this file) that also does what rope_kv_append.wgsl does after it: q
// rotated in place in y, k rotated and v copied into the layer's K and V cache rows at the
// step's position. One dispatch a layer instead of two.
//
//   y        [rows] f32, rows = (heads + 2 kv_heads) * head_dim: q | k | v, head by head (the
//            plain kernel's output); afterwards q's rows rotated, k's and v's as the plain kernel
//            left them (attention reads K and V from the caches)
//   rope     the same uniform block as `params`, read through RopeWords: the mat-vec's eight
//            words, then the RoPE and cache geometry (the position `start` is what a step rewrites)
//   table    [table_rows][head_dim / 2] (cos, sin) f32, rope.wgsl's table
//   k_cache, v_cache  [kv_heads][capacity][head_dim] as u32 words: f32 bits, or (KV_F16) two
//            f16 per word, element 2w in the low half (f16_bits: round to nearest even)
//
// A workgroup owns one "pair block" of one head: 2 ROWS rows whose RoPE partners are among
// them. Rotate-half (ADJACENT 0): rows i .. i + ROWS - 1 of the head and the ROWS rows half a
// head further; adjacent-pair (ADJACENT 1): 2 ROWS consecutive rows. It computes them as two
// blocks of the plain kernel's work (row_block, so y is the plain kernel's bit for bit before
// the rotation), keeps the values in workgroup memory, then each lane that stored a row
// rotates it with its partner (a' = a cos - b sin, b' = b cos + a sin: rope_kv_append's
// expressions) and writes it: q back into y (the same invocation stored it, so no barrier
// orders the two writes), k and v into the caches, an f16 word by the lane of its even element.
// Whole heads are rotated (rotary_dim == head_dim) and no biases are added: the host uses the
// fused kernel only there (kernels/matvec_rope_kv.py).

struct RopeWords {
    matvec: array<vec4<u32>, 2>,   // the mat-vec's Params (matvec_params.wgsl), read through `params`
    start: u32,                    // the step's position: table row and cache row
    half: u32,                     // head_dim / 2: pairs per head
    head_dim: u32,                 // E
    capacity: u32,                 // cache positions per KV head
    q_rows: u32,                   // heads * E: k's rows start here
    kv_rows: u32,                  // kv_heads * E: v's rows start at q_rows + kv_rows
    pair_blocks: u32,              // E / (2 ROWS): pair blocks a head
    _pad: u32,
}

@group(0) @binding(X_BINDING + INPUT_BINDINGS) var<uniform> rope: RopeWords;
@group(0) @binding(X_BINDING + INPUT_BINDINGS + 1u) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(X_BINDING + INPUT_BINDINGS + 2u) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(X_BINDING + INPUT_BINDINGS + 3u) var<storage, read_write> v_cache: array<u32>;

// Its overrides, ADJACENT and KV_F16, are in matvec_rope_kv_overrides.wgsl.

var<workgroup> block_rows: array<f32, 32>;    // [2 ROWS]: the pair block's y values, block A then B
var<workgroup> cached_rows: array<u32, 32>;   // [2 ROWS]: k or v values as f32 bits, for the caches

// Local row l (0 .. 2 ROWS) of the pair block: its row in y. Block A is l < ROWS.
fn pair_block_row(first_a: u32, first_b: u32, l: u32) -> u32 {
    return select(first_b + l - ROWS, first_a + l, l < ROWS);
}

@compute @workgroup_size(WG)
fn main_rope_kv(@builtin(workgroup_id) group: vec3<u32>,
                @builtin(num_workgroups) groups: vec3<u32>,
                @builtin(local_invocation_index) lane: u32) {
    let block = group.x + group.y * groups.x;
    if (block * 2u * ROWS >= params.rows) {
        return;  // the whole workgroup leaves together: barriers below stay uniform
    }
    let head_first = (block / rope.pair_blocks) * rope.head_dim;     // the head's first row
    let within = block % rope.pair_blocks;
    var first_a = head_first + within * ROWS;                        // rotate-half
    var first_b = first_a + rope.half;
    if (ADJACENT == 1u) {
        first_a = head_first + within * 2u * ROWS;                   // adjacent-pair
        first_b = first_a + ROWS;
    }
    let a = row_block(first_a, 0u, lane);
    if (lane < ROWS) {
        block_rows[lane] = a;
    }
    workgroupBarrier();     // row_sums' workgroup memory is read before the next block writes it
    let b = row_block(first_b, 0u, lane);
    if (lane < ROWS) {
        block_rows[ROWS + lane] = b;
    }
    workgroupBarrier();

    // Lane r < ROWS finishes local rows r (block A) and ROWS + r (block B): it stored both in y.
    for (var side = 0u; side < 2u; side++) {
        let l = lane + side * ROWS;
        if (lane < ROWS) {
            let row = pair_block_row(first_a, first_b, l);
            let e = row - head_first;                                // element within the head
            var partner = select(l - ROWS, l + ROWS, l < ROWS);
            var pair = select(e - rope.half, e, e < rope.half);
            var second = e >= rope.half;
            if (ADJACENT == 1u) {
                partner = l ^ 1u;
                pair = e / 2u;
                second = (e & 1u) == 1u;
            }
            let own = block_rows[l];
            var value = own;
            if (row < rope.q_rows + rope.kv_rows) {                  // q and k rotate, v does not
                let angle = table[rope.start * rope.half + pair];
                let other = block_rows[partner];
                value = select(own * angle.x - other * angle.y, own * angle.x + other * angle.y, second);
            }
            if (row < rope.q_rows) {
                y[row] = value;
            }
            cached_rows[l] = bitcast<u32>(value);
        }
    }
    workgroupBarrier();

    // The cache rows: element e of KV head h at (h * capacity + start) * E + e.
    if (head_first < rope.q_rows) {
        return;     // a q head: nothing cached (uniform: the whole workgroup leaves)
    }
    let is_v = head_first >= rope.q_rows + rope.kv_rows;
    let kv_first = head_first - rope.q_rows - select(0u, rope.kv_rows, is_v);
    let cache_row = ((kv_first / rope.head_dim) * rope.capacity + rope.start) * rope.head_dim;
    for (var l = lane; l < 2u * ROWS; l += WG) {
        let e = pair_block_row(first_a, first_b, l) - head_first;
        if (KV_F16) {
            if ((l & 1u) == 0u) {     // rows l and l + 1 are elements e and e + 1 (ROWS is even)
                let word = f16_bits(cached_rows[l]) | (f16_bits(cached_rows[l + 1u]) << 16u);
                let at = (cache_row + e) / 2u;
                if (is_v) {
                    v_cache[at] = word;
                } else {
                    k_cache[at] = word;
                }
            }
        } else if (is_v) {
            v_cache[cache_row + e] = cached_rows[l];
        } else {
            k_cache[cache_row + e] = cached_rows[l];
        }
    }
}
