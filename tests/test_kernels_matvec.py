"""The decode mat-vec family on wgpu-native: golden tests, the bound's power, host checks."""
import dataclasses
import json
import pathlib

import numpy as np
import pytest

from webslm.kernels import golden, matvec as mv
from webslm.kernels import matvec_oracle as mvo

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLM = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"


def _failures(report):
    return json.dumps(report["failed"][:5], indent=1)


def test_every_variant_passes_its_golden_cases(native_device, run):
    report = run(golden.run_all(native_device, "full", seed=3, families=["matvec"]))
    results = report["families"]["matvec"]["results"]
    kernels = {r["kernel"].split("[")[0] for r in results}
    assert kernels == {f"matvec_{e}{s}" for e in mv.ENCODINGS for s in ("", "_subgroup")}
    assert report["passed"], _failures(report)


@pytest.mark.skipif(not SLM.exists(), reason="default model not built (tools/assets.py)")
def test_real_smollm2_weights(native_device, run):
    import webslm
    model = webslm.open_model(SLM)
    report = run(golden.run_all(native_device, "quick", model=model, families=["matvec"]))
    real = [r for r in report["families"]["matvec"]["results"] if r["case"].startswith("real")]
    assert {r["case"].split()[1] for r in real} == {"blk.0.ffn_up", "blk.0.attn_k", "token_embd"}
    assert report["passed"], _failures(report)


def _case(rng, rows=6, cols=33, encoding="q4", zero="min"):
    weights = mv.Weights.quantized(rng.standard_normal((rows, cols)).astype(np.float32), encoding, 32, zero)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    return weights, x


@pytest.mark.parametrize("encoding, zero", [("q4", "min"), ("q4", "offset"), ("q8", None), ("f16", None)])
def test_the_bound_catches_wrong_results(encoding, zero):
    weights, x = _case(np.random.default_rng(5), encoding=encoding, zero=zero or "min")
    exact, bound, rule = mvo.oracle(weights, x)
    w = weights.dequantize().astype(np.float64)

    def verdict(y):
        return golden.compare_bound("matvec", "k", "c", y, exact, bound, rule).passed

    assert verdict(exact.astype(np.float32))
    assert not verdict(x[:, :-1].astype(np.float64) @ w[:, :-1].T)        # the single-element tail dropped
    assert not verdict(np.roll(exact, 1, axis=1))                          # rows shifted by one
    assert not verdict(x.astype(np.float64) @ np.roll(w, 1, axis=1).T)     # columns misaligned
    unwritten = exact.astype(np.float32).copy()
    unwritten[0, 2] = np.nan
    assert golden.compare_bound("matvec", "k", "c", unwritten, exact, bound, rule).unwritten == 1


def test_q4_min_padding_decodes_to_the_min_so_x_must_be_masked():
    """Why the kernels mask x rather than trusting zero codes: a padding code 0 decodes to
    `min`, which is not zero, so padding weights times unmasked x would add to y."""
    weights, _ = _case(np.random.default_rng(6), cols=33)
    descriptor = {"block_elements": 32, "zero": "min", "scale_type": "f16"}
    full = mv.quant.dequantize("q4", (weights.rows, 64), descriptor, weights.parts)
    assert np.all(full[:, 33:] != 0)


def test_padding_is_nan_so_an_unmasked_kernel_cannot_pass(native_device, run):
    xs, stride = mv.padded_activations(np.ones((2, 5), np.float32))
    assert stride == 8 and np.isnan(xs[:, 5:]).all()
    weights, x = _case(np.random.default_rng(7), rows=5, cols=37)
    y = run(mv.matvec(native_device, weights, x))
    exact, bound, rule = mvo.oracle(weights, x)
    assert golden.compare_bound("matvec", "k", "c", y, exact, bound, rule).passed


def test_shapes_are_checked_before_any_gpu_work(native_device):
    weights, _ = _case(np.random.default_rng(8))
    with pytest.raises(ValueError, match="multiple of 4"):
        mv.check_shapes(native_device, weights, 1, 34)
    with pytest.raises(ValueError, match="z limit"):
        mv.check_shapes(native_device, weights, 70_000, 36)
    with pytest.raises(ValueError, match="no 'q3' encoding"):
        mv.check_shapes(native_device, dataclasses.replace(weights, encoding="q3"), 1, 36)
    huge = dataclasses.replace(weights, parts={**weights.parts,
                                               "codes": bytes(native_device.limits["maxStorageBufferBindingSize"] + 4)})
    with pytest.raises(ValueError, match="maxStorageBufferBindingSize"):
        mv.check_shapes(native_device, huge, 1, 36)
    with pytest.raises(ValueError, match="columns"):
        import asyncio
        asyncio.run(mv.matvec(native_device, weights, np.ones((1, 32), np.float32)))


def test_variant_choice_follows_the_device(monkeypatch):
    monkeypatch.setattr(mv, "TUNING", mv.Tuning())      # the shapes below follow the base rule, not a device's tuning
    weights, _ = _case(np.random.default_rng(9))

    class Device:
        features = frozenset()
        limits = {"maxComputeInvocationsPerWorkgroup": 128, "maxComputeWorkgroupSizeX": 128}

    name, overrides = mv.choose_kernel(Device, weights, workgroup=256)
    assert name == "matvec_q4" and overrides["WG"] == 128
    assert overrides == {"WG": 128, "ROWS": 4, "BLOCK": 32, "SCALE_F16": 1, "ZERO_MIN": 1}
    Device.features = frozenset({"subgroups"})
    assert mv.choose_kernel(Device, weights)[0] == "matvec_q4_subgroup"
