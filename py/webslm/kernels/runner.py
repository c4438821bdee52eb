"""Run one compiled kernel once on fresh buffers: the harness of golden tests and self-tests.

The engine binds kernels to long-lived buffers; tests and admission self-tests instead want
"these arrays in, those arrays out". `run_once` does that with the safety rules the golden
tests rely on:
- every output is poisoned before the dispatch (NaN for floats, 0xFFFFFFFF for integers),
  so an element the kernel forgets to write cannot pass for a result;
- an output given as an array (not a size) starts with that content instead, for kernels
  that update a buffer in place (KV append, residual add);
- GPU errors are captured in a validation scope and raised as KernelRunError.

Bindings follow the kernel's spec in order: "uniform" takes `params`, each
"read-only-storage" takes the next input, each "storage" the next output.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from ..webgpu.interface import BufferBinding, BufferUsage, Device, Dispatch
from .registry import CompiledKernel

STORAGE = BufferUsage.STORAGE | BufferUsage.COPY_DST | BufferUsage.COPY_SRC


class KernelRunError(RuntimeError):
    """The GPU reported an error while a kernel was set up or run."""


def poison(size: int, dtype: np.dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.full(size, np.nan, dtype)
    return np.full(size, np.iinfo(dtype).max, dtype)


def params_words(*values: int | float) -> np.ndarray:
    """A uniform block from scalars: ints as u32, floats as f32, padded to 16 bytes."""
    words = np.zeros(max(4, -(-len(values) // 4) * 4), np.uint32)
    for i, value in enumerate(values):
        if isinstance(value, (float, np.floating)):
            words[i] = np.array(value, np.float32).view(np.uint32)
        else:
            if not 0 <= int(value) < 2 ** 32:
                raise ValueError(f"uniform word {i} = {value} does not fit in u32")
            words[i] = int(value)
    return words


def workgroup_grid(groups: int, max_per_dimension: int) -> tuple[int, int, int]:
    """A 2-D grid with at least `groups` workgroups, each side within the device limit.
    Kernels recover the linear id as group.x + group.y * num_groups.x and skip ids >= groups."""
    if groups <= max_per_dimension:
        return (max(groups, 1), 1, 1)
    height = math.ceil(groups / max_per_dimension)
    if height > max_per_dimension:
        raise ValueError(f"{groups} workgroups exceed a {max_per_dimension}^2 grid")
    return (max_per_dimension, height, 1)


def _as_bytes_array(a: np.ndarray) -> np.ndarray:
    """Storage buffers need a size that is a non-zero multiple of 4 bytes: pad with zeros."""
    a = np.ascontiguousarray(a)
    raw = a.reshape(-1).view(np.uint8)
    padded = max(4, -(-raw.size // 4) * 4)
    if padded == raw.size:
        return raw
    out = np.zeros(padded, np.uint8)
    out[: raw.size] = raw
    return out


@dataclasses.dataclass
class Prepared:
    """A kernel bound to its own fresh buffers: dispatch it any number of times, read outputs,
    release. Benchmarks time `dispatch` repeated; `bytes_moved`/`flops` are the minimum
    memory traffic and arithmetic of one dispatch, filled in by the family's bench helper."""
    kernel: CompiledKernel
    dispatch: Dispatch
    buffers: list
    outputs: list            # (buffer, dtype, count) per storage binding, in order
    bytes_moved: int = 0
    flops: int = 0

    async def read_outputs(self, device: Device) -> list[np.ndarray]:
        results = []
        for buffer, dtype, count in self.outputs:
            raw = await device.read_buffer(buffer, 0, max(4, -(-count * dtype.itemsize // 4) * 4))
            results.append(np.frombuffer(raw, dtype, count).copy())
        return results

    def release(self, device: Device) -> None:
        for buffer in self.buffers:
            device.destroy_buffer(buffer)
        self.buffers.clear()


def prepare(device: Device, kernel: CompiledKernel, params: np.ndarray | None,
            inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray | tuple[int, np.dtype]],
            grid: tuple[int, int, int]) -> Prepared:
    """Create and fill one buffer per binding (outputs poisoned) and the dispatch."""
    kinds = kernel.spec.bindings
    if kinds.count("read-only-storage") != len(inputs) or kinds.count("storage") != len(outputs):
        raise ValueError(f"{kernel.spec.name} binds {kinds}; got {len(inputs)} inputs and {len(outputs)} outputs")
    buffers, entries, out_info = [], [], []
    pending_inputs, pending_outputs = list(inputs), list(outputs)
    for kind in kinds:
        if kind == "uniform":
            data = params if params is not None else params_words()
            buffer = device.create_buffer(data.nbytes, BufferUsage.UNIFORM | BufferUsage.COPY_DST, "params")
        elif kind == "read-only-storage":
            data = _as_bytes_array(pending_inputs.pop(0))
            buffer = device.create_buffer(data.nbytes, STORAGE, "input")
        else:
            spec = pending_outputs.pop(0)
            if isinstance(spec, np.ndarray):
                dtype, count, data = spec.dtype, spec.size, spec.reshape(-1)
            else:
                count, dtype = spec
                data = poison(count, dtype)
            data = _as_bytes_array(data)
            buffer = device.create_buffer(data.nbytes, STORAGE, "output")
            out_info.append((buffer, np.dtype(dtype), count))
        buffers.append(buffer)
        device.write_buffer(buffer, 0, data)
        entries.append(BufferBinding(buffer))
    group = device.create_bind_group(kernel.bind_group_layout, entries)
    return Prepared(kernel, Dispatch(kernel.pipeline, [group], grid), buffers, out_info)


async def run_once(device: Device, kernel: CompiledKernel, params: np.ndarray | None,
                   inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray | tuple[int, np.dtype]],
                   grid: tuple[int, int, int]) -> list[np.ndarray]:
    """Upload, dispatch once, read every output back (flat arrays of the output's dtype)."""
    device.push_error_scope("validation")
    prepared = None
    try:
        prepared = prepare(device, kernel, params, inputs, outputs, grid)
        device.submit([prepared.dispatch])
        results = await prepared.read_outputs(device)
    finally:
        error = await device.pop_error_scope()
        if prepared is not None:
            prepared.release(device)
    if error is not None:
        raise KernelRunError(f"{kernel.spec.name}: GPU {error.kind} error: {error.message}")
    return results
