"""A Device that keeps count of what it created, and the fault injection points of admission.

Admission must leave nothing allocated when it fails. `TrackedDevice` wraps any Device
(browser or native) and counts live buffers, so a failed admission can prove it released
every one, and the tests can assert it.

`Faults` names what a test wants to go wrong, each at the point where the real failure
would surface, never by skipping the code that detects it:

    hide_features       the adapter reports fewer features; with require_tier, a policy that
                        needs what is hidden (a missing-feature rejection)
    limit_overrides     the adapter reports smaller limits (a plan that does not fit)
    fail_allocation_at  the n-th buffer is created oversize (a real GPU validation error,
                        caught by the allocation's error scope like an out-of-memory)
    fail_compile_at     the n-th pipeline compilation rejects (as createComputePipelineAsync can)
    corrupt_readback_at the n-th readback returns one float changed (wrong GPU arithmetic,
                        which only the self-test's comparison with the oracle can notice)
    lose_device_at      the device is destroyed at that stage (device.lost resolves)
    cancel_at           the admission is cancelled at that stage
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import numpy as np

from ..webgpu.interface import Device, PipelineError


@dataclasses.dataclass(frozen=True)
class Faults:
    hide_features: frozenset[str] = frozenset()
    require_tier: str | None = None
    limit_overrides: dict = dataclasses.field(default_factory=dict)
    fail_allocation_at: int | None = None
    fail_compile_at: int | None = None
    corrupt_readback_at: int | None = None
    lose_device_at: str | None = None     # a stage name
    cancel_at: str | None = None          # a stage name

    @classmethod
    def named(cls, name: str | None) -> "Faults":
        """The fault cases the tests and the worker's `admit` request can ask for by name."""
        cases = {
            None: cls(),
            "missing-feature": cls(hide_features=frozenset({"shader-f16", "subgroups"}), require_tier="B"),
            "limit-too-small": cls(limit_overrides={"maxStorageBufferBindingSize": 1 << 20,
                                                    "maxBufferSize": 1 << 20}),
            "allocation-failure": cls(fail_allocation_at=3),
            "compile-failure": cls(fail_compile_at=2),
            "self-test-mismatch": cls(corrupt_readback_at=1),
            "device-lost": cls(lose_device_at="compile"),
            "cancel": cls(cancel_at="allocate"),
        }
        if name not in cases:
            raise ValueError(f"no fault case named {name!r}; known: {sorted(k for k in cases if k)}")
        return cases[name]


# Each named fault and the (stage, code) admission must end with: the contract the native and
# browser tests hold every implementation to.
FAULT_OUTCOMES = {
    "missing-feature": ("tier", "missing-feature"),
    "limit-too-small": ("tier", "limit-too-small"),
    "allocation-failure": ("allocate", "allocation-failed"),
    "compile-failure": ("compile", "pipeline-failed"),
    "self-test-mismatch": ("self-test", "self-test-failed"),
    "device-lost": ("compile", "device-lost"),
    "cancel": ("allocate", "cancelled"),
}
NAMED_FAULTS = tuple(FAULT_OUTCOMES)
# Every TrackedDevice until destroy(); weak, so a device nobody holds (and whose GPU the
# browser collects) is not counted as open.
_OPEN: "weakref.WeakSet[TrackedDevice]" = weakref.WeakSet()


def open_devices() -> dict:
    """The admitted devices not destroyed yet, and the buffers they hold: after a model is
    unloaded or switched, exactly the current model's (the browser soak checks it)."""
    devices = list(_OPEN)
    return {"devices": len(devices), "buffers": sum(len(d.live_buffers) for d in devices)}


class TrackedDevice(Device):
    """Forwards every call to `inner`; counts buffers; applies the armed faults."""

    def __init__(self, inner: Device, faults: Faults = Faults()):
        self.inner = inner
        self.faults = faults
        self.features = inner.features
        self.limits = inner.limits
        self.implicit_wgsl_enables = getattr(inner, "implicit_wgsl_enables", frozenset())
        # What its WGSL compiler accepts (packed dot products: registry.capabilities)
        self.wgsl_language_features = frozenset(getattr(inner, "wgsl_language_features", ()))
        self.live_buffers: set[int] = set()
        self.buffers_created = 0
        self.pipelines_requested = 0
        self.readbacks = 0
        self.destroyed = False
        _OPEN.add(self)

    # lifetime and errors
    def lost(self):
        return self.inner.lost()

    def on_uncaptured_error(self, callback) -> None:
        self.inner.on_uncaptured_error(callback)

    def push_error_scope(self, filter: str) -> None:
        self.inner.push_error_scope(filter)

    async def pop_error_scope(self):
        return await self.inner.pop_error_scope()

    def destroy(self) -> None:
        self.destroyed = True
        _OPEN.discard(self)
        self.live_buffers.clear()      # destroying a device destroys every buffer it owns
        self.inner.destroy()

    # resources
    def create_buffer(self, size: int, usage: int, label: str = "") -> Any:
        self.buffers_created += 1
        if self.faults.fail_allocation_at == self.buffers_created:
            size = self.limits["maxBufferSize"] + 4       # invalid: the error scope reports it
        buffer = self.inner.create_buffer(size, usage, label)
        self.live_buffers.add(id(buffer))
        return buffer

    def write_buffer(self, buffer: Any, offset: int, data: np.ndarray) -> None:
        self.inner.write_buffer(buffer, offset, data)

    async def read_buffer(self, buffer: Any, offset: int, size: int) -> bytes:
        data = await self.inner.read_buffer(buffer, offset, size)
        self.readbacks += 1
        if self.faults.corrupt_readback_at == self.readbacks and size >= 4:
            words = bytearray(data)
            value = np.frombuffer(bytes(words[:4]), np.float32)[0]
            words[:4] = np.float32(value * 1.5 + 1.0).tobytes()   # a wrong answer, still finite
            return bytes(words)
        return data

    def destroy_buffer(self, buffer: Any) -> None:
        self.live_buffers.discard(id(buffer))
        self.inner.destroy_buffer(buffer)

    # programs
    def create_shader_module(self, code: str, label: str = "") -> Any:
        return self.inner.create_shader_module(code, label)

    def create_bind_group_layout(self, kinds, label: str = "") -> Any:
        return self.inner.create_bind_group_layout(kinds, label)

    def create_pipeline_layout(self, bind_group_layouts, label: str = "") -> Any:
        return self.inner.create_pipeline_layout(bind_group_layouts, label)

    async def create_compute_pipeline(self, layout, module, entry_point, constants=None, label=""):
        self.pipelines_requested += 1
        if self.faults.fail_compile_at == self.pipelines_requested:
            raise PipelineError(f"{label or entry_point}: compilation rejected (injected fault)")
        return await self.inner.create_compute_pipeline(layout, module, entry_point, constants, label)

    def create_bind_group(self, layout, entries, label: str = "") -> Any:
        return self.inner.create_bind_group(layout, entries, label)

    # work
    def submit(self, dispatches, copies=()) -> None:
        self.inner.submit(dispatches, copies)

    def record(self, dispatches, copies=()):
        return self.inner.record(dispatches, copies)

    def prepare(self, recording) -> None:
        self.inner.prepare(recording)

    async def run(self, recording, writes=(), read=None):
        return await self.inner.run(recording, writes, read)

    async def read_mapped(self, buffer, offset: int, size: int) -> bytes:
        return await self.inner.read_mapped(buffer, offset, size)
