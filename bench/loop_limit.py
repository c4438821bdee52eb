"""How far an adapter lets a shader invocation's loops run, and where prefill attention's
answers go wrong on an adapter that stops them early (llvmpipe: docs/RESULTS.md, "llvmpipe
stops a shader's loops at 65535 iterations").

    PYTHONPATH=py python bench/loop_limit.py [--out FILE] [--prompt-error MODEL.slm]

1. The probe's nested loop (shaders/loop_probe.wgsl) at several outer x inner sizes: the
   iterations it counted against those asked.
2. For each head_dim and prefill variant, the host's plan for one token of a 4-head, 1-KV-head
   model at position `start`, against the oracle: bisected for the last start that passes.
3. The kernels whose loops could grow with the model, at real sizes, against their oracles:
   decode attention at long contexts (chunked), the q4 GEMM at large K with every tile the
   device offers, top-k over large vocabularies.
4. With --prompt-error (the wide_heads test shape: bench/synthetic_model.py --shape
   wide_heads): the model admitted with a KV capacity of 4096, then prompts of 2000 and 2600
   tokens prefilled on the GPU against the CPU path (max |logit error| / max |logit|); or the
   admission's refusal, which is what this code does on an adapter that cuts loops short.
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

from webslm.kernels import attention, gemm, logits, probe  # noqa: E402
from webslm.kernels.weights import Weights  # noqa: E402
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


async def other_kernels(ctx: GoldenContext) -> list[dict]:
    """Section 3: each case passes its oracle, or not."""
    device, rows = ctx.device, []
    for h, kv, e, n in [(4, 1, 256, 8192), (32, 8, 128, 16384), (4, 1, 256, 16000)]:
        shape = attention.AttentionShape(h, kv, e, n + 2, "f16")
        plan = attention.plan_decode(device.limits, shape, n - 1)
        kernels = (await ctx.kernel(plan.chunk_pass.kernel, **plan.chunk_pass.overrides),
                   await ctx.kernel(plan.combine.kernel, **plan.combine.overrides) if plan.combine else None)
        q, k, v = attention.make_case(ctx.rng, shape, 1, n - 1, "random")
        got = await attention.run_decode(device, kernels, plan, shape, q, k, v)
        exact, bound = attention.error_bound(*attention.oracle_inputs(shape, q, k, v, n), n - 1,
                                             attention.default_scale(e), plan.summation_depth, plan.exp_chain)
        rows.append({"kernel": "decode attention", "case": f"H={h} K={kv} E={e} keys={n}",
                     "passed": bool(np.all(np.abs(got - exact) <= bound))})
    for k_dim in (2048, 8192, 14336):
        w = ctx.rng.standard_normal((64, k_dim)).astype(np.float32) * 0.05
        weights = Weights.quantized(w, "q4", 32, "min", "f16")
        x = ctx.rng.standard_normal((8, k_dim)).astype(np.float32)
        exact = x.astype(np.float64) @ weights.dequantize().astype(np.float64).T
        for tile in gemm.candidates(device.limits, device.features, encoding="q4"):
            got = await gemm.gemm(ctx, weights, x, tile=tile)
            rows.append({"kernel": "gemm q4", "case": f"K={k_dim} tile {tile.name}",
                         "passed": bool(np.allclose(got, exact, rtol=1e-4, atol=1e-3 * np.abs(exact).max()))})
    for vocab in (49152, 128256, 262144):
        z = ctx.rng.standard_normal(vocab).astype(np.float32)
        for k in (1, 40, 64, 256):
            got = await logits.reduce(device, None, z, k)
            rows.append({"kernel": "logits top-k", "case": f"vocab {vocab} k {k}",
                         "passed": bool(np.array_equal(got.indices, logits.oracle(z, k)[:k]))})
    failed = [row for row in rows if not row["passed"]]
    print(f"other kernels: {len(rows) - len(failed)} of {len(rows)} passed {failed or ''}", flush=True)
    return rows


async def prompt_error(path: str) -> dict:
    """Section 4 (see the module docstring)."""
    import webslm
    from webslm.admission.admit import AdmissionFailure, AdmissionPolicy, admit
    from webslm.backends.gpu import GpuBackend
    from webslm.backends.scores import Want
    from webslm.cpu import CpuBackend
    model = webslm.open_model(path)
    try:
        session = await admit(NativeGpu(), model, AdmissionPolicy(context=4096))
    except AdmissionFailure as failure:
        return {"admitted": False, "code": failure.code, "stage": failure.stage, "sentence": failure.sentence}
    backend = await GpuBackend.build(session, model)
    rng, out = np.random.default_rng(1), {"admitted": True}
    try:
        for n in (2000, 2600):
            ids = [int(i) for i in rng.integers(0, model.architecture.vocab, n)]
            backend.reset()
            got = (await backend.prefill(ids, Want("full"))).logits
            want = CpuBackend(model).prefill(ids)
            out[f"{n}_tokens"] = float(np.nanmax(np.abs(got - want)) / np.abs(want).max())
    finally:
        backend.release()
    return out


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
    report["other_kernels"] = await other_kernels(ctx)
    device.destroy()
    if args.prompt_error:
        report["prompt_error"] = await prompt_error(args.prompt_error)
        print(json.dumps(report["prompt_error"]), flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out")
    parser.add_argument("--prompt-error", metavar="MODEL", help="section 4 on this model (the wide_heads shape)")
    asyncio.run(main(parser.parse_args()))
