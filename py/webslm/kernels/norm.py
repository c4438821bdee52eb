"""RMSNorm kernels (shaders/norm.wgsl): registry entries, host side, golden tests, bench hook.

    rms_norm           x [T, D] f32, weight [D] f32 -> out [T, D] = x / sqrt(mean(x^2) + eps) * weight
    rms_norm_residual  x [T, D] f32 updated in place (x += delta), then out = rms_norm(x)
    *_vec4             the same through vec4 loads, for D % 4 == 0 (the host picks them then)

`plan_norm` checks sizes and builds the uniform block and grid; `rms_norm` / `rms_norm_residual`
run once on fresh buffers (tests, self-tests); the engine uses `plan_norm` with its own buffers.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..webgpu.interface import Device
from . import runner
from .golden import F32_TINY, F32_UNIT_ROUNDOFF, GoldenContext, GoldenResult, compare_bound, gamma, golden, label
from .registry import CompiledKernel, KernelSpec, compile_kernel, register

WORKGROUP_SIZES = runner.LAYER_WORKGROUP_SIZES

# Binding order (index = @binding): the uniform, read-only inputs, then outputs. run_once takes
# inputs and outputs in this order: rms_norm (weight, x) -> (out,);
# rms_norm_residual (weight, delta) -> (out, x updated in place).
_PLAIN = ("uniform", "read-only-storage", "read-only-storage", "storage")
_RESIDUAL = _PLAIN + ("storage",)
register(*(KernelSpec(name, ("norm.wgsl",), name, bindings, {"WG": WORKGROUP_SIZES})
           for base, bindings in (("rms_norm", _PLAIN), ("rms_norm_residual", _RESIDUAL))
           for name in (base, base + "_vec4")))


# -- host side ------------------------------------------------------------------------------

class NormPlan(NamedTuple):
    kernel: str                      # rms_norm[_residual], with _vec4 when D % 4 == 0
    overrides: dict[str, int]        # {"WG": ...}
    params: np.ndarray               # the uniform block: tokens, dim, eps
    grid: tuple[int, int, int]       # one workgroup per row


def plan_norm(limits: dict[str, int], tokens: int, dim: int, eps: float, residual: bool = False,
              kernel: str | None = None, workgroup: int | None = None) -> NormPlan:
    """Validate a [tokens, dim] RMSNorm and build its launch. Raises ValueError naming the problem."""
    base = "rms_norm_residual" if residual else "rms_norm"
    kernel = kernel or (base + "_vec4" if dim % 4 == 0 else base)
    if kernel not in (base, base + "_vec4"):
        raise ValueError(f"{kernel!r} is not a {base} kernel")
    if kernel.endswith("_vec4") and dim % 4:
        raise ValueError(f"{kernel} needs dim % 4 == 0 (vec4 rows), got dim={dim}")
    if tokens < 1 or dim < 1:
        raise ValueError(f"rms_norm needs tokens >= 1 and dim >= 1, got tokens={tokens}, dim={dim}")
    if not (np.isfinite(eps) and eps > 0 and np.float32(eps) > 0):
        raise ValueError(f"rms_norm eps must be a positive finite f32, got {eps!r}")
    runner.check_binding_size(limits, f"activations [{tokens}, {dim}] f32", tokens * dim * 4)
    # Lanes past the row only add zeros: no workgroup wider than the row's loads (but >= 64).
    wg = runner.layer_workgroup(limits, workgroup, dim // 4 if kernel.endswith("_vec4") else dim, bytes_per_lane=4)
    grid = runner.workgroup_grid(tokens, limits["maxComputeWorkgroupsPerDimension"])
    return NormPlan(kernel, {"WG": wg}, runner.params_words(tokens, dim, float(eps)), grid)


def _check_arrays(x: np.ndarray, weight: np.ndarray, delta: np.ndarray | None = None) -> tuple[int, int]:
    if x.ndim != 2:
        raise ValueError(f"x must be [T, D], got shape {x.shape}")
    tokens, dim = x.shape
    if weight.shape != (dim,):
        raise ValueError(f"weight has shape {weight.shape}, expected ({dim},) to match x's D")
    if delta is not None and delta.shape != x.shape:
        raise ValueError(f"delta has shape {delta.shape}, expected x's shape {x.shape}")
    return tokens, dim


async def rms_norm(device: Device, x: np.ndarray, weight: np.ndarray, eps: float,
                   kernel: CompiledKernel | None = None) -> np.ndarray:
    """out [T, D] for x [T, D] on fresh buffers (validated before anything is dispatched)."""
    tokens, dim = _check_arrays(x, weight)
    plan = plan_norm(device.limits, tokens, dim, eps, False, kernel and kernel.spec.name,
                     kernel and kernel.overrides.get("WG"))
    kernel = kernel or await compile_kernel(device, plan.kernel, **plan.overrides)
    out, = await runner.run_once(device, kernel, plan.params,
                                 [weight.astype(np.float32), x.astype(np.float32)],
                                 [(tokens * dim, np.float32)], plan.grid)
    return out.reshape(tokens, dim)


async def rms_norm_residual(device: Device, x: np.ndarray, delta: np.ndarray, weight: np.ndarray,
                            eps: float, kernel: CompiledKernel | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(x + delta, rms_norm(x + delta)) for x, delta [T, D]."""
    tokens, dim = _check_arrays(x, weight, delta)
    plan = plan_norm(device.limits, tokens, dim, eps, True, kernel and kernel.spec.name,
                     kernel and kernel.overrides.get("WG"))
    kernel = kernel or await compile_kernel(device, plan.kernel, **plan.overrides)
    out, x_new = await runner.run_once(device, kernel, plan.params,
                                       [weight.astype(np.float32), delta.astype(np.float32)],
                                       [(tokens * dim, np.float32), x.astype(np.float32).copy()],
                                       plan.grid)
    return x_new.reshape(tokens, dim), out.reshape(tokens, dim)


# -- the oracle and its tolerance --------------------------------------------------------------

U = F32_UNIT_ROUNDOFF
NORM_RULE = ("|err| <= (gamma(D)/2 + 24u + 2^-126/(2 eps)) |exact| + 2^-126; exact = float64 of "
             "x / sqrt(mean(x^2) + f32(eps)) * w, u = 2^-24")
RESIDUAL_RULE = "x + delta exact (one correctly rounded f32 add; 2^-126 for subnormal flush)"


def norm_oracle(x: np.ndarray, weight: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """float64 RMSNorm of f32 inputs, and the elementwise error bound of the GPU result.

    Derivation (relative error of each output, u = 2^-24): the sum of D squares of any order
    gamma(D); the mean (f32 division, 2.5 ULP = 5u) and + eps (u); sqrt (WGSL: as 1/inverseSqrt,
    2 + 2.5 ULP = 9u) halves the error of its argument and adds its own; x / divisor 5u and
    * weight u. Total gamma(D)/2 + 3u + 9u + 5u + u = gamma(D)/2 + 18u, rounded up to 24u for
    second-order terms. A GPU may flush subnormal squares: the sum then loses < D 2^-126 and
    mean + eps moves by < 2^-126 relative to eps. 2^-126 absolute covers a subnormal output."""
    x64 = x.astype(np.float64)
    eps64 = float(np.float32(eps))
    divisor = np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps64)
    exact = x64 / divisor * weight.astype(np.float64)
    dim = x.shape[-1]
    relative = gamma(dim) / 2 + 24 * U + F32_TINY / (2 * eps64)
    return exact, relative * np.abs(exact) + F32_TINY


def check_norm(kernel: str, case: str, x: np.ndarray, weight: np.ndarray, eps: float,
               got: np.ndarray) -> GoldenResult:
    exact, bound = norm_oracle(x, weight, eps)
    return compare_bound("norm", kernel, case, got, exact, bound, NORM_RULE)


def check_residual(kernel: str, case: str, x: np.ndarray, delta: np.ndarray,
                   got_x: np.ndarray) -> GoldenResult:
    exact = (x.astype(np.float32) + delta.astype(np.float32)).astype(np.float64)
    return compare_bound("norm", kernel, case + " (residual x)", got_x, exact, 0.0, RESIDUAL_RULE)


# -- golden cases ---------------------------------------------------------------------------------

def _weights(rng: np.random.Generator, dim: int) -> np.ndarray:
    return (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32)


def norm_cases(rng: np.random.Generator, quick_only: bool, model=None) -> list[tuple]:
    """(name, x [T, D], delta [T, D], weight [D], eps): random rows and adversarial ones
    (quick_only: the few that browser rows and self-tests run)."""
    n = rng.standard_normal
    cases = []

    def add(name, x, weight=None, eps=1e-5, delta=None, quick=False):
        x = np.asarray(x, np.float32)
        weight = _weights(rng, x.shape[1]) if weight is None else np.asarray(weight, np.float32)
        delta = (np.asarray(delta, np.float32) if delta is not None
                 else (0.5 * n(x.shape) * np.abs(x).max(initial=0) + 0.1).astype(np.float32))
        if quick or not quick_only:
            cases.append((f"{name} {x.shape[0]}x{x.shape[1]}", x, delta, weight, eps))

    add("random", n((3, 576)), quick=True)
    add("odd tail", 3 * n((5, 67)), quick=True)
    add("single element", n((2, 1)) + 2)
    add("D < workgroup", n((4, 5)), eps=1e-6)
    add("constant rows", np.repeat(np.array([[3.0], [-0.25], [7e4]], np.float32), 300, axis=1),
        quick=True)
    alternating = np.where(np.arange(129) % 2 == 0, 1.0, -1.0) * np.linspace(0.5, 40, 129)
    add("alternating signs", np.stack([alternating, -alternating]))
    add("near-zero (eps dominates)", 1e-20 * n((2, 64)), quick=True)
    add("huge", 1e15 * n((2, 1000)))
    spike = 1e-3 * n((2, 257))
    spike[:, -1] = [1e3, -2e3]        # the only large value sits in the single-element tail
    add("spike in the tail", spike, quick=True)
    add("mixed-sign weights", n((2, 200)), weight=np.concatenate([n(100) * 1e3, n(100) * 1e-3]))
    x = n((2, 96))
    add("cancelling delta", x, delta=-x + 1e-3 * n((2, 96)))
    if not quick_only:
        add("large D", n((2, 4097)))
        add("many rows", n((70000, 3)))      # > 65535 rows: the 2-D grid (scalar kernels)
        add("many rows vec4", n((66000, 4)))
    if model is not None:
        a = model.architecture
        for name in ("blk.0.attn_norm", "output_norm"):
            add(f"model {name}", 2 * n((3, a.hidden)), weight=model.dequantize(name), eps=a.norm_eps,
                quick=name == "output_norm")
    return cases


@golden("norm", kernels=("rms_norm", "rms_norm_vec4", "rms_norm_residual", "rms_norm_residual_vec4"))
async def golden_norm(ctx: GoldenContext) -> list[GoldenResult]:
    cases = norm_cases(ctx.rng, ctx.quick, ctx.model)
    results = []
    for spec in ctx.variants("rms_norm"):
        sizes = ctx.workgroups(bytes_per_lane=4, kernel=spec.name)
        for wg in sizes:
            kernel = await ctx.kernel(spec.name, WG=wg)
            name = label(spec, {"WG": wg})
            for case, x, delta, weight, eps in cases:
                if wg != sizes[0] and x.shape[0] > 100:
                    continue    # the 2-D grid case once per kernel, at the smallest (cheapest) WG
                if spec.name.endswith("_vec4") and x.shape[1] % 4:
                    continue
                if spec.name.startswith("rms_norm_residual"):
                    x_new, got = await rms_norm_residual(ctx.device, x, delta, weight, eps, kernel)
                    results.append(check_residual(name, case, x, delta, x_new))
                    stream = (x + delta).astype(np.float32)
                    results.append(check_norm(name, case, stream, weight, eps, got))
                else:
                    got = await rms_norm(ctx.device, x, weight, eps, kernel)
                    results.append(check_norm(name, case, x, weight, eps, got))
    return results


# -- benchmark hook -----------------------------------------------------------------------------

BENCH_KERNELS = ("rms_norm", "rms_norm_vec4", "rms_norm_residual", "rms_norm_residual_vec4")
BENCH_SHAPES: dict[str, dict] = runner.bench_shapes(
    {"smollm2-135m": {"dim": 576}, "llama-3.2-1b": {"dim": 2048}, "llama-3-8b": {"dim": 4096}})


async def prepare_bench(device: Device, name: str, shape: dict, rng: np.random.Generator) -> runner.Prepared:
    tokens, dim = shape["tokens"], shape["dim"]
    residual = name.startswith("rms_norm_residual")
    plan = plan_norm(device.limits, tokens, dim, 1e-5, residual, kernel=name)
    kernel = await compile_kernel(device, name, **plan.overrides)
    x = rng.standard_normal((tokens, dim), np.float32)
    weight = _weights(rng, dim)
    if not residual:
        prepared = runner.prepare(device, kernel, plan.params, [weight, x], [(x.size, np.float32)], plan.grid)
        prepared.bytes_moved = 4 * (2 * x.size + dim)             # x read, out written, weight
    else:
        delta = rng.standard_normal((tokens, dim), np.float32)
        prepared = runner.prepare(device, kernel, plan.params, [weight, delta],
                                  [(x.size, np.float32), x], plan.grid)
        prepared.bytes_moved = 4 * (4 * x.size + dim)             # x, delta read; x, out written
    prepared.flops = 4 * x.size + (x.size if residual else 0)
    return prepared
