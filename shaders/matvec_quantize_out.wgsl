// The pre-quantized mat-vec (matvec_main.wgsl with matvec_input_int8.wgsl, listed before this
// file) that also quantizes its output for the next mat-vec, which otherwise needs a quantize_x
// launch that reads y back right after this kernel wrote it. Two kinds of output:
//   norm    a residual projection (o, down: y += W x) whose y the next step reads through an
//           RMSNorm (gate|up, the next q|k|v, the head) on "xq2s" (quantize_x norm mode with
//           UNIT_SQUARES): units of y * g with the sum of y's squares, no header
//   swiglu  (SWIGLU_OUT) the stacked gate|up projection, rows gate at 0 .. R/2 and up at R/2 ..
//           R, whose silu(gate) * up the down projection reads (quantize_x swiglu mode): units
//           of silu(gate) * up, the header's scale 1
//
//   next_norm  [rows] f32 read as vec4: the norm weight g of the mat-vec that reads y (norm;
//              with SWIGLU_OUT bound to anything readable and not used)
//   xq_out     [M][1 + words * units] vec4<u32>, units = rows / 32 (SWIGLU_OUT: rows / 64): per
//              activation row the header, then per unit its words as quantize_x writes them
//              (int8_store.wgsl)
//
// A workgroup owns one unit of output: 32 consecutive rows (SWIGLU_OUT: 32 gate rows and the
// 32 up rows R/2 further), in ROW_BLOCKS blocks of ROWS rows (the host sets ROWS * ROW_BLOCKS
// = 32 and whole units), each block the plain kernel's work (row_block). The values stay in
// workgroup memory; after the last block one lane turns them into the unit with quantize_unit
// (int8_pack.wgsl), the function quantize_x runs, on values computed with the same operations
// in the same order: the bytes are those quantize_x would make from y.

// Its overrides, ROW_BLOCKS, OUT_NATURAL and SWIGLU_OUT, are declared in
// matvec_quantize_out_overrides.wgsl.

@group(0) @binding(X_BINDING + 2u) var<storage, read> next_norm: array<vec4<f32>>;
@group(0) @binding(X_BINDING + 3u) var<storage, read_write> xq_out: array<vec4<u32>>;

var<workgroup> unit_rows: array<f32, 32>;     // [32]: the workgroup's y values (SWIGLU_OUT: gate's)
var<workgroup> unit_ups: array<f32, 32>;      // [32]: SWIGLU_OUT, up's

fn store_xq_word(at: u32, word: vec4<u32>) {    // int8_store.wgsl's writes
    xq_out[at] = word;
}

@compute @workgroup_size(WG)
fn main_quantize_out(@builtin(workgroup_id) group: vec3<u32>,
                     @builtin(num_workgroups) groups: vec3<u32>,
                     @builtin(local_invocation_index) lane: u32) {
    let unit = group.x + group.y * groups.x;
    let out_rows = select(params.rows, params.rows / 2u, SWIGLU_OUT);    // the reader's K
    if (unit * 32u >= out_rows) {
        return;  // the whole workgroup leaves together: barriers below stay uniform
    }
    let m = group.z;
    for (var block = 0u; block < ROW_BLOCKS; block++) {
        let value = row_block(unit * 32u + block * ROWS, m, lane);
        if (lane < ROWS) {
            unit_rows[block * ROWS + lane] = value;
        }
        workgroupBarrier();     // row_sums' workgroup memory is read before the next block writes it
        if (SWIGLU_OUT) {
            let up = row_block(out_rows + unit * 32u + block * ROWS, m, lane);
            if (lane < ROWS) {
                unit_ups[block * ROWS + lane] = up;
            }
            workgroupBarrier();
        }
    }
    if (lane == 0u) {
        var quads: array<vec4<f32>, 8>;
        var squares = 0.0;
        for (var j = 0u; j < 8u; j++) {
            let quad = vec4<f32>(unit_rows[4u * j], unit_rows[4u * j + 1u], unit_rows[4u * j + 2u],
                                 unit_rows[4u * j + 3u]);
            if (SWIGLU_OUT) {      // matvec_input_swiglu.wgsl x_full's operations
                quads[j] = silu4(quad) * vec4<f32>(unit_ups[4u * j], unit_ups[4u * j + 1u], unit_ups[4u * j + 2u],
                                                   unit_ups[4u * j + 3u]);
            } else {
                squares += dot(quad, quad);                  // matvec_input_norm.wgsl x_normed's order
                quads[j] = quad * next_norm[8u * unit + j];
            }
        }
        let words = xq_unit_words();
        let row = m * (1u + words * (out_rows / 32u));
        store_unit_at(row + 1u + words * unit, quantize_unit(quads, OUT_NATURAL), squares);
        if (SWIGLU_OUT && unit == 0u) {        // the plain reader's output scale (quantize_x: 1)
            store_xq_word(row, vec4<u32>(bitcast<u32>(1.0), 0u, 0u, 0u));
        }
    }
}
