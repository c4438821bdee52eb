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
// A workgroup owns one "pair block" of one head: ROWS rows (4, 8 or 16) whose RoPE partners are
// among them. Rotate-half (ADJACENT 0): rows i .. i + ROWS/2 - 1 of the head and the ROWS/2 rows
// half a head further; adjacent-pair (ADJACENT 1): ROWS consecutive rows. It computes them in
// one pass over x as the plain kernel computes ROWS consecutive rows (pair_block: the same
// per-lane sums and reduction, so y is the plain kernel's bit for bit before the rotation, and
// as many workgroups as the plain launch with this ROWS), keeps the values in workgroup memory,
// then each lane that stored a row rotates it with its partner (a' = a cos - b sin, b' = b cos
// + a sin: rope_kv_append's expressions) and writes it: q back into y (the same invocation
// stored it, so no barrier orders the two writes), k and v into the caches, an f16 word by the
// lane of its even element.
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
    pair_blocks: u32,              // E / ROWS: pair blocks a head
    _pad: u32,
}

@group(0) @binding(X_BINDING + INPUT_BINDINGS) var<uniform> rope: RopeWords;
@group(0) @binding(X_BINDING + INPUT_BINDINGS + 1u) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(X_BINDING + INPUT_BINDINGS + 2u) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(X_BINDING + INPUT_BINDINGS + 3u) var<storage, read_write> v_cache: array<u32>;

// Its overrides, ADJACENT and KV_F16, are in matvec_rope_kv_overrides.wgsl.

var<workgroup> block_rows: array<f32, 16>;    // [ROWS]: the pair block's y values
var<workgroup> cached_rows: array<u32, 16>;   // [ROWS]: k or v values as f32 bits, for the caches

// Local row r (0 .. ROWS) of the pair block: its row in y. The first half is block A.
fn pair_row(first_a: u32, first_b: u32, r: u32) -> u32 {
    return select(first_b + r - ROWS / 2u, first_a + r, r < ROWS / 2u);
}

// Unit u's contribution to local rows r0 .. r0 + 3 (matvec_main.wgsl unit_dot over the pair
// block's rows; ROWS is 4, 8 or 16, a constant: the `if`s fold away).
fn pair_dot(xu: UnitX, u: u32, first_a: u32, first_b: u32, r0: u32) -> vec4<f32> {
    return vec4<f32>(row_dot(xu, u, pair_row(first_a, first_b, r0)),
                     row_dot(xu, u, pair_row(first_a, first_b, r0 + 1u)),
                     row_dot(xu, u, pair_row(first_a, first_b, r0 + 2u)),
                     row_dot(xu, u, pair_row(first_a, first_b, r0 + 3u)));
}

// The pair block's ROWS rows in one pass over x, as row_block does for consecutive rows: the
// same per-lane sums and reduction, so each row's value is the plain kernel's with this WG.
// Lane r < ROWS stores local row r in y and returns it (else 0). Uniform control flow.
fn pair_block(first_a: u32, first_b: u32, lane: u32) -> f32 {
    var sums = Partials(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var u = lane; u < params.units; u += WG) {
        let xu = load_x(u, 0u);
        sums.rows_0_3 += pair_dot(xu, u, first_a, first_b, 0u);
        if (ROWS > 4u) {
            sums.rows_4_7 += pair_dot(xu, u, first_a, first_b, 4u);
        }
        if (ROWS > 8u) {
            sums.rows_8_11 += pair_dot(xu, u, first_a, first_b, 8u);
            sums.rows_12_15 += pair_dot(xu, u, first_a, first_b, 12u);
        }
    }
    let scale = input_finish(lane, 0u);     // barriers inside: uniform control flow here
    let total = row_sums(sums, lane);
    var value = 0.0;
    if (lane < ROWS) {
        value = scaled(total, scale);
        y[pair_row(first_a, first_b, lane)] = value;
    }
    return value;
}

@compute @workgroup_size(WG)
fn main_rope_kv(@builtin(workgroup_id) group: vec3<u32>,
                @builtin(num_workgroups) groups: vec3<u32>,
                @builtin(local_invocation_index) lane: u32) {
    let block = group.x + group.y * groups.x;
    if (block * ROWS >= params.rows) {
        return;  // the whole workgroup leaves together: barriers below stay uniform
    }
    let half_rows = ROWS / 2u;
    let head_first = (block / rope.pair_blocks) * rope.head_dim;     // the head's first row
    let within = block % rope.pair_blocks;
    var first_a = head_first + within * half_rows;                   // rotate-half
    var first_b = first_a + rope.half;
    if (ADJACENT == 1u) {
        first_a = head_first + within * ROWS;                        // adjacent-pair
        first_b = first_a + half_rows;
    }
    let own = pair_block(first_a, first_b, lane);
    if (lane < ROWS) {
        block_rows[lane] = own;
    }
    workgroupBarrier();

    // Lane r < ROWS finishes local row r: it stored that row in y.
    if (lane < ROWS) {
        let row = pair_row(first_a, first_b, lane);
        let e = row - head_first;                                    // element within the head
        var partner = select(lane - half_rows, lane + half_rows, lane < half_rows);
        var pair = select(e - rope.half, e, e < rope.half);
        var second = e >= rope.half;
        if (ADJACENT == 1u) {
            partner = lane ^ 1u;
            pair = e / 2u;
            second = (e & 1u) == 1u;
        }
        var value = own;
        if (row < rope.q_rows + rope.kv_rows) {                      // q and k rotate, v does not
            let angle = table[rope.start * rope.half + pair];
            let other = block_rows[partner];
            value = select(own * angle.x - other * angle.y, own * angle.x + other * angle.y, second);
        }
        if (row < rope.q_rows) {
            y[row] = value;
        }
        cached_rows[lane] = bitcast<u32>(value);
    }
    workgroupBarrier();

    // The cache rows: element e of KV head h at (h * capacity + start) * E + e.
    if (head_first < rope.q_rows) {
        return;     // a q head: nothing cached (uniform: the whole workgroup leaves)
    }
    let is_v = head_first >= rope.q_rows + rope.kv_rows;
    let kv_first = head_first - rope.q_rows - select(0u, rope.kv_rows, is_v);
    let cache_row = ((kv_first / rope.head_dim) * rope.capacity + rope.start) * rope.head_dim;
    if (lane < ROWS) {
        let e = pair_row(first_a, first_b, lane) - head_first;
        if (KV_F16) {
            if ((lane & 1u) == 0u) {  // local rows r and r + 1 are elements e and e + 1 (ROWS / 2 is even)
                let word = f16_bits(cached_rows[lane]) | (f16_bits(cached_rows[lane + 1u]) << 16u);
                let at = (cache_row + e) / 2u;
                if (is_v) {
                    v_cache[at] = word;
                } else {
                    k_cache[at] = word;
                }
            }
        } else if (is_v) {
            v_cache[cache_row + e] = cached_rows[lane];
        } else {
            k_cache[cache_row + e] = cached_rows[lane];
        }
    }
}
