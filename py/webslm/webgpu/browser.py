"""The GPU interface on the browser's navigator.gpu, through Pyodide's JS FFI.

Runs only inside the worker (worker/worker.mjs), which registers the JS module
`webslm_bridge` (worker/bridge.mjs) before importing webslm. The bridge holds the few
operations that would otherwise cost many Python->JS calls or a copy:
- writeBuffer: JS takes a view of the numpy array's memory in the Wasm heap and hands it to
  queue.writeBuffer, so uploads make no intermediate copy;
- submit: one call encodes a whole list of dispatches and copies;
- readBuffer, popErrorScope, summaries: small async helpers returning plain JS values.
Everything else maps one-to-one onto WebGPU calls.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import js  # Pyodide's view of the worker's global scope
import numpy as np
import webslm_bridge as bridge  # registered by worker/worker.mjs
from pyodide.ffi import JsException, create_proxy, to_js

from .interface import (Adapter, AdapterSummary, BufferBinding, Copy, Device, DeviceLost,
                        DeviceRequestError, Dispatch, Gpu, GpuError, PipelineError, Recording, as_upload,
                        check_binding_kinds, check_error_filter, check_feature_level)


def _js(value: Any) -> Any:
    """Python dicts/lists -> JS objects/arrays; JS objects inside pass through unchanged."""
    return to_js(value, dict_converter=js.Object.fromEntries)


class BrowserGpu(Gpu):
    async def request_adapter(self, feature_level: str = "core") -> Adapter | None:
        check_feature_level(feature_level)
        gpu = getattr(js.navigator, "gpu", None)
        if gpu is None:
            return None
        adapter = await gpu.requestAdapter(_js({"featureLevel": feature_level}))
        return BrowserAdapter(adapter, feature_level) if adapter else None


class BrowserAdapter(Adapter):
    def __init__(self, adapter: Any, feature_level: str):
        self._adapter = adapter
        self.feature_level = feature_level
        self._summary = bridge.adapterSummary(adapter).to_py()
        self.features = frozenset(self._summary["features"])
        self.limits = {k: int(v) for k, v in self._summary["limits"].items()}

    def summary(self) -> AdapterSummary:
        s = self._summary
        return AdapterSummary(
            feature_level=self.feature_level, features=tuple(sorted(self.features)),
            limits=dict(sorted(self.limits.items())), vendor=s["vendor"],
            architecture=s["architecture"], description=s["description"],
            is_fallback=bool(s["isFallback"]))

    async def request_device(self, features: Iterable[str] = (),
                             limits: dict[str, int] | None = None) -> Device:
        features = sorted(set(features))
        try:
            device = await self._adapter.requestDevice(
                _js({"requiredFeatures": features, "requiredLimits": dict(limits or {})}))
        except JsException as exc:
            raise DeviceRequestError(f"requestDevice failed: {exc}") from exc
        return BrowserDevice(device)


class BrowserDevice(Device):
    def __init__(self, device: Any):
        self._device = device
        summary = bridge.deviceSummary(device).to_py()
        self.features = frozenset(summary["features"])
        self.limits = {k: int(v) for k, v in summary["limits"].items()}
        # navigator.gpu.wgslLanguageFeatures: what this browser's WGSL compiler accepts
        self.wgsl_language_features = frozenset(summary.get("wgslLanguageFeatures", ()))
        self._proxies: list[Any] = []   # JS holds these callbacks; keep them alive

    # -- lifetime and errors ------------------------------------------------------------
    async def _wait_lost(self) -> DeviceLost:
        info = await self._device.lost
        return DeviceLost(str(info.reason), str(info.message))

    def lost(self):
        return self._wait_lost()

    def on_uncaptured_error(self, callback: Callable[[GpuError], None]) -> None:
        def handler(event):
            error = bridge.describeError(event.error).to_py()
            callback(GpuError(error["kind"], error["message"]))
        proxy = create_proxy(handler)
        self._proxies.append(proxy)
        self._device.addEventListener("uncapturederror", proxy)

    def push_error_scope(self, filter: str) -> None:
        check_error_filter(filter)
        self._device.pushErrorScope(filter)

    async def pop_error_scope(self) -> GpuError | None:
        error = await bridge.popErrorScope(self._device)
        if error is None:
            return None
        error = error.to_py()
        return GpuError(error["kind"], error["message"])

    def destroy(self) -> None:
        self._device.destroy()
        for proxy in self._proxies:
            proxy.destroy()
        self._proxies.clear()

    # -- resources ---------------------------------------------------------------------
    def create_buffer(self, size: int, usage: int, label: str = "") -> Any:
        return self._device.createBuffer(_js({"size": int(size), "usage": int(usage), "label": label}))

    def write_buffer(self, buffer: Any, offset: int, data: np.ndarray) -> None:
        bridge.writeBuffer(self._device.queue, buffer, int(offset), as_upload(data))

    async def read_buffer(self, buffer: Any, offset: int, size: int) -> bytes:
        data = await bridge.readBuffer(self._device, buffer, int(offset), int(size))
        return data.to_bytes()

    async def read_mapped(self, buffer: Any, offset: int, size: int) -> bytes:
        data = await bridge.readMapped(buffer, int(offset), int(size))
        return data.to_bytes()

    def destroy_buffer(self, buffer: Any) -> None:
        buffer.destroy()

    # -- programs ----------------------------------------------------------------------
    def create_shader_module(self, code: str, label: str = "") -> Any:
        return self._device.createShaderModule(_js({"code": code, "label": label}))

    def create_bind_group_layout(self, kinds: Sequence[str], label: str = "") -> Any:
        check_binding_kinds(kinds)
        return bridge.createBindGroupLayout(self._device, _js(list(kinds)), label)

    def create_pipeline_layout(self, bind_group_layouts: Sequence[Any], label: str = "") -> Any:
        return self._device.createPipelineLayout(
            _js({"bindGroupLayouts": list(bind_group_layouts), "label": label}))

    async def create_compute_pipeline(self, layout: Any, module: Any, entry_point: str,
                                      constants: dict[str, float] | None = None,
                                      label: str = "") -> Any:
        stage = {"module": module, "entryPoint": entry_point, "constants": dict(constants or {})}
        try:
            return await self._device.createComputePipelineAsync(
                _js({"layout": layout, "compute": stage, "label": label}))
        except JsException as exc:
            raise PipelineError(f"{label or entry_point}: {exc}") from exc

    def create_bind_group(self, layout: Any, entries: Sequence[BufferBinding], label: str = "") -> Any:
        js_entries = []
        for index, entry in enumerate(entries):
            resource = {"buffer": entry.buffer, "offset": entry.offset}
            if entry.size is not None:
                resource["size"] = entry.size
            js_entries.append({"binding": index, "resource": resource})
        return self._device.createBindGroup(_js({"layout": layout, "entries": js_entries, "label": label}))

    # -- work --------------------------------------------------------------------------
    def submit(self, dispatches: Sequence[Dispatch], copies: Sequence[Copy] = ()) -> None:
        bridge.submit(self._device, *_command_lists(dispatches, copies))

    def record(self, dispatches: Sequence[Dispatch], copies: Sequence[Copy] = ()) -> Recording:
        """The lists converted to JS once; run() then replays them in one bridge call."""
        return Recording(tuple(dispatches), tuple(copies), _command_lists(dispatches, copies))

    async def run(self, recording: Recording, writes=(), read=None) -> bytes | None:
        """Per step: one writeBuffer call per write, one call that submits the recorded lists
        (and maps the readback range), and one conversion of the bytes: 4 FFI calls for the
        engine's decode step (params and the token id, submit and read, to_bytes)."""
        for buffer, offset, data in writes:
            bridge.writeBuffer(self._device.queue, buffer, int(offset), as_upload(data))
        handle = recording.handle or _command_lists(recording.dispatches, recording.copies)
        if read is None:
            bridge.submit(self._device, *handle)
            return None
        buffer, offset, size = read
        data = await bridge.submitAndRead(self._device, handle[0], handle[1], buffer, int(offset), int(size))
        return data.to_bytes()


def _command_lists(dispatches: Sequence[Dispatch], copies: Sequence[Copy]) -> tuple[Any, Any]:
    """The bridge's JS arrays: [pipeline, [group...], x, y, z] and [src, off, dst, off, size]."""
    return (_js([[d.pipeline, list(d.bind_groups), *d.grid] for d in dispatches]),
            _js([[c.source, c.source_offset, c.destination, c.destination_offset, c.size] for c in copies]))
