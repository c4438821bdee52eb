"""Admission's choice of the prefill attention kernel, by measurement (issue 16, item 3).

attention.PREFILL_VARIANTS are two kernels for one computation under one error rule:
"rows" (a query row per invocation, q and the output in registers; head_dim <= 64) and
"tiles" (16-row blocks over key tiles in workgroup memory; any head_dim). Which is faster
depends on the device, by a wide margin either way (bench/gemm_sweep.py, both kernels checked
then timed on SmolLM2's and Llama-3.2-1B's heads at T = 128 and 512, f32 and f16 caches):

    NVIDIA H200 (gemm_sweep_h200.json)         "tiles" 3.2-6.1x faster (SmolLM2, T=128: 44 us, "rows" 268)
    lavapipe (gemm_sweep_lavapipe_quick.json)  "rows" 1.4-9.5x faster

The host's order ("rows" first where it fits) was chosen on the software adapters of the
browser rows, and cost a real GPU up to 60% of a short prompt's prefill (SmolLM2 at 128
tokens: 7.8 of 13.3 ms in attention). So admission times both on this device, on the model's
attention shape (heads, head dim, cache type) at T = min(prefill chunk, TOKENS) tokens, random
inputs: each checked against the float64 oracle within attention.error_bound (a kernel that
fails is never chosen), then timed as chains of dependent dispatches in alternating rounds on
settled clocks (timing.py). The other variant replaces the rule only if it is faster by the
tuning stage's NOISE. A software adapter (the rule's dispatch over SLOW_SECONDS) keeps the
rule unmeasured: there the order above is already right, and timing costs seconds.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...kernels import attention, runner
from ...kernels.attention import AttentionShape, KvShapeError, PrefillChoice
from ...kernels.golden import compare_bound
from ...kernels.registry import compile_kernel
from . import timing

TOKENS = 128                   # the prompt length timed (the ranking held at 128 and 512 on both devices)
SLOW_SECONDS = 5e-3            # a rule dispatch slower than this: a software adapter, not measured
ROUND_SECONDS = 1e-3           # GPU time per timed round


def form_key(shape: AttentionShape) -> str:
    """What the choice depends on besides the device and the shader bundle (the cache's key)."""
    return f"{attention.PREFILL_CHOICE} {shape.n_heads}/{shape.n_kv_heads}x{shape.head_dim} {shape.dtype}"


async def _seconds_per_dispatch(device, prepared: runner.Prepared, count: int, clock: Callable[[], float],
                                trip: float = 0.0) -> float:
    """A chain of `count` dispatches (each rewrites the same output: dependent), less the round
    trip `trip` (timing.round_trip), per dispatch."""
    sync = prepared.outputs[0][0]
    await device.read_buffer(sync, 0, 4)          # the queue is idle before the clock starts
    device.submit([prepared.dispatch] * count)
    started = clock()
    await device.read_buffer(sync, 0, 4)
    elapsed = clock() - started
    return max(elapsed - trip, 0.1 * elapsed) / count      # never below a tenth of the round: noise


async def measure(device, shape: AttentionShape, chunk: int, clock: Callable[[], float], noise: float,
                  force: bool = False) -> tuple[PrefillChoice | None, dict]:
    """(the choice, or None to keep the rule; the report entry: the rule, its time and the
    chosen one's in us, variants tried, refused and rejected, or `searched: False` and why)."""
    tokens = max(1, min(chunk, TOKENS))
    case = AttentionShape(shape.n_heads, shape.n_kv_heads, shape.head_dim, tokens, shape.dtype)
    plans, refused = {}, 0
    for variant in attention.PREFILL_VARIANTS:
        try:
            plans[variant] = attention.plan_prefill(device.limits, case, 0, tokens, variant=variant)
        except KvShapeError:
            refused += 1                           # this head_dim or device does not fit it
    rule = next(iter(plans))                       # what plan_prefill takes unasked: the first that fits
    entry = {"rule": {"variant": rule}, "refused": refused, "rejected": 0}
    if len(plans) < 2:
        return None, entry | {"searched": False, "why": "one variant fits"}
    q, k_cache, v_cache = attention.make_case(np.random.default_rng(17), case, tokens, 0, "random")
    checked: dict[str, runner.Prepared] = {}
    made: list[runner.Prepared] = []              # every variant's buffers, released at the end
    try:
        for variant, plan in plans.items():
            kernel = await compile_kernel(device, plan.dispatch.kernel, **plan.dispatch.overrides)
            prepared = runner.prepare(device, kernel, plan.dispatch.params, [q, k_cache, v_cache],
                                      [(q.size, np.float32)], plan.dispatch.grid)
            made.append(prepared)
            device.submit([prepared.dispatch])
            (got,) = await prepared.read_outputs(device)
            exact, bound = attention.error_bound(*attention.oracle_inputs(case, q, k_cache, v_cache, tokens), 0,
                                                 attention.default_scale(case.head_dim), plan.summation_depth,
                                                 plan.exp_chain)
            if compare_bound("attention", plan.dispatch.kernel, "tuning", got, exact, bound, attention.RULE).passed:
                checked[variant] = prepared
            else:
                entry["rejected"] += 1             # never chosen
        if rule not in checked or len(checked) < 2:
            return None, entry | {"searched": False, "why": "a variant failed its check"}
        first = await _seconds_per_dispatch(device, checked[rule], 2, clock)
        if not force and first > SLOW_SECONDS:
            return None, entry | {"searched": False, "why": f"a rule dispatch takes over {SLOW_SECONDS * 1e3:g} ms "
                                                            f"here (a software adapter)"}
        # The rounds read `count` and `trip` when they run: the settle runs on 2 dispatches and
        # no trip; the alternating rounds on ROUND_SECONDS of dispatches, less the trip.
        variants, trip, count = list(checked), 0.0, 2
        rounds = [lambda v=v: _seconds_per_dispatch(device, checked[v], count, clock, trip) for v in variants]
        entry["settle"] = list(await timing.settle(rounds[variants.index(rule)], clock))
        trip = await timing.round_trip(device, (checked[rule].outputs[0][0], 0, 4), clock)
        count = min(64, max(2, int(ROUND_SECONDS / await _seconds_per_dispatch(device, checked[rule], 2, clock, trip))))
        entry["round_trip_us"] = round(trip * 1e6, 1)
        times = dict(zip(variants, await timing.alternating(rounds)))
    finally:
        for prepared in made:
            prepared.release(device)
    fastest = min(times, key=times.get)
    chosen = fastest if fastest != rule and times[fastest] < (1 - noise) * times[rule] else rule
    entry |= {"rule_us": round(times[rule] * 1e6, 2), "chosen_us": round(times[chosen] * 1e6, 2),
              "tried": len(times), "tokens": tokens,
              "us": {variant: round(seconds * 1e6, 2) for variant, seconds in times.items()}}
    return (PrefillChoice(chosen) if chosen != rule else None), entry
