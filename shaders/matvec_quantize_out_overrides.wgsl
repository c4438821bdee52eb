// The overrides of matvec_quantize_out.wgsl, listed before every other file of its kernel but
// the enable directives: naga 29 panicked compiling the kernel with them declared after the
// override-sized workgroup array of matvec_reduce_*.wgsl (an assertion in its arena), and
// compiled it with them here.

override ROW_BLOCKS: u32 = 2u;       // blocks of ROWS rows a workgroup: ROWS * ROW_BLOCKS = 32
override OUT_NATURAL: bool = false;  // the reader's byte order: natural (q8), else nibble order
override SWIGLU_OUT: bool = false;   // rows are gate | up; the reader takes silu(gate) * up
