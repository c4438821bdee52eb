"""The two backends of one engine: the GPU executor (backends/gpu/) and the CPU path
(backends/cpu_path.py, over webslm.cpu). Both offer the surface of `scores.Backend`."""
