"""The residual projection that quantizes its own output for the next mat-vec
(kernels/matvec_quantize_out.py) on wgpu-native: its golden family, its host-side refusals, and
checks that must fail a wrong unit."""
import numpy as np
import pytest

from webslm.kernels import golden, matvec, matvec_prequant
from webslm.kernels import matvec_quantize_out as mqo
from webslm.kernels.matvec import MatvecShapeError

FAMILY = "matvec_quantize_out"


def _results(report):
    return report["families"][FAMILY]["results"]


def test_golden_matvec_quantize_out_full(native_device, run):
    """Every pre-quantized encoding, both byte widths and orders, one to sixteen rows a block,
    both outputs (for a norm reader; gate|up for down, on a norm input of its own): y equal to
    the plain mat-vec's bit for bit, the units' bytes and scales to quantize_x's word for word,
    their two sums within SUMS_BOUND, gate|up's header equal."""
    report = run(golden.run_all(native_device, "full", families=[FAMILY]))
    assert report["passed"], report["failed"]
    results = _results(report)
    labels = " ".join(r["kernel"] for r in results)
    for encoding in matvec.PREQUANT_VARIANTS:
        assert f"_int8_{encoding}_" in labels, encoding
    for form in ("OUT_NATURAL=0", "OUT_NATURAL=1", "RESIDUAL=0", "RESIDUAL=1", "ROW_BLOCKS=32", "ROW_BLOCKS=2",
                 "SWIGLU_OUT=1", "ROW_NORM=1"):
        assert form in labels, form
    cases = [r["case"] for r in results]
    launches = sum("y against the plain mat-vec" in case for case in cases)
    swiglu = sum("xq_out header" in case for case in cases)
    assert 0 < swiglu < launches and len(results) == 3 * launches + swiglu
    for check in ("bytes and scales against quantize_x", "sums against quantize_x"):
        assert sum(check in case for case in cases) == launches, check
    exact = [r for r in results if r["rule"] == "exact"]
    assert all(r["mismatched"] == 0 for r in exact)


def test_golden_matvec_quantize_out_quick_is_small(native_device, run):
    report = run(golden.run_all(native_device, "quick", families=[FAMILY]))
    assert report["passed"], report["failed"]
    assert 6 <= len(_results(report)) <= 16


def _prequant_plan(device, rows, cols=256, **kwargs):
    weights = matvec.random_weights_fast(np.random.default_rng(0), "q4", rows, cols)
    return weights, matvec_prequant.plan(device, weights, 1, cols, rows, **kwargs)


def test_rows_that_are_not_whole_units_are_refused(native_device):
    weights, p = _prequant_plan(native_device, 48)
    with pytest.raises(MatvecShapeError, match="whole units"):
        mqo.plan(native_device, p.matvec, weights, 1, False)


def test_gate_up_halves_that_are_not_whole_units_are_refused(native_device):
    weights, p = _prequant_plan(native_device, 96)          # halves of 48 rows
    with pytest.raises(MatvecShapeError, match="whole units"):
        mqo.plan(native_device, p.matvec, weights, 1, False, swiglu=True)
    weights, p = _prequant_plan(native_device, 128)
    out = mqo.plan(native_device, p.matvec, weights, 1, False, swiglu=True)
    assert out.grid == (2, 1, 1) and out.overrides["SWIGLU_OUT"] == 1
    assert mqo.out_bytes(128, swiglu=True) == matvec_prequant.xq_bytes(2)


def test_the_plan_owns_one_unit_a_workgroup(native_device):
    weights, p = _prequant_plan(native_device, 4096, rows_per_group=8, workgroup=64)
    out = mqo.plan(native_device, p.matvec, weights, 1, True)
    assert out.grid == (4096 // 32, 1, 1) and out.overrides["ROW_BLOCKS"] * out.overrides["ROWS"] == 32
    assert out.overrides["OUT_NATURAL"] == 1 and out.params is p.matvec.params
    assert out.inputs == ("xq", "next_norm")
    assert mqo.out_bytes(4096) == matvec_prequant.xq_bytes(128)


def test_a_changed_unit_fails_the_comparison(native_device, run):
    """The family's checks fail a wrong unit: one bit of the bytes (exact), a doubled scale
    (exact), and a sum off by much more than the contraction bound."""
    ctx = golden.GoldenContext(native_device, np.random.default_rng(3))
    weights = matvec.random_weights_fast(ctx.rng, "q4", 64, 256)
    x = ctx.rng.standard_normal((1, 256)).astype(np.float32)
    y0 = ctx.rng.standard_normal((1, 64)).astype(np.float32)
    g = (1 + 0.5 * ctx.rng.standard_normal(64)).astype(np.float32)
    y, xq_out, _ = run(mqo.run(ctx, weights, x, y0, g, workgroup=32, rows_per_group=4))
    reader = matvec.random_weights_fast(ctx.rng, "q4", 4, 64)
    want = run(matvec_prequant.run(ctx, reader, y, input="norm", norm_weight=g, eps=1e-5, squares=True,
                                   quantized_only=True))

    def failed(got):
        values, squares = y.astype(np.float64) * g, y.astype(np.float64) ** 2
        return [not r.passed for r in mqo._compare_units("k", "c", got[:, 4:], want[:, 4:], 5, values, squares)]
    assert failed(xq_out) == [False, False]
    for word, change in ((4 + 20 + 1, lambda v: v ^ (1 << 9)),          # unit 1's odd bytes, one bit
                         (4 + 8, lambda v: v + (1 << 23)),              # unit 0's scale d, doubled
                         (4 + 20 + 9, lambda v: np.float32(np.uint32(v).view(np.float32) * 1.01).view(np.uint32))):
        bad = xq_out.copy()
        bad[0, word] = change(bad[0, word])
        assert any(failed(bad)), word
