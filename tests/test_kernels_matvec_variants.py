"""The mat-vec variants on wgpu-native (kernels/matvec_variants.py, golden family
"matvec_variants"): q4_dot4 / q8_dot4 (int8 activations, dot4I8Packed) and f16_wide in every
input mode, with ACCUMULATE; the int8 rounding's bound and its power; the host's choice."""
import json
import pathlib

import numpy as np
import pytest

import webslm
from webslm.kernels import golden, matvec as mv
from webslm.kernels import matvec_oracle as mvo
from webslm.kernels.matvec_variants import exact_int8_activations
from webslm.kernels.registry import KernelError, compile_kernel

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLM = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"


def _failures(report):
    return json.dumps([f"{r['kernel']} | {r['case']}: over={r['error_over_tolerance']:.3g} "
                       f"unwritten={r['unwritten']}" for r in report["failed"][:10]], indent=1)


def test_every_variant_passes_its_golden_cases(native_device, run):
    report = run(golden.run_all(native_device, "full", seed=5, families=["matvec_variants"]))
    results = report["families"]["matvec_variants"]["results"]
    assert report["passed"], _failures(report)
    seen = {(r["kernel"].split("[")[0], "ACCUMULATE=1" in r["kernel"]) for r in results}
    subgroup = (False, True) if "subgroups" in native_device.features else (False,)
    for encoding, variants in mv.VARIANTS.items():
        for variant in variants:
            for s in subgroup:
                for input in set(mv.INPUTS) - {"int8"}:      # "int8": the matvec_prequant family (below)
                    for accumulate in (False, True):
                        assert (mv.kernel_name(encoding, s, input, variant), accumulate) in seen
    shapes = {r["kernel"].split("[")[1] for r in results if "ROWS=16" in r["kernel"] and "WG=32" in r["kernel"]}
    assert shapes, "ROWS=16 was not run"
    assert {"RESIDUAL=0" in r["kernel"] for r in results if "dot4" in r["kernel"]} == {True, False}
    cases = " ".join(r["case"] for r in results)
    for word in ("int8-exact x", "outlier 1e3", "zero units", "off-grid ties", "doubled scale", "tiny x",
                 "huge x", "extreme gates", "max codes", "min codes", "mixed codes", "7x33", "129x4099"):
        assert word in cases, word
    # exactly quantized activations leave the plain mat-vec's rounding bound alone: those cases
    # pass under gamma(n) with the int8 term 0 (checked by the bound itself, see below)
    assert any("int8-exact" in r["case"] and r["passed"] for r in results)


@pytest.mark.skipif(not SLM.exists(), reason="default model not built (tools/assets.py)")
def test_real_smollm2_weights(native_device, run):
    model = webslm.open_model(SLM)
    report = run(golden.run_all(native_device, "quick", model=model, seed=6, families=["matvec_variants"]))
    real = [r for r in report["families"]["matvec_variants"]["results"] if r["case"].startswith("real")]
    assert {r["case"].split()[1] for r in real} == {"blk.0.ffn_up", "blk.0.attn_k", "token_embd", "blk.0.ffn_down"}
    assert any("norm" in r["case"] for r in real) and any("swiglu" in r["case"] for r in real)
    assert report["passed"], _failures(report)


def _q(encoding="q4", zero="min", rows=6, cols=70, seed=5):
    rng = np.random.default_rng(seed)
    w = mv.Weights.quantized(rng.standard_normal((rows, cols)).astype(np.float32), encoding, 32, zero)
    return w, exact_int8_activations(rng, 1, cols, mv.UNIT_ELEMENTS[encoding], (0, 1))     # d = 1 everywhere


@pytest.mark.parametrize("encoding, zero", [("q4", "min"), ("q4", "offset"), ("q8", None)])
def test_the_int8_bound_catches_wrong_results(encoding, zero):
    """On exactly quantized activations the int8 term is 0, so the bound is the plain
    mat-vec's: one activation off by one step of its unit's scale, the bytes of a word in the
    wrong order, a dropped tail or shifted rows all fail it."""
    weights, x = _q(encoding, zero or "min")
    exact, bound, rule = mvo.fused_oracle(weights, x, int8=1)
    assert "int8" in rule
    assert np.array_equal(mvo.int8_error(x, 0.0, mv.UNIT_ELEMENTS[encoding]), np.zeros_like(x))
    w = weights.dequantize().astype(np.float64)

    def verdict(y):
        return golden.compare_bound("matvec", "k", "c", y, exact, bound, rule).passed

    def product(x_):
        return x_.astype(np.float64) @ w.T
    assert verdict(exact.astype(np.float32))
    step = x.copy()
    step[0, 40] += np.float32(1.0)                                          # one byte off by one step
    assert not verdict(product(step))
    swapped = x.copy()
    swapped[0, 0:2] = swapped[0, [1, 0]]                                   # even/odd bytes swapped
    assert not verdict(product(swapped))
    assert not verdict(x[:, :-1].astype(np.float64) @ w[:, :-1].T)         # the tail dropped
    assert not verdict(np.roll(exact, 1, axis=1))                          # rows shifted by one


def test_int8_rounding_is_bounded_on_random_activations():
    """Random activations: the int8 term is sum |s c| delta with delta up to the unit's scale;
    a result that rounds every activation to its byte (as the kernel does) stays inside it."""
    weights, _ = _q("q4", "min", rows=8, cols=96)
    x = np.random.default_rng(7).standard_normal((1, 96)).astype(np.float32)
    exact, bound, rule = mvo.fused_oracle(weights, x, int8=1)
    plain = mvo.fused_oracle(weights, x)[1]
    residual = mvo.fused_oracle(weights, x, int8=2)[1]
    assert np.all(bound > 10 * plain)                                       # the rounding dominates
    assert np.all(residual < bound / 30)                                    # 64 times finer, and then f32
    units = x.reshape(1, -1, 32)
    d = mvo.int8_scale(np.abs(units).max(axis=2))[..., None]
    rounded = (np.round(units / d) * d).reshape(1, -1)
    assert np.abs(rounded - x).max() <= d.max() / 2
    assert golden.compare_bound("m", "k", "c", rounded @ weights.dequantize().astype(np.float64).T,
                                exact, bound, rule).passed


def test_int8_scale_follows_the_wgsl():
    amax = np.array([0.0, 1.0, 127 / 64, 1.99, 2.0, 1e-38, 3e38], np.float32)
    d = mvo.int8_scale(amax)
    assert list(d[:5]) == [2.0 ** -120, 2.0 ** -6, 2.0 ** -6, 2.0 ** -5, 2.0 ** -5]
    assert d[5] == 2.0 ** -120 and np.all(np.abs(amax / d) <= 127)
    # the error bound: exact multiples 0, anything else one step; inexact inputs a whole binade
    t = np.array([[64 * 2.0 ** -6, 0.5, 3 * 2.0 ** -6, 1e-3]], np.float32)
    assert list(mvo.int8_error(t, 0.0, 4)[0]) == [0.0, 0.0, 0.0, 2.0 ** -6]
    assert np.all(mvo.int8_error(t, 1e-7, 4) == 2.0 ** -5)
    # with the residual byte: steps of d / 64
    t[0, 2] += np.float32(2.0 ** -12)
    assert list(mvo.int8_error(t, 0.0, 4, residual=True)[0]) == [0.0, 0.0, 0.0, 2.0 ** -12]


def test_variants_need_their_conditions(native_device, run):
    weights, _ = _q("f16", rows=4, cols=70)
    with pytest.raises(mv.MatvecShapeError, match="% 8"):
        mv.choose_kernel(native_device, weights, variant="wide")
    with pytest.raises(mv.MatvecShapeError, match="no mat-vec variant"):
        mv.choose_kernel(native_device, weights, variant="dot4")
    with pytest.raises(mv.MatvecShapeError, match="% 8"):
        run(mv.matvec(native_device, weights, np.ones((1, 70), np.float32), "matvec_f16_wide",
                      {"WG": 32, "ROWS": 4}))

    class Plain:          # a device whose WGSL lacks packed_4x8_integer_dot_product
        features = native_device.features
        limits = native_device.limits
        wgsl_language_features = frozenset()
        implicit_wgsl_enables = getattr(native_device, "implicit_wgsl_enables", frozenset())
    q4, _ = _q()
    with pytest.raises(mv.MatvecShapeError, match="packed_4x8"):
        mv.choose_kernel(Plain, q4, variant="dot4")
    assert mv.choose_kernel(Plain, q4, tuning=mv.Tuning(activations="int8"))[0] == \
        mv.kernel_name("q4", "subgroups" in Plain.features)
    with pytest.raises(KernelError, match="packed_4x8"):
        run(compile_kernel(Plain, "matvec_q4_dot4", WG=32, ROWS=4))


def test_choice_follows_the_tuning(monkeypatch):
    monkeypatch.setattr(mv, "TUNING", mv.Tuning())      # the defaults below are the base rule's
    class Device:
        features = frozenset({"subgroups"})
        limits = {"maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupSizeX": 256,
                  "maxComputeWorkgroupStorageSize": 16384}
        wgsl_language_features = frozenset({"packed_4x8_integer_dot_product"})
    big = mv.Weights("q4", 14336, 4096, {}, 32, "min", "f16")
    small = mv.Weights("q4", 576, 1536, {}, 32, "min", "f16")
    f16 = mv.Weights("f16", 2048, 8192, {})
    name, o = mv.choose_kernel(Device, big, tuning=mv.Tuning(activations="int8x2", units_per_invocation=1,
                                                             rows=16, min_workgroups=1024))
    assert name == "matvec_q4_dot4_subgroup" and o["WG"] == 128 and o["ROWS"] == 8     # 14336 / 16 < 1024
    assert o["RESIDUAL"] == 1
    assert mv.choose_kernel(Device, big, tuning=mv.Tuning(activations="int8"))[1]["RESIDUAL"] == 0
    with pytest.raises(mv.MatvecShapeError, match="activations"):
        mv.choose_kernel(Device, big, tuning=mv.Tuning(activations="int4"))
    name, o = mv.choose_kernel(Device, small, tuning=mv.Tuning(rows=16, min_workgroups=256))
    assert name == "matvec_q4_subgroup" and o["ROWS"] == 2 and o["WG"] == 32
    assert mv.choose_kernel(Device, f16)[0] == "matvec_f16_wide_subgroup"
    assert mv.choose_kernel(Device, f16, tuning=mv.Tuning(wide_f16=False))[0] == "matvec_f16_subgroup"
    # 16 rows x 256 invocations of row sums do not fit 16 KiB with the norm's slots: WG steps down
    name, o = mv.choose_kernel(Device, big, workgroup=256, rows_per_group=16)
    assert o["WG"] == 128 and mv.workgroup_bytes(16, 128) <= 16384 < mv.workgroup_bytes(16, 256)
    with pytest.raises(mv.MatvecShapeError, match="rows per workgroup"):
        mv.choose_kernel(Device, big, rows_per_group=3)
    # the plan's grid follows the ROWS chosen
    Device.limits = {**Device.limits, "maxComputeWorkgroupsPerDimension": 65535,
                     "maxStorageBufferBindingSize": 1 << 27}
    w, _ = _q(rows=40, cols=64)
    assert mv.plan(Device, w, 1, 64, 40).grid == (10, 1, 1)
    assert mv.plan(Device, w, 1, 64, 40, rows_per_group=16).grid == (3, 1, 1)


def test_the_pre_quantized_path_passes_its_golden_cases(native_device, run):
    """quantize_x (every input mode) then the packed-dot mat-vec on its bytes
    (kernels/matvec_prequant.py) for q4, q8, q4k and q6k, under the int8 bound with units of 32,
    with and without ACCUMULATE, on several launch shapes, the adversarial activations, extreme
    codes and (q4k, q6k) extreme scales included."""
    report = run(golden.run_all(native_device, "full", seed=5, families=["matvec_prequant"]))
    results = report["families"]["matvec_prequant"]["results"]
    assert report["passed"], _failures(report)
    labels = " ".join(r["kernel"] for r in results)
    for input in ("plain", "norm", "swiglu"):
        for kernel in ("matvec_int8_q4_dot4", "matvec_int8_q8_xq", "matvec_int8_q4k_xq", "matvec_int8_q6k_xq"):
            assert f"quantize_x_{input}+{kernel}" in labels, (input, kernel)
    assert "'ROWS': 16" in labels and "'WG': 256" in labels
    for kernel in ("matvec_int8_q4_dot4", "matvec_int8_q8_xq", "matvec_int8_q4k_xq", "matvec_int8_q6k_xq"):
        assert any(r["kernel"].startswith(f"quantize_x_norm+{kernel}") and "'SQUARES': 1" in r["kernel"]
                   for r in results), kernel
    cases = " ".join(r["case"] for r in results)
    for word in ("int8-exact x", "outlier 1e3", "doubled scale", "huge x", "extreme gates", "max codes", "+y0",
                 "129x4099", "extreme scales 40x512 q4k", "4x4096 q4k", "extreme scales 40x512 q6k",
                 "4x4096 q6k"):
        assert word in cases, word


@pytest.mark.parametrize("name", ["q4/WG=32/ROWS=4", "q8/WG=32/ROWS=8", "q4k/WG=64/ROWS=4", "q6k/WG=32/ROWS=16",
                                  "q4/WG=32/ROWS=8/BYTES=1", "q8/WG=32/ROWS=8/BYTES=1", "q6k/WG=32/ROWS=8/BYTES=1"])
def test_the_pre_quantized_bench_hook_times_the_right_product(native_device, run, name):
    """bench/kernels.py --families matvec_prequant: the launch it times computes W x within the
    int8 bound, for the weights and x its seed makes."""
    from webslm.kernels import golden, matvec_prequant
    shape = {"rows": 40, "cols": 512}
    prepared = run(matvec_prequant.prepare_bench(native_device, name, shape, np.random.default_rng(3)))
    try:
        native_device.submit([prepared.dispatch])
        (y,) = run(prepared.read_outputs(native_device))
    finally:
        prepared.release(native_device)
    rng = np.random.default_rng(3)                      # the same draws as prepare_bench
    weights = mv.random_weights_fast(rng, name.split("/")[0], 40, 512)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    exact, bound, rule = mvo.fused_oracle(weights, x, int8=1 if name.endswith("BYTES=1") else 2, int8_unit=32)
    assert golden.compare_bound("matvec_prequant", name, "bench", y.reshape(1, -1), exact, bound, rule).passed
    assert prepared.bytes_moved > weights.nbytes and prepared.flops == 2 * 40 * 512


@pytest.mark.parametrize("encoding", ["q4", "q8"])
@pytest.mark.parametrize("input", ["plain", "norm", "swiglu"])
def test_quantize_x_makes_the_same_bytes_on_any_number_of_workgroups(native_device, run, encoding, input):
    """quantize_x spreads a row's units over ceil(units / WG) workgroups (one unit a lane) and
    workgroup 0 alone writes the header (norm: 1/rms of the whole row). Every unit's words must
    be bit for bit those of one workgroup taking the whole row (WG 256 over 129 units), on a
    row with a partial last unit and a partial last workgroup at WG 32, 64 and 128; the header
    sums the same squares in another order, so it agrees to f32 rounding."""
    from webslm.kernels import matvec_prequant
    rng = np.random.default_rng(11)
    cols = 4099                                         # 129 units of 32, the last one of 3
    weights = mv.random_weights_fast(rng, encoding, 8, cols)
    x = (3 * rng.standard_normal((2, cols))).astype(np.float32)
    x[1, 700] = 40.0                                    # an outlier unit, as SmolLM2 has
    norm_weight = rng.standard_normal(cols).astype(np.float32) if input == "norm" else None
    if input == "swiglu":
        x = mv.gate_up_row(x, rng.standard_normal((2, cols)), cols + 1)
    ctx = golden.GoldenContext(native_device, rng)
    words = []
    for size in (256, 32, 64, 128):
        xq = run(matvec_prequant.run(ctx, weights, x, input=input, norm_weight=norm_weight,
                                     eps=1e-5 if input == "norm" else None,
                                     up_offset=cols + 1 if input == "swiglu" else None,
                                     quantize_workgroup=size, quantized_only=True))
        words.append(xq)
    one = words[0]
    assert one.shape == (2, 4 * (1 + 5 * 129))
    header = one[:, :4].view(np.float32)[:, 0]
    assert np.all(np.isfinite(header)) and np.all(header > 0)
    if input == "norm":                                 # 1/rms, from the oracle
        expect = 1 / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1) + 1e-5)
        np.testing.assert_allclose(header, expect, rtol=1e-5)
    else:
        assert np.all(header == 1.0)
    assert np.any(one[:, 4:] != 0)
    for other in words[1:]:
        np.testing.assert_array_equal(other[:, 4:], one[:, 4:])
        np.testing.assert_allclose(other[:, :4].view(np.float32)[:, 0], header, rtol=1e-6)


@pytest.mark.parametrize("encoding", ["q4", "q8"])
def test_the_norm_quantizers_unit_squares_are_each_units_x_squared(native_device, run, encoding):
    """quantize_x norm with UNIT_SQUARES ("xq2s"): every unit's bytes, scale and sum are those of
    the header form, and its third word's z is the f32 sum of its own x squared (not x * g),
    a partial last unit included; the header form leaves z at 0. On 1, 3 and 5 workgroups."""
    from webslm.kernels import matvec_prequant
    rng = np.random.default_rng(12)
    cols = 4099                                         # 129 units of 32, the last one of 3
    weights = mv.random_weights_fast(rng, encoding, 8, cols)
    x = (3 * rng.standard_normal((2, cols))).astype(np.float32)
    x[1, 700] = 40.0
    g = rng.standard_normal(cols).astype(np.float32)
    ctx = golden.GoldenContext(native_device, rng)

    def words(squares, size):
        xq = run(matvec_prequant.run(ctx, weights, x, input="norm", norm_weight=g, eps=1e-5, quantize_workgroup=size,
                                     quantized_only=True, squares=squares))
        return xq[:, 4:].reshape(2, 129, 5, 4)          # the units, past the header
    header_form = words(False, 256)
    padded = np.zeros((2, 129 * 32), np.float64)
    padded[:, :cols] = x
    expect = (padded.reshape(2, 129, 32) ** 2).sum(axis=2)
    for size in (256, 64, 32):
        units = words(True, size)
        same = [0, 1, 3, 4]                             # even, odd and the residual words
        np.testing.assert_array_equal(units[:, :, same], header_form[:, :, same])
        np.testing.assert_array_equal(units[:, :, 2, :2], header_form[:, :, 2, :2])    # d, sum
        np.testing.assert_allclose(units[:, :, 2, 2].view(np.float32), expect, rtol=1e-5)
    assert np.all(header_form[:, :, 2, 2] == 0)
    with pytest.raises(mv.MatvecShapeError, match="norm input only"):
        matvec_prequant.plan(native_device, weights, 1, cols + 1, 8, "plain", squares=True)
