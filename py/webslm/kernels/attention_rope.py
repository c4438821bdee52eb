"""Decode attention with RoPE and the KV append fused in (shaders/attention_decode_rope.wgsl):
registry entries, host side, golden tests, bench hook.

    attention_decode_rope_f32, attention_decode_rope_f16   (overrides WG 64|128|256, GW 1..8,
                                                            HD4 1..64, ADJACENT 0|1)

One dispatch replaces rope_kv_append (rope_kv.py) followed by attention_decode's chunk pass
(attention.py) for the token at position p: it takes the token's UN-rotated q, k, v (the qkv
region, sections at element offsets q_at, k_at, v_at as rope_kv_append takes them), rotates
the queries while loading them, writes the rotated k row and the v row into cache row p (one
workgroup per KV head writes; every workgroup of the last chunk scores and sums row p from
its own copy) and attends over positions 0..p. The chunking (chunk, GW, the grid) is
plan_decode's; with more than one chunk the second pass is the existing combine, run as
`attention_combine_f32` for both cache types (it never reads the caches, and the f32 build
needs no shader-f16). Neither variant needs shader-f16: caches are bound as u32 words, f16
rounded by f16_round.wgsl (the same integer round-to-nearest-even as rope_kv_append_f16) and
read with unpack2x16float (exact).

Bindings of the chunk pass (index order; runner.prepare and the executor bind in this order):
    0 params   (uniform, 16 words; below)
    1 qkv      (read-only) the qkv region, f32: q [heads * head_dim] at q_at, k and v
               [kv_heads * head_dim] at k_at and v_at (element offsets; not written: q stays
               un-rotated there)
    2 k_cache  (storage) the layer's K cache, kv_cache.KvLayout [n_kv_heads][capacity][head_dim]
    3 v_cache  (storage) the layer's V cache
    4 out      (storage) [n_heads * head_dim] f32
    5 part_acc (storage) split-K scratch, DecodePlan.scratch_acc f32 (>= 4)
    6 part_ml  (storage) split-K scratch, DecodePlan.scratch_ml f32 (>= 2)
    7 table    (read-only) the RoPE table [table_rows, rotary_dim / 2] (cos, sin) f32 (rope.rope_table)
The combine pass (attention_combine_f32, its own bind group) takes bindings 0..6 of that list:
the same buffers at the same indices (params, qkv, k_cache, v_cache, out, part_acc, part_ml).
Params: words 0..9 are attention_decode's (n_heads, n_kv_heads, head_dim, capacity, n_keys =
p + 1, chunk, n_chunks, head_blocks, n_groups, scale f32), then 10 half = rotary_dim / 2,
11 q_at, 12 k_at, 13 v_at, 14 zero (must be 0: the kernel ORs it into each RoPE product's bits so
that no compiler contracts a cos - b sin into an FMA), 15 unused (0). The combine reads words
0..9 of the same block.

Rules (golden family "attention_rope"), caches compared whole, bit for bit (rows other than p
start as random bits: the context before p, NaN patterns after it): identical to what
rope_kv_append writes on the same device for the same inputs, and to numpy's rope_kv_append
(`rope_kv_reference`: k rotated in f32 with every operation rounded to nearest, f16 by
astype); rotated K also within rope's bound of the exact rotation (f16: the interval rule of
rope_kv.check_f16_interval); the output by attention's rule (attention.error_bound) with the
score error of a q rotated in the kernel (see RULE).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from ..webgpu.interface import BufferBinding, Device, Dispatch
from . import runner
from .attention import (DECODE_STORAGE, HEADS_PER_GROUP, ROW_VEC4S, AttentionShape, DecodePlan,
                        checked, error_bound, plan_decode)
from .golden import GoldenContext, GoldenResult, compare_bound, compare_exact, golden, label
from .kv_cache import DTYPES, WORKGROUPS, DispatchPlan, KvLayout, KvShapeError, adversarial_values, check_workgroup
from .registry import KernelSpec, compile_kernel, register
from .rope import CONVENTIONS, rope_oracle, rope_table
from .rope_kv import check_f16_interval, plan_rope_kv_append, rope_kv_append

BINDINGS = ("uniform", "read-only-storage", "storage", "storage", "storage", "storage", "storage",
            "read-only-storage")
PRELUDES = {"f32": ("attention_rope_kv_f32.wgsl",), "f16": ("f16_round.wgsl", "attention_rope_kv_f16.wgsl")}
SOURCES = ("attention_decode_core.wgsl", "attention_decode_rope.wgsl")
register(*(KernelSpec(f"attention_decode_rope_{dtype}", (*PRELUDES[dtype], *SOURCES), "decode_chunk_rope", BINDINGS,
                      {"WG": WORKGROUPS, "GW": HEADS_PER_GROUP, "HD4": ROW_VEC4S, "ADJACENT": (0, 1)})
           for dtype in ("f32", "f16")))

COMBINE_KERNEL = "attention_combine_f32"     # the split-K second pass, for both cache types
# Workgroup memory: decode_chunk's plus the new k and v rows (2 x 64 vec4): 15392 bytes.
STORAGE = DECODE_STORAGE + 2 * 64 * 16
PARAM_WORDS = 16


# -- host side ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DecodeRopePlan(DecodePlan):
    """plan_decode's DecodePlan (chunk_pass = the fused kernel, combine = attention_combine_f32
    or None), plus where the qkv sections are."""
    q_at: int = 0
    k_at: int = 0
    v_at: int = 0
    qkv_elements: int = 0            # the least the qkv binding must hold (f32 elements)
    rotary_dim: int = 0

    @property
    def position(self) -> int:
        return int(self.chunk_pass.params[4]) - 1


def plan_decode_rope(limits: dict, shape: AttentionShape, position: int, rotary_dim: int, table_rows: int,
                     convention: str, q_at: int | None = None, k_at: int | None = None, v_at: int | None = None,
                     qkv_elements: int | None = None, scale: float | None = None, chunk: int | None = None,
                     workgroup: int | None = None, heads_per_workgroup: int | None = None) -> DecodeRopePlan:
    """Validate and plan fused RoPE + KV append + decode attention for the token at `position`
    (keys 0..position). Raises KvShapeError (a ValueError) before any GPU work: the checks of
    plan_decode (position inside the cache, scale, chunk, heads per workgroup, cache binding
    size, u32 offsets), of plan_rope_kv_append for one token (convention, rotary_dim even in
    2..head_dim, position inside the table, sections non-negative and disjoint and inside
    `qkv_elements` when given, qkv and table bindings within the device's limit) and this
    kernel's workgroup memory. Offsets default to rope_kv.sections (q, k, v back to back).
    chunk, workgroup and heads_per_workgroup as plan_decode (None: the host's choice)."""
    wg = check_workgroup(limits, workgroup, 256, STORAGE)
    base = plan_decode(limits, shape, position, scale, chunk, wg, heads_per_workgroup)
    rope = plan_rope_kv_append(limits, shape.layout, 1, shape.n_heads, rotary_dim, position, table_rows, convention,
                               q_at, k_at, v_at, qkv_elements)
    words = np.zeros(PARAM_WORDS, np.uint32)
    words[:10] = base.chunk_pass.params[:10]
    words[10:14] = (rotary_dim // 2, rope.q_at, rope.k_at, rope.v_at)
    overrides = {**base.chunk_pass.overrides, "ADJACENT": CONVENTIONS[convention]}
    first = DispatchPlan(f"attention_decode_rope_{shape.dtype}", overrides, words, base.chunk_pass.grid)
    second = None
    if base.combine is not None:
        # The combine reads no cache; it binds qkv and the caches as array<vec4<f32>>, which
        # needs 16 bytes each: a split context has >= 2 positions of >= 4 elements, so it holds.
        second = DispatchPlan(COMBINE_KERNEL, dict(base.combine.overrides), words, base.combine.grid)
    return DecodeRopePlan(first, second, base.chunk, base.n_chunks, base.slices, base.scratch_acc, base.scratch_ml,
                          q_at=rope.q_at, k_at=rope.k_at, v_at=rope.v_at, qkv_elements=rope.qkv_elements,
                          rotary_dim=rotary_dim)


def pack_qkv(plan: DecodeRopePlan, q: np.ndarray, k: np.ndarray, v: np.ndarray, fill: float = np.nan) -> np.ndarray:
    """The qkv binding's content: the token's sections at the plan's offsets, `fill` between."""
    out = np.full(plan.qkv_elements, fill, np.float32)
    for at, rows in ((plan.q_at, q), (plan.k_at, k), (plan.v_at, v)):
        flat = np.asarray(rows, np.float32).reshape(-1)
        out[at:at + flat.size] = flat
    return out


def _check_inputs(plan: DecodeRopePlan, shape: AttentionShape, q, k, v, table, k_cache, v_cache) -> None:
    e = shape.head_dim
    for name, rows, heads in (("q", q, shape.n_heads), ("k", k, shape.n_kv_heads), ("v", v, shape.n_kv_heads)):
        if np.asarray(rows).size != heads * e:
            raise KvShapeError("shape", f"{name} must hold {heads} x {e} f32 elements, got {np.shape(rows)}")
    if table.ndim != 3 or table.shape[2] != 2 or 2 * table.shape[1] != plan.rotary_dim \
            or table.shape[0] <= plan.position:
        raise KvShapeError("shape", f"table must be [rows > {plan.position}, {plan.rotary_dim // 2}, 2], "
                                    f"got {table.shape}")
    shape.layout.check_array("k_cache", k_cache)
    shape.layout.check_array("v_cache", v_cache)


async def run_decode_rope(device: Device, kernels, plan: DecodeRopePlan, shape: AttentionShape, q: np.ndarray,
                          k: np.ndarray, v: np.ndarray, table: np.ndarray, k_cache: np.ndarray,
                          v_cache: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both passes in one submit on fresh buffers, as the engine runs them. q [heads, head_dim],
    k and v [kv_heads, head_dim] f32, un-rotated (any shape of that size); table from
    rope.rope_table; caches as KvLayout arrays (their prior content). kernels = (the chunk
    pass's compiled kernel, attention_combine_f32's or None). Returns (out [H * E], K cache,
    V cache) afterwards."""
    _check_inputs(plan, shape, q, k, v, table, k_cache, v_cache)
    first, combine = kernels
    adjacent = plan.chunk_pass.overrides["ADJACENT"]
    if first.spec.name != plan.chunk_pass.kernel or first.overrides.get("ADJACENT", 0) != adjacent:
        raise KvShapeError("shape", f"kernel {first.spec.name}{first.overrides} does not match {plan.chunk_pass.kernel} "
                                    f"with ADJACENT={adjacent}")
    if (plan.combine is None) != (combine is None):
        raise KvShapeError("shape", "the combine kernel must be given exactly when the plan has a combine pass")
    device.push_error_scope("validation")
    prepared = None
    try:
        prepared = runner.prepare(device, first, plan.chunk_pass.params,
                                  [pack_qkv(plan, q, k, v), np.ascontiguousarray(table, np.float32)],
                                  [k_cache.reshape(-1).copy(), v_cache.reshape(-1).copy(),
                                   (shape.n_heads * shape.head_dim, np.float32),
                                   (plan.scratch_acc, np.float32), (plan.scratch_ml, np.float32)],
                                  plan.chunk_pass.grid)
        dispatches = [prepared.dispatch]
        if plan.combine is not None:     # bindings 0..6 of the chunk pass, same buffers
            group = device.create_bind_group(combine.bind_group_layout,
                                             [BufferBinding(b) for b in prepared.buffers[:7]])
            dispatches.append(Dispatch(combine.pipeline, [group], plan.combine.grid))
        device.submit(dispatches)
        k_out, v_out, out = (await prepared.read_outputs(device))[:3]
    finally:
        error = await device.pop_error_scope()
        if prepared is not None:
            prepared.release(device)
    if error is not None:
        raise runner.KernelRunError(f"attention decode rope: GPU {error.kind} error: {error.message}")
    return out, k_out, v_out


# -- the oracle and its checks -----------------------------------------------------------------

RULE = ("attention's rule (attention.RULE) on the exact rotation of q, with the score error "
        "d_j = gamma(E + 3) scale sum_e M_e |k_je|, M_e = |a cos| + |b sin| for a rotated element "
        "(a cos - b sin or b cos + a sin: two more roundings before the scale), |q_e| otherwise")
ROPE_RULE = "rope: gamma(2) (|a cos| + |b sin|) + 2^-126"


def rotated_queries(q: np.ndarray, table: np.ndarray, position: int, convention: str,
                    heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(exact, magnitude), both [1, heads, head_dim] float64: q after RoPE at `position` (the
    float64 rotation of the f32 values by the table's f32 cos/sin) and the sum of |term| of
    each element (|a cos| + |b sin| when rotated, |q| otherwise)."""
    q = np.asarray(q, np.float32).reshape(1, heads, head_dim)
    exact, _ = rope_oracle(q, table, position, convention, heads, head_dim)
    half = table.shape[1]
    cos = np.abs(table[position, :, 0].astype(np.float64))
    sin = np.abs(table[position, :, 1].astype(np.float64))
    if convention == "rotate-half":
        first, second = np.arange(half), np.arange(half) + half
    else:
        first, second = 2 * np.arange(half), 2 * np.arange(half) + 1
    a, b = np.abs(q[..., first].astype(np.float64)), np.abs(q[..., second].astype(np.float64))
    magnitude = np.abs(q.astype(np.float64))
    magnitude[..., first] = a * cos + b * sin
    magnitude[..., second] = b * cos + a * sin
    return exact.reshape(1, heads, head_dim), magnitude


def _rows(layout: KvLayout, cache: np.ndarray) -> np.ndarray:
    return cache.reshape(layout.n_kv_heads, layout.capacity, layout.head_dim)


def rope_kv_reference(layout: KvLayout, k: np.ndarray, v: np.ndarray, table: np.ndarray, position: int,
                      convention: str, k_prior: np.ndarray, v_prior: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy's rope_kv_append of one token: the prior caches with row `position` replaced by
    k rotated in f32 (a cos - b sin, b cos + a sin, every operation rounded to nearest, no
    fused multiply-add) and by v, in the cache's type (astype(float16) rounds to nearest even)."""
    half = table.shape[1]
    cos, sin = table[position, :, 0], table[position, :, 1]
    first = np.arange(half) if convention == "rotate-half" else 2 * np.arange(half)
    second = first + half if convention == "rotate-half" else first + 1
    k = np.asarray(k, np.float32).reshape(layout.n_kv_heads, layout.head_dim)
    rotated = k.copy()
    rotated[:, first] = k[:, first] * cos - k[:, second] * sin
    rotated[:, second] = k[:, second] * cos + k[:, first] * sin
    caches = []
    for prior, row in ((k_prior, rotated), (v_prior, np.asarray(v, np.float32).reshape(rotated.shape))):
        cache = _rows(layout, prior.copy())
        with np.errstate(over="ignore"):
            cache[:, position] = row.astype(DTYPES[layout.dtype])
        caches.append(cache.reshape(-1))
    return caches[0], caches[1]


def check_decode_rope(kernel: str, case: str, shape: AttentionShape, plan: DecodeRopePlan, q, k, v, table,
                      convention: str, k_prior, v_prior, k_reference, v_reference, out, k_cache, v_cache,
                      family: str = "attention_rope") -> list[GoldenResult]:
    """Every rule of the module docstring, one GoldenResult each. k_reference, v_reference:
    the caches rope_kv_append left for the same inputs on the same device."""
    layout = shape.layout
    p, e, rotary = plan.position, shape.head_dim, plan.rotary_dim
    bits = np.uint32 if layout.dtype == "f32" else np.uint16
    k_numpy, v_numpy = rope_kv_reference(layout, k, v, table, p, convention, k_prior, v_prior)
    results = [compare_exact(family, kernel, case + " K and V caches bit-identical to rope_kv_append",
                             np.concatenate([k_cache, v_cache]).view(bits),
                             np.concatenate([k_reference, v_reference]).view(bits)),
               compare_exact(family, kernel, case + " K and V caches bit-identical to numpy's rope_kv_append",
                             np.concatenate([k_cache, v_cache]).view(bits),
                             np.concatenate([k_numpy, v_numpy]).view(bits))]
    # Independent of the rounding model: the rotated K elements within rope's bound of the exact
    # rotation (f16: its interval rule).
    k_exact, k_bound = rope_oracle(np.asarray(k, np.float32).reshape(1, shape.n_kv_heads, e), table, p, convention,
                                   shape.n_kv_heads, e)
    k_exact, k_bound, k_row = k_exact[0, :, :rotary], k_bound[0, :, :rotary], _rows(layout, k_cache)[:, p, :rotary]
    if layout.dtype == "f32":
        results.append(compare_bound(family, kernel, case + " K row rotated, rope's bound", k_row, k_exact, k_bound,
                                     ROPE_RULE))
    else:
        results.append(check_f16_interval(family, kernel, case + " K row rotated, rope's bound", k_row, k_exact,
                                          k_bound))
    q_exact, magnitude = rotated_queries(q, table, p, convention, shape.n_heads, e)
    keys = _rows(layout, k_numpy)[:, :p + 1].astype(np.float64).transpose(1, 0, 2)   # [n, K, E], as stored
    values = _rows(layout, v_numpy)[:, :p + 1].astype(np.float64).transpose(1, 0, 2)
    scale = float(np.float32(plan.chunk_pass.params[9:10].view(np.float32)[0]))
    exact, bound = error_bound(q_exact, keys, values, p, scale, plan.summation_depth, plan.exp_chain,
                               q_magnitude=magnitude, score_roundings=e + 3)
    results.append(checked(compare_bound(family, kernel, case + " attention output", out, exact[0], bound[0], RULE),
                           bound))
    return results


# -- golden cases ---------------------------------------------------------------------------------

class RopeDecodeCase(NamedTuple):
    name: str
    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    position: int
    capacity: int
    convention: str
    data: str = "random"             # "random", "huge" (q x 1e4: scores ~1e4), "adversarial" (k, v
                                     # from kv_cache.adversarial_values: f16 ties, subnormals, 65504)
    chunk: int | None = None         # None: the host's choice
    heads_per_workgroup: int | None = None
    workgroup: int | None = None
    gaps: bool = False               # sections apart (odd offsets), NaN between
    base: float = 1e4


def decode_rope_cases(quick: bool) -> list[RopeDecodeCase]:
    C = RopeDecodeCase
    if quick:
        return [
            C("smollm2 9/3 d64 at 5, one pass", 9, 3, 64, 64, 5, 40, "rotate-half"),
            C("split-K at the last position, 8/2 (G=4) d12 rotary 8, sections apart", 8, 2, 12, 8, 99, 100,
              "adjacent-pair", chunk=32, gaps=True),
            C("position 0, adversarial k and v", 3, 1, 8, 6, 0, 4, "rotate-half", "adversarial"),
        ]
    return [
        C("smollm2 9/3 d64 at 5, one pass", 9, 3, 64, 64, 5, 40, "rotate-half", base=1e5),
        C("position 0, 9/3 (G=3), adversarial k and v", 9, 3, 64, 64, 0, 16, "adjacent-pair", "adversarial"),
        C("last position, MHA 4/4 (G=1), chunks of 64", 4, 4, 64, 64, 299, 300, "rotate-half", chunk=64),
        C("8/2 (G=4) d128 at 700, host split", 8, 2, 128, 128, 700, 800, "adjacent-pair", base=5e5),
        C("partial rotary 8 of 12, 6/2 (G=3), huge scores, sections apart", 6, 2, 12, 8, 100, 130, "rotate-half",
          "huge", gaps=True),
        C("rotary 6 of 20 (odd half, HD4=5), 4/4, last position, chunks of 10", 4, 4, 20, 6, 37, 38,
          "adjacent-pair", "adversarial", chunk=10),
        C("MQA-like 4/1 (G=4) d256, GW=4", 4, 1, 256, 256, 130, 140, "rotate-half", heads_per_workgroup=8),
        C("9/3 at 3000 = capacity - 1, GW=3, host split", 9, 3, 64, 64, 3000, 3001, "rotate-half",
          heads_per_workgroup=8, base=1e5),
        C("d4 (HD4=1) rotary 2, 3/1 (G=3), chunks of 3", 3, 1, 4, 2, 10, 12, "adjacent-pair", chunk=3),
        C("12/4 (G=3) d36 rotary 16, huge scores, GW=3, chunks of 50", 12, 4, 36, 16, 260, 300, "adjacent-pair",
          "huge", chunk=50, heads_per_workgroup=3),
        C("32/8 (G=4) d64 at 1500, adversarial, sections apart", 32, 8, 64, 64, 1500, 1600, "rotate-half",
          "adversarial", gaps=True),
    ]


def _bounded_adversarial(rng: np.random.Generator, n: int, limit: float) -> np.ndarray:
    """kv_cache.adversarial_values below `limit` in magnitude, the rest replaced by ordinary
    values: an f16 cache must not turn them into infinity (attention over infinite values has
    no finite output to compare), and a rotation may grow a pair's elements by sqrt(2)."""
    values = adversarial_values(rng, n)
    keep = np.abs(values) < limit
    return np.where(keep, values, rng.standard_normal(n).astype(np.float32)).astype(np.float32)


def case_arrays(rng: np.random.Generator, case: RopeDecodeCase, layout: KvLayout):
    """q [H, E], k and v [K, E] f32 (un-rotated), and the prior caches: rows before the position
    hold the context (normal values in the cache's type), row p all-ones bits (NaN), rows after
    it random NaN bit patterns (a kernel that reads past the position, or reads row p before
    it is written, cannot pass)."""
    h, kv, e = case.heads, case.kv_heads, case.head_dim
    q = rng.standard_normal((h, e)).astype(np.float32)
    if case.data == "huge":
        q *= np.float32(1e4)
    if case.data == "adversarial":
        k = _bounded_adversarial(rng, kv * e, 46000.0).reshape(kv, e)
        v = _bounded_adversarial(rng, kv * e, 65520.0).reshape(kv, e)
    else:
        k = rng.standard_normal((kv, e)).astype(np.float32)
        v = rng.standard_normal((kv, e)).astype(np.float32)
    dtype = DTYPES[layout.dtype]
    bits = np.uint32 if layout.dtype == "f32" else np.uint16
    exponent, mantissa, sign = (0x7F800000, 0x7FFFFF, 1 << 31) if bits is np.uint32 else (0x7C00, 0x3FF, 1 << 15)
    caches = []
    for _ in range(2):
        raw = rng.integers(0, 2 * sign, layout.elements, dtype=np.uint64)
        nan = (raw & (mantissa | sign)) | exponent | np.uint64((raw & mantissa) == 0)   # payload != 0: NaN
        cache = nan.astype(bits).reshape(layout.n_kv_heads, layout.capacity, layout.head_dim)
        cache[:, case.position] = np.iinfo(bits).max
        context = rng.standard_normal((layout.n_kv_heads, case.position, layout.head_dim)).astype(np.float32)
        cache[:, :case.position] = context.astype(dtype).view(bits)
        caches.append(cache.reshape(-1).view(dtype))
    return q, k, v, caches[0], caches[1]


def _offsets(case: RopeDecodeCase) -> dict:
    if not case.gaps:
        return {}
    q_size, kv_size = case.heads * case.head_dim, case.kv_heads * case.head_dim
    return {"q_at": 5, "k_at": 5 + q_size + 37, "v_at": 5 + q_size + 37 + kv_size + 3}


def _planned_cases(ctx: GoldenContext) -> list[RopeDecodeCase]:
    """The cases as they are; at admission each at every (head_dim, convention) the plan's
    fused pipelines were compiled for (HD4, ADJACENT), a partial rotary kept partial."""
    cases = decode_rope_cases(ctx.quick)
    if ctx.planned is None:
        return cases
    forms = sorted({(4 * dict(items)["HD4"], dict(items).get("ADJACENT", 0)) for name, items in ctx.planned
                    if name.startswith("attention_decode_rope_")})
    convention_of = {adjacent: convention for convention, adjacent in CONVENTIONS.items()}
    return [case._replace(name=f"{case.name}, at d{e}", head_dim=e, convention=convention_of[adjacent],
                          rotary_dim=e if case.rotary_dim == case.head_dim
                          else max(2, e * case.rotary_dim // case.head_dim // 2 * 2))
            for e, adjacent in forms for case in cases]


def _plans(ctx: GoldenContext, shape: AttentionShape, case: RopeDecodeCase, table_rows: int,
           workgroup: int | None, heads_per_workgroup: int | None, **offsets) -> list:
    """The plans a case runs: its own outside admission; at admission those of the plan's
    pipelines (workgroup size and heads per workgroup are launch shape), each with a combine
    pass the plan compiled too, if it takes one."""
    def planned(workgroup, heads_per_workgroup):
        return plan_decode_rope(ctx.device.limits, shape, case.position, case.rotary_dim, table_rows,
                                case.convention, chunk=case.chunk, workgroup=workgroup,
                                heads_per_workgroup=heads_per_workgroup, **offsets)
    plan = planned(workgroup, heads_per_workgroup)
    if ctx.planned is None:
        return [plan]
    plans = []
    for overrides in ctx.launches(plan.chunk_pass.kernel, plan.chunk_pass.overrides, ("WG", "GW")):
        try:
            p = planned(overrides["WG"], overrides["GW"])
        except KvShapeError:             # heads per workgroup past this case's group
            continue
        if p.chunk_pass.overrides == overrides and (p.combine is None
                                                    or ctx.planned_pipeline(p.combine.kernel, p.combine.overrides)):
            plans.append(p)
    return plans


@golden("attention_rope", kernels=("attention_decode_rope_", COMBINE_KERNEL))
async def golden_attention_rope(ctx: GoldenContext) -> list[GoldenResult]:
    """Each case on each variant the device runs, its convention as listed; the reference caches
    come from rope_kv_append on the same device and inputs."""
    results = []
    limits = ctx.device.limits
    for spec in ctx.variants("attention_decode_rope_"):
        dtype = spec.name.rsplit("_", 1)[1]
        for index, case in enumerate(_planned_cases(ctx)):
            shape = AttentionShape(case.heads, case.kv_heads, case.head_dim, case.capacity, dtype)
            table = rope_table(case.position + 1, case.rotary_dim, case.base)
            workgroup = case.workgroup or (64 if index % 3 == 1 and not ctx.quick else None)
            offsets = _offsets(case)
            for plan in _plans(ctx, shape, case, table.shape[0], workgroup=workgroup,
                               heads_per_workgroup=case.heads_per_workgroup, **offsets):
                kernels = (await ctx.kernel(plan.chunk_pass.kernel, **plan.chunk_pass.overrides),
                           await ctx.kernel(plan.combine.kernel, **plan.combine.overrides) if plan.combine else None)
                q, k, v, k_prior, v_prior = case_arrays(ctx.rng, case, shape.layout)
                out, k_cache, v_cache = await run_decode_rope(ctx.device, kernels, plan, shape, q, k, v, table,
                                                              k_prior, v_prior)
                reference = plan_rope_kv_append(limits, shape.layout, 1, case.heads, case.rotary_dim, case.position,
                                                table.shape[0], case.convention, **offsets)
                append = await ctx.kernel(reference.kernel, **reference.overrides)
                _, k_reference, v_reference, _ = await rope_kv_append(
                    ctx.device, q.reshape(1, case.heads, -1), k.reshape(1, case.kv_heads, -1),
                    v.reshape(1, case.kv_heads, -1), table, case.position, case.convention, shape.layout,
                    k_prior, v_prior, kernel=append, **offsets)
                name = (f"{case.name} [{dtype} cache, {case.convention}, chunk {plan.chunk} x {plan.n_chunks}, "
                        f"GW={plan.chunk_pass.overrides['GW']}]")
                kernel = label(spec, plan.chunk_pass.overrides) + (f" + {plan.combine.kernel}" if plan.combine else "")
                results += check_decode_rope(kernel, name, shape, plan, q, k, v, table,
                                             case.convention, k_prior, v_prior, k_reference.view(DTYPES[dtype]),
                                             v_reference.view(DTYPES[dtype]), out, k_cache.view(DTYPES[dtype]),
                                             v_cache.view(DTYPES[dtype]))
    return results


# -- benchmark hook -----------------------------------------------------------------------------

BENCH_KERNELS = ("attention_decode_rope_f32", "attention_decode_rope_f16")
_MODELS = {"smollm2-135m": (9, 3, 64, 1e5), "llama-3.2-1b": (32, 8, 64, 5e5), "llama-3-8b": (32, 8, 128, 5e5)}
BENCH_SHAPES: dict[str, dict] = {   # as attention.BENCH_SHAPES' decode shapes ("big": skipped by quick runs)
    f"{model}/decode-{context}": {"n_heads": h, "n_kv_heads": kv, "head_dim": e, "context": context, "base": base,
                                  "big": model == "llama-3-8b" or context == 4096}
    for model, (h, kv, e, base) in _MODELS.items() for context in (1024, 4096)
}


async def prepare_bench(device: Device, name: str, shape: dict, rng: np.random.Generator) -> runner.Prepared:
    """One dispatch of the chunk pass (the host's chunking) for the token at position
    context - 1 of a cache of `context` positions; rotate-half, full rotary_dim."""
    dtype = name.rsplit("_", 1)[1]
    h, kv, e, n = (shape[key] for key in ("n_heads", "n_kv_heads", "head_dim", "context"))
    geometry = AttentionShape(h, kv, e, n, dtype)
    plan = plan_decode_rope(device.limits, geometry, n - 1, e, n, "rotate-half")
    kernel = await compile_kernel(device, name, **plan.chunk_pass.overrides)
    item = DTYPES[dtype].itemsize
    caches = [rng.standard_normal(geometry.layout.elements).astype(DTYPES[dtype]) for _ in range(2)]
    qkv = rng.standard_normal(plan.qkv_elements).astype(np.float32)
    prepared = runner.prepare(device, kernel, plan.chunk_pass.params, [qkv, rope_table(n, e, shape["base"])],
                              [*caches, (h * e, np.float32), (plan.scratch_acc, np.float32),
                               (plan.scratch_ml, np.float32)], plan.chunk_pass.grid)
    # the context's K and V read, q, k, v read, the new rows written, one table row, the output
    # (or the partials) written
    prepared.bytes_moved = (2 * kv * (n - 1) * e * item + 4 * (h + 2 * kv) * e + 2 * kv * e * item + 4 * e
                            + (4 * h * e if plan.combine is None else 4 * (plan.scratch_acc + plan.scratch_ml)))
    prepared.flops = 4 * h * n * e
    return prepared
