// The pre-quantized mat-vec (matvec_main.wgsl with matvec_input_int8.wgsl, listed before this
// file) that also quantizes its output for the next mat-vec: a residual projection (o, down:
// y += W x) whose y the next layer step reads through an RMSNorm (gate|up, the next q|k|v, the
// head). Without it a quantize_x launch (norm mode, UNIT_SQUARES: matvec_prequant "xq2s") reads
// y back right after this kernel wrote it; here each workgroup quantizes the rows it just
// summed, so the step needs no launch between the two mat-vecs.
//
//   next_norm  [rows] f32 read as vec4: the norm weight g of the mat-vec that reads y
//   xq_out     [M][1 + words * rows / 32] vec4<u32>: per activation row an unused header, then
//              per unit of 32 rows the bytes of y * g and the sum of y's squares, as quantize_x
//              UNIT_SQUARES writes them (int8_store.wgsl), for a reader with ROW_NORM
//
// A workgroup owns one unit of output: 32 consecutive rows, in ROW_BLOCKS blocks of ROWS rows
// (the host sets ROWS * ROW_BLOCKS = 32 and rows % 32 == 0), each block the plain kernel's
// work (row_block). The block's values stay in workgroup memory; after the last block one lane
// turns them into the unit with quantize_unit (int8_pack.wgsl), the function quantize_x runs,
// on the same f32 values in the same order: the bytes are those quantize_x_norm would make.

// Its overrides, ROW_BLOCKS and OUT_NATURAL, are declared in matvec_quantize_out_overrides.wgsl.

@group(0) @binding(X_BINDING + 2u) var<storage, read> next_norm: array<vec4<f32>>;
@group(0) @binding(X_BINDING + 3u) var<storage, read_write> xq_out: array<vec4<u32>>;

var<workgroup> unit_rows: array<f32, 32>;     // [32]: the workgroup's y values

fn store_xq_word(at: u32, word: vec4<u32>) {    // int8_store.wgsl's writes
    xq_out[at] = word;
}

@compute @workgroup_size(WG)
fn main_quantize_out(@builtin(workgroup_id) group: vec3<u32>,
                     @builtin(num_workgroups) groups: vec3<u32>,
                     @builtin(local_invocation_index) lane: u32) {
    let unit = group.x + group.y * groups.x;
    if (unit * 32u >= params.rows) {
        return;  // the whole workgroup leaves together: barriers below stay uniform
    }
    let m = group.z;
    for (var block = 0u; block < ROW_BLOCKS; block++) {
        let value = row_block(unit * 32u + block * ROWS, m, lane);
        if (lane < ROWS) {
            unit_rows[block * ROWS + lane] = value;
        }
        workgroupBarrier();     // row_sums' workgroup memory is read before the next block writes it
    }
    if (lane == 0u) {
        var quads: array<vec4<f32>, 8>;
        var squares = 0.0;
        for (var j = 0u; j < 8u; j++) {
            let quad = vec4<f32>(unit_rows[4u * j], unit_rows[4u * j + 1u], unit_rows[4u * j + 2u],
                                 unit_rows[4u * j + 3u]);
            squares += dot(quad, quad);                      // matvec_input_norm.wgsl x_normed's order
            quads[j] = quad * next_norm[8u * unit + j];
        }
        let words = xq_unit_words();
        store_unit_at(m * (1u + words * (params.rows / 32u)) + 1u + words * unit,
                      quantize_unit(quads, OUT_NATURAL), squares);
    }
}
