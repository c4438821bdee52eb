"""The WebGPU-shaped GPU interface (interface.py), its implementations, and the choice of
an adapter and its kernel tier (adapters.py).

Import an implementation explicitly: `webslm.webgpu.native` needs PyPI `wgpu`,
`webslm.webgpu.browser` needs Pyodide; neither is imported here.
"""
from .interface import (Adapter, AdapterSummary, BufferBinding, BufferUsage, Copy, Device,
                        DeviceLost, DeviceRequestError, Dispatch, Gpu, GpuError, PipelineError)

__all__ = ["Adapter", "AdapterSummary", "BufferBinding", "BufferUsage", "Copy", "Device",
           "DeviceLost", "DeviceRequestError", "Dispatch", "Gpu", "GpuError", "PipelineError"]
