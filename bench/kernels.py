"""Kernel bandwidth and throughput on a native WebGPU adapter (wgpu-native), with the copy
roofline measured in the same run.

    PYTHONPATH=py python bench/kernels.py [--families matvec,gemm,...] [--quick] [--out FILE]

What one row means
- A kernel variant (the one the host code would choose for this device) on one named shape
  (the family's BENCH_SHAPES: SmolLM2-135M, Llama-3.2-1B and Llama-3-8B layers).
- `us`: GPU time per dispatch (per instance for multi-pass kernels), warm: the median over 5 rounds of (time from submit to the
  completion of a small readback) / dispatches in the round. Encoding happens before the
  submit, so Python's encode cost is not in it; the readback's latency is, amortized over
  rounds of >= 50 ms, after 0.3 s of the same work to bring the clocks up. `cold_us` is one dispatch alone right after compilation.
- Each round cycles through enough distinct copies of the buffers that the working set
  exceeds 512 MiB (at most 256 copies), so weights come from memory, not from the H200's
  ~50 MiB L2. `working_set_mib` says how big it was; smaller than ~200 MiB means caches
  helped and the row is marked `cache_resident`.
- `gbps` = the family's minimum bytes moved per dispatch / us; `of_copy` = gbps / the
  copy kernel's gbps (shaders/copy.wgsl, bytes read + written) from this same run.
- `gflops` where the family states flops (GEMM, attention).

Dispatches in a round have no data dependencies (distinct buffers), so the GPU may overlap
them: this measures streaming throughput, the figure the roofline ratio is about. The
engine's dependent chain adds per-dispatch latency on top; bench/engine (issue 8) measures that.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import pathlib
import platform
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from webslm.kernels import FAMILY_MODULES, runner  # noqa: E402
from webslm.kernels.registry import KERNEL_FEATURES, compile_kernel  # noqa: E402
from webslm.webgpu.native import NativeGpu  # noqa: E402

MiB = 1 << 20
WORKING_SET = 512 * MiB
MAX_COPIES = 256
QUICK_SHAPES = ("smollm2", "square")   # what --quick benches (software adapters are slow)
ROUND_SECONDS = 0.05
WARMUP_SECONDS = 0.3     # the H200 idles at a low SM clock; raise it before timing
COPY_TRIES = 5           # copy_roofline: at most this many readings ...
COPY_AGREE = 0.03        # ... until two in a row agree within this fraction


async def open_device(gpu):
    adapter = await gpu.request_adapter("core")
    if adapter is None:
        raise SystemExit("no native WebGPU adapter")
    features = sorted(KERNEL_FEATURES & adapter.features)
    wanted = ("maxStorageBufferBindingSize", "maxBufferSize", "maxComputeWorkgroupStorageSize",
              "maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX")
    limits = {name: adapter.limits[name] for name in wanted if name in adapter.limits}
    return adapter, await adapter.request_device(features=features, limits=limits)


async def time_rounds(device, dispatches, sync_buffer, count: int, rounds: int = 5) -> list[float]:
    """Seconds per dispatch for `rounds` submits of `count` dispatches cycling the list."""
    batch = [dispatches[i % len(dispatches)] for i in range(count)]
    timings = []
    for _ in range(rounds):
        device.submit(batch[:0])                       # nothing queued before the clock starts
        await device.read_buffer(sync_buffer, 0, 4)
        device.submit(batch)
        started = time.perf_counter()                  # encoding is done: the GPU has the work
        await device.read_buffer(sync_buffer, 0, 4)
        timings.append((time.perf_counter() - started) / count)
    return timings


async def measure(device, prepare, bytes_per_instance: int, quick: bool) -> dict:
    """Prepare copies, calibrate a round to >= ROUND_SECONDS, time it; release everything."""
    copies = max(1, min(MAX_COPIES, -(-WORKING_SET // max(bytes_per_instance, 1))))
    if quick:
        copies = 1                    # a CPU adapter has no GPU cache to defeat
    instances = [await prepare() for _ in range(copies)]
    try:
        sync = instances[-1].outputs[-1][0]
        # a multi-pass kernel (logits) lists its passes in `dispatches`; they stay in order
        dispatches = [d for p in instances for d in (getattr(p, "dispatches", None) or [p.dispatch])]
        passes = len(dispatches) // len(instances)
        started = time.perf_counter()
        device.submit(dispatches[:passes])
        await device.read_buffer(sync, 0, 4)
        cold = time.perf_counter() - started
        estimate = min(await time_rounds(device, dispatches, sync, len(dispatches), rounds=1 if quick else 2))
        count = max(len(dispatches), int(ROUND_SECONDS / max(estimate, 1e-7)))
        count = min(count, 20_000) if not quick else min(count, 50)
        count = max(passes, count // passes * passes)
        if not quick:
            await time_rounds(device, dispatches, sync, count, rounds=max(1, int(WARMUP_SECONDS / ROUND_SECONDS)))
        seconds = passes * statistics.median(
            await time_rounds(device, dispatches, sync, count, rounds=3 if quick else 5))
        return {"us": seconds * 1e6, "passes": passes, "cold_us": cold * 1e6, "copies": copies,
                "dispatches_per_round": count,
                "working_set_mib": round(copies * bytes_per_instance / MiB, 1),
                "cache_resident": copies * bytes_per_instance < 200 * MiB,
                "bytes_moved": instances[0].bytes_moved, "flops": instances[0].flops}
    finally:
        for p in instances:
            p.release(device)


async def copy_roofline(device, quick: bool, total_bytes: int | None = None, tries: int = COPY_TRIES) -> dict:
    """The copy kernel over a buffer far larger than any cache: GB/s of bytes read + written.
    With total_bytes: a copy moving that many bytes (read + written), the same-size
    denominator for a kernel whose dispatches are too short to reach the big copy's rate.
    tries: at most this many readings (one with quick), until two in a row agree."""
    size = (16 if quick else 256) * MiB if total_bytes is None else max(16, total_bytes // 2 // 16 * 16)
    limit = device.limits["maxStorageBufferBindingSize"]
    size = min(size, limit // 16 * 16)
    kernel = await compile_kernel(device, "copy_vec4", WG=256)
    n = size // 16
    groups = min(-(-n // 256), 65535)
    src = np.arange(size // 4, dtype=np.uint32)

    async def prepare():
        p = runner.prepare(device, kernel, runner.params_words(n), [src], [(size // 4, np.uint32)], (groups, 1, 1))
        p.bytes_moved = 2 * size
        return p
    # Timed again until two readings agree: after a stretch of host work (an admission) the
    # H200 has dropped its SM clock (645 of 1980 MHz seen), and the first reading then comes
    # out at 1.7 TB/s instead of 4.1 (bench/results/copyprobe_h200.json). The best is the roofline.
    samples = []
    for _ in range(1 if quick else tries):
        result = await measure(device, prepare, 2 * size, quick)
        samples.append(result["bytes_moved"] / result["us"] / 1e3)
        if len(samples) >= 2 and abs(samples[-1] - samples[-2]) <= COPY_AGREE * max(samples[-2:]):
            break
    best = max(samples)
    result["us"] = result["bytes_moved"] / best / 1e3
    result["gbps"], result["samples_gbps"] = best, [round(g, 1) for g in samples]
    return {"family": "copy", "kernel": "copy_vec4[WG=256]", "shape": f"{size // MiB} MiB", **result}


async def bench_family(device, module, quick: bool, copy_gbps: float, only: set[str] | None,
                       names_override: list[str] | None = None, same_size_copy: bool = False) -> list[dict]:
    rows = []
    shapes = module.BENCH_SHAPES
    names = names_override or bench_names(module)
    for shape_name, shape in shapes.items():
        if quick and (shape.get("big", False) or not any(word in shape_name for word in QUICK_SHAPES)):
            continue                  # software adapters: the SmolLM2 shapes and one square
        for name in names:
            variant = name or shape.get("kernel")
            if only and variant not in only and shape_name not in only:
                continue
            rng = np.random.default_rng(0)
            try:
                probe = await module.prepare_bench(device, variant, shape, rng)
            except ValueError as exc:       # e.g. a decode kernel offered a prefill shape
                print(f"skip {variant} on {shape_name}: {exc}", flush=True)
                continue
            bytes_per_instance = sum(_size(b) for b in probe.buffers)
            probe.release(device)

            async def prepare(variant=variant, shape=shape, rng=rng):
                return await module.prepare_bench(device, variant, shape, rng)
            result = await measure(device, prepare, bytes_per_instance, quick)
            result["gbps"] = result["bytes_moved"] / result["us"] / 1e3
            result["of_copy"] = result["gbps"] / copy_gbps
            if same_size_copy:
                same = await copy_roofline(device, quick, total_bytes=result["bytes_moved"])
                result["copy_same_bytes_gbps"] = same["gbps"]
                result["of_copy_same_bytes"] = result["gbps"] / same["gbps"]
            if result["flops"]:
                result["gflops"] = result["flops"] / result["us"] / 1e3
            row = {"family": module.__name__.rsplit(".", 1)[1], "kernel": variant, "shape": shape_name, **result}
            rows.append(row)
            print(_line(row), flush=True)
    return rows


def bench_names(module) -> list:
    """The variants a family benchmarks (its BENCH_NAMES or BENCH_KERNELS); [None] when each
    shape names its own kernel (gemm's shape["kernel"])."""
    for attribute in ("BENCH_NAMES", "BENCH_KERNELS"):
        if hasattr(module, attribute):
            return list(getattr(module, attribute))
    return [None]


def _size(buffer) -> int:
    return int(getattr(buffer, "size", 0))


def _line(row: dict) -> str:
    extra = f"  {row['gflops']:8.1f} GFLOP/s" if row.get("gflops") else ""
    ratio = f"  {row['of_copy']:5.2f}x copy" if "of_copy" in row else ""
    if "of_copy_same_bytes" in row:
        ratio += f" ({row['of_copy_same_bytes']:4.2f}x a {row['copy_same_bytes_gbps']:.0f} GB/s copy of its size)"
    cached = "  (cache-resident)" if row.get("cache_resident") else ""
    return (f"{row['family']:10s} {row['kernel']:24s} {row['shape']:30s} {row['us']:9.2f} us "
            f"{row['gbps']:8.1f} GB/s{ratio}{extra}{cached}")


async def main(args) -> dict:
    adapter, device = await open_device(NativeGpu())
    summary = adapter.summary()
    report = {"adapter": {"description": summary.description, "vendor": summary.vendor,
                          "architecture": summary.architecture, "features": list(device.features)},
              "host": platform.platform(), "date": time.strftime("%Y-%m-%d"),
              "quick": args.quick, "rows": []}
    print(f"adapter: {summary.description}; features {sorted(device.features)}", flush=True)
    copy = await copy_roofline(device, args.quick)
    print(_line(copy), flush=True)
    report["copy"] = copy
    families = args.families.split(",") if args.families else [m for m in FAMILY_MODULES if m != "probe"]
    only = set(args.only.split(",")) if args.only else None
    for family in families:
        module = importlib.import_module(f"webslm.kernels.{family}")
        if not hasattr(module, "BENCH_SHAPES"):
            continue
        names = args.names.split(",") if args.names and len(families) == 1 else None
        report["rows"] += await bench_family(device, module, args.quick, copy["gbps"], only, names,
                                             args.same_size_copy)
        if args.out:                                   # keep what is done if a later family fails
            args.out.write_text(json.dumps(report, indent=1))
    device.destroy()
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", help="comma-separated family modules (default: all)")
    parser.add_argument("--only", help="comma-separated variant or shape names")
    parser.add_argument("--names", help="with one family: comma-separated variant names to bench")
    parser.add_argument("--same-size-copy", action="store_true",
                        help="also time a copy moving each row's bytes (the same-size roofline)")
    parser.add_argument("--quick", action="store_true", help="few copies and dispatches (software adapters)")
    parser.add_argument("--out", type=pathlib.Path, help="write the JSON report here")
    parser.add_argument("--working-set-mib", type=int, default=512,
                        help="distinct buffers per round at least this big (defeats the L2)")
    args = parser.parse_args()
    WORKING_SET = args.working_set_mib * MiB
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(main(args))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")
