"""Decode attention that quantizes its output for the o projection (kernels/attention_xq.py)
on wgpu-native: its golden family, its host-side refusals, and a check that must fail a
wrong byte."""
import numpy as np
import pytest

from webslm.kernels import attention_xq as axq
from webslm.kernels import golden, matvec, matvec_prequant
from webslm.kernels.attention import AttentionShape, make_case, plan_decode
from webslm.kernels.kv_cache import KvShapeError

CORE = {"maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupSizeX": 256,
        "maxComputeWorkgroupStorageSize": 16384, "maxStorageBufferBindingSize": 2 ** 27,
        "maxComputeWorkgroupsPerDimension": 65535}


def _results(report):
    return report["families"]["attention_xq"]["results"]


def test_golden_attention_xq_full(native_device, run):
    """Every case's output within attention's bound and its bytes equal to quantize_x_plain's
    from that output, word for word, for both cache types, byte widths and orders."""
    report = run(golden.run_all(native_device, "full", families=["attention_xq"]))
    results = _results(report)
    assert report["passed"], report["failed"]
    kernels = {r["kernel"].split("[")[0] for r in results}
    assert kernels == {"attention_decode_xq_f32", "attention_decode_xq_f16"}
    labels = " ".join(r["kernel"] for r in results)
    for form in ("NATURAL=0,RESIDUAL=0", "NATURAL=0,RESIDUAL=1", "NATURAL=1,RESIDUAL=0", "NATURAL=1,RESIDUAL=1"):
        assert form in labels, form
    cases = " ".join(r["case"] for r in results)
    for word in ("E=32", "E=64", "E=128", "E=256", "keys=1 ", "huge", "identical", "against quantize_x_plain"):
        assert word in cases, word
    assert sum("against quantize_x_plain" in r["case"] for r in results) * 2 == len(results)


def test_golden_attention_xq_quick_is_small(native_device, run):
    report = run(golden.run_all(native_device, "quick", families=["attention_xq"]))
    assert report["passed"], report["failed"]
    assert 4 <= len(_results(report)) <= 16


@pytest.mark.parametrize("head_dim", [40, 48, 4])
def test_a_head_that_is_not_whole_units_is_refused(head_dim):
    shape = AttentionShape(4, 2, head_dim, 16)
    plan = plan_decode(CORE, shape, 3)
    assert not axq.fits(shape)
    with pytest.raises(KvShapeError, match="straddle"):
        axq.quantized_chunk_pass(plan.chunk_pass, shape, True, False)


def test_the_split_pass_is_not_run_as_the_quantizing_one(native_device, run):
    """More than one chunk: the kernel would leave xq unwritten (the combine writes out), so
    the test runner refuses it; the engine records quantize_x after the combine instead."""
    shape = AttentionShape(9, 3, 64, 300)
    plan = plan_decode(native_device.limits, shape, 199, chunk=64)
    dispatch = axq.quantized_chunk_pass(plan.chunk_pass, shape, True, False)
    q, k, v = make_case(np.random.default_rng(0), shape, 1, 199, "random")
    with pytest.raises(KvShapeError, match="one pass"):
        run(axq.run_decode(native_device, None, dispatch, plan, shape, q, k, v))


def test_one_changed_byte_fails_the_comparison(native_device, run):
    """The family's byte check is exact: the fused kernel's words with one bit flipped in one
    unit's bytes no longer match quantize_x_plain's."""
    ctx = golden.GoldenContext(native_device, np.random.default_rng(4))
    shape = AttentionShape(8, 2, 64, 40)
    plan = plan_decode(native_device.limits, shape, 34, chunk=35)
    dispatch = axq.quantized_chunk_pass(plan.chunk_pass, shape, True, False)
    kernel = run(ctx.kernel(dispatch.kernel, **dispatch.overrides))
    q, k, v = make_case(ctx.rng, shape, 1, 34, "random")
    out, xq = run(axq.run_decode(native_device, kernel, dispatch, plan, shape, q, k, v))
    o_weights = matvec.random_weights_fast(ctx.rng, "q4", 4, 8 * 64)
    want = run(matvec_prequant.run(ctx, o_weights, out.reshape(1, -1), quantized_only=True)).reshape(-1)
    assert np.array_equal(xq, want)
    assert xq.size == axq.xq_words(shape, True) == 4 * (1 + 5 * 16)
    bad = xq.copy()
    bad[4 + 20 * 7] ^= 1 << 9                      # unit 7's even words, one bit
    assert golden.compare_exact("attention_xq", "k", "c", bad, want).mismatched == 1
