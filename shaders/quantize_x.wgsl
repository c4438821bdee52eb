// Quantize a mat-vec's activations once, for the pre-quantized packed-dot mat-vecs
// (matvec_input_int8.wgsl): the same bytes every workgroup of matvec_q4_dot4_x.wgsl would make
// (in natural order for q8, NATURAL), read by all of the mat-vec's workgroups.
//
//   params  the mat-vec's own uniform block (matvec_params.wgsl): cols, units, x_stride, aux
//   xq      [M][3 units] vec4<u32>, with RESIDUAL [M][5 units] (layout: matvec_input_int8.wgsl),
//           written
//   then the input mode's activations from X_BINDING on (matvec_input_{plain,norm,swiglu}.wgsl;
//   their y binding is declared there but not used here)
//
// Grid: (ceil(units / WG), 1, M). Each lane quantizes one unit: a unit's words depend on its
// own 32 activations only, so the units of a row are spread over as many workgroups as it
// takes, and no workgroup waits on another's. One workgroup per row, as this was, walked a
// Llama-8B down projection's 448 units in two rounds of 256 lanes on one SM: 7.6 us, against
// 3.1 us on 7 workgroups of 64 (H200, bench/engine.py --profile).
//
// The norm mode quantizes t = x * g and stores, beside the unit's bytes, the sum of the squares
// of its x (take_squares); the mat-vec adds those over the row as it walks the units and
// applies 1/rms to its row sums (matvec_input_int8.wgsl ROW_NORM): the numerics of the norm
// mode's dot4 mat-vec, step for step. Before, the row's 1/rms sat in a header that workgroup 0
// made by reading every unit of the row, so the norm mode ran on one workgroup as wide as the
// row (on the H200 4.5-4.8 us a launch, against 2.5 for the plain mode).

override WG: u32 = 64u;
override RESIDUAL: bool = false;   // a second byte per activation, the rounding left over (int8_lanes)
override NATURAL: bool = false;    // bytes in natural order (q8 mat-vecs), else nibble order (q4, q4k)
const X_BINDING: u32 = 2u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> xq: array<vec4<u32>>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let m = group.z;
    let u = group.x * WG + lane;                     // the unit this lane quantizes
    if (u < params.units) {
        let quads = unit_quads(u, m);
        store_unit(m, u, quantize_unit(quads, NATURAL), take_squares());
    }
}

fn store_unit(m: u32, u: u32, unit: UnitX, squares: f32) {
    let words = xq_unit_words();
    let at = words * (m * params.units + u);
    xq[at] = unit.even;
    xq[at + 1u] = unit.odd;
    xq[at + 2u] = vec4<u32>(bitcast<u32>(unit.scale), bitcast<u32>(unit.total), bitcast<u32>(squares), 0u);
    if (RESIDUAL) {
        xq[at + 3u] = unit.even_r;
        xq[at + 4u] = unit.odd_r;
    }
}

// The input files' input_finish (the mat-vec's epilogue: the norm mode's adds its lanes' squares
// with this) is not called here, but WGSL resolves every function a module names, so the module
// carries a correct one: a tree over the lanes, its order fixed.
var<workgroup> lane_values: array<f32, 256>;     // [lane < WG <= 256]

fn workgroup_total(value: f32, lane: u32) -> f32 {
    lane_values[lane] = value;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            lane_values[lane] += lane_values[lane + stride];
        }
        workgroupBarrier();
    }
    let total = lane_values[0];
    workgroupBarrier();
    return total;
}
