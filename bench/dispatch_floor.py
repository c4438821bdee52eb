"""What one compute dispatch costs on this device when its work is nearly nothing.

    PYTHONPATH=py python bench/dispatch_floor.py [--dispatches 512] [--out FILE]

A decode step of a small model is a chain of ~150-190 dependent dispatches whose kernels
move little data; how much of a step is the chain itself decides what fusion buys. Each case
records `--dispatches` dispatches of a tiny WGSL kernel into one compute pass, submits them
and waits, and reports wall time / dispatches (median of 7 after 3 warm-ups):

    dependent-1wg     1 workgroup; dispatch i reads what i - 1 wrote (buffers A -> B -> A ...):
                      the barrier + launch latency of a dependent dispatch
    dependent-132wg   the same with 132 workgroups (one per H200 multiprocessor)
    dependent-1024wg  1024 workgroups
    independent-1wg   each dispatch writes its own buffer and reads a shared one: no
                      dependency, so no barrier is needed (whether wgpu inserts one shows here)
    same-rw-1wg       one read_write buffer, a[i] += 1 every dispatch (read-write -> read-write)
    passes-1wg        as dependent-1wg, but every dispatch in its own compute pass

The kernels are this benchmark's own (not the shader bundle's): the interface's registry
compiles only trusted model kernels, so this script talks to wgpu-py directly.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import time

import numpy as np
import wgpu

SHADER = """
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@compute @workgroup_size(64)
fn copy_plus(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x % 4096u;
    dst[i] = src[i] + 1u;
}
"""
RW_SHADER = """
@group(0) @binding(0) var<storage, read_write> a: array<u32>;
@compute @workgroup_size(64)
fn bump(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x % 4096u;
    a[i] = a[i] + 1u;
}
"""


def main(args) -> dict:
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    device = adapter.request_device_sync()
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    n = args.dispatches

    def buffer():
        b = device.create_buffer(size=4096 * 4, usage=usage)
        device.queue.write_buffer(b, 0, np.zeros(4096, np.uint32))
        return b

    module = device.create_shader_module(code=SHADER)
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "copy_plus"})
    layout = pipeline.get_bind_group_layout(0)
    rw_module = device.create_shader_module(code=RW_SHADER)
    rw_pipeline = device.create_compute_pipeline(layout="auto", compute={"module": rw_module, "entry_point": "bump"})

    def group(src, dst):
        return device.create_bind_group(layout=layout, entries=[
            {"binding": 0, "resource": {"buffer": src, "offset": 0, "size": src.size}},
            {"binding": 1, "resource": {"buffer": dst, "offset": 0, "size": dst.size}}])

    a, b = buffer(), buffer()
    ping_pong = [group(a, b), group(b, a)]
    shared = buffer()
    own = [buffer() for _ in range(n)]
    independent = [group(shared, own[i]) for i in range(n)]
    rw_group = device.create_bind_group(layout=rw_pipeline.get_bind_group_layout(0), entries=[
        {"binding": 0, "resource": {"buffer": a, "offset": 0, "size": a.size}}])

    def encode(pipe, groups, workgroups, separate_passes=False):
        encoder = device.create_command_encoder()
        compute = None
        for i in range(n):
            if compute is None or separate_passes:
                if compute is not None:
                    compute.end()
                compute = encoder.begin_compute_pass()
                compute.set_pipeline(pipe)
            compute.set_bind_group(0, groups[i % len(groups)])
            compute.dispatch_workgroups(workgroups, 1, 1)
        compute.end()
        return encoder.finish()

    cases = {
        "dependent-1wg": (pipeline, ping_pong, 1, False),
        "dependent-132wg": (pipeline, ping_pong, 132, False),
        "dependent-1024wg": (pipeline, ping_pong, 1024, False),
        "independent-1wg": (pipeline, independent, 1, False),
        "same-rw-1wg": (rw_pipeline, [rw_group], 1, False),
        "passes-1wg": (pipeline, ping_pong, 1, True),
    }
    rows = {}
    for name, (pipe, groups, workgroups, passes) in cases.items():
        times = []
        for round_ in range(10):
            command_buffer = encode(pipe, groups, workgroups, passes)
            started = time.perf_counter()
            device.queue.submit([command_buffer])
            device.queue.read_buffer(a, 0, 4)          # waits for the queue
            if round_ >= 3:
                times.append(time.perf_counter() - started)
        rows[name] = {"us_per_dispatch": statistics.median(times) / n * 1e6, "dispatches": n}
        print(f"{name:<18} {rows[name]['us_per_dispatch']:7.2f} us a dispatch", flush=True)
    empty = []
    for _ in range(10):
        started = time.perf_counter()
        device.queue.submit([device.create_command_encoder().finish()])
        device.queue.read_buffer(a, 0, 4)
        empty.append(time.perf_counter() - started)
    info = adapter.info
    report = {"adapter": f"{info.get('device', '?')} ({info.get('backend_type', '?')})", "host": platform.platform(),
              "date": time.strftime("%Y-%m-%d"), "wgpu": wgpu.__version__,
              "empty_submit_and_read_us": statistics.median(empty[3:]) * 1e6, "cases": rows}
    print(f"empty submit + read: {report['empty_submit_and_read_us']:.1f} us", flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dispatches", type=int, default=512)
    parser.add_argument("--out")
    main(parser.parse_args())
