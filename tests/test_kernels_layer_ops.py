"""The layer-op kernel families (kernels/norm.py, rope.py, swiglu.py, embed.py) on wgpu-native:
their golden suites, the host-side size checks, and proof that each tolerance can fail."""
import json
import pathlib
import time

import numpy as np
import pytest

import webslm
from webslm.cpu import layers
from webslm.kernels import embed, golden, norm, rope, runner, swiglu

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLM = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
FAMILIES = ["norm", "rope", "swiglu", "embed"]

CORE = {"maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupSizeX": 256,
        "maxComputeWorkgroupStorageSize": 16384, "maxComputeWorkgroupsPerDimension": 65535,
        "maxStorageBufferBindingSize": 128 << 20}
COMPAT = {**CORE, "maxComputeInvocationsPerWorkgroup": 128, "maxComputeWorkgroupSizeX": 128}
HUGE = {**CORE, "maxStorageBufferBindingSize": 1 << 40}


def _failures(report):
    return [f"{r['kernel']} | {r['case']}: over={r['error_over_tolerance']:.3g} "
            f"max_abs={r['max_abs_error']:.3g} unwritten={r['unwritten']} mismatched={r['mismatched']}"
            for r in report["failed"]]


@pytest.fixture(scope="module")
def models(fixture_slm_path):
    """The fixture model always (adjacent-pair RoPE, partial rotary, q8 embedding with tails);
    the real SmolLM2 too when set-up has built it."""
    found = [webslm.open_model(fixture_slm_path)]
    if SLM.is_file():
        found.append(webslm.open_model(SLM))
    return found


# -- golden suites -----------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_golden_family_full(native_device, run, models, family):
    for model in models:
        started = time.perf_counter()
        report = run(golden.run_all(native_device, "full", model=model, seed=11, families=[family]))
        results = report["families"][family]["results"]
        print(f"{family} full ({model.architecture.hidden}-wide model): {len(results)} cases "
              f"in {time.perf_counter() - started:.1f} s")
        for line in _failures(report):
            print("FAILED", line)
        assert report["passed"], json.dumps(_failures(report), indent=1)
        assert any(r["case"].startswith("model") for r in results)


def test_golden_quick_is_small_and_passes(native_device, run, models):
    started = time.perf_counter()
    report = run(golden.run_all(native_device, "quick", model=models[0], seed=5, families=FAMILIES))
    print(f"quick: {report['cases']} cases in {time.perf_counter() - started:.2f} s")
    assert report["passed"], json.dumps(_failures(report), indent=1)
    for family in FAMILIES:
        assert 3 <= len(report["families"][family]["results"]) <= 40


def test_full_cases_cover_the_adversarial_inputs():
    rng = np.random.default_rng(0)
    names = " ".join(c[0] for c in norm.norm_cases(rng, False))
    for word in ("odd tail", "single element", "D < workgroup", "constant rows", "alternating",
                 "near-zero", "huge", "spike in the tail", "many rows 70000"):
        assert word in names
    rope_cases = rope.rope_cases(rng, False)
    assert any(c.start >= 30000 for c in rope_cases)
    assert {9, 3} <= {c.heads for c in rope_cases}
    assert any(c.rotary_dim < c.head_dim for c in rope_cases)
    assert any(c.head_dim % 2 for c in rope_cases)
    gates = np.concatenate([h[:, :h.shape[1] // 2].ravel() for _, h in swiglu.swiglu_cases(rng, False)])
    for g in (88, -88, 100, -100, 1e30, -1e30):
        assert np.float32(g) in gates
    tensors = [t for _, t in embed.embed_cases(rng, False)]
    kinds = {(t.encoding, t.zero, t.block, t.scale_type) for t in tensors}
    for encoding, zero in (("q8", "none"), ("q4", "offset"), ("q4", "min")):
        assert {(b, s) for e, z, b, s in kinds if (e, z) == (encoding, zero)} == \
            {(b, s) for b in (32, 64, 128, 256) for s in ("f16", "f32")}
    assert {"f32", "f16"} <= {t.encoding for t in tensors}
    # odd tails where the format allows a partial block; q5 and the super-block encodings hold
    # whole blocks only (artifact/format.py WHOLE_BLOCKS)
    tails = [t for t in tensors if t.encoding in ("f32", "f16", "q8", "q4")]
    assert any(t.dim == 1 for t in tails) and all(t.dim % 2 or t.dim == 1 for t in tails)
    assert {"q5", "q4k", "q5k", "q6k"} <= {t.encoding for t in tensors}


# -- host-side validation (before anything is dispatched) -------------------------------------------

def test_workgroup_fits_the_device():
    assert runner.fit_workgroup(CORE, 4096) == 256
    assert runner.fit_workgroup(COMPAT, 4096) == 128
    assert runner.fit_workgroup(CORE, 5) == 64
    assert runner.fit_workgroup({**CORE, "maxComputeWorkgroupStorageSize": 256}, 4096, bytes_per_lane=4) == 64
    with pytest.raises(ValueError, match="no workgroup size"):
        runner.fit_workgroup({**CORE, "maxComputeInvocationsPerWorkgroup": 32}, 256)
    assert norm.plan_norm(COMPAT, 3, 4096, 1e-5).overrides == {"WG": 128}


def test_norm_picks_vec4_only_for_rows_of_quads():
    assert norm.plan_norm(CORE, 1, 4096, 1e-5).kernel == "rms_norm_vec4"
    assert norm.plan_norm(CORE, 1, 4097, 1e-5).kernel == "rms_norm"
    assert norm.plan_norm(CORE, 1, 576, 1e-5, residual=True).kernel == "rms_norm_residual_vec4"
    assert norm.plan_norm(CORE, 1, 576, 1e-5).overrides == {"WG": 128}      # 144 quads per row
    with pytest.raises(ValueError, match="dim % 4"):
        norm.plan_norm(CORE, 1, 67, 1e-5, kernel="rms_norm_vec4")
    with pytest.raises(ValueError, match="not a rms_norm_residual kernel"):
        norm.plan_norm(CORE, 1, 64, 1e-5, residual=True, kernel="rms_norm")


def test_norm_validation():
    with pytest.raises(ValueError, match="tokens >= 1"):
        norm.plan_norm(CORE, 0, 576, 1e-5)
    with pytest.raises(ValueError, match="eps"):
        norm.plan_norm(CORE, 1, 576, 0.0)
    with pytest.raises(ValueError, match="eps"):
        norm.plan_norm(CORE, 1, 576, 1e-50)          # 0 in f32
    with pytest.raises(ValueError, match="overflow u32"):
        norm.plan_norm(HUGE, 1 << 20, 1 << 10, 1e-5)
    with pytest.raises(ValueError, match="maxStorageBufferBindingSize"):
        norm.plan_norm(CORE, 1 << 16, 1 << 10, 1e-5)
    grid = norm.plan_norm(CORE, 70000, 3, 1e-5).grid
    assert grid[0] * grid[1] >= 70000 and max(grid) <= 65535
    x = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match="weight has shape"):
        norm._check_arrays(x, np.ones(7, np.float32))
    with pytest.raises(ValueError, match="delta has shape"):
        norm._check_arrays(x, np.ones(8, np.float32), np.ones((2, 7), np.float32))


def test_rope_validation(native_device, run):
    table = rope.rope_table(10, 8, 1e4)
    with pytest.raises(ValueError, match="position >= capacity"):
        rope.plan_rope(CORE, 3, 2, 12, 8, start=8, table_rows=10, convention="rotate-half")
    assert rope.plan_rope(CORE, 3, 2, 12, 8, start=7, table_rows=10, convention="rotate-half")
    with pytest.raises(ValueError, match="even"):
        rope.plan_rope(CORE, 1, 2, 12, 7, 0, 10, "rotate-half")
    with pytest.raises(ValueError, match="<= head_dim"):
        rope.plan_rope(CORE, 1, 2, 12, 14, 0, 10, "rotate-half")
    with pytest.raises(ValueError, match="convention"):
        rope.plan_rope(CORE, 1, 2, 12, 8, 0, 10, "neox")
    with pytest.raises(ValueError, match="token_stride"):
        rope.plan_rope(CORE, 1, 2, 12, 8, 0, 10, "rotate-half", token_stride=23)
    with pytest.raises(ValueError, match="overflow u32"):
        rope.plan_rope(HUGE, 1 << 22, 32, 128, 128, 0, 1 << 22, "rotate-half")
    qk = np.ones((2, 2, 12), np.float32)
    with pytest.raises(ValueError, match="capacity"):         # refused before any dispatch
        run(rope.apply_rope(native_device, qk, table, 9, "rotate-half"))
    kernel = run(golden.compile_kernel(native_device, "rope", WG=64, ADJACENT=1))
    with pytest.raises(ValueError, match="convention"):
        run(rope.apply_rope(native_device, qk, table, 0, "rotate-half", kernel=kernel))


def test_rope_table_is_the_cpu_engines():
    cos, sin = layers.rope_tables(np.arange(30000, 30004) + 3, 64, 1e5)
    table = rope.rope_table(30004, 64, 1e5, position_offset=3)
    assert np.array_equal(table[30000:, :, 0], cos) and np.array_equal(table[30000:, :, 1], sin)


def test_swiglu_validation():
    assert swiglu.plan_swiglu(CORE, 2, 1536).kernel == "swiglu_vec4"
    assert swiglu.plan_swiglu(CORE, 2, 37).kernel == "swiglu"
    with pytest.raises(ValueError, match="ffn % 4"):
        swiglu.plan_swiglu(CORE, 2, 37, kernel="swiglu_vec4")
    with pytest.raises(ValueError, match="ffn >= 1"):
        swiglu.plan_swiglu(CORE, 2, 0)
    with pytest.raises(ValueError, match="maxStorageBufferBindingSize"):
        swiglu.plan_swiglu(CORE, 4096, 14336)


def test_swiglu_rejects_an_odd_width(native_device, run):
    with pytest.raises(ValueError, match=r"\[T, 2F\]"):
        run(swiglu.swiglu(native_device, np.ones((2, 7), np.float32)))


def test_embed_validation():
    tensor = embed.make_tensor(np.random.default_rng(0), "q8", 37, 70, 32, "none", "f16")
    with pytest.raises(ValueError, match="token id 37 at position 2 is not < vocab 37"):
        embed.plan_embed(CORE, np.array([0, 36, 37, 1]), tensor)
    with pytest.raises(ValueError, match="token id -1 at position 0"):
        embed.plan_embed(CORE, np.array([-1]), tensor)
    with pytest.raises(ValueError, match="1-D integer"):
        embed.plan_embed(CORE, np.array([[1]]), tensor)
    with pytest.raises(ValueError, match="1-D integer"):
        embed.plan_embed(CORE, np.array([1.0]), tensor)
    with pytest.raises(ValueError, match="maxStorageBufferBindingSize"):
        embed.plan_embed({**CORE, "maxStorageBufferBindingSize": 1024}, np.array([1]), tensor)
    with pytest.raises(ValueError, match="overflow u32"):
        runner.check_binding_size(HUGE, "embeddings out", (1 << 28) * 70 * 4)
    with pytest.raises(ValueError, match="part 'scales' has"):
        embed.embed_tensor("q8", (37, 70), tensor.quant, {**tensor.parts, "scales": tensor.parts["scales"][:-2]})
    with pytest.raises(ValueError, match="no embedding kernel"):
        embed.embed_tensor("q8", (37, 70), {**tensor.quant, "zero": "min"}, tensor.parts)
    plan = embed.plan_embed(COMPAT, np.array([3]), tensor)
    assert plan.kernel == "embed_q8" and plan.overrides == {"WG": 64, "BLOCK": 32, "SCALE_F16": 1}


# -- every tolerance can fail ---------------------------------------------------------------------

def test_norm_tolerance_catches_wrong_results():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 67)).astype(np.float32)
    x[:, -1] *= 3
    w = (1 + 0.1 * rng.standard_normal(67)).astype(np.float32)
    reference = layers.rms_norm(x, w, 1e-5)                       # the CPU engine's f32 result
    assert norm.check_norm("k", "c", x, w, 1e-5, reference).passed
    assert not norm.check_norm("k", "c", x, w, 1e-5, np.roll(reference, 1, axis=0)).passed   # shifted rows
    no_tail = layers.rms_norm(x[:, :-1], w[:-1], 1e-5)          # a kernel that forgot column D-1
    assert not norm.check_norm("k", "c", x, w, 1e-5, np.concatenate([no_tail, reference[:, -1:]], 1)).passed
    assert not norm.check_norm("k", "c", x, w, 1e-5, layers.rms_norm(x, w, 1e-2)).passed   # wrong eps
    assert not norm.check_norm("k", "c", x, w, 1e-5, x / np.sqrt(np.mean(x * x, 1, keepdims=True)) * w
                               * np.float32(1 + 2e-5)).passed                              # 2e-5 relative
    unwritten = reference.copy()
    unwritten[2, 66] = np.nan
    result = norm.check_norm("k", "c", x, w, 1e-5, unwritten)
    assert result.unwritten == 1 and not result.passed
    delta = rng.standard_normal((4, 67)).astype(np.float32)
    assert norm.check_residual("k", "c", x, delta, x + delta).passed
    assert not norm.check_residual("k", "c", x, delta, x).passed                       # delta not added
    assert not norm.check_residual("k", "c", x, delta, (x + delta) * np.float32(1 + 2 ** -22)).passed


def test_rope_tolerance_catches_wrong_results():
    rng = np.random.default_rng(2)
    qk = rng.standard_normal((3, 9, 12)).astype(np.float32)
    table = rope.rope_table(40000, 8, 1e4)
    start = 30000
    cos, sin = table[start:start + 3, :, 0], table[start:start + 3, :, 1]
    for convention in ("rotate-half", "adjacent-pair"):
        right = layers.apply_rope(qk, cos, sin, convention)
        assert rope.check_rope("k", "c", qk, table, start, convention, 9, 12, right).passed
        shifted = layers.apply_rope(qk, table[start + 1:start + 4, :, 0], table[start + 1:start + 4, :, 1], convention)
        assert not rope.check_rope("k", "c", qk, table, start, convention, 9, 12, shifted).passed   # position + 1
        other = "adjacent-pair" if convention == "rotate-half" else "rotate-half"
        assert not rope.check_rope("k", "c", qk, table, start, convention, 9, 12,
                                   layers.apply_rope(qk, cos, sin, other)).passed
        missing_head = right.copy()
        missing_head[:, -1] = qk[:, -1]                                               # last head not rotated
        assert not rope.check_rope("k", "c", qk, table, start, convention, 9, 12, missing_head).passed
        touched = right.copy()
        touched[:, :, 8:] *= -1                                                       # dims past rotary_dim
        assert not rope.check_rope("k", "c", qk, table, start, convention, 9, 12, touched).passed


def test_swiglu_tolerance_catches_wrong_results():
    rng = np.random.default_rng(3)
    gate, up = (3 * rng.standard_normal((2, 37))).astype(np.float32), rng.standard_normal((2, 37)).astype(np.float32)
    h = np.concatenate([gate, up], axis=1)
    right = (gate / (1 + np.exp(-gate)) * up).astype(np.float32)
    assert swiglu.check_swiglu("k", "c", h, right).passed
    assert not swiglu.check_swiglu("k", "c", h, (up / (1 + np.exp(-up)) * gate)).passed    # gate and up swapped
    assert not swiglu.check_swiglu("k", "c", h, np.roll(right, 1, axis=1)).passed          # off by one column
    assert not swiglu.check_swiglu("k", "c", h, right * np.float32(1 + 1e-5)).passed
    assert not swiglu.check_swiglu("k", "c", h, gate * up).passed                          # no sigmoid
    # At the extremes the rule admits the flushed zeros and nothing else.
    g = np.array([[-88.0, -100.0, -1e30, 88.0, 1e30]], np.float32)
    h = np.concatenate([g, np.full_like(g, 1.5)], axis=1)
    assert swiglu.check_swiglu("k", "c", h, np.array([[-0.0, -0.0, -0.0, 132.0, 1.5e30]], np.float32)).passed
    assert not swiglu.check_swiglu("k", "c", h, np.array([[-0.0, -0.0, np.nan, 132.0, 1.5e30]], np.float32)).passed
    assert not swiglu.check_swiglu("k", "c", h, np.array([[-1e-3, -0.0, -0.0, 132.0, 1.5e30]], np.float32)).passed


def test_embed_rule_catches_wrong_results():
    rng = np.random.default_rng(4)
    ids = np.array([0, 36, 5, 7], np.uint32)
    tensor = embed.make_tensor(rng, "q8", 37, 67, 32, "none", "f32")
    right = tensor.dequantize()[ids]
    assert embed.check_embed("k", "c", tensor, ids, right).passed
    assert not embed.check_embed("k", "c", tensor, ids, tensor.dequantize()[(ids + 1) % 37]).passed   # id off by one
    no_tail = right.copy()
    no_tail[:, -1] = 0
    assert not embed.check_embed("k", "c", tensor, ids, no_tail).passed
    one_ulp = right.copy()
    one_ulp.view(np.uint32)[1, 3] += 1
    assert not embed.check_embed("k", "c", tensor, ids, one_ulp).passed                       # bit exact
    # q4 "min" with f32 scales: a fused multiply-add passes, a 32-ULP error does not.
    tensor = embed.make_tensor(rng, "q4", 37, 67, 32, "min", "f32")
    right = tensor.dequantize()[ids]
    from webslm.artifact.quant import unpack_nibbles
    codes = unpack_nibbles(tensor.parts["codes"].reshape(37, -1))[ids, :67].astype(np.float64)
    scales = np.repeat(np.frombuffer(tensor.parts["scales"], np.float32).reshape(37, -1)[ids], 32, 1)[:, :67]
    mins = np.repeat(np.frombuffer(tensor.parts["mins"], np.float32).reshape(37, -1)[ids], 32, 1)[:, :67]
    fused = (scales.astype(np.float64) * codes + mins).astype(np.float32)
    assert (fused != right).any()
    assert embed.check_embed("k", "c", tensor, ids, fused).passed
    off = right.copy()
    off.view(np.uint32)[0, np.argmax(np.abs(right[0]))] += 32
    assert not embed.check_embed("k", "c", tensor, ids, off).passed


# -- the benchmark hooks ---------------------------------------------------------------------------

@pytest.mark.parametrize("module", [norm, rope, swiglu, embed])
def test_bench_hooks_prepare_every_kernel(native_device, run, module):
    shape_name = "smollm2-135m decode"
    for name in module.BENCH_KERNELS:
        shape = module.BENCH_SHAPES[shape_name]
        prepared = run(module.prepare_bench(native_device, name, shape, np.random.default_rng(0)))
        try:
            assert prepared.bytes_moved > 0 and prepared.flops >= 0
            native_device.submit([prepared.dispatch])
            outputs = run(prepared.read_outputs(native_device))
            assert all(np.isfinite(o).all() for o in outputs), name
        finally:
            prepared.release(native_device)
    assert {"smollm2-135m decode", "llama-3.2-1b prefill", "llama-3-8b decode"} <= set(module.BENCH_SHAPES)
