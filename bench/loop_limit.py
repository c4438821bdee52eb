"""How far an adapter lets a shader invocation's loops run, and where prefill attention's
answers go wrong on an adapter that stops them early (llvmpipe: docs/RESULTS.md, "llvmpipe
stops a shader's loops at 65535 iterations").

    PYTHONPATH=py python bench/loop_limit.py [--out FILE]

1. The probe's nested loop (shaders/loop_probe.wgsl) at several outer x inner sizes: the
   iterations it counted against those asked.
2. For each head_dim and prefill variant, the host's plan for one token of a 4-head, 1-KV-head
   model at position `start`, against the oracle: bisected for the last start that passes.
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

from webslm.kernels import attention, probe  # noqa: E402
from webslm.kernels.golden import GoldenContext  # noqa: E402
from webslm.kernels.registry import compile_kernel  # noqa: E402
from webslm.webgpu.native import NativeGpu  # noqa: E402

SIZES = [(100, 100), (1000, 100), (300, 300), (1000, 1000), (1, 70000), (70000, 1)]
PREFILL = [(256, "tiles"), (128, "tiles"), (64, "tiles"), (64, "rows"), (32, "tiles")]
LONGEST = 40000


async def prefill_passes(ctx: GoldenContext, e: int, start: int, variant: str) -> tuple[bool, int]:
    shape = attention.AttentionShape(4, 1, e, start + 6, "f16")
    plan = attention.plan_prefill(ctx.device.limits, shape, start, 1, variant=variant)
    kernel = await ctx.kernel(plan.dispatch.kernel, **plan.dispatch.overrides)
    q, k, v = attention.make_case(ctx.rng, shape, 1, start, "random")
    got = await attention.run_prefill(ctx.device, kernel, plan, shape, q, k, v)
    exact, bound = attention.error_bound(*attention.oracle_inputs(shape, q, k, v, start + 1), start,
                                         attention.default_scale(e), plan.summation_depth, plan.exp_chain)
    return bool(np.all(np.abs(got - exact) <= bound)), plan.tile


async def main(args) -> dict:
    adapter = await NativeGpu().request_adapter("core")
    device = await adapter.request_device(sorted(adapter.features), {})
    kernel = await compile_kernel(device, "loop_probe")
    report = {"adapter": adapter.summary().description, "date": time.strftime("%Y-%m-%d"),
              "loop_limit": await probe.loop_limit(device), "loops": [], "prefill": []}
    for outer, inner in SIZES:
        got = (await probe.loop_count(device, kernel, outer, inner))[0]
        report["loops"].append({"outer": outer, "inner": inner, "asked": outer * inner, "ran": got})
        print(f"loop {outer} x {inner}: asked {outer * inner}, ran {got}", flush=True)
    ctx = GoldenContext(device, np.random.default_rng(0), "quick")
    for e, variant in PREFILL:
        low, high = 16, LONGEST
        passed, tile = await prefill_passes(ctx, e, high, variant)
        if passed:
            row = {"head_dim": e, "variant": variant, "tile": tile, "passes_to": high}
        else:
            while high - low > 1:                 # low passes, high fails
                mid = (low + high) // 2
                if (await prefill_passes(ctx, e, mid, variant))[0]:
                    low = mid
                else:
                    high = mid
            row = {"head_dim": e, "variant": variant, "tile": tile, "last_passing_start": low,
                   "first_failing_start": high}
        report["prefill"].append(row)
        print(json.dumps(row), flush=True)
    device.destroy()
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out")
    asyncio.run(main(parser.parse_args()))
