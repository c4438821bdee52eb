"""Every decode mat-vec candidate on the shapes that matter, against copies timed in the same run.

    PYTHONPATH=py python bench/matvec_sweep.py --out bench/results/matvec_sweep_<tag>.json
    PYTHONPATH=py python bench/matvec_sweep.py --quick --out /tmp/sweep.json     # software adapters

For each weight format (q4 "min", q4 "offset", q8, f16; blocks of 32, f16 scales; q5 "offset"
block 32 and the K-quants q4k, q5k, q6k, on the shapes whose rows hold whole 256-blocks) and shape
(SHAPES: Llama-3-8B, Llama-3.2-1B and SmolLM2 layers and heads), every candidate launch: each
kernel variant of the format (matvec.VARIANTS: the plain kernel, q4/q8 dot4 where the WGSL has
dot4I8Packed, f16_wide) times every workgroup size WG and rows per workgroup ROWS of the
allowlists (WG past the row's units left out: lanes with nothing to do), on the device's
reduction (subgroups where present), input "plain" unless --inputs says more.

Each candidate is first checked: one dispatch (its wall time is `cold_us`, the first use after
compiling), y read back and compared on 256 rows (first, last, random) with
matvec_oracle.fused_oracle's bound on activations the int8 variants quantize exactly, so the bound is
tight for every variant. A candidate that fails is recorded and not timed.

Timing: rounds of dispatches cycling through copies of the weights that together pass
--working-set-mib (default 256, beyond the H200's ~50 MiB L2), each round >= 5 ms of GPU
work (software adapters: a few dispatches), encoded before the clock starts; `us` = the median
round's time per dispatch, `us_min` / `us_max` the extremes of the rounds (slow samples show
there). Dispatches of a round are independent, as in bench/kernels.py: streaming throughput.
Beside every (format, shape): a copy (shaders/copy.wgsl) moving the same bytes, timed the same
way (`copy_same_gbps`, `of_copy_same`), and a 256 MiB copy at the start and the end of the run
(`of_copy_256` uses their mean).

Then the rule: candidate matvec.Tuning values (activations f32 / int8 / int8x2, units per
invocation, rows per workgroup and its halving) are scored on the timings (the geometric mean
over formats and shapes of each choice's time over the best time measured for that format and
shape), and the best is printed as a line to paste into py/webslm/kernels/matvec.py (TUNING):
among the exact rules (activations="f32"), among those and int8x2 (error ~1/8192 of a unit's
largest activation), and among all.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import math
import pathlib
import platform
import statistics
import sys
import time
import zlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from webslm.kernels import matvec as mv, matvec_oracle as mvo, runner  # noqa: E402
from webslm.kernels.golden import compare_bound  # noqa: E402
from webslm.kernels.matvec_variants import exact_int8_activations  # noqa: E402
from webslm.kernels.registry import KERNEL_FEATURES, compile_kernel  # noqa: E402
from webslm.webgpu.interface import BufferBinding, BufferUsage, Copy, Dispatch  # noqa: E402
from webslm.webgpu.native import NativeGpu  # noqa: E402

MiB = 1 << 20
SHAPES = {                                   # name -> (rows N, cols K)
    "llama8b gate 14336x4096": (14336, 4096),
    "llama1b gate+up 16384x2048": (16384, 2048),
    "llama1b down 2048x8192": (2048, 8192),
    "square 4096x4096": (4096, 4096),
    "smollm2 down 576x1536": (576, 1536),
    "smollm2 gate 1536x576": (1536, 576),
    "smollm2 head 49152x576": (49152, 576),
    "llama1b up 8192x2048": (8192, 2048),
    "llama1b head 128256x2048": (128256, 2048),
}
QUICK_SHAPES = {"tiny 64x256": (64, 256), "tail 200x1000": (200, 1000), "smollm2 down 576x1536": (576, 1536),
                "k 96x512": (96, 512)}
FORMATS = {"q4-min": ("q4", "min"), "q4-offset": ("q4", "offset"), "q8": ("q8", None), "f16": ("f16", None),
           "q5": ("q5", "offset"), "q4k": ("q4k", None), "q5k": ("q5k", None), "q6k": ("q6k", None)}
WHOLE_BLOCKS = {"q5": 32, "q4k": 256, "q5k": 256, "q6k": 256}   # rows of these hold whole blocks
CHECK_ROWS = 256
ROUND_SECONDS = 0.005
MAX_COPIES = 256


# -- device, buffers, timing ----------------------------------------------------------------------

async def open_device():
    adapter = await NativeGpu().request_adapter("core")
    if adapter is None:
        raise SystemExit("no native WebGPU adapter")
    wanted = ("maxStorageBufferBindingSize", "maxBufferSize", "maxComputeWorkgroupStorageSize",
              "maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX")
    limits = {name: adapter.limits[name] for name in wanted if name in adapter.limits}
    device = await adapter.request_device(features=sorted(KERNEL_FEATURES & adapter.features), limits=limits)
    return adapter, device


def storage_buffer(device, nbytes: int, label: str):
    return device.create_buffer(max(16, -(-nbytes // 16) * 16),
                                BufferUsage.STORAGE | BufferUsage.COPY_DST | BufferUsage.COPY_SRC, label)


def upload_copies(device, data: np.ndarray, copies: int, label: str) -> list:
    """`copies` buffers holding `data`: one written from the host, the rest copied on the GPU."""
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    padded = np.zeros(-(-max(raw.size, 16) // 16) * 16, np.uint8)
    padded[:raw.size] = raw
    buffers = [storage_buffer(device, padded.size, f"{label} {i}") for i in range(copies)]
    device.write_buffer(buffers[0], 0, padded)
    if copies > 1:
        device.submit([], [Copy(buffers[0], 0, b, 0, padded.size) for b in buffers[1:]])
    return buffers


def submit_timed(device, recording) -> None:
    """Encode the recorded dispatches (raw handles: ~1 us each instead of wgpu-py's ~12 us),
    then submit: the clock starts after this returns, so encoding is never in a timing."""
    buffer = device._encode(recording)          # NativeDevice's raw encoder (bench only)
    device._device.queue.submit([buffer])


async def time_rounds(device, dispatches: list, sync, count: int, rounds: int) -> list[float]:
    """Seconds per dispatch of `rounds` submits of `count` dispatches cycling through the list."""
    recording = device.record([dispatches[i % len(dispatches)] for i in range(count)])
    out = []
    for _ in range(rounds):
        await device.read_buffer(sync, 0, 4)         # the queue is idle before the clock starts
        submit_timed(device, recording)
        started = time.perf_counter()
        await device.read_buffer(sync, 0, 4)
        out.append((time.perf_counter() - started) / count)
    return out


async def measure(device, dispatches: list, sync, quick: bool) -> dict:
    """Calibrate a round to >= ROUND_SECONDS of GPU work, then time rounds; us per dispatch."""
    estimate = min(await time_rounds(device, dispatches, sync, len(dispatches), 1))
    if quick:
        count = max(1, min(len(dispatches) * 2, 6))
        rounds = 3
    else:
        count = max(len(dispatches), min(20_000, int(ROUND_SECONDS / max(estimate, 1e-7))))
        rounds = 5
    samples = await time_rounds(device, dispatches, sync, count, rounds)
    return {"us": statistics.median(samples) * 1e6, "us_min": min(samples) * 1e6, "us_max": max(samples) * 1e6,
            "dispatches_per_round": count}


async def copy_gbps(device, kernel, total_bytes: int, working_set: int, quick: bool) -> dict:
    """A copy moving total_bytes (half read, half written) per dispatch, timed like the mat-vecs."""
    size = max(16, total_bytes // 2 // 16 * 16)
    size = min(size, device.limits["maxStorageBufferBindingSize"] // 16 * 16)
    copies = 1 if quick else max(1, min(MAX_COPIES, -(-working_set // (2 * size))))
    n = size // 16
    groups = min(-(-n // 256), 65535)
    src = upload_copies(device, np.arange(size // 4, dtype=np.uint32), copies, "copy src")
    dst = [storage_buffer(device, size, "copy dst") for _ in range(copies)]
    params = device.create_buffer(16, BufferUsage.UNIFORM | BufferUsage.COPY_DST, "copy params")
    device.write_buffer(params, 0, runner.params_words(n))
    dispatches = [Dispatch(kernel.pipeline, [device.create_bind_group(kernel.bind_group_layout, [
        BufferBinding(params), BufferBinding(s), BufferBinding(d)])], (groups, 1, 1)) for s, d in zip(src, dst)]
    try:
        result = await measure(device, dispatches, dst[-1], quick)
    finally:
        for b in (*src, *dst, params):
            device.destroy_buffer(b)
    return {"bytes_moved": 2 * size, "copies": copies, **result, "gbps": 2 * size / result["us"] / 1e3}


# -- the candidates of one (format, shape) --------------------------------------------------------

def rows_subset(weights: mv.Weights, rows: np.ndarray) -> mv.Weights:
    """The weights of `rows` only, as parts of their own (for the oracle on a sample of rows)."""
    parts = {}
    for name, part in weights.parts.items():
        raw = np.frombuffer(memoryview(part).cast("B"), np.uint8)
        parts[name] = raw.reshape(weights.rows, -1)[rows].tobytes()
    return dataclasses.replace(weights, rows=len(rows), parts=parts)


def candidates(device, weights: mv.Weights, input: str, wg_filter, rows_filter) -> list[tuple[str, dict]]:
    """(kernel name, overrides) of every variant (dot4 with RESIDUAL 0 and 1) x WG x ROWS this
    device admits for the weights."""
    out = []
    for variant in ("", *mv.VARIANTS[weights.encoding]):
        try:
            mv.check_variant(device, weights, variant)
        except mv.MatvecShapeError:
            continue
        for activations, wg, rows in itertools.product(("int8", "int8x2") if variant == "dot4" else ("f32",),
                                                       mv.WORKGROUP_SIZES, mv.ROWS_PER_WORKGROUP):
            if (wg > max(32, mv.units(weights)) or (wg_filter and wg not in wg_filter)
                    or (rows_filter and rows not in rows_filter)):
                continue
            name, overrides = mv.choose_kernel(device, weights, wg, rows, input, variant=variant,
                                               tuning=mv.Tuning(activations=activations))
            if overrides["WG"] == wg and (name, overrides) not in out:
                out.append((name, overrides))
    return out


def variant_label(name: str, overrides: dict) -> str:
    """"plain", "wide", "dot4" or "dot4x2" (dot4 with RESIDUAL=1)."""
    variant = mv.variant_of(name) or "plain"
    return variant + ("x2" if overrides.get("RESIDUAL") else "")


async def sweep_one(device, args, fmt: str, shape: str, rows_n: int, cols: int, input: str,
                    compiled: dict, copy_kernel, copy_256: float) -> list[dict]:
    encoding, zero = FORMATS[fmt]
    rng = np.random.default_rng(zlib.crc32(f"{fmt} {shape}".encode()))
    weights = mv.random_weights_fast(rng, encoding, rows_n, cols, 32, zero or "min")
    x = exact_int8_activations(rng, 1, cols, mv.UNIT_ELEMENTS[encoding], (-4, 0))
    xs, stride = mv.padded_activations(x, 0.0)
    inputs, eps, up_offset, norm_weight = [xs], None, None, None
    if input == "norm":
        eps, norm_weight = 1e-5, np.ones(cols, np.float32)           # g = 1: t = x exactly
        inputs.append(mv.padded_norm_weight(norm_weight, cols, 0.0))
    elif input == "swiglu":
        up_offset = stride
        xs = mv.gate_up_row(x, np.ones_like(x), up_offset, 0.0)
        inputs, stride = [xs], 2 * up_offset
    mv.check_shapes(device, weights, 1, stride, input, eps, up_offset)
    bytes_moved = weights.nbytes + sum(a.nbytes for a in inputs) + 4 * rows_n
    copies = 1 if args.quick else max(1, min(MAX_COPIES, -(-args.working_set_mib * MiB // weights.nbytes)))

    sample = np.unique(np.concatenate([np.arange(min(64, rows_n)), np.arange(max(0, rows_n - 64), rows_n),
                                       rng.integers(0, rows_n, CHECK_ROWS)]))
    sub = rows_subset(weights, sample)
    oracles = {int8: mvo.fused_oracle(sub, x if input != "swiglu" else xs, input, norm_weight, eps, up_offset,
                                     int8=int8) for int8 in ((0, 1, 2) if encoding in ("q4", "q8") else (0,))}

    parts = [upload_copies(device, part, copies, name) for name, part in zip(mv.PART_NAMES[encoding],
                                                                              weights.bindings())]
    activations = [upload_copies(device, a, 1, "x")[0] for a in inputs]
    ys = [storage_buffer(device, 4 * rows_n, "y") for _ in range(copies)]
    params = device.create_buffer(32, BufferUsage.UNIFORM | BufferUsage.COPY_DST, "params")
    device.write_buffer(params, 0, mv.params(weights, stride, rows_n, input, eps, up_offset))
    rows = []
    try:
        same = await copy_gbps(device, copy_kernel, bytes_moved, args.working_set_mib * MiB, args.quick)
        print(f"{fmt:9s} {shape:28s} same-size copy {same['gbps']:8.1f} GB/s ({copies} copies of "
              f"{weights.nbytes / MiB:.1f} MiB)", flush=True)
        for name, overrides in candidates(device, weights, input, args.wg, args.rows):
            key = (name, tuple(sorted(overrides.items())))
            if key not in compiled:
                compiled[key] = await compile_kernel(device, name, **overrides)
            kernel = compiled[key]
            dispatches = []
            for i in range(copies):
                entries = [BufferBinding(params), *(BufferBinding(p[i]) for p in parts),
                           *(BufferBinding(a) for a in activations), BufferBinding(ys[i])]
                dispatches.append(Dispatch(kernel.pipeline, [device.create_bind_group(kernel.bind_group_layout, entries)],
                                           mv.grid(device, weights, overrides["ROWS"], 1)))
            device.write_buffer(ys[0], 0, np.full(rows_n, np.nan, np.float32))     # unwritten rows stay NaN
            await device.read_buffer(ys[0], 0, 4)
            started = time.perf_counter()
            device.submit(dispatches[:1])
            y = np.frombuffer(await device.read_buffer(ys[0], 0, 4 * rows_n), np.float32)
            cold = (time.perf_counter() - started) * 1e6
            label = variant_label(name, overrides)
            exact, bound, rule = oracles[{"dot4": 1, "dot4x2": 2}.get(label, 0)]
            check = compare_bound("matvec", name, shape, y[sample][None, :], exact, bound, rule)
            row = {"format": fmt, "shape": shape, "rows": rows_n, "cols": cols, "input": input,
                   "variant": label, "kernel": name, "overrides": overrides, "WG": overrides["WG"],
                   "ROWS": overrides["ROWS"], "valid": check.passed,
                   "error_over_tolerance": check.error_over_tolerance, "cold_us": cold,
                   "bytes_moved": bytes_moved, "copies": copies,
                   "working_set_mib": round(copies * weights.nbytes / MiB, 1),
                   "cache_resident": copies * weights.nbytes < 200 * MiB and not args.quick,
                   "copy_same_gbps": same["gbps"]}
            if check.passed:
                timing = await measure(device, dispatches, ys[-1], args.quick)
                gbps = bytes_moved / timing["us"] / 1e3
                row |= {**timing, "gbps": gbps, "of_copy_same": gbps / same["gbps"], "of_copy_256": gbps / copy_256}
                print(f"{fmt:9s} {shape:28s} {row['variant']:6s} WG={row['WG']:<3d} ROWS={row['ROWS']:<2d} "
                      f"{timing['us']:9.2f} us {gbps:8.1f} GB/s  {row['of_copy_same']:5.2f}x same-size copy  "
                      f"{row['of_copy_256']:5.2f}x 256 MiB copy", flush=True)
            else:
                print(f"{fmt:9s} {shape:28s} {name} {overrides}: FAILED its check "
                      f"(error/bound {check.error_over_tolerance:.3g}, unwritten {check.unwritten})", flush=True)
            rows.append(row)
    finally:
        for b in (*[b for p in parts for b in p], *activations, *ys, params):
            device.destroy_buffer(b)
    return rows


# -- the measured rule ----------------------------------------------------------------------------

def candidate_tunings() -> list[mv.Tuning]:
    out = []
    for activations, upi, rows, floor in itertools.product(mv.ACTIVATIONS, (1, 2, 4, 8, 16), mv.ROWS_PER_WORKGROUP,
                                                           (0, 128, 256, 512, 1024, 2048)):
        if rows == 1 and floor:
            continue
        out.append(mv.Tuning(activations=activations, wide_f16=True, units_per_invocation=upi, rows=rows,
                             min_workgroups=floor))
    return out + [dataclasses.replace(t, wide_f16=False) for t in out if t.activations == "f32"]


def score_tunings(device, rows: list[dict], input: str) -> dict:
    """Each candidate Tuning's choices looked up in the timings: geometric mean of chosen / best."""
    timed = {(r["format"], r["shape"], r["kernel"], r["WG"], r["ROWS"], r["overrides"].get("RESIDUAL")): r["us"]
             for r in rows if "us" in r}
    groups = {(r["format"], r["shape"], r["rows"], r["cols"]) for r in rows}
    best = {}
    for (fmt, shape, *_), us in timed.items():
        best[(fmt, shape)] = min(us, best.get((fmt, shape), math.inf))
    scored = []
    for tuning in candidate_tunings():
        logs, missing = [], 0
        for fmt, shape, n, k in sorted(groups):
            encoding, zero = FORMATS[fmt]
            stub = mv.Weights(encoding, n, k, {}, 32 if encoding in ("q4", "q8") else None,
                              zero if encoding == "q4" else None, "f16" if encoding in ("q4", "q8") else None)
            name, overrides = mv.choose_kernel(device, stub, input=input, tuning=tuning)
            us = timed.get((fmt, shape, name, overrides["WG"], overrides["ROWS"], overrides.get("RESIDUAL")))
            if us is None or (fmt, shape) not in best:
                missing += 1
                continue
            logs.append(math.log(us / best[(fmt, shape)]))
        if logs and not missing:
            scored.append((math.exp(sum(logs) / len(logs)), tuning))
    scored.sort(key=lambda item: item[0])
    exact = [item for item in scored if item[1].activations == "f32"]
    residual = [item for item in scored if item[1].activations != "int8"]

    def line(item):
        return None if item is None else {"geomean_over_best": item[0], "tuning": repr(item[1])}
    return {"best": line(scored[0] if scored else None), "best_exact": line(exact[0] if exact else None),
            "best_exact_or_int8x2": line(residual[0] if residual else None),
            "current": line(next((s for s in scored if s[1] == mv.TUNING), None)),
            "top": [line(item) for item in scored[:10]]}


# -- main -----------------------------------------------------------------------------------------

async def main(args) -> dict:
    adapter, device = await open_device()
    summary = adapter.summary()
    print(f"adapter: {summary.description}; features {sorted(device.features)}; WGSL language features "
          f"{sorted(getattr(device, 'wgsl_language_features', ()))}", flush=True)
    copy_kernel = await compile_kernel(device, "copy_vec4", WG=256)
    copy_size = (16 if args.quick else 256) * MiB
    start = await copy_gbps(device, copy_kernel, 2 * copy_size, 2 * copy_size, args.quick)
    print(f"copy {copy_size // MiB} MiB: {start['gbps']:.1f} GB/s", flush=True)
    report = {"adapter": {"description": summary.description, "vendor": summary.vendor,
                          "architecture": summary.architecture, "features": sorted(device.features),
                          "wgsl_language_features": sorted(getattr(device, "wgsl_language_features", ()))},
              "host": platform.platform(), "date": time.strftime("%Y-%m-%d"), "quick": args.quick,
              "command": " ".join(sys.argv), "tuning_in_use": repr(mv.TUNING),
              "copy_start": start, "rows": []}
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        shapes = {k: v for k, v in {**SHAPES, **QUICK_SHAPES}.items() if any(s in k for s in args.shapes)}
    compiled: dict = {}
    began = time.perf_counter()
    for input in args.inputs:
        for fmt in args.formats:
            for shape, (n, k) in shapes.items():
                if k % WHOLE_BLOCKS.get(FORMATS[fmt][0], 1):
                    continue
                report["rows"] += await sweep_one(device, args, fmt, shape, n, k, input, compiled, copy_kernel,
                                                  start["gbps"])
                if args.out:
                    args.out.write_text(json.dumps(report, indent=1))
    end = await copy_gbps(device, copy_kernel, 2 * copy_size, 2 * copy_size, args.quick)
    report["copy_end"] = end
    mean_copy = (start["gbps"] + end["gbps"]) / 2
    for row in report["rows"]:
        if "gbps" in row:
            row["of_copy_256"] = row["gbps"] / mean_copy
    report["copy_256_gbps"] = mean_copy
    report["seconds"] = time.perf_counter() - began
    report["best"] = {}
    for row in report["rows"]:
        key = f"{row['input']} {row['format']} {row['shape']}"
        if "us" in row and ("us" not in report["best"].get(key, {}) or row["us"] < report["best"][key]["us"]):
            report["best"][key] = {k: row[k] for k in ("kernel", "variant", "overrides", "WG", "ROWS", "us", "gbps",
                                                       "of_copy_same", "of_copy_256")}
    report["rule"] = {input: score_tunings(device, [r for r in report["rows"] if r["input"] == input], input)
                      for input in args.inputs}
    report["failed"] = [{k: r[k] for k in ("format", "shape", "kernel", "WG", "ROWS", "error_over_tolerance")}
                        for r in report["rows"] if not r["valid"]]
    print(f"copy 256 MiB at the end: {end['gbps']:.1f} GB/s; {len(report['rows'])} candidates, "
          f"{len(report['failed'])} failed their check, {report['seconds']:.0f} s", flush=True)
    for key, best in report["best"].items():
        print(f"best {key:45s} {best['kernel']:28s} {best['variant']:6s} WG={best['WG']:<3d} ROWS={best['ROWS']:<2d} "
              f"{best['us']:9.2f} us  {best['of_copy_same']:5.2f}x same-size  {best['of_copy_256']:5.2f}x 256 MiB")
    for input, rule in report["rule"].items():
        for which in ("best_exact", "best_exact_or_int8x2", "best", "current"):
            if rule[which]:
                print(f"rule ({input}) {which:10s}: {rule[which]['geomean_over_best']:.3f}x the best per shape: "
                      f"TUNING = {rule[which]['tuning']}")
    device.destroy()
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, one copy, few dispatches (software adapters)")
    parser.add_argument("--out", type=pathlib.Path, help="write the JSON report here")
    parser.add_argument("--formats", type=lambda s: s.split(","), default=list(FORMATS),
                        help=f"comma-separated, of {list(FORMATS)}")
    parser.add_argument("--shapes", type=lambda s: s.split(","), help="substrings of shape names to keep")
    parser.add_argument("--inputs", type=lambda s: s.split(","), default=["plain"], help="plain,norm,swiglu")
    parser.add_argument("--wg", type=lambda s: [int(v) for v in s.split(",")], help="only these WG")
    parser.add_argument("--rows", type=lambda s: [int(v) for v in s.split(",")], help="only these ROWS")
    parser.add_argument("--working-set-mib", type=int, default=256,
                        help="copies of the weights per round at least this big (defeats the L2)")
    arguments = parser.parse_args()
    if arguments.out:
        arguments.out.parent.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(main(arguments))
    if arguments.out:
        arguments.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {arguments.out}")
