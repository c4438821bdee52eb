"""Golden tests of the attention family (attention.py): family "attention", kv_append,
decode (one pass and split with its combine pass, sliding windows) and prefill (tiles and rows)
against attention.error_bound under attention.RULE (docs/kernels.md, "attention").

The case lists (DECODE_CASES, PREFILL_CASES, the windowed ones, and their quick subsets), and
at admission the plans a case runs on (`decode_plans`, `prefill_plans`: the plan's own
pipelines) at the plan's head dims (`at_planned_head_dims`).
"""
from __future__ import annotations

import numpy as np

from .attention import (PREFILL_VARIANTS, ROWS_KERNEL_MAX_HD4, RULE, AttentionShape, DecodePlan, PrefillPlan,
                        checked, default_scale, error_bound, make_case, oracle_inputs, plan_decode, plan_prefill,
                        run_decode, run_prefill, window_keys)
from .golden import GoldenContext, GoldenResult, compare_bound, golden
from .golden import label as variant_label
from .kv_cache import DTYPES, KvShapeError, golden_append
from .registry import KERNELS

DECODE_CASES = [   # (label, H, K, E, n_keys, data, chunk or None for the host's choice)
    ("one position", 9, 3, 64, 1, "random", None),
    ("SmolLM2 long", 9, 3, 64, 3001, "random", None),
    ("32/8 d128", 32, 8, 128, 1500, "random", None),
    ("MHA 4/4", 4, 4, 64, 257, "random", None),
    ("MQA 8/1 d128", 8, 1, 128, 777, "random", None),
    ("6/2 d40", 6, 2, 40, 300, "random", None),
    ("4/2 d256", 4, 2, 256, 130, "random", None),
    ("huge scores", 9, 3, 64, 1000, "huge", None),
    ("large close scores", 32, 8, 128, 600, "close", None),
    ("identical keys", 32, 8, 128, 2000, "identical", None),
    ("single pass", 9, 3, 64, 500, "random", 500),
    ("many chunks", 9, 3, 64, 1000, "random", 37),
]
QUICK_DECODE = [("one position", 9, 3, 64, 1, "random", None), ("split", 9, 3, 64, 200, "random", 64),
                ("huge scores", 9, 3, 64, 100, "huge", 40)]
PREFILL_CASES = [  # (label, H, K, E, start, T, data)
    ("SmolLM2 prompt", 9, 3, 64, 0, 37, "random"),
    ("SmolLM2 long context", 9, 3, 64, 3000, 7, "random"),
    ("32/8 d128", 32, 8, 128, 5, 33, "random"),
    ("one position", 4, 4, 64, 0, 1, "random"),
    ("MQA 8/1 d128", 8, 1, 128, 100, 17, "random"),
    ("6/2 d40", 6, 2, 40, 10, 20, "random"),
    ("4/2 d256", 4, 2, 256, 3, 11, "random"),
    ("huge scores", 9, 3, 64, 50, 30, "huge"),
    ("large close scores", 9, 3, 64, 40, 12, "close"),
    ("identical keys", 32, 8, 128, 150, 6, "identical"),
    ("many row blocks", 9, 3, 64, 0, 130, "random"),
]
# Sliding windows (Gemma 3's local layers): (label, H, K, E, n_keys or start, T, window, chunk).
# Decode: keys before the window are NaN (a kernel that reads one cannot pass); prefill: they
# are large (scores ~1e3 above the rest: any weight not exactly 0 moves the output).
WINDOW_DECODE_CASES = [
    ("window 8 at position 40", 4, 2, 32, 41, 1, 8, None),
    ("Gemma 3 270M: 4/1 d256, window 512 at 3000, split", 4, 1, 256, 3001, 1, 512, None),
    ("window 512 past the position", 9, 3, 64, 300, 1, 512, None),
    ("window 100, chunks of 37", 9, 3, 64, 1000, 1, 100, 37),
    ("window 1", 4, 1, 64, 77, 1, 1, None),
]
WINDOW_PREFILL_CASES = [
    ("window 8, prompt of 24", 4, 2, 32, 0, 24, 8),
    ("Gemma 3 270M: 4/1 d256, window 512, chunk at 600", 4, 1, 256, 600, 40, 512),
    ("window 20, chunk at 50", 9, 3, 64, 50, 33, 20),
    ("window 1", 4, 4, 64, 3, 17, 1),
    ("window longer than the context", 6, 2, 40, 10, 20, 1000),
]
QUICK_WINDOW_DECODE = WINDOW_DECODE_CASES[:1]
QUICK_WINDOW_PREFILL = WINDOW_PREFILL_CASES[:1]


def poison_before_window(shape: AttentionShape, cache: np.ndarray, first: int, value: float) -> np.ndarray:
    """The cache with positions 0..first-1 set to `value`."""
    out = cache.copy().reshape(shape.n_kv_heads, shape.capacity, shape.head_dim)
    out[:, :first] = value
    return out.reshape(-1)


def at_planned_head_dims(ctx: GoldenContext, cases: list[tuple], prefill: bool = False) -> list[tuple]:
    """Cases (label, H, K, E, keys or start, T, ...) as they are; at admission each at every
    head_dim E the plan's attention pipelines were compiled for (HD4 = E / 4), the model's
    own, and only those within the plan's KV capacity (`GoldenContext.positions`)."""
    if ctx.planned is None:
        return cases
    dims = sorted({4 * dict(items)["HD4"] for name, items in ctx.planned
                   if name.startswith("attention_") and "HD4" in dict(items)})
    return [(*case[:3], e, *case[4:]) for case in cases for e in dims
            if ctx.positions is None or (case[4] + case[5] if prefill else case[4]) <= ctx.positions]


AT_CAPACITY = "at the KV capacity"     # the label of at_capacity's cases (admission reads it)


def at_capacity(ctx: GoldenContext, prefill: bool = False) -> list[tuple]:
    """With a KV capacity given (admission: `GoldenContext.positions`), one case whose last
    token sits at the plan's last position: the longest walk over the keys a step of this
    plan can make. Prefill attention loops over every key tile in one invocation, so an
    adapter that stops long loops early fails here first (llvmpipe past 65535 iterations: at
    head_dim 256 from key 2404 on; kernels/probe.py `loop_limit`), and admission refuses the
    capacity instead of answering wrongly at long prompts. Decode attention's chunks keep its
    loops short; it runs at the capacity too, which costs little."""
    if ctx.positions is None:
        return []
    if prefill:
        return [(AT_CAPACITY, 4, 1, 64, ctx.positions - 1, 1, "random")]
    return [(AT_CAPACITY, 4, 1, 64, ctx.positions, "random", None)]


def decode_plans(ctx: GoldenContext, shape: AttentionShape, position: int, **kwargs) -> list[DecodePlan]:
    """The plans a decode case runs: its own outside admission; at admission those of the plan's
    chunk-pass pipelines for its head_dim (GoldenContext.launches: the workgroup size and heads
    per workgroup are launch shape), each with a combine pass the plan compiled too, if any."""
    plan = plan_decode(ctx.device.limits, shape, position, **kwargs)
    if ctx.planned is None:
        return [plan]
    plans = []
    for overrides in ctx.launches(plan.chunk_pass.kernel, plan.chunk_pass.overrides, ("WG", "GW")):
        try:
            planned = plan_decode(ctx.device.limits, shape, position, **{**kwargs, "workgroup": overrides["WG"],
                                                                         "heads_per_workgroup": overrides["GW"]})
        except KvShapeError:          # heads per workgroup past this case's group
            continue
        if planned.chunk_pass.overrides == overrides and (
                planned.combine is None or ctx.planned_pipeline(planned.combine.kernel, planned.combine.overrides)):
            plans.append(planned)
    return plans


def prefill_plans(ctx: GoldenContext, shape: AttentionShape, start: int, t: int, **kwargs) -> list[PrefillPlan]:
    """The plans a prefill case runs: its own outside admission; at admission those of the
    plan's pipelines of its variant and head_dim, at their workgroup size."""
    plan = plan_prefill(ctx.device.limits, shape, start, t, **kwargs)
    return [plan_prefill(ctx.device.limits, shape, start, t, **{**kwargs, "workgroup": overrides.get("WG")})
            for overrides in ctx.launches(plan.dispatch.kernel, plan.dispatch.overrides)]


async def _window_decode_case(ctx: GoldenContext, plan: DecodePlan, shape: AttentionShape, label: str, n: int,
                              window: int) -> GoldenResult:
    """One windowed decode case: the positions before the window poisoned (NaN) in the cache."""
    h, kv, e = shape.n_heads, shape.n_kv_heads, shape.head_dim
    kernels = (await ctx.kernel(plan.chunk_pass.kernel, **plan.chunk_pass.overrides),
               await ctx.kernel(plan.combine.kernel, **plan.combine.overrides) if plan.combine else None)
    q, k_cache, v_cache = make_case(ctx.rng, shape, 1, n - 1, "random")
    exact, bound = error_bound(*oracle_inputs(shape, q, k_cache, v_cache, n), n - 1, default_scale(e),
                               plan.summation_depth, plan.exp_chain, window=window)
    first = window_keys(n - 1, window)[1]
    k_cache, v_cache = (poison_before_window(shape, c, first, np.nan) for c in (k_cache, v_cache))
    got = await run_decode(ctx.device, kernels, plan, shape, q, k_cache, v_cache)
    return checked(compare_bound(
        "attention", variant_label(KERNELS[plan.chunk_pass.kernel], plan.chunk_pass.overrides)
        + (f" + {plan.combine.kernel}" if plan.combine else ""),
        f"{label}: H={h} K={kv} E={e} keys={n} window={window}, chunk {plan.chunk} x {plan.n_chunks}",
        got, exact, bound, RULE), bound)


async def golden_window(ctx: GoldenContext, dtype: str) -> list[GoldenResult]:
    """Decode and prefill attention with a sliding window against the windowed oracle."""
    results = []
    decode = at_planned_head_dims(ctx, QUICK_WINDOW_DECODE if ctx.quick else WINDOW_DECODE_CASES)
    for label, h, kv, e, n, _, window, chunk in decode if ctx.variants(f"attention_decode_{dtype}") else []:
        shape = AttentionShape(h, kv, e, n + 2, dtype)
        for plan in decode_plans(ctx, shape, n - 1, chunk=chunk, window=window):
            results.append(await _window_decode_case(ctx, plan, shape, label, n, window))
    prefill = [(case, variant) for case in at_planned_head_dims(ctx, QUICK_WINDOW_PREFILL if ctx.quick
                                                                else WINDOW_PREFILL_CASES, prefill=True)
               for variant in PREFILL_VARIANTS if variant == "tiles" or case[3] <= 4 * ROWS_KERNEL_MAX_HD4]
    for (label, h, kv, e, start, t, window), variant in prefill:
        if not ctx.variants(f"attention_prefill_{'rows_' if variant == 'rows' else ''}{dtype}"):
            continue
        shape = AttentionShape(h, kv, e, start + t + 3, dtype)
        for plan in prefill_plans(ctx, shape, start, t, variant=variant, window=window):
            kernel = await ctx.kernel(plan.dispatch.kernel, **plan.dispatch.overrides)
            q, k_cache, v_cache = make_case(ctx.rng, shape, t, start, "random")
            first = window_keys(start, window)[1]        # the first token's window: every token's starts later
            k_cache = poison_before_window(shape, k_cache.astype(np.float32), first, 1e3 / np.sqrt(e))
            k_cache = k_cache.astype(DTYPES[dtype])
            got = await run_prefill(ctx.device, kernel, plan, shape, q, k_cache, v_cache)
            exact, bound = error_bound(*oracle_inputs(shape, q, k_cache, v_cache, start + t), start, default_scale(e),
                                       plan.summation_depth, plan.exp_chain, window=window)
            results.append(checked(compare_bound(
                "attention", variant_label(KERNELS[plan.dispatch.kernel], plan.dispatch.overrides),
                f"{label}: H={h} K={kv} E={e} start={start} T={t} window={window}, tile {plan.tile}",
                got, exact, bound, RULE), bound))
    return results


QUICK_PREFILL = [("prompt", 9, 3, 64, 20, 5, "random"),   # 25 keys: two tiles
                 ("huge scores", 9, 3, 64, 0, 9, "huge"),
                 ("one position", 4, 4, 64, 0, 1, "random")]


@golden("attention", kernels=("attention_decode_f32", "attention_decode_f16", "attention_combine_",
                                 "attention_prefill_", "kv_append_"))
async def golden_attention(ctx: GoldenContext) -> list[GoldenResult]:
    results = await golden_append(ctx, "attention")
    for dtype in ("f32", "f16"):
        decode_cases = at_planned_head_dims(ctx, (QUICK_DECODE if ctx.quick else DECODE_CASES) + at_capacity(ctx)) \
            if ctx.variants(f"attention_decode_{dtype}") else []
        for index, (label, h, kv, e, n, data, chunk) in enumerate(decode_cases):
            shape = AttentionShape(h, kv, e, n + 3 + index, dtype)    # capacity past the context
            workgroup = 64 if index % 3 == 1 and not ctx.quick else None   # the smallest size too
            heads = 8 if index % 2 == 0 and not ctx.quick else None          # GW = G (up to 8) too
            for plan in decode_plans(ctx, shape, n - 1, chunk=chunk, workgroup=workgroup,
                                     heads_per_workgroup=heads):
                kernels = (await ctx.kernel(plan.chunk_pass.kernel, **plan.chunk_pass.overrides),
                           await ctx.kernel(plan.combine.kernel, **plan.combine.overrides) if plan.combine else None)
                q, k_cache, v_cache = make_case(ctx.rng, shape, 1, n - 1, data)
                got = await run_decode(ctx.device, kernels, plan, shape, q, k_cache, v_cache)
                exact, bound = error_bound(*oracle_inputs(shape, q, k_cache, v_cache, n), n - 1,
                                           default_scale(e), plan.summation_depth, plan.exp_chain)
                results.append(checked(compare_bound(
                    "attention", variant_label(KERNELS[plan.chunk_pass.kernel], plan.chunk_pass.overrides)
                    + (f" + {plan.combine.kernel}" if plan.combine else ""),
                    f"{label}: H={h} K={kv} E={e} keys={n} {data}, chunk {plan.chunk} x {plan.n_chunks}",
                    got, exact, bound, RULE), bound))
        prefill = [(case, variant) for case in at_planned_head_dims(
                       ctx, (QUICK_PREFILL if ctx.quick else PREFILL_CASES) + at_capacity(ctx, prefill=True), prefill=True)
                   for variant in PREFILL_VARIANTS if variant == "tiles" or case[3] <= 4 * ROWS_KERNEL_MAX_HD4]
        prefill = [(case, variant) for case, variant in prefill   # the variants this device runs and this run tests
                   if ctx.variants(f"attention_prefill_{'rows_' if variant == 'rows' else ''}{dtype}")]
        for index, ((label, h, kv, e, start, t, data), variant) in enumerate(prefill):
            shape = AttentionShape(h, kv, e, start + t + 5, dtype)
            workgroup = 64 if index % 3 == 1 and variant == "tiles" and not ctx.quick else None
            for plan in prefill_plans(ctx, shape, start, t, workgroup=workgroup, variant=variant):
                kernel = await ctx.kernel(plan.dispatch.kernel, **plan.dispatch.overrides)
                q, k_cache, v_cache = make_case(ctx.rng, shape, t, start, data)
                got = await run_prefill(ctx.device, kernel, plan, shape, q, k_cache, v_cache)
                exact, bound = error_bound(*oracle_inputs(shape, q, k_cache, v_cache, start + t), start,
                                           default_scale(e), plan.summation_depth, plan.exp_chain)
                results.append(checked(compare_bound(
                    "attention", variant_label(KERNELS[plan.dispatch.kernel], plan.dispatch.overrides),
                    f"{label}: H={h} K={kv} E={e} start={start} T={t} {data}, tile {plan.tile}",
                    got, exact, bound, RULE), bound))
        results += await golden_window(ctx, dtype)
    return results
