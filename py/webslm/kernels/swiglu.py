"""SwiGLU activation (shaders/swiglu.wgsl): registry entries, host side, golden tests, bench hook.

    swiglu       h [T, 2F] f32 (gate | up) -> out [T, F] = silu(gate) * up, any F
    swiglu_vec4  the same with vec4 loads and stores, for F % 4 == 0 (the host picks it then)
    geglu, geglu_vec4   the same with gelu_tanh(gate) (Gemma 3; shaders/gelu.wgsl, geglu.wgsl)
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..webgpu.interface import Device
from . import runner
from .golden import F32_TINY, F32_UNIT_ROUNDOFF, GoldenContext, GoldenResult, compare_bound, golden, label
from .registry import CompiledKernel, KernelSpec, compile_kernel, register

WORKGROUP_SIZES = runner.LAYER_WORKGROUP_SIZES

# Bindings: params, h (read) -> out.
register(
    KernelSpec("swiglu", ("silu.wgsl", "swiglu.wgsl"), "swiglu", ("uniform", "read-only-storage", "storage"),
               {"WG": WORKGROUP_SIZES}),
    KernelSpec("swiglu_vec4", ("silu.wgsl", "swiglu.wgsl"), "swiglu_vec4", ("uniform", "read-only-storage", "storage"),
               {"WG": WORKGROUP_SIZES}),
    KernelSpec("geglu", ("gelu.wgsl", "geglu.wgsl"), "geglu", ("uniform", "read-only-storage", "storage"),
               {"WG": WORKGROUP_SIZES}),
    KernelSpec("geglu_vec4", ("gelu.wgsl", "geglu.wgsl"), "geglu_vec4", ("uniform", "read-only-storage", "storage"),
               {"WG": WORKGROUP_SIZES}),
)
ACTIVATIONS = {"silu": "swiglu", "gelu-tanh": "geglu"}     # the gate's activation -> kernel family


# -- host side ------------------------------------------------------------------------------

class SwigluPlan(NamedTuple):
    kernel: str                      # "swiglu_vec4" when F % 4 == 0, else "swiglu"
    overrides: dict[str, int]
    params: np.ndarray               # tokens, ffn
    grid: tuple[int, int, int]


def plan_swiglu(limits: dict[str, int], tokens: int, ffn: int, kernel: str | None = None,
                workgroup: int | None = None, activation: str = "silu") -> SwigluPlan:
    """Validate a [tokens, 2*ffn] -> [tokens, ffn] gated activation (SwiGLU, or GeGLU with
    activation "gelu-tanh") and build its launch."""
    if tokens < 1 or ffn < 1:
        raise ValueError(f"swiglu needs tokens >= 1 and ffn >= 1, got tokens={tokens}, ffn={ffn}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, not {activation!r}")
    family = ACTIVATIONS[activation]
    kernel = kernel or (family + "_vec4" if ffn % 4 == 0 else family)
    if kernel.endswith("_vec4") and ffn % 4:
        raise ValueError(f"{kernel} needs ffn % 4 == 0 (vec4 rows), got ffn={ffn}")
    if kernel not in (family, family + "_vec4"):
        raise ValueError(f"no {family} kernel named {kernel!r}")
    runner.check_binding_size(limits, f"h [{tokens}, {2 * ffn}] f32", tokens * 2 * ffn * 4)
    per_invocation = 4 if kernel.endswith("_vec4") else 1
    wg = runner.layer_workgroup(limits, workgroup, 256)
    groups = -(-tokens * ffn // (per_invocation * wg))
    grid = runner.workgroup_grid(groups, limits["maxComputeWorkgroupsPerDimension"])
    return SwigluPlan(kernel, {"WG": wg}, runner.params_words(tokens, ffn), grid)


async def swiglu(device: Device, h: np.ndarray, kernel: CompiledKernel | None = None,
                 activation: str = "silu") -> np.ndarray:
    """out [T, F] for h [T, 2F] on fresh buffers."""
    if h.ndim != 2 or h.shape[1] % 2:
        raise ValueError(f"h must be [T, 2F] (gate | up), got shape {h.shape}")
    tokens, ffn = h.shape[0], h.shape[1] // 2
    plan = plan_swiglu(device.limits, tokens, ffn, kernel.spec.name if kernel else None,
                       kernel.overrides.get("WG") if kernel else None, activation)
    kernel = kernel or await compile_kernel(device, plan.kernel, **plan.overrides)
    out, = await runner.run_once(device, kernel, plan.params, [h.astype(np.float32)],
                                 [(tokens * ffn, np.float32)], plan.grid)
    return out.reshape(tokens, ffn)


# -- the oracle and its tolerance --------------------------------------------------------------

U = F32_UNIT_ROUNDOFF
SWIGLU_RULE = ("|err| <= (k(g) (3 + 2|g|) 2u + 12u) |exact| + 2^-125 |g up| + 2^-126, k = 1.5 for g < 0, "
               "exp(-|g|) for g >= 0 (WGSL exp: 3 + 2|x| ULP); exact = float64 g up / (1 + exp(-g))")


def swiglu_oracle(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 silu(gate) * up of f32 inputs, and the elementwise error bound.

    Derivation (u = 2^-24, 1 ULP <= 2u relative): e = exp(-|g|) has relative error
    d = (3 + 2|g|) 2u (WGSL's exp accuracy); 1 + e one rounding, 1 / (1 + e) 2.5 ULP = 5u.
    sigmoid = r for g >= 0 feels e's error only through 1 + e: e d; for g < 0 it is e * r
    (one more rounding) and feels d fully plus e d / (1 + e) <= d / 2 through r: 1.5 d. Then
    g * sigmoid and * up: 2u. Sum 1u + 5u + 1u + 2u = 9u, rounded up to 12u. When e is
    subnormal (|g| > 87.3) a GPU may flush it: sigmoid moves by < 2^-126 absolute, g * sigmoid
    may flush too, hence 2^-125 |g up|; a subnormal output may flush (2^-126)."""
    h64 = h.astype(np.float64)
    ffn = h.shape[1] // 2
    g, up = h64[:, :ffn], h64[:, ffn:]
    e = np.exp(-np.abs(g))
    sigmoid = np.where(g >= 0, 1 / (1 + e), e / (1 + e))
    exact = g * sigmoid * up
    k = np.where(g < 0, 1.5, e)
    relative = k * (3 + 2 * np.abs(g)) * 2 * U + 12 * U
    bound = relative * np.abs(exact) + 2.0 ** -125 * np.abs(g * up) + F32_TINY
    return exact, bound


GEGLU_RULE = ("|err| <= (k(z) (3 + 2|z|) 2u + 8u |z| + 16u) |exact| + 2^-125 |g up| + 2^-126, "
              "z = 2c (g + 0.044715 g^3) with f32 constants, k as SWIGLU_RULE; exact = float64 g up sigmoid(z)")


def geglu_oracle(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 gelu_tanh(gate) * up of f32 inputs (the f32 constants of gelu.wgsl, which equal
    cpu/layers.gelu_tanh's: 0.5 (1 + tanh(y)) = sigmoid(2y)), and the elementwise bound.

    Derivation (u = 2^-24): z is g^3 (2 roundings), * k, + g (same signs: no cancellation),
    * 2c: relative error <= 5u, rounded up to 8u |z| absolute after the factor that carries it
    into sigmoid (d sigmoid / sigmoid = (1 - s) dz <= |dz|). The rest is silu's derivation on z
    (SWIGLU_RULE's terms with z for g), plus 2u for the two final products."""
    h64 = h.astype(np.float64)
    ffn = h.shape[1] // 2
    g, up = h64[:, :ffn], h64[:, ffn:]
    c2, k = float(np.float32(1.5957691216057308)), float(np.float32(0.044715))
    z = c2 * (g + k * g ** 3)
    with np.errstate(over="ignore"):
        e = np.exp(-np.abs(z))
    sigmoid = np.where(z >= 0, 1 / (1 + e), e / (1 + e))
    exact = g * sigmoid * up
    kz = np.where(z < 0, 1.5, e)
    relative = kz * (3 + 2 * np.abs(z)) * 2 * U + 8 * U * np.abs(z) + 16 * U
    bound = relative * np.abs(exact) + 2.0 ** -125 * np.abs(g * up) + F32_TINY
    return exact, bound


def check_swiglu(kernel: str, case: str, h: np.ndarray, got: np.ndarray) -> GoldenResult:
    exact, bound = swiglu_oracle(h)
    return compare_bound("swiglu", kernel, case, got, exact, bound, SWIGLU_RULE)


# -- golden cases ---------------------------------------------------------------------------------

def swiglu_cases(rng: np.random.Generator, quick_only: bool, model=None) -> list[tuple[str, np.ndarray]]:
    """(name, h [T, 2F]) pairs: random projections and adversarial gates."""
    n = rng.standard_normal

    def gate_up(gate, up):
        return np.concatenate([np.asarray(gate, np.float32), np.asarray(up, np.float32)], axis=1)

    extremes = np.array([88, -88, 100, -100, 1e30, -1e30, 87.5, -87.5, 0, -0.0, 1e-30, -1e-30,
                         20, -20, 1, -1], np.float32)
    cases = [
        ("random 3x1536", gate_up(3 * n((3, 1536)), n((3, 1536)))),
        ("odd F 2x37", gate_up(5 * n((2, 37)), n((2, 37)))),
        ("extreme gates +-88 +-100 +-1e30", gate_up(np.stack([extremes, -extremes]),
                                                    np.stack([np.full(16, 1.5), n(16)]))),
    ]
    if quick_only:
        return cases
    ramp = np.linspace(-120, 120, 4 * 241).reshape(4, 241)
    alternating = np.where(np.arange(64) % 2 == 0, 1.0, -1.0) * np.linspace(0.1, 60, 64)
    cases += [
        ("single element 1x1", gate_up([[-2.5]], [[3.0]])),
        ("gate ramp -120..120, odd F", gate_up(ramp, n((4, 241)))),
        ("alternating signs", gate_up(np.stack([alternating, -alternating]), np.stack([alternating] * 2))),
        ("huge up 1e30", gate_up(n((2, 64)), 1e30 * n((2, 64)))),
        ("tiny values 1e-30", gate_up(1e-30 * n((2, 64)), 1e-20 * n((2, 64)))),
        ("constant rows", gate_up(np.full((3, 100), 2.0), np.full((3, 100), -0.5))),
        ("prefill 300x1536", gate_up(3 * n((300, 1536)), n((300, 1536)))),
    ]
    if model is not None:
        # Real projections: unit-RMS activations of 4 tokens through the first layer's gate and up.
        a = model.architecture
        x = n((4, a.hidden))
        gate, up = model.dequantize("blk.0.ffn_gate"), model.dequantize("blk.0.ffn_up")
        cases.append((f"model blk.0 gate|up of 4 tokens, F={a.ffn}",
                      gate_up((x @ gate.T.astype(np.float64)), (x @ up.T.astype(np.float64)))))
    return cases


@golden("swiglu", kernels=("swiglu", "swiglu_vec4", "geglu", "geglu_vec4"))
async def golden_swiglu(ctx: GoldenContext) -> list[GoldenResult]:
    """Both activations on the same cases (GeGLU's gates past |g| ~ 10 saturate like SiLU's)."""
    results = []
    for case, h in swiglu_cases(ctx.rng, ctx.quick, ctx.model):
        ffn = h.shape[1] // 2
        for activation, family in ACTIVATIONS.items():
            for spec in ctx.variants(family):
                if spec.name.endswith("_vec4") and ffn % 4:
                    continue
                for wg in ctx.workgroups(kernel=spec.name):
                    kernel = await ctx.kernel(spec.name, WG=wg)
                    got = await swiglu(ctx.device, h, kernel, activation)
                    if activation == "silu":
                        results.append(check_swiglu(label(spec, kernel.overrides), case, h, got))
                    else:
                        exact, bound = geglu_oracle(h)
                        results.append(compare_bound("swiglu", label(spec, kernel.overrides), case, got, exact,
                                                     bound, GEGLU_RULE))
    return results


# -- benchmark hook -----------------------------------------------------------------------------

BENCH_KERNELS = ("swiglu", "swiglu_vec4")
BENCH_SHAPES: dict[str, dict] = runner.bench_shapes(
    {"smollm2-135m": {"ffn": 1536}, "llama-3.2-1b": {"ffn": 8192}, "llama-3-8b": {"ffn": 14336}})


async def prepare_bench(device: Device, name: str, shape: dict, rng: np.random.Generator) -> runner.Prepared:
    tokens, ffn = shape["tokens"], shape["ffn"]
    plan = plan_swiglu(device.limits, tokens, ffn, kernel=name)
    kernel = await compile_kernel(device, name, **plan.overrides)
    h = rng.standard_normal((tokens, 2 * ffn), np.float32)
    prepared = runner.prepare(device, kernel, plan.params, [h], [(tokens * ffn, np.float32)], plan.grid)
    prepared.bytes_moved = 4 * 3 * tokens * ffn      # gate and up read, out written
    prepared.flops = 5 * tokens * ffn                # exp counted once: abs, exp, add, div, 2 mul
    return prepared
