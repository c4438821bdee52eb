"""The attention family (kv_append, decode, prefill) on wgpu-native, and its host-side checks."""
import time

import numpy as np
import pytest

from webslm.kernels import golden
from webslm.kernels.attention import (AttentionShape, BENCH_KERNELS, BENCH_SHAPES, default_scale,
                                      error_bound, plan_decode, plan_prefill)
from webslm.kernels.golden import compare_bound
from webslm.kernels.kv_cache import KvLayout, KvShapeError, pick_workgroup, plan_append

CORE = {"maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupSizeX": 256,
        "maxComputeWorkgroupStorageSize": 16384, "maxStorageBufferBindingSize": 2 ** 27,
        "maxComputeWorkgroupsPerDimension": 65535}
COMPAT = {**CORE, "maxComputeInvocationsPerWorkgroup": 128, "maxComputeWorkgroupSizeX": 128}


def test_golden_attention_full(native_device, run):
    started = time.perf_counter()
    report = run(golden.run_all(native_device, "full", families=["attention"]))
    seconds = time.perf_counter() - started
    results = report["families"]["attention"]["results"]
    for r in results:
        if not r["passed"]:
            print("FAILED", r)
    worst = max(r["error_over_tolerance"] for r in results)
    print(f"attention golden: {len(results)} results in {seconds:.1f} s, worst error/tolerance {worst:.3g}")
    kernels = {r["kernel"].split("[")[0] for r in results}
    assert {"kv_append_f32", "attention_decode_f32", "attention_prefill_f32"} <= kernels
    if "shader-f16" in native_device.features:
        assert {"kv_append_f16", "attention_decode_f16", "attention_prefill_f16"} <= kernels
    assert report["passed"], report["failed"]


def test_golden_attention_quick_is_small(native_device, run):
    report = run(golden.run_all(native_device, "quick", families=["attention"]))
    assert report["passed"], report["failed"]
    assert report["cases"] < 60


# -- host-side validation: every problem is refused before a dispatch ------------------

@pytest.mark.parametrize("kwargs, problem", [
    ({"n_heads": 9, "n_kv_heads": 4}, "head-ratio"),
    ({"n_heads": 9, "n_kv_heads": 0}, "head-ratio"),
    ({"head_dim": 42}, "head-dim"),
    ({"head_dim": 512}, "head-dim"),
    ({"capacity": 0}, "shape"),
    ({"capacity": 2 ** 22, "n_kv_heads": 8, "n_heads": 32, "head_dim": 128}, "offset-overflow"),
    ({"dtype": "bf16"}, "shape"),
])
def test_shape_refusals(kwargs, problem):
    base = {"n_heads": 9, "n_kv_heads": 3, "head_dim": 64, "capacity": 100, "dtype": "f32"}
    with pytest.raises(KvShapeError) as error:
        AttentionShape(**{**base, **kwargs})
    assert error.value.problem == problem
    assert isinstance(error.value, ValueError)


def test_position_must_be_inside_the_cache():
    shape = AttentionShape(9, 3, 64, 100)
    plan_decode(CORE, shape, 99)
    for position in (100, 1000, -1):
        with pytest.raises(KvShapeError, match="position"):
            plan_decode(CORE, shape, position)
    plan_prefill(CORE, shape, 90, 10)
    with pytest.raises(KvShapeError, match="position"):
        plan_prefill(CORE, shape, 91, 10)
    with pytest.raises(KvShapeError, match="shape"):
        plan_prefill(CORE, shape, 0, 0)
    plan_append(CORE, shape.layout, 99, 1)
    with pytest.raises(KvShapeError, match="position"):
        plan_append(CORE, shape.layout, 99, 2)


def test_scale_must_be_finite():
    shape = AttentionShape(9, 3, 64, 100)
    for scale in (float("nan"), float("inf"), 1e39, 0.0):
        with pytest.raises(KvShapeError, match="scale"):
            plan_decode(CORE, shape, 5, scale=scale)
        with pytest.raises(KvShapeError, match="scale"):
            plan_prefill(CORE, shape, 0, 5, scale=scale)


def test_buffers_past_the_binding_limit_are_refused():
    shape = AttentionShape(32, 8, 128, 40000)        # 164 MB per f32 cache buffer
    with pytest.raises(KvShapeError) as error:
        plan_decode(CORE, shape, 10)
    assert error.value.problem == "binding-size"
    plan_decode({**CORE, "maxStorageBufferBindingSize": 2 ** 31}, shape, 10)


def test_workgroup_follows_the_device():
    assert pick_workgroup(COMPAT, 256) == 128
    assert pick_workgroup(CORE, 256) == 256
    assert plan_decode(COMPAT, AttentionShape(9, 3, 64, 10), 5).chunk_pass.overrides["WG"] == 128
    assert plan_prefill(COMPAT, AttentionShape(9, 3, 64, 10), 0, 5, variant="tiles").dispatch.overrides["WG"] <= 128
    # head_dim <= 64: a query row per invocation (64 invocations, 16 KiB), on compatibility devices too
    for limits in (COMPAT, CORE):
        rows = plan_prefill(limits, AttentionShape(9, 3, 64, 200), 0, 130)
        assert rows.dispatch.kernel == "attention_prefill_rows_f32" and rows.dispatch.overrides == {"HD4": 16}
        assert rows.dispatch.grid == (3 * -(-130 * 3 // 64), 1, 1) and (rows.rows, rows.tile) == (64, 16)
    assert plan_prefill(CORE, AttentionShape(32, 8, 128, 200), 0, 9).dispatch.kernel == "attention_prefill_f32"
    assert plan_prefill(CORE, AttentionShape(9, 3, 64, 200), 0, 9, workgroup=64).dispatch.kernel == \
        "attention_prefill_f32"                  # a workgroup size is the tiles kernel's override
    with pytest.raises(KvShapeError, match="variant"):
        plan_prefill(CORE, AttentionShape(32, 8, 128, 200), 0, 9, variant="rows")
    with pytest.raises(KvShapeError, match="variant"):
        plan_prefill({**CORE, "maxComputeWorkgroupStorageSize": 8192}, AttentionShape(9, 3, 64, 200), 0, 9,
                     variant="rows")
    with pytest.raises(KvShapeError, match="workgroup"):
        plan_decode(COMPAT, AttentionShape(9, 3, 64, 10), 5, workgroup=256)
    with pytest.raises(KvShapeError, match="device"):
        plan_decode({**CORE, "maxComputeWorkgroupStorageSize": 8192}, AttentionShape(9, 3, 64, 10), 5)


def test_decode_is_split_only_when_long():
    short = plan_decode(CORE, AttentionShape(9, 3, 64, 5000), 10)
    assert short.n_chunks == 1 and short.combine is None
    long = plan_decode(CORE, AttentionShape(9, 3, 64, 5000), 4095)
    assert long.n_chunks > 1 and long.combine is not None
    assert long.chunk * long.n_chunks >= 4096 > long.chunk * (long.n_chunks - 1)
    wide = plan_decode(CORE, AttentionShape(32, 1, 128, 5000), 4095, heads_per_workgroup=8)
    assert wide.chunk_pass.overrides["GW"] == 8 and wide.chunk * 8 <= 2048   # MQA: 4 blocks of 8
    assert plan_decode(CORE, AttentionShape(9, 3, 64, 5000), 4095, heads_per_workgroup=8) \
        .chunk_pass.overrides["GW"] == 3
    # one head per workgroup, two once the context's K/V pass 8 MiB
    assert plan_decode(CORE, AttentionShape(32, 8, 128, 5000), 1023).chunk_pass.overrides["GW"] == 1
    assert plan_decode(CORE, AttentionShape(32, 8, 128, 5000), 4095).chunk_pass.overrides["GW"] == 2
    assert plan_decode(CORE, AttentionShape(9, 3, 64, 5000), 255).n_chunks == 1
    assert plan_decode(CORE, AttentionShape(9, 3, 64, 5000), 4095, chunk=500).n_chunks == 9
    with pytest.raises(KvShapeError):
        plan_decode(CORE, AttentionShape(9, 3, 64, 5000), 4095, chunk=2000, heads_per_workgroup=3)  # 3 x 2000 > 2048


def test_layout_indexing():
    layout = KvLayout(3, 100, 64, "f16")
    assert layout.index(2, 5) == (2 * 100 + 5) * 64
    assert layout.nbytes == 3 * 100 * 64 * 2


# -- the comparison must be able to fail ----------------------------------------------

def _case(rng, t, start, heads=9, kv_heads=3, e=64):
    n = start + t
    q = rng.standard_normal((t, heads, e))
    k = rng.standard_normal((n, kv_heads, e)).astype(np.float32).astype(np.float64)
    v = rng.standard_normal((n, kv_heads, e)).astype(np.float32).astype(np.float64)
    return q.astype(np.float32).astype(np.float64), k, v


def _check(got, exact, bound):
    return compare_bound("attention", "test", "case", got, exact, bound, "rule")


@pytest.mark.parametrize("n", [37, 3001])
def test_wrong_kv_head_mapping_fails(n):
    rng = np.random.default_rng(3)
    q, k, v = _case(rng, 1, n - 1)
    exact, bound = error_bound(q, k, v, n - 1, default_scale(64), depth=n + 10, exps=2)
    assert _check(exact, exact, bound).passed
    from webslm.cpu import layers
    # Spread the 3 KV heads over 9 (MHA form): right is h // 3, wrong is h % 3.
    right = layers.attention(q, k[:, np.arange(9) // 3], v[:, np.arange(9) // 3], n - 1)
    assert _check(right, exact, bound).passed
    wrong = layers.attention(q, k[:, np.arange(9) % 3], v[:, np.arange(9) % 3], n - 1)
    assert not _check(wrong, exact, bound).passed


@pytest.mark.parametrize("n", [37, 3001])
def test_missing_last_position_fails(n):
    from webslm.cpu import layers
    rng = np.random.default_rng(4)
    q, k, v = _case(rng, 1, n - 1)
    depth = n + 10
    exact, bound = error_bound(q, k, v, n - 1, default_scale(64), depth=depth, exps=2)
    wrong = layers.attention(q, k[:-1], v[:-1], n - 2)
    assert not _check(wrong, exact, bound).passed


def test_non_causal_prefill_fails():
    from webslm.cpu import layers
    rng = np.random.default_rng(5)
    q, k, v = _case(rng, 20, 30)
    exact, bound = error_bound(q, k, v, 30, default_scale(64), depth=100, exps=20)
    assert _check(exact, exact, bound).passed
    non_causal = layers.attention(q, k, v, 49)   # every row sees all 50 keys
    assert not _check(non_causal, exact, bound).passed
    off_by_one = layers.attention(q, k, v, 31)   # every row sees one key too many
    assert not _check(off_by_one, exact, bound).passed


def test_unwritten_and_overflowed_results_fail():
    rng = np.random.default_rng(6)
    q, k, v = _case(rng, 3, 10)
    exact, bound = error_bound(q, k, v, 10, default_scale(64), depth=30, exps=3)
    holed = exact.copy()
    holed[1, 5] = np.nan
    assert _check(holed, exact, bound).unwritten == 1
    overflowed = exact.copy()
    overflowed[0, 0] = np.inf
    assert not _check(overflowed, exact, bound).passed


def test_bound_is_tight_enough_to_matter():
    """On ordinary data (|v| ~ 1) the bound is some hundreds of f32 roundings, set by the
    summation depth, far below what a wrong position or head changes (~1/n)."""
    rng = np.random.default_rng(7)
    q, k, v = _case(rng, 1, 999)
    exact, bound = error_bound(q, k, v, 999, default_scale(64), depth=200, exps=2)
    assert bound.max() < 1e-4
    assert bound.min() > 200 * 2.0 ** -24 * 0.5


def test_bench_hook_covers_the_shapes():
    assert {"smollm2-135m/decode-1024", "llama-3-8b/decode-4096", "llama-3.2-1b/prefill-512"} <= set(BENCH_SHAPES)
    assert all(s["head_dim"] in (64, 128) for s in BENCH_SHAPES.values())
    assert "attention_decode_f32" in BENCH_KERNELS and "kv_append_f16" in BENCH_KERNELS


def test_bench_prepares_without_readback(native_device, run):
    from webslm.kernels.attention import prepare_bench
    rng = np.random.default_rng(8)
    shape = {"n_heads": 9, "n_kv_heads": 3, "head_dim": 64, "tokens": 1, "context": 300}
    for name in ("attention_decode_f32", "attention_combine_f32", "attention_prefill_f32", "kv_append_f32"):
        prepared = run(prepare_bench(native_device, name, shape, rng))
        assert prepared.bytes_moved > 0
        native_device.submit([prepared.dispatch])
        prepared.release(native_device)
    with pytest.raises(ValueError):
        run(prepare_bench(native_device, "attention_decode_f32", {**shape, "tokens": 4}, rng))
