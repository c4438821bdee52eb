"""The native implementation behaves like WebGPU where wgpu-py does not by itself:
errors go to scopes or the uncaptured handler, invalid objects poison later calls,
destroy() resolves `lost`, and names are the browser's."""
import asyncio
import subprocess
import sys

import numpy as np
import pytest

from webslm.kernels.registry import KernelError, compile_kernel
from webslm.webgpu.interface import BufferUsage, DeviceRequestError, PipelineError
from webslm.webgpu.native import Invalid, camel_limit, kebab_limit


async def _device(gpu):
    adapter = await gpu.request_adapter("core")
    return adapter, await adapter.request_device()


def test_names_are_the_browsers(native_gpu, run):
    adapter, device = run(_device(native_gpu))
    assert "maxStorageBufferBindingSize" in adapter.limits
    assert "subgroup" not in adapter.features          # wgpu-native's spelling is translated
    assert all("-" not in name for name in adapter.limits)
    assert camel_limit("max-compute-workgroup-storage-size") == "maxComputeWorkgroupStorageSize"
    assert kebab_limit("maxComputeWorkgroupStorageSize") == "max-compute-workgroup-storage-size"
    device.destroy()


def test_validation_error_goes_to_the_innermost_scope(native_gpu, run):
    async def body():
        _, device = await _device(native_gpu)
        device.push_error_scope("out-of-memory")
        device.push_error_scope("validation")
        buffer = device.create_buffer(16, 0)              # usage 0 is invalid
        validation = await device.pop_error_scope()
        oom = await device.pop_error_scope()
        device.destroy()
        return buffer, validation, oom
    buffer, validation, oom = run(body())
    assert isinstance(buffer, Invalid)
    assert validation is not None and validation.kind == "validation"
    assert oom is None


def test_unscoped_error_reaches_the_uncaptured_handler_and_invalid_objects_propagate(native_gpu, run):
    async def body():
        _, device = await _device(native_gpu)
        seen = []
        device.on_uncaptured_error(seen.append)
        bad = device.create_buffer(16, 0)
        device.write_buffer(bad, 0, np.ones(4, np.float32))   # using an invalid object
        device.destroy()
        return seen
    seen = run(body())
    assert [e.kind for e in seen] == ["validation", "validation"]
    assert "invalid" in seen[1].message


def test_destroy_resolves_lost(native_gpu, run):
    async def body():
        _, device = await _device(native_gpu)
        lost = asyncio.ensure_future(device.lost())
        await asyncio.sleep(0)
        assert not lost.done()
        device.destroy()
        return await asyncio.wait_for(lost, 5)
    info = run(body())
    assert info.reason == "destroyed"


# Devices destroyed while a readback is pending; after each, devices made before it are freed
# (their wgpu-py callbacks' memory is freed on top of the map callback's), a new adapter is
# requested (its wgpuInstanceProcessEvents is where wgpu-native called a map callback left
# pending) and used, and the garbage is collected; then the process exits.
ABANDONED_READBACKS = """
import asyncio, gc
import numpy as np
from webslm.webgpu.native import NativeGpu
from webslm.webgpu.interface import BufferUsage, Copy

async def one(adapter, i):
    others = [await adapter.request_device() for _ in range(i % 3)]
    device = await adapter.request_device()
    source = device.create_buffer(1 << 22, BufferUsage.STORAGE | BufferUsage.COPY_DST | BufferUsage.COPY_SRC)
    device.write_buffer(source, 0, np.ones(1 << 20, np.float32))
    staging = device.create_buffer(1 << 22, BufferUsage.MAP_READ | BufferUsage.COPY_DST, "staging")
    device.submit([], [Copy(source, 0, staging, 0, 1 << 22)] * (i % 4 * 4))    # 0-12 copies to wait for
    read = asyncio.ensure_future(device.read_mapped(staging, 0, 1 << 22))
    await asyncio.sleep(0)                     # the map is requested
    device.destroy()
    try:
        await asyncio.wait_for(read, 10)
        result = "the readback completed"    # the map landed just before the loss (a race)
    except RuntimeError as exc:              # rejected: a typed failure
        result = str(exc)
    for other in others:
        other.destroy()
    del others
    gc.collect()
    fresh = await (await NativeGpu().request_adapter()).request_device()
    data = np.arange(64, dtype=np.uint32)
    buffer = fresh.create_buffer(256, BufferUsage.STORAGE | BufferUsage.COPY_DST | BufferUsage.COPY_SRC)
    fresh.write_buffer(buffer, 0, data)
    assert np.frombuffer(await fresh.read_buffer(buffer, 0, 256), np.uint32).tolist() == data.tolist()
    fresh.destroy()
    return result

async def main():
    adapter = await NativeGpu().request_adapter()
    for i in range(8):
        print(await one(adapter, i), flush=True)
        gc.collect()

asyncio.run(main())
gc.collect()
print("collected")
"""


def test_a_readback_pending_at_destroy_fails_and_never_crashes_later(native_gpu):
    """The pending map is rejected (not left waiting forever) or, in a race, lands just before the
    loss; and nothing crashes or misfires later: wgpu-native used to call the abandoned map's
    callback at the next adapter request, after wgpu-py had freed it, which crashed this script
    (segfault or illegal instruction) 13 runs in 20, and in most others landed in another
    callback that reused its memory: a device-lost callback printing "DEVICE LOST!", or an
    adapter request's callback called twice ("Ignoring call to GPUPromise._set_input")."""
    out = subprocess.run([sys.executable, "-c", ABANDONED_READBACKS], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    lines = out.stdout.splitlines()
    assert len(lines) == 9 and lines[-1] == "collected", out.stdout
    assert all("readback" in line for line in lines[:8]), lines      # a typed failure or a whole read
    assert "DEVICE LOST" not in out.stderr and "Ignoring call" not in out.stderr, out.stderr[-2000:]


def test_missing_feature_is_a_typed_device_request_error(native_gpu, run):
    async def body():
        adapter = await native_gpu.request_adapter("core")
        await adapter.request_device(features=["texture-compression-astc-sliced-3d-not-a-feature"])
    with pytest.raises(DeviceRequestError):
        run(body())


def test_bad_wgsl_is_a_pipeline_error(native_gpu, run):
    async def body():
        _, device = await _device(native_gpu)
        device.push_error_scope("validation")
        module = device.create_shader_module("this is not wgsl")
        layout = device.create_pipeline_layout([device.create_bind_group_layout(["storage"])])
        try:
            await device.create_compute_pipeline(layout, module, "main")
        finally:
            error = await device.pop_error_scope()
            device.destroy()
        return error
    with pytest.raises(PipelineError):
        run(body())


def test_override_outside_the_allowlist_is_refused_before_any_gpu_work(native_gpu, run):
    async def body():
        _, device = await _device(native_gpu)
        try:
            await compile_kernel(device, "probe_matvec_f32", WG=96)
        finally:
            device.destroy()
    with pytest.raises(KernelError, match="WG=96"):
        run(body())
    with pytest.raises(KernelError, match="no kernel"):
        run(compile_kernel(None, "not_a_kernel"))


def test_write_then_read_round_trips_bytes_exactly(native_gpu, run):
    async def body():
        _, device = await _device(native_gpu)
        data = np.random.default_rng(3).integers(0, 2**32, 1001, dtype=np.uint32)  # odd length
        buffer = device.create_buffer(data.nbytes, BufferUsage.STORAGE | BufferUsage.COPY_DST | BufferUsage.COPY_SRC)
        device.write_buffer(buffer, 0, data)
        whole = await device.read_buffer(buffer, 0, data.nbytes)
        part = await device.read_buffer(buffer, 8, 6)           # unaligned size is padded internally
        device.destroy()
        return data, whole, part
    data, whole, part = run(body())
    assert whole == data.tobytes()
    assert part == data.tobytes()[8:14]
