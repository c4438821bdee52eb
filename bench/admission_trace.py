"""Where a native admission's time goes: its stages, and within each the pipelines compiled,
the submissions and the reads, counted and timed (summed, and end to end as the union of
their intervals, since compiles overlap).

    PYTHONPATH=py python bench/admission_trace.py --model FILE.slm [--tuning later|auto]
        [--compile-at-once N] [--admissions N] [--warm-up] [--out FILE.json]

One admission in a fresh process (a browser's first visit: run with
`__GL_SHADER_DISK_CACHE=0` on NVIDIA for a cold driver cache). "later" is the page's default
(`tuning="auto", tune_later=True`). The figures in docs/RESULTS.md, "Admission's self-test on
the plan's own pipelines", come from this script on the H200. --warm-up first runs
admission/warm_up.py (timed on its own, under "warm_up"), as the page does beside the model's
download: the admission after it is what a page on a real GPU waits for once the model is in.

    PYTHONPATH=py python bench/admission_trace.py --prefill-attention H,K,E,START,T,DTYPE ...

instead times nothing: it runs one prefill attention case per argument (random data, the
host's tile) against the oracle and prints its error and the query rows that came out NaN
(lavapipe at E = 256 from key 2404 on; the H200 passes the same cases).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time

import numpy as np

import webslm
from webslm.admission import admit as admission
from webslm.admission.warm_up import warm_up
from webslm.webgpu import native

EVENTS: list[tuple[str, str, float, float]] = []      # (kind, stage, start, end)
STAGE = {"now": "?"}


def _timed(kind: str, method):
    """The device method, with each call's interval kept under the current stage."""
    if asyncio.iscoroutinefunction(method):
        async def timed(self, *args, **kwargs):
            began = time.perf_counter()
            try:
                return await method(self, *args, **kwargs)
            finally:
                EVENTS.append((kind, STAGE["now"], began, time.perf_counter()))
    else:
        def timed(self, *args, **kwargs):
            began = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                EVENTS.append((kind, STAGE["now"], began, time.perf_counter()))
    return timed


def instrument() -> None:
    device = native.NativeDevice
    device.create_shader_module = _timed("module", device.create_shader_module)
    device.create_compute_pipeline = _timed("pipeline", device.create_compute_pipeline)
    device.submit = _timed("submit", device.submit)
    device.read_buffer = _timed("read", device.read_buffer)
    enter = admission._Admission._enter

    async def entering(self, stage: str) -> None:
        STAGE["now"] = stage
        await enter(self, stage)
    admission._Admission._enter = entering


def union(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one of the intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


async def trace(path: str, tuning: str) -> dict:
    model = webslm.open_model(path)
    EVENTS.clear()
    began = time.perf_counter()
    session = await admission.admit(native.NativeGpu(), model, admission.AdmissionPolicy(
        tuning="auto", tune_later=tuning == "later"))
    seconds = time.perf_counter() - began
    spans = collections.defaultdict(lambda: collections.defaultdict(list))
    for kind, stage, start, end in EVENTS:
        spans[stage][kind].append((start, end))
    session.destroy()
    return {"model": path, "tuning": tuning, "compile_at_once": admission.COMPILE_AT_ONCE,
            "admission_s": round(seconds, 3), "stages": session.seconds,
            "self_test_family_seconds": session.self_test["family_seconds"],
            "per_stage": {stage: {kind: {"n": len(v), "sum_s": round(sum(e - s for s, e in v), 3),
                                         "union_s": round(union(v), 3)} for kind, v in kinds.items()}
                          for stage, kinds in spans.items()},
            # the tune stage's calls one by one (ms from the stage's first call): the first look
            "tune_events": [(kind, round((start - tune[0]) * 1e3, 1), round((end - start) * 1e3, 1))
                            for kind, stage, start, end in EVENTS if stage == "tune"
                            for tune in [[s for _, st, s, _ in EVENTS if st == "tune"]]]}


async def prefill_attention(cases: list[str]) -> None:
    from webslm.kernels import attention
    from webslm.kernels.golden import GoldenContext, compare_bound
    adapter = await native.NativeGpu().request_adapter("core")
    device = await adapter.request_device(sorted(adapter.features), {})
    ctx = GoldenContext(device, np.random.default_rng(0), "quick")
    for case in cases:
        h, kv, e, start, t, dtype = case.split(",")
        h, kv, e, start, t = map(int, (h, kv, e, start, t))
        shape = attention.AttentionShape(h, kv, e, start + t + 5, dtype)
        plan = attention.plan_prefill(device.limits, shape, start, t, variant="tiles")
        kernel = await ctx.kernel(plan.dispatch.kernel, **plan.dispatch.overrides)
        q, k, v = attention.make_case(ctx.rng, shape, t, start, "random")
        got = await attention.run_prefill(device, kernel, plan, shape, q, k, v)
        exact, bound = attention.error_bound(*attention.oracle_inputs(shape, q, k, v, start + t), start,
                                             attention.default_scale(e), plan.summation_depth, plan.exp_chain)
        result = attention.checked(compare_bound("attention", plan.dispatch.kernel, case, got, exact, bound,
                                                 attention.RULE), bound)
        nan_rows = np.argwhere(np.isnan(got.reshape(t, h, e)).any(axis=2)).tolist()
        print(f"{case}: tile {plan.tile}, error/tolerance {result.error_over_tolerance:.3g}, "
              f"passed {result.passed}, NaN (token, head) rows {nan_rows[:8]}{' ...' if len(nan_rows) > 8 else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model")
    parser.add_argument("--tuning", choices=("later", "auto"), default="later")
    parser.add_argument("--compile-at-once", type=int, help="pipeline compiles in flight (admission's default)")
    parser.add_argument("--admissions", type=int, default=1,
                        help="admissions in turn in the one process (the first pays its one-time costs)")
    parser.add_argument("--warm-up", action="store_true",
                        help="warm the GPU first (admission/warm_up.py), as the page does while the model loads")
    parser.add_argument("--out")
    parser.add_argument("--prefill-attention", nargs="+", metavar="H,K,E,START,T,DTYPE")
    args = parser.parse_args()
    if args.prefill_attention:
        asyncio.run(prefill_attention(args.prefill_attention))
        return
    if not args.model:
        parser.error("--model is required")
    if args.compile_at_once:
        admission.COMPILE_AT_ONCE = args.compile_at_once
    instrument()

    async def admissions():
        warmed = await warm_up(native.NativeGpu()) if args.warm_up else None
        traces = [await trace(args.model, args.tuning) for _ in range(args.admissions)]
        if warmed is not None:
            traces[0]["warm_up"] = warmed
        return traces
    report = asyncio.run(admissions())
    report = report[0] if len(report) == 1 else report
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
