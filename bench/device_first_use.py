"""A new device's first submissions and reads, timed one by one: what admission's first look at
a rule pays (docs/RESULTS.md, "Admission's self-test on the plan's own pipelines": two reads of
80-150 ms each on the H200) and whether it is the device's or the work's.

    PYTHONPATH=py python bench/device_first_use.py [--upload-mib N] [--out FILE]

In one process: an adapter, then two devices in turn (the second shows what a process's first
device paid once). On each: empty submit + 4-byte read, five times; then N MiB written with
write_buffer and the same round trip (the first submission after it carries the upload); then
a trivial compute dispatch's first and later round trips. Seconds, one line each.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))
sys.path.insert(0, str(ROOT / "bench"))

from kernels import open_device  # noqa: E402
from webslm.webgpu.interface import BufferUsage  # noqa: E402
from webslm.webgpu.native import NativeGpu  # noqa: E402
from webslm.kernels import probe, runner  # noqa: E402,F401  (probe registers copy_vec4)
from webslm.kernels.registry import compile_kernel  # noqa: E402

STORAGE = BufferUsage.STORAGE | BufferUsage.COPY_SRC | BufferUsage.COPY_DST


async def round_trip(device, buffer) -> float:
    began = time.perf_counter()
    device.submit([])
    await device.read_buffer(buffer, 0, 4)
    return time.perf_counter() - began


async def one_device(gpu, upload_mib: int) -> dict:
    began = time.perf_counter()
    adapter, device = await open_device(gpu)
    out = {"device_s": time.perf_counter() - began}
    small = device.create_buffer(256, STORAGE, "small")
    device.write_buffer(small, 0, np.arange(64, dtype=np.uint32))
    out["empty_round_trips_s"] = [await round_trip(device, small) for _ in range(5)]
    big = device.create_buffer(upload_mib << 20, STORAGE, "big")
    began = time.perf_counter()
    chunk = np.ones(16 << 20, dtype=np.uint8)
    for offset in range(0, upload_mib << 20, chunk.size):
        device.write_buffer(big, offset, chunk)
    out["write_buffer_s"] = time.perf_counter() - began
    out["after_upload_round_trips_s"] = [await round_trip(device, small) for _ in range(3)]
    began = time.perf_counter()
    kernel = await compile_kernel(device, "copy_vec4", WG=64)
    out["compile_s"] = time.perf_counter() - began
    data = np.arange(1024, dtype=np.uint32)
    prepared = runner.prepare(device, kernel, np.array([256, 0, 0, 0], dtype=np.uint32), [data],
                              [(1024, np.uint32)], (4, 1, 1))
    trips = []
    for _ in range(4):
        began = time.perf_counter()
        device.submit([prepared.dispatch])
        await device.read_buffer(prepared.outputs[0][0], 0, 4)
        trips.append(time.perf_counter() - began)
    out["dispatch_round_trips_s"] = trips
    prepared.release(device)
    device.destroy()
    return {"adapter": adapter.summary().description, **out}


async def main(args) -> dict:
    gpu = NativeGpu()
    report = {"upload_mib": args.upload_mib, "devices": []}
    for _ in range(2):
        report["devices"].append(await one_device(gpu, args.upload_mib))
        print(json.dumps(report["devices"][-1], default=lambda x: round(x, 4)), flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upload-mib", type=int, default=128)
    parser.add_argument("--out")
    asyncio.run(main(parser.parse_args()))
