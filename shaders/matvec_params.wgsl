// The decode mat-vec's uniform block (matvec_main.wgsl), also read by the activation quantizer
// that runs before a pre-quantized mat-vec (quantize_x.wgsl): both launches of such a mat-vec
// share one params slot, so they agree on the row's geometry by construction.

struct Params {
    rows: u32,       // N, output rows
    cols: u32,       // K, real elements per row
    blocks: u32,     // scale blocks per row (quantized encodings)
    units: u32,      // units per weight row
    row_words: u32,  // u32 words per weight row (f16 and f32 encodings)
    x_stride: u32,   // floats between activation rows; a multiple of 4
    y_stride: u32,   // floats between output rows
    aux: u32,        // input "norm": eps (f32 bits); "swiglu": floats from a row's gate to its up; else 0
}
