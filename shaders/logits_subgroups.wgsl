// Argmax with subgroup operations (tier C, device feature "subgroups"): the entry points of
// logits.wgsl's argmax with the workgroup tree (log2 WG barriers) replaced by one subgroup
// max/min per subgroup and two workgroup atomics (3 barriers). Compiled as
//   enable_subgroups.wgsl + logits.wgsl + logits_subgroups.wgsl
// so bindings, Params, the order, the scans and the stores are logits.wgsl's.
//
// Nothing assumes a subgroup size or which invocations share a subgroup: each subgroup
// reduces its own invocations' entries, its elected invocation (the first active one:
// subgroupBroadcastFirst(lane) == lane holds in exactly one) folds that into the workgroup
// atomics, first the best key (atomicMax), then, among subgroups holding that key, the lowest
// index (atomicMin) - the same (key descending, index ascending) order as the tree.

var<workgroup> group_key: atomic<u32>;
var<workgroup> group_index: atomic<u32>;
var<workgroup> group_nans: atomic<u32>;

// Call once per dispatch, from uniform control flow; every invocation gets the result.
fn subgroup_best(lane: u32, mine: Best) -> Best {
    if (lane == 0u) {
        atomicStore(&group_key, 0u);
        atomicStore(&group_index, NONE);
        atomicStore(&group_nans, 0u);
    }
    workgroupBarrier();
    let top = subgroupMax(mine.key);
    let at = subgroupMin(select(NONE, mine.index, mine.key == top));
    let nans = subgroupAdd(mine.nans);
    let elected = subgroupBroadcastFirst(lane) == lane;
    if (elected) {
        atomicMax(&group_key, top);
        atomicAdd(&group_nans, nans);
    }
    workgroupBarrier();
    let best_key = atomicLoad(&group_key);
    if (elected && top == best_key) {
        atomicMin(&group_index, at);
    }
    workgroupBarrier();
    return Best(best_key, atomicLoad(&group_index), atomicLoad(&group_nans));
}

@compute @workgroup_size(WG)
fn argmax_partial_subgroups(@builtin(workgroup_id) wid: vec3<u32>,
                            @builtin(num_workgroups) grid: vec3<u32>,
                            @builtin(local_invocation_index) lane: u32) {
    let group = wid.x + wid.y * grid.x;
    if (group >= params.groups) {
        return;   // uniform: the same group id in the whole workgroup
    }
    let best = subgroup_best(lane, scan_logits(group, lane));
    if (lane == 0u) {
        store_partial(group, best);
    }
}

@compute @workgroup_size(WG)
fn argmax_merge_subgroups(@builtin(local_invocation_index) lane: u32) {
    let best = subgroup_best(lane, scan_partials(lane));
    if (lane == 0u) {
        store_result(best);
    }
}
