"""Per-head RMSNorm of q and k in place (shaders/head_norm.wgsl): Gemma 3's q_norm and k_norm.

    head_norm   qkv (the planar activation: q [T][heads*E] at q_at, k [T][kv_heads*E] at k_at,
                v after them) -> q and k rows of E elements normalized in place, each times its
                weight (q_weight for q heads, k_weight for k heads); v untouched

One dispatch for both: the step program's "head_norm" op (program/ops.py), between the q/k/v
projections and RoPE. The error rule is norm.py's (the same arithmetic per row).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..webgpu.interface import Device
from . import runner
from .golden import GoldenContext, GoldenResult, compare_bound, compare_exact, golden, label
from .norm import NORM_RULE, norm_oracle
from .registry import CompiledKernel, KernelSpec, compile_kernel, register

WORKGROUP_SIZES = runner.LAYER_WORKGROUP_SIZES
register(KernelSpec("head_norm", ("head_norm.wgsl",), "head_norm",
                    ("uniform", "read-only-storage", "read-only-storage", "storage"), {"WG": WORKGROUP_SIZES}))


class HeadNormPlan(NamedTuple):
    kernel: str
    overrides: dict[str, int]
    params: np.ndarray               # tokens, heads, kv_heads, head_dim, q_at, k_at, eps
    grid: tuple[int, int, int]       # one workgroup per head row: T * (heads + kv_heads)


def plan_head_norm(limits: dict[str, int], tokens: int, heads: int, kv_heads: int, head_dim: int, eps: float,
                   q_at: int = 0, k_at: int | None = None, qkv_elements: int | None = None,
                   workgroup: int | None = None) -> HeadNormPlan:
    """Validate one launch (ValueError naming the problem) and build it. k_at defaults to
    right after q; qkv_elements, when given, is the binding's length in f32 elements."""
    if min(tokens, heads, kv_heads, head_dim) < 1:
        raise ValueError(f"head_norm needs tokens, heads, kv_heads, head_dim >= 1, got "
                         f"{tokens}, {heads}, {kv_heads}, {head_dim}")
    if not (np.isfinite(eps) and eps > 0 and np.float32(eps) > 0):
        raise ValueError(f"head_norm eps must be a positive finite f32, got {eps!r}")
    q_size, k_size = tokens * heads * head_dim, tokens * kv_heads * head_dim
    k_at = q_at + q_size if k_at is None else k_at
    if q_at < 0 or k_at < 0 or (q_at < k_at + k_size and k_at < q_at + q_size):
        raise ValueError(f"the q section [{q_at}, {q_at + q_size}) and the k section [{k_at}, {k_at + k_size}) "
                         f"must be non-negative and disjoint")
    end = max(q_at + q_size, k_at + k_size)
    if qkv_elements is not None and qkv_elements < end:
        raise ValueError(f"the qkv binding holds {qkv_elements} elements; the sections reach {end}")
    runner.check_binding_size(limits, "the qkv binding", 4 * end)
    wg = runner.layer_workgroup(limits, workgroup, head_dim, bytes_per_lane=4)
    grid = runner.workgroup_grid(tokens * (heads + kv_heads), limits["maxComputeWorkgroupsPerDimension"])
    return HeadNormPlan("head_norm", {"WG": wg},
                        runner.params_words(tokens, heads, kv_heads, head_dim, q_at, k_at, float(eps)), grid)


async def head_norm(device: Device, qkv: np.ndarray, q_weight: np.ndarray, k_weight: np.ndarray, tokens: int,
                    heads: int, kv_heads: int, eps: float, q_at: int = 0, k_at: int | None = None,
                    kernel: CompiledKernel | None = None) -> np.ndarray:
    """The qkv binding after one launch on fresh buffers (qkv: its whole content, f32)."""
    head_dim = q_weight.size
    if k_weight.size != head_dim:
        raise ValueError(f"q_weight ({q_weight.size}) and k_weight ({k_weight.size}) must both be [head_dim]")
    plan = plan_head_norm(device.limits, tokens, heads, kv_heads, head_dim, eps, q_at, k_at, qkv.size,
                          kernel.overrides.get("WG") if kernel else None)
    kernel = kernel or await compile_kernel(device, plan.kernel, **plan.overrides)
    out, = await runner.run_once(device, kernel, plan.params,
                                 [q_weight.astype(np.float32), k_weight.astype(np.float32)],
                                 [qkv.astype(np.float32).copy()], plan.grid)
    return out


# -- golden cases ---------------------------------------------------------------------------------

def head_norm_cases(rng: np.random.Generator, quick: bool, model=None) -> list[tuple]:
    """(name, tokens, heads, kv_heads, head_dim, eps, scale, gap): random heads and adversarial
    ones; gap > 0 puts the k section `gap` elements past q (NaN between, and a v section after)."""
    cases = [("Gemma 3 270M decode: 4/1 heads of 256", 1, 4, 1, 256, 1e-6, 1.0, 0),
             ("prefill 5 tokens, 4/2 heads of 32, sections apart", 5, 4, 2, 32, 1e-6, 1.0, 37)]
    if quick:
        return cases
    cases += [("odd head_dim 12, 3/1 heads", 3, 3, 1, 12, 1e-5, 1.0, 0),
              ("head_dim 4 < workgroup", 2, 2, 2, 4, 1e-6, 1.0, 5),
              ("near-zero heads (eps dominates)", 2, 4, 1, 64, 1e-6, 1e-20, 0),
              ("huge heads", 2, 4, 1, 256, 1e-6, 1e15, 0),
              ("head_dim 300 > workgroup", 2, 2, 1, 300, 1e-6, 3.0, 0),
              ("many rows: 200 tokens x 5 heads", 200, 4, 1, 64, 1e-6, 1.0, 0)]
    if model is not None and getattr(model.architecture, "gemma3", None) is not None:
        a = model.architecture
        cases.append(("model blk.0 heads", 3, a.n_heads, a.n_kv_heads, a.head_dim, a.norm_eps, 2.0, 0))
    return cases


def _weights(rng, model, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    if model is not None and getattr(model.architecture, "gemma3", None) is not None \
            and model.architecture.head_dim == head_dim:
        offset = np.float32(model.architecture.gemma3.norm_weight_offset)
        return (model.dequantize("blk.0.attn_q_norm") + offset, model.dequantize("blk.0.attn_k_norm") + offset)
    return tuple((1 + 0.5 * rng.standard_normal(head_dim)).astype(np.float32) for _ in range(2))


@golden("head_norm", kernels=("head_norm",))
async def golden_head_norm(ctx: GoldenContext) -> list[GoldenResult]:
    results = []
    for wg in ctx.workgroups(bytes_per_lane=4, kernel="head_norm"):
        kernel = await ctx.kernel("head_norm", WG=wg)
        name = label(kernel.spec, {"WG": wg})
        for case, tokens, heads, kv_heads, head_dim, eps, scale, gap in head_norm_cases(ctx.rng, ctx.quick, ctx.model):
            q_size, k_size = tokens * heads * head_dim, tokens * kv_heads * head_dim
            k_at = q_size + gap
            qkv = np.empty(k_at + 2 * k_size, np.float32)
            qkv[:q_size] = scale * ctx.rng.standard_normal(q_size)
            qkv[q_size:k_at] = np.nan                                   # the gap: never touched
            qkv[k_at:] = scale * ctx.rng.standard_normal(2 * k_size)   # k, then v
            q_weight, k_weight = _weights(ctx.rng, ctx.model, head_dim)
            got = await head_norm(ctx.device, qkv, q_weight, k_weight, tokens, heads, kv_heads, eps, 0, k_at, kernel)
            for section, at, size, weight in (("q", 0, q_size, q_weight), ("k", k_at, k_size, k_weight)):
                rows = qkv[at:at + size].reshape(-1, head_dim)
                exact, bound = norm_oracle(rows, weight, eps)
                results.append(compare_bound("head_norm", name, f"{case} {section}", got[at:at + size].reshape(rows.shape),
                                             exact, bound, NORM_RULE))
            rest = np.ones(qkv.size, bool)
            rest[:q_size] = rest[k_at:k_at + k_size] = False
            results.append(compare_exact("head_norm", name, f"{case}: the gap and v unchanged (bits)",
                                         got[rest].view(np.uint32), qkv[rest].view(np.uint32)))
    return results
