// Register-tiled GEMM (gemm_tiled_main.wgsl) with f32 workgroup tiles: tiles hold exactly
// what the loads and the decoder produced.
alias tile4 = vec4<f32>;
