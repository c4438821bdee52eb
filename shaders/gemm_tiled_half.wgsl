// Register-tiled GEMM (gemm_tiled_main.wgsl) with f16 workgroup tiles (after
// enable_f16.wgsl; needs shader-f16): half the workgroup memory and half the tile loads,
// each activation and decoded weight rounded to f16 once when stored; products and sums stay
// f32. Values must be finite in f16 (|v| <= 65504); docs/kernels.md states the bound.
alias tile4 = vec4<f16>;
