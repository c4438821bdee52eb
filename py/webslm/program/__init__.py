"""The step program: one forward step written once, as an ordered list of named ops.

    ops.py       the reference program (unfused, the CPU oracle's steps one for one) and the
                 activations it needs, for a decode step (T = 1) or a prefill chunk
    fusion.py    fusion as named rewrite rules over the op list
    lowering.py  an op -> the kernel launch(es) that compute it on a device (kernel, overrides,
                 params, grid, and the bindings in the kernel's order, by name)

The memory planner derives temporaries, liveness and params slots from the program; admission
compiles exactly the kernels its ops lower to; the GPU executor records them, binding each op's
named regions. `ops` and `fusion` are pure (the planner imports them and nothing of kernels or
WebGPU); only `lowering` knows kernels.
"""
