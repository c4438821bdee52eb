"""Decode attention with RoPE and the KV append fused in (kernels/attention_rope.py) on
wgpu-native, its host-side refusals, and rules that must fail wrong results."""
import dataclasses
import time

import numpy as np
import pytest

from webslm.cpu import layers
from webslm.kernels import golden
from webslm.kernels import attention_rope as ar
from webslm.kernels.attention import AttentionShape, DecodePlan, plan_decode
from webslm.kernels.kv_cache import DTYPES, KvShapeError
from webslm.kernels.registry import KERNELS, compile_kernel
from webslm.kernels.rope import rope_table

CORE = {"maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupSizeX": 256,
        "maxComputeWorkgroupStorageSize": 16384, "maxStorageBufferBindingSize": 2 ** 27,
        "maxComputeWorkgroupsPerDimension": 65535}
COMPAT = {**CORE, "maxComputeInvocationsPerWorkgroup": 128, "maxComputeWorkgroupSizeX": 128}
SHAPE = AttentionShape(9, 3, 64, 100)


def _results(report, family="attention_rope"):
    return report["families"][family]["results"]


def test_golden_attention_rope_full(native_device, run):
    started = time.perf_counter()
    report = run(golden.run_all(native_device, "full", families=["attention_rope"]))
    results = _results(report)
    for r in results:
        if not r["passed"]:
            print("FAILED", r)
    worst = max(r["error_over_tolerance"] for r in results)
    print(f"attention_rope golden: {len(results)} results in {time.perf_counter() - started:.1f} s, "
          f"worst error/tolerance {worst:.3g}")
    assert report["passed"], report["failed"]
    kernels = {r["kernel"].split("[")[0] for r in results}
    assert kernels == {"attention_decode_rope_f32", "attention_decode_rope_f16"}   # no shader-f16 needed
    cases = {r["case"] for r in results}
    assert any("x 1," in c for c in cases) and any("x 47," in c for c in cases)     # one pass and split-K
    assert {"rotate-half", "adjacent-pair"} <= {word for c in cases for word in c.replace(",", " ").split()}
    assert sum("bit-identical to rope_kv_append" in c for c in cases) == 2 * len(ar.decode_rope_cases(False))


def test_golden_attention_rope_quick_is_small(native_device, run):
    report = run(golden.run_all(native_device, "quick", families=["attention_rope"]))
    assert report["passed"], report["failed"]
    results = _results(report)
    runs = {r["case"].split(" K and V caches")[0] for r in results if "bit-identical" in r["case"]}
    assert len(runs) <= 3 * 2                              # at most 3 cases per variant
    assert len(results) < 40
    assert any("x 1," in c for c in runs) and any("x 4," in c for c in runs)   # one pass and split-K


# -- the plan: plan_decode's chunking, the fused kernel, the combine unchanged ----------------

@pytest.mark.parametrize("position, kwargs", [(0, {}), (5, {}), (255, {}), (3000, {}),
                                              (3000, {"heads_per_workgroup": 8}), (700, {"chunk": 37}),
                                              (99, {"workgroup": 64})])
def test_plan_is_plan_decode_plus_rope(position, kwargs):
    shape = AttentionShape(9, 3, 64, 4096, "f16")
    plan = ar.plan_decode_rope(CORE, shape, position, 32, 4096, "adjacent-pair", **kwargs)
    base = plan_decode(CORE, shape, position, **kwargs)
    assert isinstance(plan, DecodePlan)
    assert (plan.chunk, plan.n_chunks, plan.slices, plan.scratch_acc, plan.scratch_ml) == \
        (base.chunk, base.n_chunks, base.slices, base.scratch_acc, base.scratch_ml)
    assert plan.summation_depth == base.summation_depth and plan.exp_chain == base.exp_chain
    assert plan.chunk_pass.kernel == "attention_decode_rope_f16"
    assert plan.chunk_pass.overrides == {**base.chunk_pass.overrides, "ADJACENT": 1}
    assert plan.chunk_pass.grid == base.chunk_pass.grid
    words = plan.chunk_pass.params
    assert words.dtype == np.uint32 and words.size == 16                       # 64 bytes
    assert np.array_equal(words[:10], base.chunk_pass.params[:10])
    assert list(words[10:]) == [16, 0, 9 * 64, 12 * 64, 0, 0]                  # half, q_at, k_at, v_at
    assert plan.position == position and plan.qkv_elements == 15 * 64
    if base.combine is None:
        assert plan.combine is None
    else:
        assert plan.combine.kernel == "attention_combine_f32"
        assert plan.combine.overrides == base.combine.overrides and plan.combine.grid == base.combine.grid
        assert plan.combine.params is words


def test_registry_entries():
    for dtype in ("f32", "f16"):
        spec = KERNELS[f"attention_decode_rope_{dtype}"]
        assert spec.requires == frozenset()                   # caches as u32 words: no shader-f16
        assert spec.entry_point == "decode_chunk_rope"
        assert spec.bindings == ("uniform", "read-only-storage", "storage", "storage", "storage", "storage",
                                 "storage", "read-only-storage")
        assert spec.bindings[:7][4:] == KERNELS["attention_combine_f32"].bindings[4:]
        assert spec.sources[-2:] == ("attention_decode_core.wgsl", "attention_decode_rope.wgsl")
        assert set(spec.overrides) == {"WG", "GW", "HD4", "ADJACENT"}
    assert ar.STORAGE <= 16384


def test_workgroup_follows_the_device():
    assert ar.plan_decode_rope(COMPAT, SHAPE, 5, 64, 100, "rotate-half").chunk_pass.overrides["WG"] == 128
    assert ar.plan_decode_rope(CORE, SHAPE, 5, 64, 100, "rotate-half").chunk_pass.overrides["WG"] == 256
    with pytest.raises(KvShapeError) as error:
        ar.plan_decode_rope(COMPAT, SHAPE, 5, 64, 100, "rotate-half", workgroup=256)
    assert error.value.problem == "workgroup"
    small = {**CORE, "maxComputeWorkgroupStorageSize": 15000}     # enough for decode_chunk, not this kernel
    plan_decode(small, SHAPE, 5)
    with pytest.raises(KvShapeError) as error:
        ar.plan_decode_rope(small, SHAPE, 5, 64, 100, "rotate-half")
    assert error.value.problem == "device"


# -- host-side refusals: every problem before a dispatch -----------------------------------------

@pytest.mark.parametrize("kwargs, problem", [
    ({"position": 100}, "position"),                         # = capacity
    ({"position": 1000}, "position"),
    ({"position": -1}, "position"),
    ({"position": 50, "table_rows": 50}, "position"),        # the table ends before the position
    ({"rotary_dim": 7}, "shape"),
    ({"rotary_dim": 0}, "shape"),
    ({"rotary_dim": 66}, "shape"),
    ({"convention": "neox"}, "shape"),
    ({"q_at": -1}, "shape"),
    ({"k_at": 100}, "shape"),                                # inside the q section [0, 576)
    ({"q_at": 0, "k_at": 576, "v_at": 700}, "shape"),        # v overlaps k [576, 768)
    ({"qkv_elements": 15 * 64 - 1}, "shape"),                # the binding is one element short
    ({"v_at": 2 ** 32}, "offset-overflow"),
    ({"chunk": 2049}, "shape"),
    ({"chunk": 800, "heads_per_workgroup": 3}, "shape"),     # 3 x 800 > 2048 scores
    ({"heads_per_workgroup": 9}, "shape"),
    ({"scale": float("nan")}, "shape"),
    ({"scale": 0.0}, "shape"),
    ({"workgroup": 32}, "workgroup"),
])
def test_refusals(kwargs, problem):
    args = {"position": 5, "rotary_dim": 64, "table_rows": 100, "convention": "rotate-half", **kwargs}
    with pytest.raises(KvShapeError) as error:
        ar.plan_decode_rope(CORE, SHAPE, **args)
    assert error.value.problem == problem
    assert isinstance(error.value, ValueError)


def test_bindings_past_the_device_limit_are_refused():
    big = AttentionShape(32, 8, 128, 40000)                  # 164 MB per f32 cache
    with pytest.raises(KvShapeError) as error:
        ar.plan_decode_rope(CORE, big, 10, 128, 40000, "rotate-half")
    assert error.value.problem == "binding-size"
    roomy = {**CORE, "maxStorageBufferBindingSize": 2 ** 31}
    ar.plan_decode_rope(roomy, big, 10, 128, 40000, "rotate-half")
    with pytest.raises(KvShapeError) as error:                # the table: 2^27 rows x 64 pairs x 8 bytes
        ar.plan_decode_rope(roomy, big, 10, 128, 2 ** 27, "rotate-half")
    assert error.value.problem == "binding-size"


def test_sections_apart_are_carried_into_the_params():
    plan = ar.plan_decode_rope(CORE, SHAPE, 7, 32, 100, "rotate-half", q_at=5, k_at=1000, v_at=2000,
                               qkv_elements=3000)
    assert list(plan.chunk_pass.params[10:14]) == [16, 5, 1000, 2000]
    assert (plan.q_at, plan.k_at, plan.v_at, plan.qkv_elements) == (5, 1000, 2000, 2000 + 3 * 64)


def test_run_refuses_mismatched_inputs(native_device, run):
    shape = AttentionShape(4, 2, 8, 10)
    plan = ar.plan_decode_rope(native_device.limits, shape, 3, 8, 10, "rotate-half")
    kernel = run(compile_kernel(native_device, plan.chunk_pass.kernel, **plan.chunk_pass.overrides))
    other = run(compile_kernel(native_device, plan.chunk_pass.kernel, **{**plan.chunk_pass.overrides, "ADJACENT": 1}))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(n * 8).astype(np.float32) for n in (4, 2, 2))
    table = rope_table(10, 8, 1e4)
    cache = np.zeros(shape.layout.elements, np.float32)
    with pytest.raises(KvShapeError, match="q must"):
        run(ar.run_decode_rope(native_device, (kernel, None), plan, shape, q[:-1], k, v, table, cache, cache))
    with pytest.raises(KvShapeError, match="table"):
        run(ar.run_decode_rope(native_device, (kernel, None), plan, shape, q, k, v, rope_table(10, 4, 1e4), cache, cache))
    with pytest.raises(KvShapeError, match="table"):
        run(ar.run_decode_rope(native_device, (kernel, None), plan, shape, q, k, v, table[:3], cache, cache))
    with pytest.raises(KvShapeError, match="k_cache"):
        run(ar.run_decode_rope(native_device, (kernel, None), plan, shape, q, k, v, table, cache[:-1], cache))
    with pytest.raises(KvShapeError, match="ADJACENT"):
        run(ar.run_decode_rope(native_device, (other, None), plan, shape, q, k, v, table, cache, cache))
    with pytest.raises(KvShapeError, match="combine"):
        run(ar.run_decode_rope(native_device, (kernel, kernel), plan, shape, q, k, v, table, cache, cache))


# -- as the engine runs it: one grid and chunk for every position -------------------------------

def test_fixed_grid_and_chunk_as_the_executor_uses_them(native_device, run):
    """forward.py plans decode attention once for the full cache and keeps that grid (and, past
    the single-pass length, that chunk): workgroups past the position's must leave at once, and
    results must be those of the position's own plan, bit for bit."""
    limits = native_device.limits
    shape = AttentionShape(9, 3, 64, 600, "f32")
    widest = ar.plan_decode_rope(limits, shape, 599, 64, 600, "rotate-half")
    assert widest.combine is not None
    rng = np.random.default_rng(3)
    table = rope_table(600, 64, 1e5)
    kernels = {}

    async def go(plan, q, k, v, k_prior, v_prior):
        names = [plan.chunk_pass, plan.combine] if plan.combine else [plan.chunk_pass]
        compiled = []
        for step in names:
            key = (step.kernel, tuple(sorted(step.overrides.items())))
            if key not in kernels:
                kernels[key] = await compile_kernel(native_device, step.kernel, **step.overrides)
            compiled.append(kernels[key])
        return await ar.run_decode_rope(native_device, (compiled[0], compiled[1] if plan.combine else None), plan,
                                        shape, q, k, v, table, k_prior, v_prior)

    for position, chunk in ((40, None), (400, widest.chunk)):
        case = ar.RopeDecodeCase("fixed grid", 9, 3, 64, 64, position, 600, "rotate-half")
        q, k, v, k_prior, v_prior = ar.case_arrays(rng, case, shape.layout)
        own = ar.plan_decode_rope(limits, shape, position, 64, 600, "rotate-half", chunk=chunk)
        fixed = dataclasses.replace(own, chunk_pass=dataclasses.replace(own.chunk_pass, grid=widest.chunk_pass.grid))
        assert fixed.chunk_pass.grid[0] > int(own.chunk_pass.params[8])       # more workgroups than groups
        a = run(go(own, q, k, v, k_prior, v_prior))
        b = run(go(fixed, q, k, v, k_prior, v_prior))
        for x, y in zip(a, b):
            assert np.array_equal(x.view(np.uint32), y.view(np.uint32))
        assert np.isfinite(a[0]).all()


def test_bench_hook_prepares_the_chunk_pass(native_device, run):
    prepared = run(ar.prepare_bench(native_device, "attention_decode_rope_f16",
                                    ar.BENCH_SHAPES["smollm2-135m/decode-1024"], np.random.default_rng(0)))
    try:
        assert prepared.bytes_moved > 2 * 3 * 1023 * 64 * 2 and prepared.flops == 4 * 9 * 1024 * 64
    finally:
        prepared.release(native_device)


# -- the rules must fail wrong results ---------------------------------------------------------------

def _rotate_f32(x: np.ndarray, table: np.ndarray, position: int, convention: str) -> np.ndarray:
    """a cos - b sin, b cos + a sin in f32, each operation rounded to nearest."""
    half = table.shape[1]
    cos, sin = table[position, :, 0], table[position, :, 1]
    first = np.arange(half) if convention == "rotate-half" else 2 * np.arange(half)
    second = first + half if convention == "rotate-half" else first + 1
    out = x.astype(np.float32).copy()
    a, b = x[..., first].astype(np.float32), x[..., second].astype(np.float32)
    out[..., first] = a * cos - b * sin
    out[..., second] = b * cos + a * sin
    return out


class Case:
    """A case with the results a right kernel returns (numpy's rotation, exact attention)."""

    def __init__(self, dtype="f32", convention="rotate-half", position=40, rotary=16):
        self.shape = AttentionShape(6, 2, 16, 50, dtype)
        self.convention = convention
        self.table = rope_table(50, rotary, 1e4)
        case = ar.RopeDecodeCase("rules", 6, 2, 16, rotary, position, 50, convention)
        self.plan = ar.plan_decode_rope(CORE, self.shape, position, rotary, 50, convention, chunk=16)
        rng = np.random.default_rng(11)
        self.q, self.k, self.v, self.k_prior, self.v_prior = ar.case_arrays(rng, case, self.shape.layout)
        self.position = position
        self.k_cache, self.v_cache = self.append(_rotate_f32(self.k, self.table, position, convention), self.v)
        self.out = self.attend(self.q_rotated(), self.k_cache, self.v_cache, position)

    def append(self, k_row, v_row, position=None):
        position = self.position if position is None else position
        dtype = DTYPES[self.shape.dtype]
        caches = []
        for prior, row in ((self.k_prior, k_row), (self.v_prior, v_row)):
            cache = prior.copy().reshape(2, 50, 16)
            cache[:, position] = row.astype(dtype)
            caches.append(cache.reshape(-1))
        return caches

    def q_rotated(self, position=None, convention=None):
        return _rotate_f32(self.q, self.table, self.position if position is None else position,
                           convention or self.convention)

    def attend(self, q, k_cache, v_cache, last):
        keys = k_cache.reshape(2, 50, 16)[:, :last + 1].astype(np.float64).transpose(1, 0, 2)
        values = v_cache.reshape(2, 50, 16)[:, :last + 1].astype(np.float64).transpose(1, 0, 2)
        return layers.attention(q.astype(np.float64).reshape(1, 6, 16), keys, values, last)[0].astype(np.float32)

    def check(self, out=None, k_cache=None, v_cache=None):
        return ar.check_decode_rope("test", "case", self.shape, self.plan, self.q, self.k, self.v, self.table,
                                    self.convention, self.k_prior, self.v_prior, self.k_cache, self.v_cache,
                                    self.out if out is None else out, self.k_cache if k_cache is None else k_cache,
                                    self.v_cache if v_cache is None else v_cache)


def _failed(results):
    return [r.case.removeprefix("case ") for r in results if not r.passed]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("convention", ["rotate-half", "adjacent-pair"])
def test_rules_catch_wrong_results(dtype, convention):
    c = Case(dtype, convention)
    assert _failed(c.check()) == []
    other = "adjacent-pair" if convention == "rotate-half" else "rotate-half"
    # the output: q not rotated, rotated at the next position or by the other convention, the new
    # position left out, the new k row attended unrotated
    assert _failed(c.check(out=c.attend(c.q, c.k_cache, c.v_cache, c.position))) == ["attention output"]
    assert _failed(c.check(out=c.attend(c.q_rotated(c.position + 1), c.k_cache, c.v_cache, c.position))) \
        == ["attention output"]
    assert _failed(c.check(out=c.attend(c.q_rotated(convention=other), c.k_cache, c.v_cache, c.position))) \
        == ["attention output"]
    assert _failed(c.check(out=c.attend(c.q_rotated(), c.k_cache, c.v_cache, c.position - 1))) == ["attention output"]
    unrotated = c.append(c.k, c.v)
    assert _failed(c.check(out=c.attend(c.q_rotated(), *unrotated, c.position))) == ["attention output"]
    # the caches (compared whole, with rope_kv_append's and with numpy's): k not rotated, the other
    # convention, the row at position + 1, k into the V cache, one bit off in V, in a rotated K
    both = {"K and V caches bit-identical to rope_kv_append", "K and V caches bit-identical to numpy's rope_kv_append"}
    rotated = "K row rotated, rope's bound"
    assert set(_failed(c.check(k_cache=unrotated[0]))) == both | {rotated}
    wrong = c.append(_rotate_f32(c.k, c.table, c.position, other), c.v)[0]
    assert set(_failed(c.check(k_cache=wrong))) == both | {rotated}
    shifted = c.append(_rotate_f32(c.k, c.table, c.position, convention), c.v, c.position + 1)
    assert set(_failed(c.check(k_cache=shifted[0], v_cache=shifted[1]))) == both | {rotated}
    swapped = c.append(_rotate_f32(c.k, c.table, c.position, convention), _rotate_f32(c.k, c.table, c.position, convention))
    assert set(_failed(c.check(v_cache=swapped[1]))) == both
    bits = np.uint32 if dtype == "f32" else np.uint16
    for cache in ("k", "v"):
        nudged = getattr(c, f"{cache}_cache").copy()
        nudged.view(bits)[c.shape.layout.index(1, c.position) + 3] ^= 1      # element 3: rotated in K
        failed = set(_failed(c.check(**{f"{cache}_cache": nudged})))
        # rope's bound admits an f32 ulp (not an f16 one): only the bit comparisons see it
        assert failed == (both | {rotated} if cache == "k" and dtype == "f16" else both), cache
    # poison left in the output
    holed = c.out.copy()
    holed[7] = np.nan
    assert [r.unwritten for r in c.check(out=holed) if r.case.endswith("output")] == [1]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_the_new_key_is_scored_as_stored(native_device, run, dtype):
    """Position 1, and cache row 0 holds exactly the k row the kernel appends: both keys score
    alike, so with v = 0 at row 0 and 1 at the new row every output is 1/2. A kernel that scored
    the new key from its f32 rotation instead of the f16 value it stores would be off by far
    more (q x 100: the f16 rounding moves that score by ~1e-2)."""
    shape = AttentionShape(4, 2, 16, 4, dtype)
    table = rope_table(2, 16, 1e4)
    plan = ar.plan_decode_rope(native_device.limits, shape, 1, 16, 2, "adjacent-pair")
    rng = np.random.default_rng(5)
    q = (100 * rng.standard_normal((4, 16))).astype(np.float32)
    k = rng.standard_normal((2, 16)).astype(np.float32)
    v = np.ones((2, 16), np.float32)
    zeros = np.zeros(shape.layout.elements, DTYPES[dtype])
    k_appended, _ = ar.rope_kv_reference(shape.layout, k, v, table, 1, "adjacent-pair", zeros, zeros)
    k_prior = k_appended.reshape(2, 4, 16).copy()
    k_prior[:, 0] = k_prior[:, 1]
    k_prior[:, 1] = np.nan
    kernel = run(compile_kernel(native_device, plan.chunk_pass.kernel, **plan.chunk_pass.overrides))
    out, k_cache, _ = run(ar.run_decode_rope(native_device, (kernel, None), plan, shape, q, k, v, table,
                                             k_prior.reshape(-1), zeros))
    assert np.array_equal(k_cache.reshape(2, 4, 16)[:, 1].view(np.uint8), k_prior[:, 0].view(np.uint8))
    assert np.abs(out - 0.5).max() < 1e-4
    if dtype == "f16":
        rotated32 = ar.rope_kv_reference(AttentionShape(4, 2, 16, 4).layout, k, v, table, 1, "adjacent-pair",
                                         np.zeros(128, np.float32), np.zeros(128, np.float32))[0].reshape(2, 4, 16)[:, 1]
        q_rot = ar.rotated_queries(q, table, 1, "adjacent-pair", 4, 16)[0][0]
        shift = 0.25 * np.abs(np.einsum("he,he->h", q_rot, (rotated32 - k_prior[:, 0].astype(np.float32))[[0, 0, 1, 1]]))
        assert shift.min() > 1e-3          # what scoring the f32 value would move the scores by


def test_rules_catch_the_k_tail_past_rotary_dim():
    c = Case("f16", rotary=8)
    assert _failed(c.check()) == []
    k_row = _rotate_f32(c.k, c.table, c.position, c.convention)
    k_row[:, 12] = np.nextafter(k_row[:, 12].astype(np.float16), np.float16(np.inf)).astype(np.float32)
    assert set(_failed(c.check(k_cache=c.append(k_row, c.v)[0]))) == \
        {"K and V caches bit-identical to rope_kv_append", "K and V caches bit-identical to numpy's rope_kv_append"}


def test_a_contracted_rope_kv_append_is_told_apart():
    """Where rope_kv_append's a cos - b sin were fused into an FMA (the reference differs from
    numpy's rounding), only the comparison with rope_kv_append fails: the kernel's own rounding
    is numpy's."""
    c = Case()
    fused = c.k_cache.copy().reshape(2, 50, 16)
    half = 8
    cos, sin = c.table[c.position, :, 0], c.table[c.position, :, 1]
    a, b = c.k[:, :half], c.k[:, half:]
    # fma(a, cos, -(b sin)): the f32 product a cos is exact in float64, then one rounding
    fused[:, c.position, :half] = (a.astype(np.float64) * cos - b * sin).astype(np.float32)
    fused[:, c.position, half:] = (b.astype(np.float64) * cos + a * sin).astype(np.float32)
    assert not np.array_equal(fused.reshape(-1).view(np.uint32), c.k_cache.view(np.uint32))
    results = ar.check_decode_rope("test", "case", c.shape, c.plan, c.q, c.k, c.v, c.table, c.convention,
                                   c.k_prior, c.v_prior, fused.reshape(-1), c.v_cache, c.out, c.k_cache, c.v_cache)
    assert _failed(results) == ["K and V caches bit-identical to rope_kv_append"]


def test_rotation_error_widens_the_score_bound():
    """The output bound counts the rotation's two roundings (gamma(E + 3) on |a cos| + |b sin|):
    it is at least attention's bound for the exactly rotated q."""
    from webslm.kernels.attention import error_bound
    c = Case()
    q_exact, magnitude = ar.rotated_queries(c.q, c.table, c.position, c.convention, 6, 16)
    keys = c.k_cache.reshape(2, 50, 16)[:, :41].astype(np.float64).transpose(1, 0, 2)
    values = c.v_cache.reshape(2, 50, 16)[:, :41].astype(np.float64).transpose(1, 0, 2)
    _, plain = error_bound(q_exact, keys, values, 40, 0.25, c.plan.summation_depth, c.plan.exp_chain)
    _, widened = error_bound(q_exact, keys, values, 40, 0.25, c.plan.summation_depth, c.plan.exp_chain,
                             q_magnitude=magnitude, score_roundings=19)
    assert (widened >= plain).all() and (widened > plain).any()
    assert np.all(magnitude >= np.abs(q_exact) * (1 - 1e-12))
