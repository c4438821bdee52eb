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

Also the host-side checks every family shares: the workgroup size a device admits
(`largest_workgroup`, `fit_workgroup`), a buffer's fit in one binding (`check_binding_size`),
the 2-D grid (`workgroup_grid`), and the benchmark shapes per model and phase (`bench_shapes`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from ..webgpu.interface import BufferBinding, BufferUsage, Device, Dispatch
from .registry import CompiledKernel

STORAGE = BufferUsage.STORAGE | BufferUsage.COPY_DST | BufferUsage.COPY_SRC
U32_LIMIT = 2 ** 32
LAYER_WORKGROUP_SIZES = (64, 128, 256)   # the WG allowlist of the layer ops (norm, rope, swiglu, embed)


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
            if not 0 <= int(value) < U32_LIMIT:
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


def max_invocations(limits: dict[str, int]) -> int:
    """The most invocations a 1-D workgroup may have on this device."""
    return min(limits["maxComputeInvocationsPerWorkgroup"], limits["maxComputeWorkgroupSizeX"])


def largest_workgroup(limits: dict[str, int], sizes: Sequence[int], wanted: int,
                      storage: Callable[[int], int] | None = None) -> int | None:
    """The largest allowlisted size (of `sizes`) <= wanted that the device admits: invocations
    per workgroup, its x dimension and, when `storage(size)` gives the workgroup memory a size
    needs, maxComputeWorkgroupStorageSize. None when no size fits (callers raise their own
    error). Compatibility-mode devices allow 128 invocations and 16 KiB, so 256 steps down."""
    ceiling = min(wanted, max_invocations(limits))
    fitting = [size for size in sizes if size <= ceiling
               and (storage is None or storage(size) <= limits["maxComputeWorkgroupStorageSize"])]
    return max(fitting, default=None)


def fit_workgroup(limits: dict[str, int], wanted: int, bytes_per_lane: int = 0,
                  sizes: Sequence[int] = LAYER_WORKGROUP_SIZES) -> int:
    """largest_workgroup for the layer ops: wanted is raised to the smallest size, workgroup
    memory is bytes_per_lane * WG, and no fitting size is a ValueError."""
    size = largest_workgroup(limits, sizes, max(wanted, sizes[0]),
                             (lambda wg: wg * bytes_per_lane) if bytes_per_lane else None)
    if size is None:
        raise ValueError(f"no workgroup size of {tuple(sizes)} fits this device "
                         f"({max_invocations(limits)} invocations)")
    return size


def layer_workgroup(limits: dict[str, int], workgroup: int | None, wanted: int, bytes_per_lane: int = 0,
                    sizes: Sequence[int] = LAYER_WORKGROUP_SIZES) -> int:
    """The WG of a layer-op launch: `workgroup` when the caller gives one (it must be
    allowlisted), else fit_workgroup(limits, wanted, bytes_per_lane)."""
    wg = workgroup or fit_workgroup(limits, wanted, bytes_per_lane, sizes)
    if wg not in sizes:
        raise ValueError(f"workgroup {wg} is not one of {tuple(sizes)}")
    return wg


def check_binding_size(limits: dict[str, int], what: str, nbytes: int) -> None:
    """A buffer the kernel binds whole must fit maxStorageBufferBindingSize, and every element
    index must fit the u32 arithmetic of the WGSL (offsets past 2^32 would wrap)."""
    if nbytes >= U32_LIMIT:
        raise ValueError(f"{what} needs {nbytes} bytes: its offsets overflow u32 (2^32)")
    if nbytes > limits["maxStorageBufferBindingSize"]:
        raise ValueError(f"{what} needs {nbytes} bytes, more than this device's "
                         f"maxStorageBufferBindingSize ({limits['maxStorageBufferBindingSize']})")


BENCH_PHASES = (("decode", 1), ("prefill", 512))   # (phase, tokens) of the benchmark shapes


def bench_shapes(per_model: dict[str, dict]) -> dict[str, dict]:
    """A family's BENCH_SHAPES: "<model> <phase>" -> {"tokens": ..., **the model's sizes}."""
    return {f"{model} {phase}": {"tokens": tokens, **sizes}
            for model, sizes in per_model.items() for phase, tokens in BENCH_PHASES}


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
