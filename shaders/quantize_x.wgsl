// Quantize a mat-vec's activations once, for the pre-quantized packed-dot mat-vecs
// (matvec_input_int8.wgsl): the same bytes every workgroup of matvec_q4_dot4_x.wgsl would make
// (in natural order for q8, NATURAL), made by one workgroup per activation row m (grid z),
// read by all of the mat-vec's.
//
//   params  the mat-vec's own uniform block (matvec_params.wgsl): cols, units, x_stride, aux
//   xq      [M][1 + 3 units] vec4<u32>, with RESIDUAL [M][1 + 5 units] (layout:
//           matvec_input_int8.wgsl), written
//   then the input mode's activations from X_BINDING on (matvec_input_{plain,norm,swiglu}.wgsl;
//   their y binding is declared there but not used here)
//
// The norm mode quantizes t = x * g and stores 1/rms in the row's header, which the mat-vec
// applies to its row sums: the numerics of the norm mode's dot4 mat-vec, step for step. The
// sum of squares comes from the quads the unit loop loads (each once), added over the
// workgroup by workgroup_total below.

override WG: u32 = 64u;
override RESIDUAL: bool = false;   // a second byte per activation, the rounding left over (int8_lanes)
override NATURAL: bool = false;    // bytes in natural order (q8 mat-vecs), else nibble order (q4, q4k)
const X_BINDING: u32 = 2u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> xq: array<vec4<u32>>;

var<workgroup> lane_values: array<f32, 256>;     // [lane < WG <= 256]

// The sum of every lane's value, returned to every lane: a tree over the lanes (log2 WG
// barrier steps; its order is fixed, so the result is the same in every run). A loop over
// the WG values in every lane, as this was, cost the norm mode's quantizer a dependent chain
// of WG shared-memory reads: on the H200 its launch took 5.2 us at WG 64 and 8.2 at WG 128,
// where the same launch without the norm (swiglu) took 4.3 at WG 256.
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
    workgroupBarrier();              // every lane has read it before a later call writes
    return total;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let m = group.z;
    let words = xq_unit_words();
    let row = m * (1u + words * params.units);
    for (var u = lane; u < params.units; u += WG) {
        let unit = quantize_unit(unit_quads(u, m), NATURAL);
        let at = row + 1u + words * u;
        xq[at] = unit.even;
        xq[at + 1u] = unit.odd;
        xq[at + 2u] = vec4<u32>(bitcast<u32>(unit.scale), bitcast<u32>(unit.total), 0u, 0u);
        if (RESIDUAL) {
            xq[at + 3u] = unit.even_r;
            xq[at + 4u] = unit.odd_r;
        }
    }
    let scale = input_finish(lane, m);   // barriers inside (norm): uniform control flow here
    if (lane == 0u) {
        xq[row] = vec4<u32>(bitcast<u32>(scale), 0u, 0u, 0u);
    }
}
