"""One WebGPU-shaped interface with two implementations.

    browser.py  navigator.gpu through Pyodide's JS FFI, inside the Web Worker
    native.py   wgpu-native through PyPI `wgpu` (CLI, kernel tests, GPU benchmarks)

Kernel and engine code is written once against the classes below and cannot tell the two
apart. The surface is deliberately the subset the engine needs: compute only, buffers bound
whole or by range, explicit bind group layouts, override constants, many dispatches per pass.

Names follow WebGPU: feature names as the browser spells them ("shader-f16", "subgroups",
"timestamp-query"), limits in camelCase ("maxStorageBufferBindingSize"). Operations that
are asynchronous in WebGPU (adapter and device requests, pipeline compilation, popping an
error scope, reading a buffer back, device loss) are coroutines here, so the same code
runs under `asyncio` natively and under Pyodide's event loop in the worker.

Errors follow WebGPU too: creating an object never raises for a GPU-side validation or
out-of-memory error. The error goes to the innermost matching error scope, else to the
uncaptured-error callback, and the object returned is unusable. Misuse of this Python
interface itself (a wrong type, an unknown binding kind) raises ValueError/TypeError.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Awaitable, Callable, Iterable, Sequence

import numpy as np


class BufferUsage:
    """GPUBufferUsage flags; the values are the WebGPU specification's."""
    MAP_READ = 0x0001
    MAP_WRITE = 0x0002
    COPY_SRC = 0x0004
    COPY_DST = 0x0008
    UNIFORM = 0x0040
    STORAGE = 0x0080


# The feature names WebGPU standardizes (GPUFeatureName), in the specification's order. Native
# extras are never exposed (native.py), and a receipt may record only these.
WEBGPU_FEATURES = (
    "core-features-and-limits", "depth-clip-control", "depth32float-stencil8",
    "texture-compression-bc", "texture-compression-bc-sliced-3d", "texture-compression-etc2",
    "texture-compression-astc", "texture-compression-astc-sliced-3d", "timestamp-query",
    "indirect-first-instance", "shader-f16", "rg11b10ufloat-renderable", "bgra8unorm-storage",
    "float32-filterable", "float32-blendable", "clip-distances", "dual-source-blending",
    "subgroups", "texture-formats-tier1", "texture-formats-tier2", "primitive-index",
)

BINDING_KINDS = ("uniform", "read-only-storage", "storage")
ERROR_FILTERS = ("validation", "out-of-memory", "internal")
FEATURE_LEVELS = ("core", "compatibility")


@dataclasses.dataclass(frozen=True)
class GpuError:
    """A captured GPU error: which kind (one of ERROR_FILTERS) and the implementation's text.

    The text is for developers' logs only; it is never parsed and never put in a receipt."""
    kind: str
    message: str


@dataclasses.dataclass(frozen=True)
class DeviceLost:
    reason: str      # "destroyed" or "unknown", as in GPUDeviceLostInfo.reason
    message: str


@dataclasses.dataclass(frozen=True)
class BufferBinding:
    """One bind group entry: a range of a buffer (size None = to the end)."""
    buffer: Any
    offset: int = 0
    size: int | None = None


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """One compute dispatch: a pipeline, its bind groups (group index = list index) and a grid."""
    pipeline: Any
    bind_groups: Sequence[Any]
    grid: tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Copy:
    """A buffer-to-buffer copy, recorded after the compute pass of the same submit."""
    source: Any
    source_offset: int
    destination: Any
    destination_offset: int
    size: int


@dataclasses.dataclass(frozen=True)
class Recording:
    """A command list recorded once and submitted many times (the engine's decode step).
    `handle` is the implementation's prebuilt form (the browser keeps a JS array, so a
    replay costs one FFI call instead of one per dispatch); None where the lists suffice."""
    dispatches: tuple[Dispatch, ...]
    copies: tuple[Copy, ...]
    handle: Any = None


@dataclasses.dataclass(frozen=True)
class AdapterSummary:
    """What an adapter offers, as plain data (goes to logs, tests and the status page)."""
    feature_level: str
    features: tuple[str, ...]
    limits: dict[str, int]
    vendor: str
    architecture: str
    description: str
    is_fallback: bool


class Adapter(abc.ABC):
    feature_level: str
    features: frozenset[str]
    limits: dict[str, int]

    @abc.abstractmethod
    def summary(self) -> AdapterSummary: ...

    @abc.abstractmethod
    async def request_device(self, features: Iterable[str] = (),
                             limits: dict[str, int] | None = None) -> "Device":
        """A device with exactly these features and limits; raises DeviceRequestError."""


class Device(abc.ABC):
    features: frozenset[str]
    limits: dict[str, int]

    # -- lifetime and errors ------------------------------------------------------------
    @abc.abstractmethod
    def lost(self) -> Awaitable[DeviceLost]:
        """Resolves once, when the device is lost (including by destroy())."""

    @abc.abstractmethod
    def on_uncaptured_error(self, callback: Callable[[GpuError], None]) -> None: ...

    @abc.abstractmethod
    def push_error_scope(self, filter: str) -> None: ...

    @abc.abstractmethod
    async def pop_error_scope(self) -> GpuError | None: ...

    @abc.abstractmethod
    def destroy(self) -> None: ...

    # -- resources ---------------------------------------------------------------------
    @abc.abstractmethod
    def create_buffer(self, size: int, usage: int, label: str = "") -> Any: ...

    @abc.abstractmethod
    def write_buffer(self, buffer: Any, offset: int, data: np.ndarray) -> None:
        """Queue a write of a C-contiguous array's bytes (no intermediate copy in the browser)."""

    @abc.abstractmethod
    async def read_buffer(self, buffer: Any, offset: int, size: int) -> bytes:
        """Copy a range of a COPY_SRC buffer into a staging buffer, map it and return its bytes."""

    @abc.abstractmethod
    def destroy_buffer(self, buffer: Any) -> None: ...

    # -- programs ----------------------------------------------------------------------
    @abc.abstractmethod
    def create_shader_module(self, code: str, label: str = "") -> Any: ...

    @abc.abstractmethod
    def create_bind_group_layout(self, kinds: Sequence[str], label: str = "") -> Any:
        """Binding i has kind kinds[i] (one of BINDING_KINDS), visible to compute."""

    @abc.abstractmethod
    def create_pipeline_layout(self, bind_group_layouts: Sequence[Any], label: str = "") -> Any: ...

    @abc.abstractmethod
    async def create_compute_pipeline(self, layout: Any, module: Any, entry_point: str,
                                      constants: dict[str, float] | None = None,
                                      label: str = "") -> Any:
        """Compiles asynchronously; raises PipelineError if compilation fails."""

    @abc.abstractmethod
    def create_bind_group(self, layout: Any, entries: Sequence[BufferBinding],
                          label: str = "") -> Any: ...

    # -- work --------------------------------------------------------------------------
    @abc.abstractmethod
    def submit(self, dispatches: Sequence[Dispatch], copies: Sequence[Copy] = ()) -> None:
        """One command encoder: one compute pass with every dispatch in order, then the copies."""

    def record(self, dispatches: Sequence[Dispatch], copies: Sequence[Copy] = ()) -> Recording:
        """Prepare a command list for repeated submission by run()."""
        return Recording(tuple(dispatches), tuple(copies))

    def prepare(self, recording: Recording) -> None:
        """A hint that `recording` is run next: an implementation may do its per-run host work
        for it now, while the GPU works (native: encode its command buffer). No effect on
        results; a recording prepared and never run again costs only memory until destroy."""
        return None      # the default: nothing to do ahead (the browser's replay is one call)

    async def run(self, recording: Recording, writes: Sequence[tuple[Any, int, np.ndarray]] = (),
                  read: tuple[Any, int, int] | None = None) -> bytes | None:
        """One step of the hot path: queue the writes (buffer, offset, array), submit the
        recording, and when `read` = (MAP_READ buffer, offset, size) is given, map that range
        once the GPU is done and return its bytes. Raises RuntimeError when the readback
        cannot complete (a lost device); GPU errors go to scopes / the uncaptured callback."""
        for buffer, offset, data in writes:
            self.write_buffer(buffer, offset, data)
        self.submit(recording.dispatches, recording.copies)
        if read is None:
            return None
        return await self.read_mapped(*read)

    @abc.abstractmethod
    async def read_mapped(self, buffer: Any, offset: int, size: int) -> bytes:
        """Map a range of a MAP_READ buffer (after the submits that fill it), copy it out, unmap."""


class Gpu(abc.ABC):
    """The entry point: navigator.gpu or wgpu.gpu."""

    @abc.abstractmethod
    async def request_adapter(self, feature_level: str = "core") -> Adapter | None:
        """None when no adapter is available (WebGPU's null adapter)."""


class DeviceRequestError(RuntimeError):
    """requestDevice rejected: a feature or limit the adapter does not have, or no device."""


class PipelineError(RuntimeError):
    """createComputePipelineAsync rejected: the WGSL did not compile or validate."""


def check_feature_level(feature_level: str) -> None:
    if feature_level not in FEATURE_LEVELS:
        raise ValueError(f"feature level must be one of {FEATURE_LEVELS}, not {feature_level!r}")


def check_binding_kinds(kinds: Sequence[str]) -> None:
    for kind in kinds:
        if kind not in BINDING_KINDS:
            raise ValueError(f"binding kind must be one of {BINDING_KINDS}, not {kind!r}")


def check_error_filter(filter: str) -> None:
    if filter not in ERROR_FILTERS:
        raise ValueError(f"error filter must be one of {ERROR_FILTERS}, not {filter!r}")


def as_upload(data: np.ndarray) -> np.ndarray:
    """The array as C-contiguous bytes ready for writeBuffer (WebGPU needs size % 4 == 0)."""
    if not isinstance(data, np.ndarray):
        raise TypeError(f"write_buffer takes a numpy array, not {type(data).__name__}")
    data = np.ascontiguousarray(data)
    if data.nbytes % 4:
        raise ValueError(f"write size must be a multiple of 4 bytes, got {data.nbytes}")
    return data


def align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment
