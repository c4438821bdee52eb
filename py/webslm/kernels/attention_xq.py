"""Decode attention that quantizes its own output for the o projection
(shaders/attention_decode_xq.wgsl): registry entries, host side, golden tests.

    attention_decode_xq_f32, attention_decode_xq_f16   (overrides WG, GW, HD4 as
        attention_decode_*, HD4 a multiple of 8; RESIDUAL 0|1, NATURAL 0|1)

Where the o projection runs on activations quantized once (matvec_prequant.py: a quantize_x
launch, then the packed-dot mat-vec), the quantizer reads attention's output right after
attention wrote it: one more dispatch a layer that moves a few KB, at the cost of a dispatch's
latency (quantize_x plain: 3.3 us a layer in the Llama-8B step on the H200, docs/RESULTS.md).
This chunk pass does the same work at its end, on the outputs it holds in workgroup memory,
when the chunk is the whole context. The bytes are quantize_x_plain's for the same `out`, bit
for bit (the same quantize_unit on the same f32 values); `out` itself is still written.

Bindings: attention_decode's seven (params, q, k_cache, v_cache, out, part_acc, part_ml), then
    7 xq  (storage) [1 + words * units] vec4<u32>, units = n_heads * head_dim / 32 (the layout of
          matvec_input_int8.wgsl for one row; words 3, or 5 with RESIDUAL)
With more than one chunk the kernel writes only the partials, like attention_decode: the host
then records the combine pass and a quantize_x launch (program/lowering.py), so xq is never
half-written. Whether a session uses it at all is measured: the tuning stage times the whole
decode step with and without it and keeps the faster (`CHOICE`, `OutputChoice`).

Golden family "attention_xq": on random and adversarial caches, one pass, both cache types,
both byte widths and orders: `out` within attention.error_bound, and xq equal word for word to
what quantize_x_plain makes from that `out` on the same device.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import matvec, matvec_prequant, runner
from .attention import (DECODE_BINDINGS, DECODE_SOURCES, HEADS_PER_GROUP, PRELUDES, RULE, AttentionShape, DecodePlan,
                        checked, default_scale, error_bound, make_case, oracle_inputs, plan_decode)
from .golden import GoldenContext, GoldenResult, compare_bound, compare_exact, golden
from .golden import label as variant_label
from .kv_cache import WORKGROUPS, DispatchPlan, KvShapeError
from .registry import KERNELS, KernelSpec, register

INT8_SOURCES = ("int8_unit.wgsl", "matvec_int8_x.wgsl", "int8_pack.wgsl", "int8_store.wgsl")
ROW_VEC4S = tuple(range(8, 65, 8))      # head_dim / 4 for head_dim 32, 64, .. 256: whole units of 32

for _dtype, _features in (("f32", frozenset()), ("f16", frozenset({"shader-f16"}))):
    register(KernelSpec(f"attention_decode_xq_{_dtype}",
                        (*PRELUDES[_dtype], *INT8_SOURCES, *DECODE_SOURCES, "attention_decode_xq.wgsl"),
                        "decode_chunk_xq", DECODE_BINDINGS + ("storage",),
                        {"WG": WORKGROUPS, "GW": HEADS_PER_GROUP, "HD4": ROW_VEC4S, "RESIDUAL": (0, 1),
                         "NATURAL": (0, 1)},
                        _features | {matvec.DOT4_FEATURE}))


# Whether attention quantizes for o is a step's choice, not a form's: the tuning stage times the
# whole decode step both ways (backends/gpu/tuning.py _step_check) and keeps an OutputChoice
# under this key among the session's choices only where the separate quantize_x was faster.
CHOICE = "attention output quantized"


@dataclasses.dataclass(frozen=True)
class OutputChoice:
    """Whether decode attention writes the o projection's int8 input (lowering's default where
    the program marks it and o is on the pre-quantized path: yes)."""
    quantize: bool

    def as_dict(self) -> dict:
        return {"quantize": self.quantize}

    @classmethod
    def from_dict(cls, data) -> "OutputChoice":
        """From cached JSON (untrusted): typed, or KvShapeError."""
        if not isinstance(data, dict) or set(data) != {"quantize"} or not isinstance(data["quantize"], bool):
            raise KvShapeError("shape", f"not an attention output choice: {data!r}"[:200])
        return cls(data["quantize"])


KERNEL_PREFIX = "attention_decode_xq_"


def kernel_name(dtype: str) -> str:
    return f"{KERNEL_PREFIX}{dtype}"


def fits(shape: AttentionShape) -> bool:
    """Whether a head's outputs are whole units of 32 (the kernel's workgroups own whole units)."""
    return shape.head_dim % matvec_prequant.UNIT == 0 and shape.head_dim // 4 in ROW_VEC4S


def quantized_chunk_pass(chunk_pass: DispatchPlan, shape: AttentionShape, residual: bool,
                         natural: bool) -> DispatchPlan:
    """attention_decode's chunk pass (plan_decode) as this kernel: the same work, params and grid,
    and the output's bytes for a consumer reading `residual` (two bytes) in `natural` order (q8)."""
    if not fits(shape):
        raise KvShapeError("shape", f"head_dim {shape.head_dim} is not a multiple of {matvec_prequant.UNIT}: "
                                    f"a unit of the quantized output would straddle two heads")
    return dataclasses.replace(chunk_pass, kernel=kernel_name(shape.dtype),
                               overrides={**chunk_pass.overrides, "RESIDUAL": int(residual),
                                          "NATURAL": int(natural)})


def xq_words(shape: AttentionShape, residual: bool) -> int:
    """u32 words of the xq binding: one row of the o projection's quantized input."""
    return matvec_prequant.xq_bytes(shape.n_heads * shape.head_dim // matvec_prequant.UNIT, 1, residual) // 4


async def run_decode(device, kernel, dispatch: DispatchPlan, plan: DecodePlan, shape: AttentionShape,
                     q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(out [H * E] f32, xq [words] u32) of one pass on fresh buffers (tests)."""
    if plan.combine is not None:
        raise KvShapeError("shape", "the quantized output is written in one pass only")
    residual = bool(dispatch.overrides["RESIDUAL"])
    out, _, _, xq = await runner.run_once(
        device, kernel, dispatch.params, [q, k_cache, v_cache],
        [(shape.n_heads * shape.head_dim, np.float32), (plan.scratch_acc, np.float32),
         (plan.scratch_ml, np.float32), (xq_words(shape, residual), np.uint32)], dispatch.grid)
    return out, xq


# -- golden tests ---------------------------------------------------------------------------

CASES = [   # (label, H, K, E, n_keys, data, GW or None for the host's choice, WG or None)
    ("one position", 9, 3, 64, 1, "random", None, None),
    ("SmolLM2 heads, 200 keys", 9, 3, 64, 200, "random", None, None),
    ("Llama-8B heads, 130 keys", 32, 8, 128, 130, "random", None, None),
    ("4 heads a workgroup", 16, 2, 64, 77, "random", 4, 64),
    ("huge scores", 9, 3, 64, 100, "huge", None, None),
    ("identical keys", 8, 2, 128, 150, "identical", None, 128),
    ("head_dim 256", 4, 1, 256, 60, "random", None, None),
    ("head_dim 32", 6, 2, 32, 40, "close", 3, None),
]
QUICK_CASES = [CASES[1], CASES[3]]
# The byte forms: (RESIDUAL, NATURAL) with the o weights' encoding that asks for them.
FORMS = [(1, 0, "q4"), (1, 1, "q8"), (0, 0, "q4"), (0, 1, "q8")]


def _planned_cases(ctx: GoldenContext, dtype: str) -> list[tuple]:
    """(case, GW, WG, RESIDUAL, NATURAL) to run: outside admission the case lists with every
    byte form; at admission, for each of the plan's pipelines of this kernel, one case of its
    head_dim, heads per workgroup and workgroup size with its own byte form."""
    if ctx.planned is None:
        cases = QUICK_CASES if ctx.quick else CASES
        return [(case, case[6], case[7], residual, natural)
                for i, case in enumerate(cases) for residual, natural, _ in (FORMS if not ctx.quick else FORMS[:2])
                if ctx.quick or (i + residual + natural) % 2 == 0 or case[0] == "one position"]
    out = []
    for name, items in sorted(ctx.planned):
        if name != kernel_name(dtype):
            continue
        o = dict(items)
        gw, e = o["GW"], 4 * o["HD4"]
        out.append((("the plan's pipeline", 2 * gw, 2, e, 1 + min(ctx.positions or 64, 64) // 2, "random", gw,
                     o["WG"]), gw, o["WG"], o["RESIDUAL"], o["NATURAL"]))
    return out


@golden("attention_xq", kernels=(KERNEL_PREFIX,))
async def golden_attention_xq(ctx: GoldenContext) -> list[GoldenResult]:
    results = []
    for dtype in ("f32", "f16"):
        if not ctx.variants(kernel_name(dtype)):
            continue
        for (label, h, kv, e, n, data, _, _), gw, wg, residual, natural in _planned_cases(ctx, dtype):
            shape = AttentionShape(h, kv, e, n + 5, dtype)
            plan = plan_decode(ctx.device.limits, shape, n - 1, chunk=n, workgroup=wg, heads_per_workgroup=gw)
            dispatch = quantized_chunk_pass(plan.chunk_pass, shape, residual, natural)
            kernel = await ctx.kernel(dispatch.kernel, **dispatch.overrides)
            q, k_cache, v_cache = make_case(ctx.rng, shape, 1, n - 1, data)
            out, xq = await run_decode(ctx.device, kernel, dispatch, plan, shape, q, k_cache, v_cache)
            exact, bound = error_bound(*oracle_inputs(shape, q, k_cache, v_cache, n), n - 1, default_scale(e),
                                       plan.summation_depth, plan.exp_chain)
            name = variant_label(KERNELS[dispatch.kernel], dispatch.overrides)
            case = f"{label}: H={h} K={kv} E={e} keys={n} {data}"
            results.append(checked(compare_bound("attention_xq", name, f"{case}: out", out.reshape(1, -1), exact,
                                                 bound, RULE), bound))
            # The bytes quantize_x_plain makes from this very `out`, for o weights whose
            # encoding asks for this order (their values do not matter: only xq is read back).
            o_weights = matvec.random_weights_fast(ctx.rng, "q8" if natural else "q4", 4, h * e)
            want = await matvec_prequant.run(ctx, o_weights, out.reshape(1, -1), residual=bool(residual),
                                             quantized_only=True)
            results.append(compare_exact("attention_xq", name, f"{case}: xq against quantize_x_plain",
                                         xq.reshape(1, -1), want))
    return results
