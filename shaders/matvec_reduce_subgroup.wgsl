// Row sums for the decode mat-vec kernels through subgroup operations (tier C only).
//
// Every invocation holds partial sums for the same ROWS rows, so one subgroupAdd per row
// is correct however the device groups invocations into subgroups: no assumption about
// subgroup size or about which invocations share a subgroup. Each subgroup's elected
// invocation (the first active one: subgroupBroadcastFirst of the invocation index equals
// its own index in exactly one invocation; naga has no subgroupElect) stores its sums in the
// slot of its own invocation index and sets that index's bit in a workgroup mask (atomicOr:
// the mask comes out the same whatever order the subgroups arrive in); after one barrier,
// invocation r < ROWS adds the slots of row r in invocation order, walking the mask's bits.
// So the sum's order, and the result to the last bit, never depends on timing: the same
// inputs give the same tokens (an earlier version took slots in arrival order, and greedy
// answers of one prompt could differ between runs). The mask is cleared explicitly (behind
// a barrier) rather than trusting workgroup memory's zero initialization: lavapipe was seen
// carrying workgroup values over from an earlier workgroup.

var<workgroup> subgroup_sums: array<f32, ROWS * WG>;   // [ROWS <= 16][invocation < WG]
var<workgroup> elected_mask: array<atomic<u32>, 8>;    // bit i of word w: invocation 32 w + i stored (WG <= 256)

// Clears the mask: call from uniform control flow; the barrier after it is the caller's.
fn clear_elected(lane: u32) {
    if (lane < 8u) {
        atomicStore(&elected_mask[lane], 0u);
    }
}

// Marks this invocation as its subgroup's elected one.
fn mark_elected(lane: u32) {
    atomicOr(&elected_mask[lane / 32u], 1u << (lane % 32u));
}

fn row_sums(sums: Partials, lane: u32) -> f32 {
    clear_elected(lane);
    workgroupBarrier();
    var row_totals: array<f32, 16>;
    for (var r = 0u; r < ROWS; r++) {
        row_totals[r] = subgroupAdd(row_partial(sums, r));
    }
    if (subgroupBroadcastFirst(lane) == lane) {
        mark_elected(lane);
        for (var r = 0u; r < ROWS; r++) {
            subgroup_sums[r * WG + lane] = row_totals[r];
        }
    }
    workgroupBarrier();
    let row = min(lane, ROWS - 1u);
    var total = 0.0;
    for (var word = 0u; word < (WG + 31u) / 32u; word++) {
        var bits = atomicLoad(&elected_mask[word]);
        while (bits != 0u) {
            total += subgroup_sums[row * WG + 32u * word + firstTrailingBit(bits)];
            bits &= bits - 1u;
        }
    }
    return total;
}

// The sum of every lane's `value`, returned to every lane (the RMSNorm input's sum of
// squares, matvec_input_norm.wgsl): one subgroupAdd, each elected invocation stores it at its
// own index and marks the mask, as above, and every lane adds the marked slots in invocation
// order. The slots are a constant-size array, not ROWS * WG: see matvec_reduce_workgroup.wgsl
// (naga 29 declaration order). Call from uniform control flow.
var<workgroup> total_slots: array<f32, 256>;      // [invocation < WG <= 256]

fn workgroup_total(value: f32, lane: u32) -> f32 {
    clear_elected(lane);
    workgroupBarrier();
    let sum = subgroupAdd(value);
    if (subgroupBroadcastFirst(lane) == lane) {
        mark_elected(lane);
        total_slots[lane] = sum;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var word = 0u; word < (WG + 31u) / 32u; word++) {
        var bits = atomicLoad(&elected_mask[word]);
        while (bits != 0u) {
            total += total_slots[32u * word + firstTrailingBit(bits)];
            bits &= bits - 1u;
        }
    }
    workgroupBarrier();                           // every lane has read the mask before row_sums clears it
    return total;
}
