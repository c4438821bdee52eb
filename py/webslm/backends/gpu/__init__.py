"""The GPU executor: an admitted session (webslm.admission) driven as the engine's backend.

    regions.py   the plan's regions as bindings; weight pieces; the params slots
    forward.py   the forward pass as launches and dispatch lists
    executor.py  GpuBackend: build, prefill, decode_one, rebuild, release
"""
from .executor import GpuBackend, GpuBackendError

__all__ = ["GpuBackend", "GpuBackendError"]
