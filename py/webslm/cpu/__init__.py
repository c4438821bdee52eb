"""The CPU reference engine in numpy: the oracle for every GPU result, and the browser's CPU
path (after a device loss, and in browsers without WebGPU)."""
from .backend import CpuBackend

__all__ = ["CpuBackend"]
