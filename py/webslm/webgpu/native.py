"""The GPU interface on wgpu-native (PyPI `wgpu`): Vulkan/Metal/D3D12 without a browser.

Where wgpu-py 0.32 differs from WebGPU, this file makes it behave like WebGPU:
- wgpu-py raises GPUValidationError (etc.) from the failing call; WebGPU instead returns an
  invalid object and reports to error scopes. wgpu-native exposes no error scopes, so they
  are kept here: a raised GPU error goes to the innermost matching scope, else to the
  uncaptured-error callbacks, and the call returns an `Invalid` placeholder whose later use
  is itself a validation error (as with WebGPU's invalid objects).
- wgpu-native 0.32 does not implement `device.lost`; loss is reported here when the device
  is destroyed through this interface. A driver reset is not observed natively.
- wgpu-native calls the subgroup feature "subgroup" and spells limits in kebab-case; both
  are translated to the browser's names.
"""
from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import wgpu

from . import native_replay
from .interface import (Adapter, AdapterSummary, BufferBinding, BufferUsage, Copy, Device, Recording,
                        DeviceLost, DeviceRequestError, Dispatch, Gpu, GpuError, PipelineError,
                        WEBGPU_FEATURES,
                        align_up, as_upload, check_binding_kinds, check_error_filter,
                        check_feature_level)

log = logging.getLogger(__name__)

# The features WebGPU standardizes; wgpu-native's own extras are left out of summaries and
# can never be requested, so a native run cannot depend on something no browser offers.
STANDARD_FEATURES = frozenset(WEBGPU_FEATURES)
_NATIVE_FEATURE_NAMES = {"subgroup": "subgroups"}
_WEB_FEATURE_NAMES = {web: native for native, web in _NATIVE_FEATURE_NAMES.items()}

_ERROR_KINDS = (
    (wgpu.GPUOutOfMemoryError, "out-of-memory"),
    (wgpu.GPUValidationError, "validation"),
    (wgpu.GPUInternalError, "internal"),
)


def camel_limit(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(part.capitalize() for part in rest)


def kebab_limit(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"-\1", name).lower()


class Invalid:
    """What a failed create call returns, like WebGPU's invalid objects."""

    def __init__(self, what: str):
        self.what = what

    def __repr__(self) -> str:
        return f"<invalid {self.what}>"


class NativeGpu(Gpu):
    async def request_adapter(self, feature_level: str = "core") -> Adapter | None:
        check_feature_level(feature_level)
        try:
            adapter = await wgpu.gpu.request_adapter_async(feature_level=feature_level)
        except RuntimeError as exc:  # wgpu-py raises when no adapter exists
            log.info("no native adapter: %s", exc)
            return None
        return NativeAdapter(adapter, feature_level) if adapter is not None else None


class NativeAdapter(Adapter):
    def __init__(self, adapter: Any, feature_level: str):
        self._adapter = adapter
        self.feature_level = feature_level
        self.features = frozenset(_NATIVE_FEATURE_NAMES.get(f, f) for f in adapter.features) & STANDARD_FEATURES
        self.limits = {camel_limit(k): int(v) for k, v in adapter.limits.items()}

    def summary(self) -> AdapterSummary:
        info = self._adapter.info
        return AdapterSummary(
            feature_level=self.feature_level, features=tuple(sorted(self.features)),
            limits=dict(sorted(self.limits.items())), vendor=str(info.get("vendor", "")),
            architecture=str(info.get("architecture", "")),
            description=f"{info.get('device', '')} ({info.get('backend_type', '')}, {info.get('adapter_type', '')})",
            is_fallback=info.get("adapter_type") == "CPU")

    async def request_device(self, features: Iterable[str] = (),
                             limits: dict[str, int] | None = None) -> Device:
        features = sorted(set(features))
        missing = [f for f in features if f not in self.features]
        if missing:
            raise DeviceRequestError(f"adapter lacks features {missing}")
        try:
            device = await self._adapter.request_device_async(
                required_features=[_WEB_FEATURE_NAMES.get(f, f) for f in features],
                required_limits={kebab_limit(k): v for k, v in (limits or {}).items()})
        except Exception as exc:
            raise DeviceRequestError(f"requestDevice failed: {exc}") from exc
        return NativeDevice(device, frozenset(features))


class NativeDevice(Device):
    # naga implements subgroup operations but not yet the `enable subgroups;` directive
    # (it rejects it); kernels/registry.py leaves that prelude out for this device.
    implicit_wgsl_enables = frozenset({"subgroups"})
    # WGSL language features naga (29, in wgpu-native 0.32) accepts: dot4I8Packed and
    # pack4xI8, lowered to SPIR-V OpSDot where the Vulkan device has integer dot products and
    # to shifts and multiplies where not (kernels/registry.py LANGUAGE_FEATURES).
    wgsl_language_features = frozenset({"packed_4x8_integer_dot_product"})
    # read_mapped blocks the thread until the GPU is done instead of awaiting (lower latency per
    # decode step; nothing else on the event loop runs meanwhile). bench/engine.py compares both.
    blocking_readback = False

    def __init__(self, device: Any, features: frozenset[str]):
        self._device = device
        self.features = features
        self.limits = {camel_limit(k): int(v) for k, v in device.limits.items()}
        self._scopes: list[tuple[str, list[GpuError]]] = []
        self._uncaptured: list[Callable[[GpuError], None]] = []
        self._lost_info: DeviceLost | None = None
        self._lost_waiters: list[asyncio.Future] = []
        # id(Recording) -> (the recording, its next command buffer) (run, prepare). The recording
        # is held so that its id is never reused by another one while its buffer waits here (a
        # retune drops the executor's recordings: a new one at the same address would run this).
        self._encoded_ahead: dict[int, tuple[Recording, Any]] = {}
        self._mapping: list[Any] = []               # buffers whose map (_map_and_read) is awaited
        self._last_run: int | None = None           # id() of the recording run last (run)
        self.replay = native_replay.load()          # the C encoding loop, else None: Python's (_encode)

    # -- lifetime and errors ------------------------------------------------------------
    async def _wait_lost(self) -> DeviceLost:
        if self._lost_info is None:
            waiter = asyncio.get_running_loop().create_future()
            self._lost_waiters.append(waiter)
            await waiter
        return self._lost_info

    def lost(self):
        return self._wait_lost()

    def on_uncaptured_error(self, callback: Callable[[GpuError], None]) -> None:
        self._uncaptured.append(callback)

    def push_error_scope(self, filter: str) -> None:
        check_error_filter(filter)
        self._scopes.append((filter, []))

    async def pop_error_scope(self) -> GpuError | None:
        if not self._scopes:
            raise RuntimeError("pop_error_scope with no scope pushed")  # WebGPU: OperationError
        _, errors = self._scopes.pop()
        return errors[0] if errors else None

    def destroy(self) -> None:
        if self._lost_info is not None:
            return
        self._retire_ahead()
        # A readback in flight is aborted first, as WebGPU's buffer.destroy() aborts a pending
        # mapAsync: wgpu-native calls the map's callback inside wgpuBufferDestroy ("Buffer map
        # aborted"), so its promise is rejected by wgpu-native itself and no callback is left
        # for it to call later. Left pending, the map waits forever (destroying the device stops
        # the poll thread that completes it). Rejecting the promise here instead (what this did
        # before) is not enough: a settled GPUPromise drops its keepalive, the cffi callback, yet
        # wgpu-native still calls it later, when the next adapter request processes the
        # instance's events or the buffer is released. That call landed in whichever callback
        # reused the memory (a new device's lost callback printed "DEVICE LOST!") or in freed
        # memory: a segfault in request_adapter_async, 13 runs in 20 of a reproduction script.
        for buffer in self._mapping:
            buffer.destroy()
        self._device.destroy()
        self._lost_info = DeviceLost("destroyed", "device.destroy() was called")
        for waiter in self._lost_waiters:
            if not waiter.done():
                waiter.set_result(self._lost_info)

    def _report(self, error: GpuError) -> None:
        for filter, errors in reversed(self._scopes):
            if filter == error.kind:
                errors.append(error)
                return
        if not self._uncaptured:
            log.warning("uncaptured GPU %s error: %s", error.kind, error.message)
        for callback in self._uncaptured:
            callback(error)

    def _call(self, what: str, function: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run one wgpu call the WebGPU way: GPU errors are reported, not raised."""
        invalid = [a for a in _flatten(args, kwargs) if isinstance(a, Invalid)]
        if invalid:
            self._report(GpuError("validation", f"{what}: uses {invalid[0]!r}"))
            return Invalid(what)
        if self._lost_info is not None:
            return Invalid(what)  # WebGPU: no new errors are generated by a lost device
        try:
            return function(*args, **kwargs)
        except wgpu.GPUError as exc:
            kind = next((k for cls, k in _ERROR_KINDS if isinstance(exc, cls)), "validation")
            self._report(GpuError(kind, f"{what}: {exc}"))
            return Invalid(what)

    # -- resources ---------------------------------------------------------------------
    def create_buffer(self, size: int, usage: int, label: str = "") -> Any:
        return self._call("createBuffer", self._device.create_buffer,
                          label=label, size=int(size), usage=int(usage))

    def write_buffer(self, buffer: Any, offset: int, data: np.ndarray) -> None:
        self._call("writeBuffer", self._device.queue.write_buffer, buffer, int(offset), as_upload(data))

    async def read_buffer(self, buffer: Any, offset: int, size: int) -> bytes:
        staging_size = align_up(size, 4)
        staging = self.create_buffer(staging_size, BufferUsage.MAP_READ | BufferUsage.COPY_DST,
                                     "readback staging")
        self.submit([], [Copy(buffer, offset, staging, 0, staging_size)])
        if isinstance(staging, Invalid) or self._lost_info is not None:
            raise RuntimeError("read_buffer: the copy could not be recorded (see error scopes)")
        try:
            return (await self._map_and_read(staging, 0, staging_size))[:size]
        finally:
            self.destroy_buffer(staging)

    async def read_mapped(self, buffer: Any, offset: int, size: int) -> bytes:
        return await self._map_and_read(buffer, offset, size)

    async def _map_and_read(self, buffer: Any, offset: int, size: int) -> bytes:
        """Map `buffer` for reading, copy the range out and unmap; destroy() aborts the map."""
        if isinstance(buffer, Invalid) or self._lost_info is not None:
            raise RuntimeError("read_mapped: the device is lost or the buffer invalid")
        promise = buffer.map_async(wgpu.MapMode.READ, int(offset), int(size))
        self._mapping.append(buffer)
        try:
            if self.blocking_readback:
                promise.sync_wait()       # the poll thread's event, without a hop through the event loop
            else:
                await promise
        except RuntimeError as exc:      # the map failed: aborted by destroy(), or refused by wgpu-native
            if self._lost_info is None:
                raise
            raise RuntimeError("read_mapped: the device was destroyed during the readback") from exc
        finally:
            self._mapping.remove(buffer)
        try:
            if self._lost_info is not None:      # the map landed, then the device was destroyed
                raise RuntimeError("read_mapped: the device was lost during the readback")
            return bytes(buffer.read_mapped(int(offset), int(size)))
        finally:
            if self._lost_info is None:   # a lost device's buffer cannot be unmapped (a validation error)
                buffer.unmap()

    def destroy_buffer(self, buffer: Any) -> None:
        if self._lost_info is not None:   # destroying the device destroyed its buffers
            return
        if not isinstance(buffer, Invalid):
            buffer.destroy()

    # -- programs ----------------------------------------------------------------------
    def create_shader_module(self, code: str, label: str = "") -> Any:
        return self._call("createShaderModule", self._device.create_shader_module, label=label, code=code)

    def create_bind_group_layout(self, kinds: Sequence[str], label: str = "") -> Any:
        check_binding_kinds(kinds)
        entries = [{"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}}
                   for i, kind in enumerate(kinds)]
        return self._call("createBindGroupLayout", self._device.create_bind_group_layout,
                          label=label, entries=entries)

    def create_pipeline_layout(self, bind_group_layouts: Sequence[Any], label: str = "") -> Any:
        return self._call("createPipelineLayout", self._device.create_pipeline_layout,
                          label=label, bind_group_layouts=list(bind_group_layouts))

    async def create_compute_pipeline(self, layout: Any, module: Any, entry_point: str,
                                      constants: dict[str, float] | None = None,
                                      label: str = "") -> Any:
        if isinstance(layout, Invalid) or isinstance(module, Invalid):
            raise PipelineError(f"{label or entry_point}: invalid layout or shader module")
        stage = {"module": module, "entry_point": entry_point, "constants": dict(constants or {})}

        def compile_now():
            return self._device.create_compute_pipeline_async(label=label, layout=layout, compute=stage).sync_wait()
        try:
            # wgpu-native compiles in the calling thread: on a worker thread, so that compiles
            # awaited together (admission's compile stage) run on several cores, as a browser's
            # createComputePipelineAsync does.
            return await asyncio.to_thread(compile_now)
        except wgpu.GPUError as exc:
            raise PipelineError(f"{label or entry_point}: {exc}") from exc

    def create_bind_group(self, layout: Any, entries: Sequence[BufferBinding], label: str = "") -> Any:
        native = [{"binding": i, "resource": _resource(e)} for i, e in enumerate(entries)]
        return self._call("createBindGroup", self._device.create_bind_group,
                          label=label, layout=layout, entries=native)

    # -- work --------------------------------------------------------------------------
    def submit(self, dispatches: Sequence[Dispatch], copies: Sequence[Copy] = ()) -> None:
        self._call("submit", self._encode_and_submit, list(dispatches), list(copies))

    def record(self, dispatches: Sequence[Dispatch], copies: Sequence[Copy] = ()) -> Recording:
        """The dispatches as raw wgpu-native handles, so a replay is three C calls per
        dispatch: wgpu-py's wrappers cost ~12 us a dispatch in Python (measured on lavapipe,
        425 dispatches: 5.2 ms per decode step), more than an H200 spends running them. With
        the replay loop (native_replay.py) those calls are made from C, in one call a step."""
        dispatches, copies = tuple(dispatches), tuple(copies)
        if any(len(d.bind_groups) != 1 or isinstance(d.pipeline, Invalid) or isinstance(d.bind_groups[0], Invalid)
               for d in dispatches):
            return Recording(dispatches, copies)          # the checked path reports the problem
        rows = [(d.pipeline._internal, d.bind_groups[0]._internal, *d.grid) for d in dispatches]
        commands = self.replay.commands(rows) if self.replay else native_replay.Commands(tuple(rows))
        return Recording(dispatches, copies, commands)

    async def run(self, recording: Recording, writes=(), read=None) -> bytes | None:
        """Submit a command buffer encoded ahead of time, then encode the next one for the
        same recording while the GPU works: a recorded list does not depend on the data the
        writes carry, so a decode step's encoding hides behind the previous step."""
        for buffer, offset, data in writes:
            self.write_buffer(buffer, offset, data)
        if recording.handle is None:
            self.submit(recording.dispatches, recording.copies)
        else:
            key = id(recording)
            ahead = self._encoded_ahead.pop(key, (None, None))[1]
            self._call("submit", lambda: self._device.queue.submit([ahead or self._encode(recording)]))
            # Encode ahead only a step that repeats (one with a readback, run twice in a row:
            # decode), and keep it for its recording until it runs: wgpu-native never frees a
            # command buffer dropped unsubmitted (~25 MB each on lavapipe), so destroy() submits
            # what is left (_retire_ahead) and a prefill chunk is never encoded ahead.
            if read is not None and key == self._last_run and self._lost_info is None:
                self._encoded_ahead[key] = (recording, self._call("encode", self._encode, recording))
            self._last_run = key
        return None if read is None else await self.read_mapped(*read)

    def prepare(self, recording: Recording) -> None:
        """Encode `recording`'s next command buffer now (the executor's next chained step, a
        different recording from the one just run, so run()'s own encoding ahead misses it)."""
        key = id(recording)
        if recording.handle is not None and key not in self._encoded_ahead and self._lost_info is None:
            self._encoded_ahead[key] = (recording, self._call("encode", self._encode, recording))

    def _retire_ahead(self) -> None:
        """At teardown: submit the command buffers encoded ahead and never run (their results
        are never read), so that wgpu-native frees them; a lost device, or one with a readback
        in flight, just drops them."""
        waiting, self._encoded_ahead = [buffer for _, buffer in self._encoded_ahead.values()], {}
        # Not while a readback maps its buffer (the step copies into it: wgpu-native aborts).
        if waiting and self._lost_info is None and not self._mapping:
            self._call("submit", lambda: self._device.queue.submit(waiting))

    def _encode(self, recording: Recording):
        from wgpu.backends.wgpu_native._ffi import ffi, lib
        encoder = self._device.create_command_encoder()
        commands: native_replay.Commands = recording.handle
        if commands:
            compute = encoder.begin_compute_pass()
            if commands.arrays is not None and self.replay is not None:
                self.replay.encode(compute._internal, commands)
            else:                         # the same calls from Python (replay.c not built, or off)
                pass_id, previous = compute._internal, None
                set_pipeline = lib.wgpuComputePassEncoderSetPipeline
                set_group, dispatch = lib.wgpuComputePassEncoderSetBindGroup, lib.wgpuComputePassEncoderDispatchWorkgroups
                for pipeline, group, x, y, z in commands.rows:
                    if pipeline != previous:
                        set_pipeline(pass_id, pipeline)
                        previous = pipeline
                    set_group(pass_id, 0, group, 0, ffi.NULL)
                    dispatch(pass_id, x, y, z)
            compute.end()
        for c in recording.copies:
            encoder.copy_buffer_to_buffer(c.source, c.source_offset, c.destination, c.destination_offset, c.size)
        return encoder.finish()

    def _encode_and_submit(self, dispatches: list[Dispatch], copies: list[Copy]) -> None:
        invalid = [o for d in dispatches for o in (d.pipeline, *d.bind_groups) if isinstance(o, Invalid)]
        invalid += [o for c in copies for o in (c.source, c.destination) if isinstance(o, Invalid)]
        if invalid:
            raise wgpu.GPUValidationError(f"command uses {invalid[0]!r}")
        encoder = self._device.create_command_encoder()
        if dispatches:
            compute = encoder.begin_compute_pass()
            for d in dispatches:
                compute.set_pipeline(d.pipeline)
                for index, group in enumerate(d.bind_groups):
                    compute.set_bind_group(index, group)
                compute.dispatch_workgroups(*d.grid)
            compute.end()
        for c in copies:
            encoder.copy_buffer_to_buffer(c.source, c.source_offset, c.destination,
                                          c.destination_offset, c.size)
        self._device.queue.submit([encoder.finish()])


def _resource(entry: BufferBinding) -> dict:
    resource = {"buffer": entry.buffer, "offset": entry.offset}
    if entry.size is not None:
        resource["size"] = entry.size
    return resource


def _flatten(args: tuple, kwargs: dict) -> list:
    """Every leaf value in the call's arguments (descriptors nest lists and dicts)."""
    flat, pending = [], [*args, *kwargs.values()]
    while pending:
        value = pending.pop()
        if isinstance(value, (list, tuple)):
            pending.extend(value)
        elif isinstance(value, dict):
            pending.extend(value.values())
        else:
            flat.append(value)
    return flat
