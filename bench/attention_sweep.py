"""Decode attention's launch choices, timed as the step runs them: one dispatch repeated back to
back in one submit, each waiting on the last (they write the same output), so a row's `us` is
what that dispatch adds to a step, its barrier included.

    PYTHONPATH=py python bench/attention_sweep.py [--quick] [--out FILE]

For each model's heads (SmolLM2-135M, Llama-3.2-1B, Llama-3.1-8B; f16 cache) and context
length: the chunk pass at every workgroup size and heads-per-workgroup the kernel allows, with
the host's chunking and with shorter chunks (then the combine pass is timed too), and the
"floor": the combine pass of a one-chunk plan, which returns at once (a dispatch that does
nothing, on the same grid). What `us` a layer's attention costs is chunk + combine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import platform
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))
sys.path.insert(0, str(ROOT / "bench"))

from kernels import open_device  # noqa: E402
from webslm.kernels import attention, runner  # noqa: E402
from webslm.webgpu.interface import BufferBinding, Dispatch  # noqa: E402
from webslm.kernels.registry import compile_kernel  # noqa: E402
from webslm.webgpu.native import NativeGpu  # noqa: E402

MODELS = {"smollm2": (9, 3, 64), "llama1b": (32, 8, 64), "llama8b": (32, 8, 128)}
CONTEXTS = (1, 128, 192, 512, 1024, 4096)
REPEATS = 200


async def chain_us(device, dispatches: list, sync, repeats: int) -> float:
    """GPU time of `dispatches` (in order) repeated `repeats` times in one submit, per repeat,
    less the round trip of an empty submit; the median of 5."""
    async def once(batch) -> float:
        device.submit([])
        await device.read_buffer(sync, 0, 4)
        device.submit(batch)
        started = time.perf_counter()
        await device.read_buffer(sync, 0, 4)
        return time.perf_counter() - started
    await once(dispatches * repeats)                       # warm: clocks up, pipelines used
    empty = statistics.median([await once([]) for _ in range(5)])
    full = statistics.median([await once(dispatches * repeats) for _ in range(5)])
    return max(full - empty, 0.0) / repeats * 1e6


async def time_plan(device, shape, position: int, chunk, wg: int, gw: int, rng, repeats: int) -> dict:
    plan = attention.plan_decode(device.limits, shape, position, chunk=chunk, workgroup=wg, heads_per_workgroup=gw)
    h, e = shape.n_heads, shape.head_dim
    k_cache = rng.standard_normal(shape.layout.elements).astype(np.float16)
    v_cache = rng.standard_normal(shape.layout.elements).astype(np.float16)
    q = rng.standard_normal(h * e).astype(np.float32)
    scratch = [(max(4, plan.scratch_acc), np.float32), (max(2, plan.scratch_ml), np.float32)]
    first = await compile_kernel(device, plan.chunk_pass.kernel, **plan.chunk_pass.overrides)
    prepared = runner.prepare(device, first, plan.chunk_pass.params, [q, k_cache, v_cache],
                              [(h * e, np.float32), *scratch], plan.chunk_pass.grid)
    # the combine pass on the same buffers: with one chunk it returns at once (the floor)
    second_plan = plan.combine or attention.DispatchPlan(
        f"attention_combine_{shape.dtype}", {"WG": wg, "HD4": e // 4}, plan.chunk_pass.params,
        runner.workgroup_grid(-(-(h * e // 4) // wg), 65535))
    second = await compile_kernel(device, second_plan.kernel, **second_plan.overrides)
    group = device.create_bind_group(second.bind_group_layout, [BufferBinding(b) for b in prepared.buffers])
    combine = Dispatch(second.pipeline, [group], second_plan.grid)
    sync = prepared.outputs[0][0]
    row = {"position": position, "keys": position + 1, "chunk": plan.chunk, "n_chunks": plan.n_chunks,
           "WG": plan.chunk_pass.overrides["WG"], "GW": plan.chunk_pass.overrides["GW"],
           "workgroups": plan.chunk_pass.grid[0] * plan.chunk_pass.grid[1]}
    row["chunk_us"] = await chain_us(device, [prepared.dispatch], sync, repeats)
    if plan.combine is not None:
        row["combine_us"] = await chain_us(device, [combine], sync, repeats)
        row["both_us"] = await chain_us(device, [prepared.dispatch, combine], sync, repeats)
    else:
        row["floor_us"] = await chain_us(device, [combine], sync, repeats)
    prepared.release(device)
    return row


async def main(args) -> dict:
    adapter, device = await open_device(NativeGpu())
    rng = np.random.default_rng(0)
    rows = []
    contexts = (1, 128, 512) if args.quick else [int(c) for c in args.contexts.split(",")]
    repeats = 20 if args.quick else REPEATS
    for model, (h, kv, e) in MODELS.items():
        for context in contexts:
            shape = attention.AttentionShape(h, kv, e, max(context, 2), "f16")
            chunks = [None] + [c for c in map(int, filter(None, args.chunks.split(","))) if c < context]
            for chunk in chunks:
                for wg in map(int, args.workgroups.split(",")):
                    for gw in map(int, args.heads.split(",")):
                        if gw > h // kv:
                            continue
                        try:
                            row = await time_plan(device, shape, context - 1, chunk, wg, gw, rng, repeats)
                        except attention.KvShapeError as refused:
                            print(f"{model} {context} chunk {chunk} WG {wg} GW {gw}: {refused}", flush=True)
                            continue
                        row.update(model=model, host_chunking=chunk is None)
                        rows.append(row)
                        cost = row.get("both_us", row["chunk_us"])
                        print(f"{model:8} keys {row['keys']:5} chunk {row['chunk']:5} x{row['n_chunks']:<3} "
                              f"WG {row['WG']:3} GW {row['GW']} groups {row['workgroups']:4}: chunk "
                              f"{row['chunk_us']:7.2f} us, combine {row.get('combine_us', 0):6.2f}, both "
                              f"{cost:7.2f}, floor {row.get('floor_us', float('nan')):6.2f}", flush=True)
    report = {"adapter": adapter.summary().description, "host": platform.platform(),
              "date": time.strftime("%Y-%m-%d"), "repeats": repeats, "rows": rows}
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few contexts and repeats (software adapters)")
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="keys, comma-separated")
    parser.add_argument("--chunks", default="16,32,64", help="chunk lengths tried besides the host's")
    parser.add_argument("--workgroups", default="64,128,256")
    parser.add_argument("--heads", default="1,2,4", help="query heads per workgroup (GW)")
    parser.add_argument("--out")
    asyncio.run(main(parser.parse_args()))
