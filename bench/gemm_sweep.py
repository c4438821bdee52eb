"""Every prefill GEMM variant on the model shapes, validated against numpy, timed, in one run.

    PYTHONPATH=py python bench/gemm_sweep.py --out bench/results/gemm_sweep_<tag>.json
    PYTHONPATH=py python bench/gemm_sweep.py --quick        # software adapters: tiny shapes

Cells: encodings (q4 "min" = llama.cpp's Q4_1 layout, q4 "offset" = Q4_0, q8, f16; blocks of
32 with f16 scales) x shapes (SmolLM2-135M and Llama-3.2-1B layers, the q|k|v and gate|up
projections stacked as the prefill program runs them) x T tokens (128, 512); in each cell
every tile of kernels/gemm.py TILES the device admits.

Per (tile, cell): one dispatch is checked first against the float64 oracle (gemm_oracle.py,
the tile's own rule) on a dozen rows (the first, the last, the middle and random ones; all
N columns) and for unwritten (NaN) elements anywhere; a variant that fails is reported and
never timed. Then a chain of dispatches on the same buffers (each waits for the previous one,
as the engine's layers do; the weights stay in L2 between them) is timed by the wall clock from
submit to a 4-byte readback, calibrated to ROUND_SECONDS a round, after a warm-up round; `us`
is the median of ROUNDS rounds per dispatch. TFLOP/s = 2 M N K / us; GB/s = (weight bytes +
x + y) / us.

Prefill attention (kernels/attention.py, both variants, f32 and f16 caches) on the same models'
heads at T = 128 and 512 new tokens from position 0 is timed the same way after the GEMMs
(--no-attention skips it), checked against attention.py's oracle and rule on every row first.

Encodings after the first measure only the tiles within --prune (1.5x) of the best in the
same shape and T for the first encoding, plus the host's choice and the classic kernel's best
there (--prune 0 measures every tile: about three times longer).

Summary per cell: the fastest tile, the host's current choice (choose_tile with TILE_ORDER and
MIN_WORKGROUPS) and its loss, the classic kernel's best. `recommendation`, per tier: the
TILE_ORDER and MIN_WORKGROUPS for kernels/gemm.py that minimise the summed time of the first
encoding's cells (every tile is timed there; a greedy search over the measured table; tier B
may use f16 tiles), with what that setting gives on the other encodings. Cells are measured in
order of importance (q4 "min" first) and the run stops starting new ones after --max-seconds,
so a slow device still writes a useful (marked) partial file.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import pathlib
import platform
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from webslm.kernels import attention, gemm, golden, runner  # noqa: E402
from webslm.kernels.gemm_oracle import decode64, oracle, random_parts  # noqa: E402
from webslm.kernels.registry import KERNEL_FEATURES, compile_kernel  # noqa: E402
from webslm.webgpu.interface import BufferBinding, BufferUsage, Dispatch  # noqa: E402
from webslm.webgpu.native import NativeGpu  # noqa: E402

ENCODINGS = {   # name -> random_parts arguments, in the order they are measured
    "q4min": ("q4", 32, "min", "f16"),
    "q8": ("q8", 32, None, "f16"),
    "q4offset": ("q4", 32, "offset", "f16"),
    "f16": ("f16", None, None, None),
}
SHAPES = {      # name -> (N, K): y [T, N] = x [T, K] W^T
    "smollm2 qkv 960x576": (960, 576),
    "smollm2 o 576x576": (576, 576),
    "smollm2 gate|up 3072x576": (3072, 576),
    "smollm2 down 576x1536": (576, 1536),
    "llama1b qkv 3072x2048": (3072, 2048),
    "llama1b o 2048x2048": (2048, 2048),
    "llama1b gate|up 16384x2048": (16384, 2048),
    "llama1b down 2048x8192": (2048, 8192),
}
TOKENS = (128, 512)
ATTENTION = {"smollm2 9/3 d64": (9, 3, 64), "llama1b 32/8 d64": (32, 8, 64)}   # heads, KV heads, head_dim
QUICK = {"shapes": {"tiny 200x96": (200, 96), "tiny 70x160": (70, 160)}, "tokens": (37, 64),
         "attention": {"tiny 4/2 d64": (4, 2, 64)}}
ROUND_SECONDS, ROUNDS, MAX_CHAIN = 0.015, 3, 4000
CHECK_ROWS = 12
MIN_WORKGROUPS_TRIED = (16, 32, 64, 96, 128, 192, 256, 384, 512)


async def open_device():
    adapter = await NativeGpu().request_adapter("core")
    if adapter is None:
        raise SystemExit("no native WebGPU adapter")
    features = sorted(KERNEL_FEATURES & adapter.features)
    wanted = ("maxStorageBufferBindingSize", "maxBufferSize", "maxComputeWorkgroupStorageSize",
              "maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX")
    limits = {name: adapter.limits[name] for name in wanted if name in adapter.limits}
    return adapter, await adapter.request_device(features=features, limits=limits)


class Cell:
    """One (encoding, shape, T): weights, x and y on the GPU, and the oracle on CHECK_ROWS rows."""

    def __init__(self, device, rng, encoding: str, shape: str, n: int, k: int, t: int, weights, decoded):
        self.device, self.encoding, self.shape, self.t, self.n, self.k = device, encoding, shape, t, n, k
        self.weights, self.decoded = weights, decoded
        self.x = rng.standard_normal((t, k)).astype(np.float32)
        self.x_padded, self.x_stride = gemm.padded_activations(self.x, np.nan)
        usage = runner.STORAGE
        self.buffers = {"x": self._upload(self.x_padded)}
        self.buffers |= {f"w{i}": self._upload(part) for i, part in enumerate(weights.bindings())}
        self.buffers["y"] = device.create_buffer(t * n * 4, usage, "y")
        rows = {0, 1, t - 1, t - 2, t // 2} | set(rng.integers(0, t, CHECK_ROWS).tolist())
        self.rows = np.array(sorted(r for r in rows if 0 <= r < t))
        self._oracles: dict[bool, tuple] = {}

    def _upload(self, array: np.ndarray):
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        padded = np.zeros(max(4, -(-raw.size // 4) * 4), np.uint8)
        padded[: raw.size] = raw
        buffer = self.device.create_buffer(padded.size, runner.STORAGE, "input")
        self.device.write_buffer(buffer, 0, padded)
        return buffer

    def release(self):
        for buffer in self.buffers.values():
            self.device.destroy_buffer(buffer)

    @property
    def bytes_moved(self) -> int:
        return self.weights.nbytes + self.t * self.k * 4 + self.t * self.n * 4

    @property
    def flops(self) -> int:
        return 2 * self.t * self.n * self.k

    async def dispatch(self, tile, compiled: dict) -> tuple[Dispatch, object]:
        p = gemm.plan(self.device.limits, self.weights, self.t, self.x_stride, self.n, tile=tile,
                      features=self.device.features)
        key = (p.kernel, tuple(sorted(p.overrides.items())))
        if key not in compiled:
            compiled[key] = await compile_kernel(self.device, p.kernel, **p.overrides)
        kernel = compiled[key]
        params = self.device.create_buffer(p.params.nbytes, BufferUsage.UNIFORM | BufferUsage.COPY_DST, "params")
        self.device.write_buffer(params, 0, p.params)
        parts = [self.buffers[f"w{i}"] for i in range(len(self.weights.bindings()))]
        entries = [BufferBinding(b) for b in (params, self.buffers["x"], self.buffers["y"], *parts)]
        group = self.device.create_bind_group(kernel.bind_group_layout, entries)
        return Dispatch(kernel.pipeline, [group], p.grid), params

    async def check(self, dispatch, half: bool) -> dict:
        """Poison y, run once, compare CHECK_ROWS rows with the oracle; count NaN anywhere."""
        self.device.write_buffer(self.buffers["y"], 0, np.full(self.t * self.n, np.nan, np.float32))
        self.device.submit([dispatch])
        y = np.frombuffer(await self.device.read_buffer(self.buffers["y"], 0, self.t * self.n * 4),
                          np.float32).reshape(self.t, self.n)
        if half not in self._oracles:
            self._oracles[half] = oracle(self.weights, self.x[self.rows], half=half, decoded=self.decoded)
        exact, bound, rule = self._oracles[half]
        result = golden.compare_bound("gemm", "sweep", self.shape, y[self.rows], exact, bound, rule)
        unwritten = int(np.isnan(y).sum())
        return {"valid": bool(result.passed and unwritten == 0), "error_over_bound": result.error_over_tolerance,
                "unwritten": unwritten}

    async def time(self, dispatch) -> float:
        return await time_chain(self.device, dispatch, self.buffers["y"])


async def time_chain(device, dispatch, sync_buffer) -> float:
    """Seconds per dispatch of a dependent chain (median of ROUNDS calibrated rounds)."""
    async def chain(count: int) -> float:
        device.submit([])
        await device.read_buffer(sync_buffer, 0, 4)
        device.submit([dispatch] * count)
        started = time.perf_counter()
        await device.read_buffer(sync_buffer, 0, 4)
        return (time.perf_counter() - started) / count

    estimate = await chain(2)
    count = int(min(MAX_CHAIN, max(2, ROUND_SECONDS / max(estimate, 1e-7))))
    await chain(count)                                  # warm-up: clocks up, caches filled
    return statistics.median([await chain(count) for _ in range(ROUNDS)])


async def attention_rows(device, quick: bool) -> list[dict]:
    """Both prefill attention variants per (model heads, T, cache type): checked, then timed."""
    rows, rng = [], np.random.default_rng(1)
    dtypes = ["f32"] + (["f16"] if "shader-f16" in device.features else [])
    for name, (h, kv, e) in (QUICK["attention"] if quick else ATTENTION).items():
        for t in QUICK["tokens"] if quick else TOKENS:
            for dtype in dtypes:
                shape = attention.AttentionShape(h, kv, e, t, dtype)
                q, k_cache, v_cache = attention.make_case(rng, shape, t, 0, "random")
                exact, chosen = None, attention.plan_prefill(device.limits, shape, 0, t).dispatch.kernel
                for variant in attention.PREFILL_VARIANTS:
                    plan = attention.plan_prefill(device.limits, shape, 0, t, variant=variant)
                    kernel = await compile_kernel(device, plan.dispatch.kernel, **plan.dispatch.overrides)
                    prepared = runner.prepare(device, kernel, plan.dispatch.params, [q, k_cache, v_cache],
                                              [(q.size, np.float32)], plan.dispatch.grid)
                    try:
                        device.submit([prepared.dispatch])
                        (got,) = await prepared.read_outputs(device)
                        exact, bound = attention.error_bound(*attention.oracle_inputs(shape, q, k_cache, v_cache, t),
                                                             0, attention.default_scale(e), plan.summation_depth,
                                                             plan.exp_chain)
                        check = golden.compare_bound("attention", "sweep", name, got, exact, bound, attention.RULE)
                        row = {"shape": name, "t": t, "cache": dtype, "variant": variant, "kernel": plan.dispatch.kernel,
                               "chosen": plan.dispatch.kernel == chosen, "valid": check.passed,
                               "error_over_bound": check.error_over_tolerance}
                        if check.passed:
                            seconds = await time_chain(device, prepared.dispatch, prepared.outputs[0][0])
                            pairs = h * t * (t + 1) // 2              # (query, visible key) pairs
                            row |= {"us": seconds * 1e6, "tflops": 4 * e * pairs / seconds / 1e12}
                    finally:
                        prepared.release(device)
                    rows.append(row)
                    print(f"attention {name:18s} T={t:<4d} {dtype} {variant:6s} " + (
                        f"{row['us']:9.1f} us {row['tflops']:6.2f} TFLOP/s" if row["valid"] else
                        f"INVALID error/bound {row['error_over_bound']:.3g}") + ("  <- chosen" if row["chosen"] else ""),
                        flush=True)
    return rows


def choice(limits, features, m: int, n: int, order=None, min_workgroups=None) -> str | None:
    try:
        return gemm.choose_tile(limits, m, n, features, order, min_workgroups).name
    except gemm.GemmError:
        return None


def recommend(rows: list[dict], limits: dict, features, half: bool) -> dict | None:
    """The TILE_ORDER and MIN_WORKGROUPS minimising the summed time over the first encoding's
    cells (the ones where every tile was timed), by a greedy search: one representative per tile
    size (the variant with the best geometric mean of time / cell best; with and without split
    K), largest first; then drop tiles while the total improves. `other_encodings`: the summed
    time of the other encodings' cells under that setting, where its picks were timed."""
    first = rows[0]["encoding"] if rows else None
    table: dict[tuple, dict[str, float]] = {}
    shapes: dict[tuple, tuple[int, int]] = {}
    for r in rows:
        if r.get("us") and r["valid"] and (half or not r["half"]) and r["encoding"] == first:
            cell = (r["encoding"], r["shape"], r["t"])
            table.setdefault(cell, {})[r["tile"]] = r["us"]
            shapes[cell] = (r["t"], r["n"])
    if not table:
        return None
    best = {cell: min(times.values()) for cell, times in table.items()}
    scores: dict[str, list[float]] = {}
    for cell, times in table.items():
        for tile, us in times.items():
            scores.setdefault(tile, []).append(math.log(us / best[cell]))
    by_size: dict[tuple, str] = {}      # (TM, TN, split K): the best variant timed in every cell
    for tile, logs in sorted(scores.items(), key=lambda kv: statistics.fmean(kv[1])):
        t = gemm.TILES[tile]
        if len(logs) == len(table) and t.sections:
            by_size.setdefault((t.tm, t.tn, t.ksplit > 1), tile)
    if not by_size:
        return None
    order = sorted(by_size.values(), key=lambda name: (-gemm.TILES[name].tm * gemm.TILES[name].tn,
                                                       gemm.TILES[name].ksplit, -gemm.TILES[name].invocations))

    def total(names, mw) -> float:
        s = 0.0
        for cell, times in table.items():
            picked = choice(limits, features, *shapes[cell], tuple(names), mw)
            s += times.get(picked, float("inf"))
        return s

    def best_mw(names):
        return min(((total(names, mw), mw) for mw in MIN_WORKGROUPS_TRIED))

    current, (score, mw) = list(order), best_mw(order)
    improved = True
    while improved and len(current) > 1:
        improved = False
        for name in list(current):
            trial = [n for n in current if n != name]
            trial_score, trial_mw = best_mw(trial)
            if trial_score < score * 0.999:
                current, score, mw, improved = trial, trial_score, trial_mw, True
                break
    others, covered = 0.0, 0
    for cell in {(r["encoding"], r["shape"], r["t"]) for r in rows if r["encoding"] != first}:
        timed = {r["tile"]: r["us"] for r in rows if (r["encoding"], r["shape"], r["t"]) == cell and r.get("us")}
        picked = choice(limits, features, cell[2], next(r["n"] for r in rows if r["shape"] == cell[1]),
                        tuple(current), mw)
        if picked in timed:
            others, covered = others + timed[picked], covered + 1
    return {"order": current, "min_workgroups": mw, "total_us": score, "best_total_us": sum(best.values()),
            "cells": len(table), "tuned_on": first, "other_encodings_us": others, "other_cells_timed": covered}


async def main(args) -> dict:
    adapter, device = await open_device()
    summary = adapter.summary()
    limits, features = device.limits, device.features
    shapes = QUICK["shapes"] if args.quick else SHAPES
    tokens = QUICK["tokens"] if args.quick else TOKENS
    encodings = args.encodings.split(",") if args.encodings else list(ENCODINGS)
    tiles = [t for name, t in gemm.TILES.items()
             if t.admitted(limits, features) and (not args.tiles or name in args.tiles.split(","))]
    report = {"bench": "gemm_sweep", "adapter": summary.description, "features": sorted(features),
              "limits": {k: limits[k] for k in ("maxComputeWorkgroupStorageSize", "maxComputeInvocationsPerWorkgroup")},
              "host": platform.platform(), "date": time.strftime("%Y-%m-%d %H:%M"), "quick": args.quick,
              "knob": {"TILE_ORDER": gemm.TILE_ORDER, "MIN_WORKGROUPS": gemm.MIN_WORKGROUPS},
              "tiles": [t.name for t in tiles], "complete": True, "rows": []}
    print(f"adapter: {summary.description}; {len(tiles)} tiles admitted: {', '.join(t.name for t in tiles)}", flush=True)
    started, compiled = time.perf_counter(), {}
    rng = np.random.default_rng(0)
    first: dict[tuple, dict[str, float]] = {}     # (shape, T) -> tile -> us, for the first encoding
    for encoding in encodings:
        enc, block, zero, scale_type = ENCODINGS[encoding]
        for shape, (n, k) in shapes.items():
            weights = random_parts(rng, enc, n, k, block or 32, zero or "min", scale_type or "f16")
            decoded = decode64(weights)
            for t in tokens:
                if time.perf_counter() - started > args.max_seconds:
                    report["complete"] = False
                    break
                cell = Cell(device, rng, encoding, shape, n, k, t, weights, decoded)
                chosen = choice(limits, features, t, n)
                try:
                    served = [tile for tile in tiles if tile.serves(enc)]
                    for tile in _worth_timing(served, first.get((shape, t)), chosen, args.prune):
                        dispatch, params = await cell.dispatch(tile, compiled)
                        row = {"encoding": encoding, "shape": shape, "t": t, "n": n, "k": k, "tile": tile.name,
                               "kernel": tile.kernel(enc), "half": tile.half, "classic": not tile.sections,
                               "chosen": tile.name == chosen, "workgroups": -(-t // tile.tm) * -(-n // tile.tn)}
                        row |= await cell.check(dispatch, tile.half)
                        if row["valid"]:
                            seconds = await cell.time(dispatch)
                            row |= {"us": seconds * 1e6, "tflops": cell.flops / seconds / 1e12,
                                    "gbps": cell.bytes_moved / seconds / 1e9}
                        device.destroy_buffer(params)
                        if encoding == encodings[0] and row.get("us"):
                            first.setdefault((shape, t), {})[tile.name] = row["us"]
                        report["rows"].append(row)
                        print(_line(row), flush=True)
                finally:
                    cell.release()
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    report["attention"] = [] if args.no_attention else await attention_rows(device, args.quick)
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["summary"] = summarize(report["rows"])
    report["recommendation"] = {tier: recommend(report["rows"], limits, features, half=tier == "B")
                                for tier in ("A", "B") if tier == "A" or "shader-f16" in features}
    for line in report["summary"]:
        print(f"{line['encoding']:9s} {line['shape']:28s} T={line['t']:<4d} best {line['best']:22s} "
              f"{line['best_us']:9.1f} us {line['best_tflops']:6.2f} TFLOP/s | chosen {line['chosen']} "
              f"x{line['chosen_over_best']:.2f} | classic best x{line['classic_over_best']:.2f}")
    for tier, rec in report["recommendation"].items():
        if rec:
            print(f"recommended tier {tier}: TILE_ORDER[{tier!r}] = {tuple(rec['order'])}, MIN_WORKGROUPS = "
                  f"{rec['min_workgroups']} ({rec['tuned_on']}: total {rec['total_us']:.0f} us vs "
                  f"{rec['best_total_us']:.0f} us for the best tile in every cell)")
    print(f"{len(report['rows'])} rows in {report['seconds']} s; complete: {report['complete']}")
    device.destroy()
    return report


def _worth_timing(tiles: list, first: dict[str, float] | None, chosen: str | None, prune: float) -> list:
    """Every tile for the first encoding (or without pruning); later ones: those within `prune`
    of the first encoding's best in this shape and T, the host's choice and the best classic."""
    if not prune or not first:
        return tiles
    best = min(first.values())
    classic = min((t for t in tiles if not t.sections and t.name in first), key=lambda t: first[t.name], default=None)
    keep = {name for name, us in first.items() if us <= prune * best} | {chosen} | {classic.name if classic else None}
    return [t for t in tiles if t.name in keep]


def summarize(rows: list[dict]) -> list[dict]:
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault((r["encoding"], r["shape"], r["t"]), []).append(r)
    out = []
    for (encoding, shape, t), group in cells.items():
        timed = [r for r in group if r.get("us")]
        if not timed:
            continue
        best = min(timed, key=lambda r: r["us"])
        chosen = next((r for r in timed if r["chosen"]), None)
        classic = min((r["us"] for r in timed if r["classic"]), default=float("nan"))
        out.append({"encoding": encoding, "shape": shape, "t": t, "best": best["tile"], "best_us": best["us"],
                    "best_tflops": best["tflops"], "chosen": chosen["tile"] if chosen else None,
                    "chosen_us": chosen["us"] if chosen else None,
                    "chosen_over_best": chosen["us"] / best["us"] if chosen else float("nan"),
                    "classic_over_best": classic / best["us"],
                    "invalid": [r["tile"] for r in group if not r["valid"]]})
    return out


def _line(row: dict) -> str:
    head = f"{row['encoding']:9s} {row['shape']:28s} T={row['t']:<4d} {row['tile']:22s}"
    if not row["valid"]:
        return f"{head} INVALID: error/bound {row['error_over_bound']:.3g}, unwritten {row['unwritten']}"
    mark = "  <- chosen" if row["chosen"] else ""
    return f"{head} {row['us']:9.1f} us {row['tflops']:6.2f} TFLOP/s {row['gbps']:7.1f} GB/s{mark}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (software adapters)")
    parser.add_argument("--encodings", help=f"comma-separated subset of {','.join(ENCODINGS)}")
    parser.add_argument("--tiles", help="comma-separated tile names (kernels/gemm.py TILES)")
    parser.add_argument("--prune", type=float, default=1.5,
                        help="later encodings: only tiles within this factor of the first's best (0: all)")
    parser.add_argument("--max-seconds", type=float, default=200.0, help="start no new cell after this")
    parser.add_argument("--no-attention", action="store_true", help="skip the prefill attention timings")
    parser.add_argument("--out", type=pathlib.Path, help="write the JSON report here")
    args = parser.parse_args()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(main(args))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
