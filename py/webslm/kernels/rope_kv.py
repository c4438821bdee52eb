"""RoPE on q and k plus the KV append in one dispatch (shaders/rope_kv_append.wgsl): registry
entries, host side, golden tests.

    rope_kv_append_f32, rope_kv_append_f16   (overrides WG 64|128|256, ADJACENT 0|1)
    rope_kv_append_bias_f32, _bias_f16       the same adding the q, k, v projection biases
                                             (Qwen2) first: rot(q + bq), rot(k + bk), v + bv

For T tokens at positions start..start+T-1 it rotates q [T, heads, head_dim] in place and
writes the rotated k rows and the v rows into one layer's K and V caches (kv_cache.KvLayout:
[n_kv_heads][capacity][head_dim], f32 or f16), replacing rope (q and k) + kv_append. The k
section is read, not rotated in place: attention reads K from the cache.

Bindings (index order; runner.prepare and the executor bind in this order):
    0 params   (uniform, 10 words: tokens, heads, kv_heads, head_dim, half, start, capacity,
               q_at, k_at, v_at)
    1 table    (read-only) the RoPE table [table_rows, rotary_dim/2] (cos, sin) f32
               (rope.rope_table, the one the rope kernel uses)
    2 qkv      (storage) one binding holding the planar sections q [T][heads*head_dim] at
               element q_at, k [T][kv_heads*head_dim] at k_at, v [T][kv_heads*head_dim] at v_at
               (offsets in f32 elements from the binding's start; sections disjoint)
    3 k_cache  (storage) the layer's K cache
    4 v_cache  (storage) the layer's V cache
    5 bias_q, 6 bias_k, 7 bias_v  (read-only, the _bias variants) [heads*head_dim], [kv_heads*head_dim] x 2
The bias variants need rotary_dim == head_dim (every q element is rotated, so every one gets
its bias in the rotation; Qwen2 rotates whole heads): the host refuses other shapes.
Neither variant needs shader-f16: the caches are written as u32 words, f16 rounded to nearest
even in integer arithmetic (f16_round.wgsl, the same code as kv_append_f16).

Rule: q's rotated elements by rope's rule (rope.rope_oracle); q's other elements, the k and v
sections and everything else in qkv unchanged (bits); cache rows other than start..start+T-1
unchanged (bits); V rows exact (f32 bits; f16 = numpy's round-to-nearest-even of the f32);
K elements past rotary_dim exact likewise; rotated K elements: f32 cache by rope's rule; f16
cache exactly the round-to-nearest-even of a value within rope's bound of the exact rotation,
i.e. f16(exact - bound) <= got <= f16(exact + bound) (f16 rounding is monotone), which is a
bit comparison wherever both ends round alike.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..webgpu.interface import Device
from . import runner
from .golden import GoldenContext, GoldenResult, compare_bound, compare_exact, golden, label
from .kv_cache import DTYPES, KvLayout, KvShapeError, adversarial_values, check_workgroup
from .registry import CompiledKernel, KernelSpec, compile_kernel, register
from .rope import CONVENTIONS, rope_oracle, rope_table

WORKGROUPS = (64, 128, 256)
BINDINGS = ("uniform", "read-only-storage", "storage", "storage", "storage")
BIAS_BINDINGS = BINDINGS + ("read-only-storage",) * 3
register(*(KernelSpec(f"rope_kv_append_{kind}{dtype}", ("f16_round.wgsl", "rope_kv_append.wgsl"),
                      f"rope_kv_append_{kind}{dtype}", bindings, {"WG": WORKGROUPS, "ADJACENT": (0, 1)})
           for dtype in ("f32", "f16") for kind, bindings in (("", BINDINGS), ("bias_", BIAS_BINDINGS))))


# -- host side ------------------------------------------------------------------------------

class RopeKvPlan(NamedTuple):
    kernel: str                      # rope_kv_append_{f32,f16}, the cache's dtype
    overrides: dict[str, int]        # {"WG": ..., "ADJACENT": 0|1}
    params: np.ndarray               # the uniform block (10 words, padded to 12)
    grid: tuple[int, int, int]
    q_at: int                        # element offsets of the sections in the qkv binding
    k_at: int
    v_at: int
    qkv_elements: int                # the least the qkv binding must hold (f32 elements)

    def params_at(self, start: int) -> np.ndarray:
        """The params for the same tokens at another first position: what a decode step
        rewrites (word 5), without planning again. A plan made for the last position the
        cache and table allow (plan_rope_kv_append) vouches for every earlier one."""
        words = self.params.copy()
        tokens, capacity = int(words[0]), int(words[6])
        if not 0 <= start <= capacity - tokens:
            raise KvShapeError("position", f"positions {start}..{start + tokens - 1} exceed the capacity {capacity}")
        words[5] = start
        return words


def sections(tokens: int, heads: int, layout: KvLayout) -> tuple[int, int, int]:
    """Default offsets: q, k, v back to back, [T][heads*E], [T][kv*E], [T][kv*E]."""
    q = tokens * heads * layout.head_dim
    kv = tokens * layout.n_kv_heads * layout.head_dim
    return 0, q, q + kv


def plan_rope_kv_append(limits: dict, layout: KvLayout, tokens: int, heads: int, rotary_dim: int, start: int,
                        table_rows: int, convention: str, q_at: int | None = None, k_at: int | None = None,
                        v_at: int | None = None, qkv_elements: int | None = None,
                        workgroup: int | None = None, bias: bool = False) -> RopeKvPlan:
    """Validate one launch and build it (KvShapeError, a ValueError, before any GPU work).
    Offsets default to `sections`; `qkv_elements`, when given, is the qkv binding's length;
    bias: the variant that adds the q, k, v biases (needs rotary_dim == head_dim)."""
    if convention not in CONVENTIONS:
        raise KvShapeError("shape", f"rope convention must be one of {sorted(CONVENTIONS)}, not {convention!r}")
    if tokens < 1 or heads < 1 or start < 0:
        raise KvShapeError("shape", f"need tokens >= 1, heads >= 1 and start >= 0, got {tokens}, {heads}, {start}")
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > layout.head_dim:
        raise KvShapeError("shape", f"rotary_dim {rotary_dim} must be even, >= 2 and <= head_dim {layout.head_dim}")
    if bias and rotary_dim != layout.head_dim:
        raise KvShapeError("shape", f"the bias variant adds q's bias in the rotation, so it needs rotary_dim "
                                    f"{rotary_dim} == head_dim {layout.head_dim}")
    if start + tokens > layout.capacity:
        raise KvShapeError("position", f"positions {start}..{start + tokens - 1} exceed the capacity {layout.capacity}")
    if start + tokens > table_rows:
        raise KvShapeError("position", f"positions {start}..{start + tokens - 1} need table rows up to "
                                        f"{start + tokens}, but the table has {table_rows}")
    layout.check_device(limits)
    defaults = sections(tokens, heads, layout)
    q_at, k_at, v_at = (d if v is None else v for v, d in zip((q_at, k_at, v_at), defaults))
    spans = {"q": (q_at, tokens * heads * layout.head_dim),
             "k": (k_at, tokens * layout.n_kv_heads * layout.head_dim),
             "v": (v_at, tokens * layout.n_kv_heads * layout.head_dim)}
    for name, (at, size) in spans.items():
        if at < 0:
            raise KvShapeError("shape", f"the {name} section's offset {at} is negative")
    ordered = sorted(spans.items(), key=lambda item: item[1][0])
    for (first, (at, size)), (second, (next_at, _)) in zip(ordered, ordered[1:]):
        if at + size > next_at:
            raise KvShapeError("shape", f"the {first} section [{at}, {at + size}) overlaps the {second} "
                                        f"section at {next_at}")
    end = max(at + size for at, size in spans.values())
    if qkv_elements is not None and qkv_elements < end:
        raise KvShapeError("shape", f"the qkv binding holds {qkv_elements} elements; the sections reach {end}")
    if end >= runner.U32_LIMIT:
        raise KvShapeError("offset-overflow", f"qkv sections reach element {end}, past u32 offsets")
    half = rotary_dim // 2
    for what, nbytes in ((f"rope table [{table_rows}, {half}] (cos, sin)", table_rows * half * 8),
                         ("the qkv binding", 4 * end)):
        try:
            runner.check_binding_size(limits, what, nbytes)
        except ValueError as exc:
            raise KvShapeError("binding-size", str(exc)) from None
    wg = check_workgroup(limits, workgroup, 256)
    items = tokens * (heads * half + layout.n_kv_heads * layout.head_dim // 4)
    groups = -(-items // wg)
    if groups * wg >= runner.U32_LIMIT:
        raise KvShapeError("offset-overflow", f"{items} work items overflow the u32 invocation index")
    try:
        grid = runner.workgroup_grid(groups, limits.get("maxComputeWorkgroupsPerDimension", 65535))
    except ValueError as exc:
        raise KvShapeError("shape", str(exc)) from None
    params = runner.params_words(tokens, heads, layout.n_kv_heads, layout.head_dim, half, start,
                                 layout.capacity, q_at, k_at, v_at)
    return RopeKvPlan(f"rope_kv_append_{'bias_' if bias else ''}{layout.dtype}",
                      {"WG": wg, "ADJACENT": CONVENTIONS[convention]},
                      params, grid, q_at, k_at, v_at, end)


def pack_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray, plan: RopeKvPlan, fill: float = np.nan) -> np.ndarray:
    """The qkv binding's content: the three sections at the plan's offsets, `fill` between."""
    out = np.full(plan.qkv_elements, fill, np.float32)
    for at, rows in ((plan.q_at, q), (plan.k_at, k), (plan.v_at, v)):
        flat = np.asarray(rows, np.float32).reshape(-1)
        out[at:at + flat.size] = flat
    return out


async def rope_kv_append(device: Device, q: np.ndarray, k: np.ndarray, v: np.ndarray, table: np.ndarray,
                         start: int, convention: str, layout: KvLayout, k_cache: np.ndarray, v_cache: np.ndarray,
                         q_at: int | None = None, k_at: int | None = None, v_at: int | None = None,
                         kernel: CompiledKernel | None = None, biases: tuple | None = None
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, RopeKvPlan]:
    """Run once on fresh buffers. q [T, heads, head_dim], k and v [T, kv_heads, head_dim] f32;
    table from rope.rope_table; caches as KvLayout arrays (their prior content); biases
    (bq, bk, bv) for the bias variant. Returns (the qkv binding afterwards (f32), K cache,
    V cache, the plan) for the golden checks."""
    if q.ndim != 3 or q.shape[2] != layout.head_dim:
        raise KvShapeError("shape", f"q must be [T, heads, {layout.head_dim}], got {q.shape}")
    tokens, heads = q.shape[:2]
    for name, rows in (("k", k), ("v", v)):
        if rows.shape != (tokens, layout.n_kv_heads, layout.head_dim):
            raise KvShapeError("shape", f"{name} must be [{tokens}, {layout.n_kv_heads}, {layout.head_dim}], "
                                        f"got {rows.shape}")
    if table.ndim != 3 or table.shape[2] != 2:
        raise KvShapeError("shape", f"table must be [rows, rotary_dim/2, 2], got {table.shape}")
    layout.check_array("k_cache", k_cache)
    layout.check_array("v_cache", v_cache)
    plan = plan_rope_kv_append(device.limits, layout, tokens, heads, 2 * table.shape[1], start, table.shape[0],
                               convention, q_at, k_at, v_at, workgroup=kernel.overrides.get("WG") if kernel else None,
                               bias=biases is not None)
    if kernel is None:
        kernel = await compile_kernel(device, plan.kernel, **plan.overrides)
    elif kernel.spec.name != plan.kernel or kernel.overrides.get("ADJACENT", 0) != plan.overrides["ADJACENT"]:
        raise KvShapeError("shape", f"kernel {kernel.spec.name}{kernel.overrides} does not match "
                                    f"{plan.kernel} with the {convention} convention")
    inputs = [np.asarray(table, np.float32)] + [np.asarray(b, np.float32).reshape(-1) for b in biases or ()]
    qkv, k_out, v_out = await runner.run_once(
        device, kernel, plan.params, inputs,
        [pack_qkv(q, k, v, plan), k_cache.reshape(-1).copy(), v_cache.reshape(-1).copy()], plan.grid)
    return qkv, k_out, v_out, plan


# -- the oracle and its checks -----------------------------------------------------------------

F16_RULE = ("rotated K in an f16 cache: f16(exact - bound) <= got <= f16(exact + bound), exact and bound "
            "rope's (round to nearest even is monotone)")


def _cache_rows(layout: KvLayout, cache: np.ndarray, start: int, tokens: int) -> np.ndarray:
    """[T, kv_heads, head_dim] rows start..start+T-1 of a flat cache."""
    return cache.reshape(layout.n_kv_heads, layout.capacity, layout.head_dim)[:, start:start + tokens].transpose(1, 0, 2)


def _outside_rows(layout: KvLayout, cache: np.ndarray, start: int, tokens: int) -> np.ndarray:
    mask = np.ones((layout.n_kv_heads, layout.capacity, layout.head_dim), bool)
    mask[:, start:start + tokens] = False
    return cache.reshape(mask.shape)[mask]


def check_rope_kv(kernel: str, case: str, layout: KvLayout, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  table: np.ndarray, start: int, convention: str, k_prior: np.ndarray, v_prior: np.ndarray,
                  qkv_in: np.ndarray, plan: RopeKvPlan, qkv: np.ndarray, k_cache: np.ndarray,
                  v_cache: np.ndarray, family: str = "rope_kv") -> list[GoldenResult]:
    """Every rule of the module docstring, one GoldenResult each."""
    tokens, heads, head_dim = q.shape
    rotary = 2 * table.shape[1]
    dtype = DTYPES[layout.dtype]
    bits = np.uint32 if layout.dtype == "f32" else np.uint16
    results = []
    q_exact, q_bound = rope_oracle(q, table, start, convention, heads, head_dim)
    q_got = qkv[plan.q_at:plan.q_at + q.size].reshape(q.shape)
    results.append(compare_bound(family, kernel, case + " q", q_got[:, :, :rotary], q_exact[:, :, :rotary],
                                 q_bound[:, :, :rotary], "rope: gamma(2) (|a cos| + |b sin|) + 2^-126"))
    untouched = np.ones(qkv.size, bool)
    untouched[plan.q_at:plan.q_at + q.size] = np.broadcast_to(np.arange(head_dim) >= rotary, q.shape).reshape(-1)
    results.append(compare_exact(family, kernel, case + " qkv outside q's rotated elements unchanged",
                                 qkv.view(np.uint32)[untouched], qkv_in.view(np.uint32)[untouched]))
    results.append(compare_exact(family, kernel, case + " cache rows outside start..start+T-1 unchanged",
                                 np.concatenate([_outside_rows(layout, k_cache, start, tokens),
                                                 _outside_rows(layout, v_cache, start, tokens)]).view(bits),
                                 np.concatenate([_outside_rows(layout, k_prior, start, tokens),
                                                 _outside_rows(layout, v_prior, start, tokens)]).view(bits)))
    with np.errstate(over="ignore"):
        v_want = v.astype(np.float32).astype(dtype)
        k_plain_want = k[:, :, rotary:].astype(np.float32).astype(dtype)
    results.append(compare_exact(family, kernel, case + " V rows (bits)",
                                 _cache_rows(layout, v_cache, start, tokens).view(bits), v_want.view(bits)))
    k_rows = _cache_rows(layout, k_cache, start, tokens)
    if rotary < head_dim:
        results.append(compare_exact(family, kernel, case + " K rows past rotary_dim (bits)",
                                     np.ascontiguousarray(k_rows[:, :, rotary:]).view(bits), k_plain_want.view(bits)))
    k_exact, k_bound = rope_oracle(k, table, start, convention, layout.n_kv_heads, head_dim)
    k_exact, k_bound, k_got = k_exact[:, :, :rotary], k_bound[:, :, :rotary], k_rows[:, :, :rotary]
    if layout.dtype == "f32":
        results.append(compare_bound(family, kernel, case + " K rows rotated", k_got, k_exact, k_bound,
                                     "rope: gamma(2) (|a cos| + |b sin|) + 2^-126"))
    else:
        results.append(check_f16_interval(family, kernel, case + " K rows rotated (f16)", k_got, k_exact, k_bound))
    return results


def check_f16_interval(family: str, kernel: str, case: str, got: np.ndarray, exact: np.ndarray,
                       bound: np.ndarray) -> GoldenResult:
    """got (f16) must be the round-to-nearest-even of some value within bound of exact: since
    that rounding is monotone, f16(exact - bound) <= got <= f16(exact + bound). The float64
    ends are widened by 2^-50 relative so their own rounding cannot exclude a right answer."""
    exact = np.asarray(exact, np.float64).reshape(-1)
    bound = np.asarray(bound, np.float64).reshape(-1) + np.abs(exact) * 2.0 ** -50
    got = np.asarray(got, np.float16).reshape(-1)
    with np.errstate(over="ignore"):
        low, high = (exact - bound).astype(np.float16), (exact + bound).astype(np.float16)
    got64 = got.astype(np.float64)
    unwritten = int(np.isnan(got64).sum())
    mismatched = int(np.sum(~((low <= got) & (got <= high)) & ~np.isnan(got64)))
    error = np.abs(got64 - exact)
    return GoldenResult(family, kernel, case, F16_RULE, float(np.nanmax(error, initial=0.0)),
                        0.0 if mismatched == 0 else float("inf"), unwritten, mismatched)


# -- golden cases ---------------------------------------------------------------------------------

class RopeKvCase(NamedTuple):
    name: str
    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    base: float
    start: int
    tokens: int
    capacity: int
    gaps: bool = False               # sections apart, with NaN between (offsets in params)
    adversarial: bool = False        # k past rotary_dim and v from kv_cache.adversarial_values
    position_offset: int = 0
    scale: float = 1.0


def rope_kv_cases(quick: bool, model=None) -> list[RopeKvCase]:
    cases = [
        RopeKvCase("smollm2 9/3 heads, decode at 5", 9, 3, 64, 64, 1e5, 5, 1, 40),
        RopeKvCase("partial rotary 8 of 12, 4/2 heads, 3 tokens, sections apart", 4, 2, 12, 8, 1e4, 1, 3, 9, gaps=True),
        RopeKvCase("rotary 6 of 8 (odd half), adversarial v", 3, 1, 8, 6, 1e4, 30, 2, 33, adversarial=True),
    ]
    if quick:
        return cases
    cases += [
        RopeKvCase("smollm2 decode at the last position", 9, 3, 64, 64, 1e5, 39, 1, 40),
        RopeKvCase("smollm2 decode at 0", 9, 3, 64, 64, 1e5, 0, 1, 40, adversarial=True),
        RopeKvCase("prefill 37 tokens at 3, sections apart", 9, 3, 64, 64, 1e5, 3, 37, 64, gaps=True),
        RopeKvCase("head_dim 128 base 5e5, 32/8 heads", 32, 8, 128, 128, 5e5, 100, 3, 200),
        RopeKvCase("MQA head_dim 256, 4/1 heads", 4, 1, 256, 256, 1e4, 7, 2, 16),
        RopeKvCase("rotary 4 of 8 (half 2)", 2, 2, 8, 4, 1e4, 2, 3, 8),
        RopeKvCase("single pair rotary 2 of 4", 3, 3, 4, 2, 1e4, 11, 2, 13),
        RopeKvCase("positions 30000..30002", 3, 1, 64, 64, 1e5, 30000, 3, 30003),
        RopeKvCase("position offset 3", 2, 2, 12, 12, 1e4, 40, 2, 64, position_offset=3),
        RopeKvCase("huge values 1e30", 3, 1, 64, 64, 1e4, 9, 1, 10, scale=1e30),
        RopeKvCase("f16-overflowing k (6e4)", 3, 1, 64, 64, 1e4, 9, 1, 10, scale=6e4),
        RopeKvCase("tiny values 1e-6 (f16 subnormals)", 3, 1, 64, 64, 1e4, 9, 1, 10, scale=1e-6),
    ]
    if model is not None:
        a = model.architecture
        r = a.rope
        tokens = min(2, a.context_length)
        cases.append(RopeKvCase(f"model {a.n_heads}/{a.n_kv_heads} heads ({r.convention}), last positions of the "
                                f"context", a.n_heads, a.n_kv_heads, a.head_dim, r.rotary_dim, r.base,
                                a.context_length - tokens, tokens, a.context_length,
                                position_offset=r.position_offset))
    return cases


def case_arrays(rng: np.random.Generator, case: RopeKvCase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q [T, heads, E], k and v [T, kv, E] f32 for a case."""
    n = rng.standard_normal
    q = (case.scale * n((case.tokens, case.heads, case.head_dim))).astype(np.float32)
    k = (case.scale * n((case.tokens, case.kv_heads, case.head_dim))).astype(np.float32)
    v = (case.scale * n((case.tokens, case.kv_heads, case.head_dim))).astype(np.float32)
    if case.adversarial:
        shape = (case.tokens, case.kv_heads, case.head_dim)
        v = adversarial_values(rng, int(np.prod(shape))).reshape(shape)
        tail = adversarial_values(rng, int(np.prod(shape))).reshape(shape)
        k[:, :, case.rotary_dim:] = tail[:, :, case.rotary_dim:]
    return q, k, v


def prior_cache(rng: np.random.Generator, layout: KvLayout, start: int, tokens: int) -> np.ndarray:
    """Random bit patterns, with the rows the kernel must write poisoned (all ones: NaN)."""
    bits = np.uint32 if layout.dtype == "f32" else np.uint16
    cache = rng.integers(0, 2 ** 31, layout.elements).astype(bits)
    cache.reshape(layout.n_kv_heads, layout.capacity, layout.head_dim)[:, start:start + tokens] = np.iinfo(bits).max
    return cache.view(DTYPES[layout.dtype])


@golden("rope_kv", kernels=("rope_kv_append_",))
async def golden_rope_kv(ctx: GoldenContext) -> list[GoldenResult]:
    """Both variants and both conventions on every case, at the host's workgroup (and 64, full)."""
    results = []
    tables = {}
    sizes = [None] if ctx.quick else [None, 64]
    for case in rope_kv_cases(ctx.quick, ctx.model):
        key = (case.start + case.tokens, case.rotary_dim, case.base, case.position_offset)
        if key not in tables:
            tables[key] = rope_table(*key)
        table = tables[key]
        q, k, v = case_arrays(ctx.rng, case)
        for spec in ctx.variants("rope_kv_append_"):
            dtype = spec.name.rsplit("_", 1)[1]
            if spec.name.startswith("rope_kv_append_bias_"):
                if case.rotary_dim == case.head_dim:
                    results += await _golden_bias(ctx, spec, dtype, case, table, q, k, v)
                continue
            layout = KvLayout(case.kv_heads, case.capacity, case.head_dim, dtype)
            k_prior = prior_cache(ctx.rng, layout, case.start, case.tokens)
            v_prior = prior_cache(ctx.rng, layout, case.start, case.tokens)
            offsets = {}
            if case.gaps:
                q_at, k_at, v_at = sections(case.tokens, case.heads, layout)
                offsets = {"q_at": 5, "k_at": k_at + 37, "v_at": v_at + 64}
            for convention, adjacent in CONVENTIONS.items():
                for wg in sizes:
                    asked = plan_rope_kv_append(ctx.device.limits, layout, case.tokens, case.heads, case.rotary_dim,
                                                case.start, table.shape[0], convention, workgroup=wg, **offsets)
                    for overrides in ctx.launches(asked.kernel, asked.overrides):
                        kernel = await ctx.kernel(asked.kernel, **overrides)
                        qkv, k_cache, v_cache, plan = await rope_kv_append(
                            ctx.device, q, k, v, table, case.start, convention, layout, k_prior, v_prior,
                            kernel=kernel, **offsets)
                        results += check_rope_kv(label(spec, plan.overrides), f"{case.name} [{dtype} cache]", layout,
                                                 q, k, v, table, case.start, convention, k_prior, v_prior,
                                                 pack_qkv(q, k, v, plan), plan, qkv, k_cache.view(DTYPES[dtype]),
                                                 v_cache.view(DTYPES[dtype]))
    return results


async def _golden_bias(ctx: GoldenContext, spec, dtype: str, case: RopeKvCase, table: np.ndarray,
                       q: np.ndarray, k: np.ndarray, v: np.ndarray) -> list[GoldenResult]:
    """The bias variant: the checks of the plain kernel on the biased values (q + bq, k + bk,
    v + bv, each one f32 add, as the kernel and the CPU path compute them), both conventions.
    Biases are random, and on adversarial cases 1e4 times larger than the values (the add
    dominates: a bias added twice or not at all is off by orders of the bound)."""
    rng = ctx.rng
    size = 1e4 * case.scale if case.adversarial else case.scale
    biases = tuple((size * rng.standard_normal(n * case.head_dim)).astype(np.float32)
                   for n in (case.heads, case.kv_heads, case.kv_heads))
    biased = [(x + b.reshape(x.shape[1:])).astype(np.float32) for x, b in zip((q, k, v), biases)]
    layout = KvLayout(case.kv_heads, case.capacity, case.head_dim, dtype)
    results = []
    for convention in CONVENTIONS:
        k_prior = prior_cache(rng, layout, case.start, case.tokens)
        v_prior = prior_cache(rng, layout, case.start, case.tokens)
        asked = plan_rope_kv_append(ctx.device.limits, layout, case.tokens, case.heads, case.rotary_dim, case.start,
                                    table.shape[0], convention, bias=True)
        for overrides in ctx.launches(asked.kernel, asked.overrides):
            kernel = await ctx.kernel(asked.kernel, **overrides)
            qkv, k_cache, v_cache, plan = await rope_kv_append(ctx.device, q, k, v, table, case.start, convention,
                                                               layout, k_prior, v_prior, kernel=kernel, biases=biases)
            results += check_rope_kv(label(spec, plan.overrides), f"{case.name} + biases x{size:g} [{dtype} cache]",
                                     layout, *biased, table, case.start, convention, k_prior, v_prior,
                                     pack_qkv(q, k, v, plan), plan, qkv, k_cache.view(DTYPES[dtype]),
                                     v_cache.view(DTYPES[dtype]))
    return results


# -- benchmark hook -----------------------------------------------------------------------------

BENCH_KERNELS = ("rope_kv_append_f32", "rope_kv_append_f16")
# Decode: one token at position 1000 of a 4096-position cache; prefill: 512 tokens from 0.
BENCH_SHAPES: dict[str, dict] = {
    f"{model} {phase}": {"tokens": tokens, "heads": h, "kv_heads": k, "head_dim": e, "rotary_dim": e,
                         "start": start, "capacity": 4096, "base": base, "convention": "rotate-half"}
    for model, h, k, e, base in (("smollm2-135m", 9, 3, 64, 1e5), ("llama-3.2-1b", 32, 8, 64, 5e5),
                                 ("llama-3-8b", 32, 8, 128, 5e5))
    for phase, tokens, start in (("decode", 1, 1000), ("prefill", 512, 0))
}


async def prepare_bench(device: Device, name: str, shape: dict, rng: np.random.Generator) -> runner.Prepared:
    s = shape
    layout = KvLayout(s["kv_heads"], s["capacity"], s["head_dim"], name.rsplit("_", 1)[1])
    plan = plan_rope_kv_append(device.limits, layout, s["tokens"], s["heads"], s["rotary_dim"], s["start"],
                               s["capacity"], s["convention"])
    kernel = await compile_kernel(device, plan.kernel, **plan.overrides)
    table = rope_table(s["capacity"], s["rotary_dim"], s["base"])
    qkv = rng.standard_normal(plan.qkv_elements).astype(np.float32)
    caches = [np.zeros(layout.elements, DTYPES[layout.dtype]) for _ in range(2)]
    prepared = runner.prepare(device, kernel, plan.params, [table], [qkv, *caches], plan.grid)
    q_elements = s["tokens"] * s["heads"] * s["head_dim"]
    kv_elements = s["tokens"] * s["kv_heads"] * s["head_dim"]
    # q read and written, k and v read, their cache rows written, one table row per token
    prepared.bytes_moved = (4 * (2 * q_elements + 2 * kv_elements) + 2 * kv_elements * DTYPES[layout.dtype].itemsize
                            + 4 * s["tokens"] * s["rotary_dim"])
    prepared.flops = 3 * s["tokens"] * (s["heads"] + s["kv_heads"]) * s["rotary_dim"]
    return prepared
