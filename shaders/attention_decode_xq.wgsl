// Decode attention that also quantizes its output for the o projection: the chunk pass of
// attention_decode.wgsl (listed before this file), and then, when the chunk is the whole
// context (one pass), each workgroup turns its query heads' outputs into the int8 units the
// pre-quantized mat-vec reads (matvec_input_int8.wgsl), the bytes quantize_x_plain would make
// from `out` (quantize_x.wgsl), so the step needs no quantizer launch between attention and o.
//
//   xq  [1 + words * units] vec4<u32>, units = n_heads * head_dim / 32, words 3 (5 with
//       RESIDUAL): the header (1.0: the plain input's output scale), then per unit its even
//       and odd byte words, (d, sum) and with RESIDUAL the residual words (int8_unit.wgsl)
//
// A unit of 32 activations never straddles two heads: head_dim is a multiple of 32 (the host
// checks), so a workgroup owns whole units. Its outputs are in workgroup memory (`qv`, which
// write_chunk fills beside `out` in one pass); quantize_unit (int8_pack.wgsl) is the one
// quantize_x runs, on the same f32 values, so the bytes are the same bit for bit. With more
// than one chunk the combine pass writes `out` and the step quantizes it with quantize_x, as
// without this kernel (the host records that launch in the long recording).

override RESIDUAL: bool = false;   // a second byte per activation (int8_lanes)
override NATURAL: bool = false;    // bytes in natural order (a q8 o projection), else nibble order

@group(0) @binding(7) var<storage, read_write> xq: array<vec4<u32>>;

fn store_xq_word(at: u32, word: vec4<u32>) {    // int8_store.wgsl's writes
    xq[at] = word;
}

@compute @workgroup_size(WG)
fn decode_chunk_xq(@builtin(workgroup_id) group: vec3<u32>,
                   @builtin(num_workgroups) groups: vec3<u32>,
                   @builtin(local_invocation_index) lane: u32) {
    let wid = group.x + group.y * groups.x;
    if (wid >= params.n_groups) {
        return;  // the whole workgroup leaves together: barriers below stay uniform
    }
    chunk_phases(wid, lane);
    if (params.n_chunks == 1u) {     // uniform: a params word
        workgroupBarrier();          // every output of the workgroup is in qv
        quantize_heads(lane, chunk_work(wid));
    }
}

// The units of this workgroup's query heads, one a lane: head g's unit i is qv[g * HD4 + 8 i ..].
fn quantize_heads(lane: u32, w: ChunkWork) {
    let per_head = HD4 / 8u;
    let words = xq_unit_words();
    for (var i = lane; i < w.n_heads_here * per_head; i += WG) {
        var quads: array<vec4<f32>, 8>;
        for (var j = 0u; j < 8u; j++) {
            quads[j] = qv[8u * i + j];
        }
        store_unit_at(1u + words * (w.head0 * per_head + i), quantize_unit(quads, NATURAL), 0.0);
    }
    if (w.head0 == 0u && lane == 0u) {     // one workgroup: the first heads' (a single chunk)
        xq[0] = vec4<u32>(bitcast<u32>(1.0), 0u, 0u, 0u);
    }
}
