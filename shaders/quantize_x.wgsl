// Quantize a mat-vec's activations once, for the pre-quantized packed-dot mat-vecs
// (matvec_input_int8.wgsl): the same bytes every workgroup of matvec_q4_dot4_x.wgsl would make
// (in natural order for q8, NATURAL), read by all of the mat-vec's workgroups.
//
//   params  the mat-vec's own uniform block (matvec_params.wgsl): cols, units, x_stride, aux
//   xq      [M][1 + 3 units] vec4<u32>, with RESIDUAL [M][1 + 5 units] (layout:
//           matvec_input_int8.wgsl), written
//   then the input mode's activations from X_BINDING on (matvec_input_{plain,norm,swiglu}.wgsl;
//   their y binding is declared there but not used here)
//
// Grid: (ceil(units / WG), 1, M). Each lane quantizes one unit: a unit's bytes depend on its
// own 32 activations only, so the units of a row are spread over as many workgroups as it
// takes. One workgroup per row, as this was, walked a Llama-8B down projection's 448 units in
// two rounds of 256 lanes on one SM: 7.6 us, against 3.1 us on 7 workgroups of 64 (H200,
// bench/engine.py --profile). The host sizes the norm mode's workgroup to the whole row
// (kernels/matvec_prequant.py QUANTIZE_WG_NORM), for the reason below.
//
// The norm mode quantizes t = x * g and stores 1/rms in the row's header, which the mat-vec
// applies to its row sums: the numerics of the norm mode's dot4 mat-vec, step for step. The
// header needs the whole row's sum of squares, so workgroup 0 (and only it) reads every unit
// of the row; the squares come from the quads its unit loop loads (each once), added over the
// workgroup by workgroup_total below. With UNIT_SQUARES (matvec_prequant variant "xq2s") no
// workgroup reads the whole row: each unit carries the sum of its x squared (its third word's
// z), the mat-vec adds them as it walks the units (matvec_input_int8.wgsl ROW_NORM), and the
// header is not written; the norm mode then spreads over workgroups like the others.

override WG: u32 = 64u;
override RESIDUAL: bool = false;   // a second byte per activation, the rounding left over (int8_lanes)
override NATURAL: bool = false;    // bytes in natural order (q8 mat-vecs), else nibble order (q4, q4k)
override UNIT_SQUARES: bool = false;   // norm mode: each unit carries its squares, no header (above)
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

// The header's scale needs every unit of the row in the norm mode (its 1/rms), and in no
// other: the input files say which with INPUT_WHOLE_ROW.
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let m = group.z;
    let words = xq_unit_words();
    let row = m * (1u + words * params.units);
    let mine = group.x * WG + lane;                  // the unit this lane quantizes
    let header = group.x == 0u;                      // uniform over the workgroup
    if (header && INPUT_WHOLE_ROW && !UNIT_SQUARES) {
        // every unit's quads, for their squares; this workgroup's own units (u < WG) quantized
        for (var u = lane; u < params.units; u += WG) {
            let quads = unit_quads(u, m);
            if (u == mine) {
                store_unit(row, u, quantize_unit(quads, NATURAL), 0.0);
            }
        }
    } else if (mine < params.units) {
        let unit = quantize_unit(unit_quads(mine, m), NATURAL);
        var squares = 0.0;
        if (UNIT_SQUARES) {
            squares = take_squares();       // the squares of the quads unit_quads just read
        }
        store_unit(row, mine, unit, squares);
    }
    if (header && !UNIT_SQUARES) {
        let scale = input_finish(lane, m);   // barriers inside (norm): uniform control flow here
        if (lane == 0u) {
            xq[row] = vec4<u32>(bitcast<u32>(scale), 0u, 0u, 0u);
        }
    }
}

fn store_xq_word(at: u32, word: vec4<u32>) {    // int8_store.wgsl's writes
    xq[at] = word;
}

fn store_unit(row: u32, u: u32, unit: UnitX, squares: f32) {
    store_unit_at(row + 1u + xq_unit_words() * u, unit, squares);
}
