// The unit of activations the q4 packed-dot mat-vec multiplies (matvec_q4_dot4.wgsl), made by
// int8_pack.wgsl's quantize_unit in the mat-vec or in quantize_x.wgsl, or read back from what
// quantize_x wrote (matvec_input_int8.wgsl).

// A unit of x as bytes: word j of `even` holds q at 8j, 8j+2, 8j+4, 8j+6 (low byte first),
// word j of `odd` q at 8j+1, 8j+3, 8j+5, 8j+7; `even_r`, `odd_r` the residual bytes r likewise
// (RESIDUAL only); and the f32 sum of the unit's x.
struct UnitX {
    even: vec4<u32>,
    odd: vec4<u32>,
    even_r: vec4<u32>,
    odd_r: vec4<u32>,
    scale: f32,       // d
    total: f32,
}

