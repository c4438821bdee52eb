// Rotary position embedding, applied in place to the query or key rows of T tokens
// (py/webslm/cpu/layers.py apply_rope; host side and tests in py/webslm/kernels/rope.py).
//
//   qk     [T, token_stride] f32, token t's heads at t * token_stride + head * head_dim,
//          rotated in place on their first rotary_dim elements (the rest is not touched)
//   table  [table_rows, rotary_dim / 2] pairs (cos, sin) f32, row p = absolute position p
//          (position_offset included); token t uses row start + t
//
// Pair i of a head (i < rotary_dim / 2) is rotated by the angle of row (start + t), column i:
//   a' = a cos - b sin,   b' = b cos + a sin
// with (a, b) = (x[i], x[i + rotary_dim/2]) for rotate-half (Hugging Face layout) or
// (x[2i], x[2i + 1]) for adjacent-pair (GGML layout), chosen by the ADJACENT override.
//
// Why a table instead of cos()/sin() here: angles reach position * 1 rad (30000+ rad for long
// contexts), and WGSL's sin/cos have only absolute error bounds on [-pi, pi]; several GPUs
// reduce large arguments badly. The host builds the table with the CPU reference's own
// function (rope_tables, in f32), so GPU and CPU rotate by identical numbers.
//
// token_stride lets the engine rotate Q and K of a fused QKV row in one dispatch (heads =
// query heads + KV heads, token_stride = the whole QKV row); for a plain [T, heads, head_dim]
// buffer it is heads * head_dim.
//
// One invocation per pair: it reads two elements and one table entry and writes two
// elements, and no two invocations touch the same element, so there are no barriers and an
// invocation past the last pair simply returns.

override WG: u32 = 64u;        // 64, 128 or 256 (registry allowlist)
override ADJACENT: u32 = 0u;   // 0: rotate-half, 1: adjacent-pair

struct Params {
    tokens: u32,         // T
    heads: u32,          // heads rotated per token
    head_dim: u32,       // elements per head
    half: u32,           // rotary_dim / 2: pairs per head
    start: u32,          // table row of token 0 (its absolute position)
    token_stride: u32,   // elements from one token's first head to the next token's
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> table: array<vec2<f32>>;   // [table_rows, half] (cos, sin)
@group(0) @binding(2) var<storage, read_write> qk: array<f32>;      // [T, token_stride], in place

@compute @workgroup_size(WG)
fn rope(@builtin(workgroup_id) group: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let pair = (group.x + group.y * groups.x) * WG + lane;
    let pairs_per_token = params.heads * params.half;
    if (pair >= params.tokens * pairs_per_token) {
        return;  // past the last pair (no barriers in this kernel)
    }
    let token = pair / pairs_per_token;
    let within = pair - token * pairs_per_token;
    let head = within / params.half;
    let i = within - head * params.half;

    let angle = table[(params.start + token) * params.half + i];   // (cos, sin)
    let head_start = token * params.token_stride + head * params.head_dim;
    var first = head_start + i;                 // rotate-half: i and i + half
    var second = first + params.half;
    if (ADJACENT == 1u) {
        first = head_start + 2u * i;            // adjacent-pair: 2i and 2i + 1
        second = first + 1u;
    }
    let a = qk[first];
    let b = qk[second];
    qk[first] = a * angle.x - b * angle.y;
    qk[second] = b * angle.x + a * angle.y;
}
