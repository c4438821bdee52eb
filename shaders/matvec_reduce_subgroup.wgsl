// Row sums for the decode mat-vec kernels through subgroup operations (tier C only).
//
// Every invocation holds partial sums for the same ROWS rows, so one subgroupAdd per row
// is correct however the device groups invocations into subgroups: no assumption about
// subgroup size or about which invocations share a subgroup. Each subgroup's elected
// invocation (the first active one: subgroupBroadcastFirst of the invocation index equals
// its own index in exactly one invocation; naga has no subgroupElect) then takes a slot
// with a workgroup atomic and stores its sums there; after one barrier, invocation
// r < ROWS adds the slots of row r. The slot counter is reset explicitly (behind a
// barrier) rather than trusting workgroup memory's zero initialization: lavapipe was seen
// carrying the counter over from an earlier workgroup.

var<workgroup> subgroup_sums: array<f32, ROWS * WG>;   // [ROWS <= 16][slot < number of subgroups]
var<workgroup> subgroups_stored: atomic<u32>;

fn row_sums(sums: Partials, lane: u32) -> f32 {
    if (lane == 0u) {
        atomicStore(&subgroups_stored, 0u);
    }
    workgroupBarrier();
    var row_totals: array<f32, 16>;
    for (var r = 0u; r < ROWS; r++) {
        row_totals[r] = subgroupAdd(row_partial(sums, r));
    }
    if (subgroupBroadcastFirst(lane) == lane) {
        let slot = atomicAdd(&subgroups_stored, 1u);
        for (var r = 0u; r < ROWS; r++) {
            subgroup_sums[r * WG + slot] = row_totals[r];
        }
    }
    workgroupBarrier();
    let slots = atomicLoad(&subgroups_stored);
    let row = min(lane, ROWS - 1u);
    var total = 0.0;
    for (var slot = 0u; slot < slots; slot++) {
        total += subgroup_sums[row * WG + slot];
    }
    return total;
}

// The sum of every lane's `value`, returned to every lane (the RMSNorm input's sum of
// squares, matvec_input_norm.wgsl): one subgroupAdd, each elected invocation takes a slot
// with its own workgroup atomic (reset behind a barrier, as above), and every lane adds the
// slots in slot order. The slots are a constant-size array, not ROWS * WG: see
// matvec_reduce_workgroup.wgsl (naga 29 declaration order). Call from uniform control flow.
var<workgroup> total_slots: array<f32, 256>;      // [slot < number of subgroups <= WG <= 256]
var<workgroup> totals_stored: atomic<u32>;

fn workgroup_total(value: f32, lane: u32) -> f32 {
    if (lane == 0u) {
        atomicStore(&totals_stored, 0u);
    }
    workgroupBarrier();
    let sum = subgroupAdd(value);
    if (subgroupBroadcastFirst(lane) == lane) {
        total_slots[atomicAdd(&totals_stored, 1u)] = sum;
    }
    workgroupBarrier();
    let slots = atomicLoad(&totals_stored);
    var total = 0.0;
    for (var slot = 0u; slot < slots; slot++) {
        total += total_slots[slot];
    }
    return total;
}
