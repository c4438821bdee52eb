"""The fused decode kernels on wgpu-native: mat-vec with the RMSNorm or SwiGLU input and
ACCUMULATE (kernels/matvec.py, golden family "matvec_fused"), and RoPE + KV append in one
dispatch (kernels/rope_kv.py, family "rope_kv"): golden suites, proof that each rule fails
wrong results, and the host-side checks before any dispatch."""
import json
import pathlib

import numpy as np
import pytest

import webslm
from webslm.cpu import layers
from webslm.kernels import golden, matvec as mv, rope_kv
from webslm.kernels import matvec_oracle as mvo
from webslm.kernels.kv_cache import KvLayout, KvShapeError, append_reference
from webslm.kernels.registry import KERNELS
from webslm.kernels.rope import rope_table
from webslm.webgpu.interface import BufferBinding

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLM = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
CORE = {"maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupSizeX": 256,
        "maxComputeWorkgroupStorageSize": 16384, "maxComputeWorkgroupsPerDimension": 65535,
        "maxStorageBufferBindingSize": 128 << 20}


def _failures(report):
    return json.dumps([f"{r['kernel']} | {r['case']}: over={r['error_over_tolerance']:.3g} "
                       f"unwritten={r['unwritten']} mismatched={r['mismatched']}" for r in report["failed"][:10]],
                      indent=1)


@pytest.fixture(scope="module")
def models(fixture_slm_path):
    """The fixture model (adjacent-pair RoPE, rotary 8 of 12, f16 norm weights, q8 down) and
    SmolLM2 when set-up has built it."""
    found = [webslm.open_model(fixture_slm_path)]
    if SLM.is_file():
        found.append(webslm.open_model(SLM))
    return found


# -- golden suites -----------------------------------------------------------------------------

def test_matvec_fused_full_covers_every_variant(native_device, run):
    report = run(golden.run_all(native_device, "full", seed=3, families=["matvec_fused"]))
    results = report["families"]["matvec_fused"]["results"]
    assert report["passed"], _failures(report)
    seen = {(r["kernel"].split("[")[0], "ACCUMULATE=1" in r["kernel"]) for r in results}
    subgroup = ("", "_subgroup") if "subgroups" in native_device.features else ("",)
    for encoding in mv.ENCODINGS:
        for s in subgroup:
            for input in ("norm", "swiglu"):
                for accumulate in (False, True):
                    assert (mv.kernel_name(encoding, bool(s), input), accumulate) in seen
            assert (mv.kernel_name(encoding, bool(s)), True) in seen
    cases = " ".join(r["case"] for r in results)
    for word in ("near-zero x", "spike in the tail", "huge x", "mixed-sign norm weights", "extreme gates",
                 "gate ramp", "y0 cancels", "huge y0", "max codes", "min codes", "mixed codes", "1x1"):
        assert word in cases


def test_matvec_fused_real_weights(native_device, run, models):
    for model in models:
        report = run(golden.run_all(native_device, "quick", model=model, seed=4, families=["matvec_fused"]))
        assert report["passed"], _failures(report)
        real = {r["case"].split()[1] for r in report["families"]["matvec_fused"]["results"]
                if r["case"].startswith("real")}
        assert real == {"blk.0.attn_q", "blk.0.ffn_up", "blk.0.attn_output", "blk.0.ffn_down"}, real


def test_rope_kv_full(native_device, run, models):
    for model in models:
        report = run(golden.run_all(native_device, "full", model=model, seed=11, families=["rope_kv"]))
        results = report["families"]["rope_kv"]["results"]
        assert report["passed"], _failures(report)
        assert {r["kernel"].split("[")[0] for r in results} == {"rope_kv_append_f32", "rope_kv_append_f16",
                                                                "rope_kv_append_bias_f32", "rope_kv_append_bias_f16"}
        assert {"ADJACENT=0" in r["kernel"] for r in results} == {True, False}
        assert any(r["case"].startswith("model") for r in results)


def test_quick_runs_are_small_and_pass(native_device, run, models):
    report = run(golden.run_all(native_device, "quick", model=models[0], seed=5,
                                families=["matvec_fused", "rope_kv"]))
    assert report["passed"], _failures(report)
    # 54 for f32..q4, 30 for q5 and the super-blocks (each in every input mode: admission's
    # self-test must reach every kernel a plan uses)
    assert len(report["families"]["matvec_fused"]["results"]) <= 90
    assert len(report["families"]["rope_kv"]["results"]) <= 90   # with the bias entry points (Qwen2)


# -- the mat-vec rules fail wrong results ----------------------------------------------------------

def _weights(rng, rows=6, cols=37, encoding="q4", zero="min"):
    return mv.Weights.quantized(rng.standard_normal((rows, cols)).astype(np.float32), encoding, 32, zero)


def _verdict(exact, bound, rule, y):
    return golden.compare_bound("matvec_fused", "k", "c", y, exact, bound, rule).passed


@pytest.mark.parametrize("encoding", ["q4", "q8", "f16"])
def test_norm_rule_catches_wrong_results(encoding):
    rng = np.random.default_rng(1)
    w = _weights(rng, encoding=encoding)
    wd = w.dequantize().astype(np.float64)
    x = (2 * rng.standard_normal((1, 37))).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(37)).astype(np.float32)
    exact, bound, rule = mvo.fused_oracle(w, x, "norm", g, 1e-5)

    def normed(x, g, eps=1e-5, k=37):
        x64 = x.astype(np.float64)
        return x64 / np.sqrt(np.sum(x64 * x64, axis=1, keepdims=True) / k + eps) * g

    assert _verdict(exact, bound, rule, exact.astype(np.float32))
    assert _verdict(exact, bound, rule, (layers.rms_norm(x, g, 1e-5) @ wd.T).astype(np.float32))   # the CPU path
    assert not _verdict(exact, bound, rule, normed(x, g, k=40) @ wd.T)          # mean over cols rounded up to 4
    assert not _verdict(exact, bound, rule, normed(x, 1.0) @ wd.T)              # norm weight not applied
    assert not _verdict(exact, bound, rule, (x.astype(np.float64) * g) @ wd.T)  # 1/rms not applied
    assert not _verdict(exact, bound, rule, normed(x[:, :-1], g[:-1], k=37) @ wd[:, :-1].T)   # tail dropped
    assert not _verdict(exact, bound, rule, np.roll(exact, 1, axis=1))         # rows shifted
    tiny = (1e-20 * rng.standard_normal((1, 37))).astype(np.float32)           # eps dominates
    exact, bound, rule = mvo.fused_oracle(w, tiny, "norm", g, 1e-5)
    assert _verdict(exact, bound, rule, exact)
    assert not _verdict(exact, bound, rule, normed(tiny, g, eps=1e-6) @ wd.T)   # the wrong eps
    unwritten = exact.astype(np.float32).copy()
    unwritten[0, 3] = np.nan
    assert golden.compare_bound("m", "k", "c", unwritten, exact, bound, rule).unwritten == 1


@pytest.mark.parametrize("encoding", ["q4", "q8", "f32"])
def test_swiglu_rule_catches_wrong_results(encoding):
    rng = np.random.default_rng(2)
    w = _weights(rng, encoding=encoding)
    wd = w.dequantize().astype(np.float64)
    gate, up = (3 * rng.standard_normal((1, 37))).astype(np.float32), rng.standard_normal((1, 37)).astype(np.float32)
    h = mv.gate_up_row(gate, up, 40)
    assert np.isnan(h[:, 37:40]).all() and np.isnan(h[:, 77:]).all()
    exact, bound, rule = mvo.fused_oracle(w, h, "swiglu", up_offset=40)
    silu = lambda g: g / (1 + np.exp(-g.astype(np.float64)))                  # noqa: E731
    assert _verdict(exact, bound, rule, exact.astype(np.float32))
    assert _verdict(exact, bound, rule, (silu(gate) * up) @ wd.T)
    assert not _verdict(exact, bound, rule, (silu(up) * gate) @ wd.T)          # gate and up swapped
    assert not _verdict(exact, bound, rule, (gate.astype(np.float64) * up) @ wd.T)   # no sigmoid
    assert not _verdict(exact, bound, rule, (silu(gate) * np.roll(up, 1)) @ wd.T)     # up off by one column
    assert not _verdict(exact, bound, rule, (silu(gate) * up)[:, :-1] @ wd[:, :-1].T)  # tail dropped


def test_accumulate_rule_catches_wrong_results():
    rng = np.random.default_rng(3)
    w = _weights(rng)
    x = rng.standard_normal((1, 37)).astype(np.float32)
    y0 = (10 * rng.standard_normal((1, 6))).astype(np.float32)
    exact, bound, rule = mvo.fused_oracle(w, x, "plain", y0=y0)
    wx = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    assert "ACCUMULATE" in rule
    assert _verdict(exact, bound, rule, (wx + y0).astype(np.float32))
    assert not _verdict(exact, bound, rule, wx)               # y0 not added (the output overwritten)
    assert not _verdict(exact, bound, rule, wx + 2 * y0)      # y0 added twice
    assert not _verdict(exact, bound, rule, y0 - wx)          # subtracted
    # a y0 that cancels W x: the bound is the product's plus a rounding of y0, not y0's size
    y0 = -wx.astype(np.float32)
    exact, bound, rule = mvo.fused_oracle(w, x, "plain", y0=y0)
    assert np.all(bound < 2 * mvo.fused_oracle(w, x)[1] + 1e-6 * np.abs(y0))
    assert not _verdict(exact, bound, rule, np.full_like(exact, 0.05))


def test_norm_kernel_on_the_gpu_against_the_cpu_layers(native_device, run):
    """One end-to-end product on the GPU, compared with the CPU engine's own layers too."""
    rng = np.random.default_rng(4)
    w = _weights(rng, rows=40, cols=64)
    x = (3 * rng.standard_normal((1, 64))).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)
    y = run(mv.matvec(native_device, w, x, input="norm", norm_weight=g, eps=1e-5))
    exact, bound, rule = mvo.fused_oracle(w, x, "norm", g, 1e-5)
    assert _verdict(exact, bound, rule, y)
    cpu = layers.rms_norm(x, g, 1e-5) @ w.dequantize().T
    assert np.allclose(y, cpu, rtol=1e-4, atol=1e-4)
    y0 = rng.standard_normal((1, 40)).astype(np.float32)
    y_acc = run(mv.matvec(native_device, w, x, input="norm", norm_weight=g, eps=1e-5, y0=y0))
    exact, bound, rule = mvo.fused_oracle(w, x, "norm", g, 1e-5, y0=y0)
    assert _verdict(exact, bound, rule, y_acc)


# -- rope_kv_append's rules fail wrong results ---------------------------------------------------

def _rope_kv_reference(layout, q, k, v, table, start, convention, k_prior, v_prior, plan):
    """What a right kernel writes, computed by the CPU reference (f32) and kv_cache's append."""
    t = q.shape[0]
    cos, sin = table[start:start + t, :, 0], table[start:start + t, :, 1]
    q_rot = layers.apply_rope(q, cos, sin, convention).astype(np.float32)
    k_rot = layers.apply_rope(k, cos, sin, convention).astype(np.float32)
    qkv = rope_kv.pack_qkv(q_rot, k, v, plan)
    width = layout.n_kv_heads * layout.head_dim
    k_cache = append_reference(layout, k_prior, k_rot.reshape(t, width), start)
    v_cache = append_reference(layout, v_prior, v.reshape(t, width), start)
    return qkv, k_cache, v_cache, k_rot


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("convention", ["rotate-half", "adjacent-pair"])
def test_rope_kv_rules_catch_wrong_results(dtype, convention):
    rng = np.random.default_rng(5)
    layout = KvLayout(2, 9, 12, dtype)
    start, heads = 4, 4
    table = rope_table(9, 8, 1e4)
    q = rng.standard_normal((2, heads, 12)).astype(np.float32)
    k = rng.standard_normal((2, 2, 12)).astype(np.float32)
    v = rng.standard_normal((2, 2, 12)).astype(np.float32)
    k_prior = rope_kv.prior_cache(rng, layout, start, 2)
    v_prior = rope_kv.prior_cache(rng, layout, start, 2)
    plan = rope_kv.plan_rope_kv_append(CORE, layout, 2, heads, 8, start, 9, convention)
    qkv_in = rope_kv.pack_qkv(q, k, v, plan)

    def passes(qkv, k_cache, v_cache):
        results = rope_kv.check_rope_kv("k", "c", layout, q, k, v, table, start, convention, k_prior, v_prior,
                                        qkv_in, plan, qkv, k_cache, v_cache)
        return all(r.passed for r in results)

    qkv, k_cache, v_cache, k_rot = _rope_kv_reference(layout, q, k, v, table, start, convention, k_prior, v_prior, plan)
    assert passes(qkv, k_cache, v_cache)
    other = "adjacent-pair" if convention == "rotate-half" else "rotate-half"
    wrong = _rope_kv_reference(layout, q, k, v, table, start + 1, convention, k_prior, v_prior, plan)
    assert not passes(wrong[0], k_cache, v_cache)                        # q at the next position
    assert not passes(qkv, append_reference(layout, k_prior, wrong[3].reshape(2, -1), start), v_cache)  # k too
    conv = _rope_kv_reference(layout, q, k, v, table, start, other, k_prior, v_prior, plan)
    assert not passes(conv[0], conv[1], v_cache)                         # the other convention
    assert not passes(qkv, append_reference(layout, k_prior, k.reshape(2, -1), start), v_cache)   # k not rotated
    assert not passes(qkv, k_cache, append_reference(layout, v_prior, k.reshape(2, -1), start))   # k in the V cache
    assert not passes(qkv, append_reference(layout, k_prior, k_rot.reshape(2, -1), start + 1), v_cache)  # row + 1
    assert not passes(qkv, k_prior, v_cache)                             # K rows never written (poison)
    in_place = qkv.copy()
    in_place[plan.k_at:plan.k_at + k.size] = k_rot.reshape(-1)           # k rotated in the qkv binding
    assert not passes(in_place, k_cache, v_cache)
    if dtype == "f16":
        bits = k_cache.view(np.uint16).copy()
        at = layout.index(1, start + 1) + 3                              # a rotated element, one ulp off
        bits[at] += 1
        assert not passes(qkv, bits.view(np.float16), v_cache)
        nearest = v.astype(np.float16)                                   # V rounded toward zero instead
        toward_zero = np.where(np.abs(nearest.astype(np.float32)) > np.abs(v),
                               np.nextafter(nearest, np.float16(0)), nearest).astype(np.float16)
        assert (toward_zero != nearest).any()
        assert not passes(qkv, k_cache, append_reference(layout, v_prior, toward_zero.astype(np.float32)
                                                         .reshape(2, -1), start))


def test_f16_interval_is_a_bit_comparison_away_from_ties():
    exact = np.array([1.0, 1.0 + 2 ** -11 + 2 ** -13, 3.14159])
    bound = np.full(3, 1e-7)
    want = exact.astype(np.float16)
    assert rope_kv.check_f16_interval("f", "k", "c", want, exact, bound).passed
    for i in range(3):
        off = want.copy()
        off.view(np.uint16)[i] += 1
        assert not rope_kv.check_f16_interval("f", "k", "c", off, exact, bound).passed
    tie = np.array([1.0 + 2 ** -11])                 # halfway between two f16: within the bound both pass
    near = np.array([1.0, 1.0 + 2 ** -10], np.float16)
    for got in near:
        assert rope_kv.check_f16_interval("f", "k", "c", np.array([got]), tie, np.array([1e-6])).passed


# -- host checks before any dispatch -----------------------------------------------------------------

def test_matvec_input_modes_are_validated(native_device, run):
    rng = np.random.default_rng(6)
    w = _weights(rng, cols=37)
    check = lambda **kw: mv.check_shapes(native_device, w, 1, kw.pop("stride", 40), **kw)   # noqa: E731
    check(input="norm", eps=1e-5, norm_elements=40)
    check(input="swiglu", up_offset=40, stride=80)
    for kwargs, problem in [({"input": "gelu"}, "input"),
                            ({"input": "norm"}, "eps"),
                            ({"input": "norm", "eps": 0.0}, "eps"),
                            ({"input": "norm", "eps": 1e-50}, "eps"),
                            ({"input": "plain", "eps": 1e-5}, "eps"),
                            ({"input": "norm", "eps": 1e-5, "norm_elements": 37}, "norm-weight"),
                            ({"input": "swiglu", "stride": 80}, "up-offset"),
                            ({"input": "swiglu", "up_offset": 38, "stride": 80}, "up-offset"),
                            ({"input": "swiglu", "up_offset": 36, "stride": 80}, "up-offset"),
                            ({"input": "swiglu", "up_offset": 40, "stride": 76}, "stride"),
                            ({"input": "plain", "up_offset": 40}, "up-offset")]:
        with pytest.raises(mv.MatvecShapeError) as info:
            check(**kwargs)
        assert info.value.problem == problem, kwargs
    x = rng.standard_normal((1, 37)).astype(np.float32)
    name, overrides = mv.choose_kernel(native_device, w, accumulate=True)
    with pytest.raises(mv.MatvecShapeError, match="accumulate"):      # ACCUMULATE=1 without y0
        run(mv.matvec(native_device, w, x, name, overrides))
    with pytest.raises(mv.MatvecShapeError, match="input"):           # a plain kernel for the norm input
        run(mv.matvec(native_device, w, x, name, overrides, input="norm", norm_weight=x[0], eps=1e-5,
                      y0=np.zeros((1, 6), np.float32)))
    with pytest.raises(mv.MatvecShapeError, match="norm weight has 36"):
        run(mv.matvec(native_device, w, x, input="norm", norm_weight=x[0, :36], eps=1e-5))
    with pytest.raises(mv.MatvecShapeError, match="y0 has shape"):
        run(mv.matvec(native_device, w, x, y0=np.zeros((1, 5), np.float32)))
    a, b = object(), object()
    mv.check_no_alias([BufferBinding(a, 0, 16)], BufferBinding(b, 0, 16))
    with pytest.raises(mv.MatvecShapeError, match="alias"):
        mv.check_no_alias([BufferBinding(b, 0, 16), BufferBinding(a, 256, 16)], BufferBinding(a, 0, 16))


def test_matvec_plan_for_the_executor(native_device):
    rng = np.random.default_rng(7)
    w = _weights(rng, rows=6, cols=64)
    p = mv.plan(native_device, w, 1, 64, 6, input="norm", eps=1e-5)
    assert p.kernel.startswith("matvec_norm_q4") and "ACCUMULATE" not in p.overrides
    assert p.inputs == ("x", "norm_weight")
    assert p.params.view(np.float32)[7] == np.float32(1e-5) and list(p.params[:7]) == [6, 64, 2, 2, 8, 64, 6]
    p = mv.plan(native_device, w, 1, 2 * 64, 6, input="swiglu", accumulate=True, up_offset=64)
    assert p.kernel.startswith("matvec_swiglu_q4") and p.overrides["ACCUMULATE"] == 1 and p.params[7] == 64
    p = mv.plan(native_device, w, 1, 64, 6, accumulate=True)
    assert p.kernel.startswith("matvec_q4") and p.params[7] == 0 and p.inputs == ("x",)
    spec = KERNELS[mv.kernel_name("q4", False, "norm")]
    assert spec.bindings == ("uniform",) + ("read-only-storage",) * 5 + ("storage",)
    assert KERNELS[mv.kernel_name("f32", False, "swiglu")].bindings == \
        ("uniform", "read-only-storage", "read-only-storage", "storage")


def test_rope_kv_plan_is_validated():
    layout = KvLayout(3, 40, 64, "f16")
    plan = rope_kv.plan_rope_kv_append(CORE, layout, 1, 9, 64, 39, 40, "rotate-half")
    assert plan.kernel == "rope_kv_append_f16" and plan.overrides == {"WG": 256, "ADJACENT": 0}
    assert list(plan.params[:10]) == [1, 9, 3, 64, 32, 39, 40, 0, 576, 768] and plan.qkv_elements == 960
    assert plan.grid == (2, 1, 1)                         # 288 q pairs + 48 k/v quads
    for args, kwargs, problem in [
            ((1, 9, 64, 40, 41, "rotate-half"), {}, "position"),           # past the capacity
            ((2, 9, 64, 38, 39, "rotate-half"), {}, "position"),           # past the table
            ((1, 9, 63, 0, 40, "rotate-half"), {}, "shape"),               # odd rotary_dim
            ((1, 9, 66, 0, 40, "rotate-half"), {}, "shape"),               # rotary_dim > head_dim
            ((1, 9, 64, 0, 40, "neox"), {}, "shape"),
            ((0, 9, 64, 0, 40, "rotate-half"), {}, "shape"),
            ((1, 9, 64, 0, 40, "rotate-half"), {"k_at": 500}, "shape"),    # k overlaps q
            ((1, 9, 64, 0, 40, "rotate-half"), {"v_at": 700}, "shape"),    # v overlaps k
            ((1, 9, 64, 0, 40, "rotate-half"), {"qkv_elements": 959}, "shape"),
            ((1, 9, 64, 0, 40, "rotate-half"), {"workgroup": 32}, "workgroup")]:
        with pytest.raises(KvShapeError) as info:
            rope_kv.plan_rope_kv_append(CORE, layout, *args, **kwargs)
        assert info.value.problem == problem, (args, kwargs)
    with pytest.raises(KvShapeError, match="binding-size"):
        rope_kv.plan_rope_kv_append({**CORE, "maxStorageBufferBindingSize": 1024}, KvLayout(1, 4, 4), 1, 1, 4, 0, 4,
                                    "rotate-half", q_at=0, k_at=4, v_at=400)
    gapped = rope_kv.plan_rope_kv_append(CORE, layout, 1, 9, 64, 0, 40, "adjacent-pair", q_at=64, k_at=1024, v_at=2048)
    assert gapped.qkv_elements == 2048 + 192 and gapped.overrides["ADJACENT"] == 1


def test_rope_kv_refuses_mismatched_arrays(native_device, run):
    layout = KvLayout(1, 8, 8, "f32")
    table = rope_table(8, 8, 1e4)
    q = np.zeros((1, 2, 8), np.float32)
    k = np.zeros((1, 1, 8), np.float32)
    cache = np.zeros(layout.elements, np.float32)
    with pytest.raises(KvShapeError, match="k must be"):
        run(rope_kv.rope_kv_append(native_device, q, np.zeros((1, 2, 8), np.float32), k, table, 0, "rotate-half",
                                   layout, cache, cache))
    with pytest.raises(KvShapeError, match="k_cache"):
        run(rope_kv.rope_kv_append(native_device, q, k, k, table, 0, "rotate-half", layout,
                                   cache.astype(np.float16), cache))
    with pytest.raises(KvShapeError, match="capacity"):
        run(rope_kv.rope_kv_append(native_device, q, k, k, table, 8, "rotate-half", layout, cache, cache))
