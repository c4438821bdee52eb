"""The prefill GEMM family (kernels/gemm.py) on wgpu-native: golden suite and host checks."""
import json
import pathlib
import time

import numpy as np
import pytest

from webslm.kernels import gemm, gemm_cases, golden
from webslm.kernels.gemm import GemmError, RegisterTile, Tile
from webslm.kernels.registry import KERNELS
from webslm.kernels.weights import Weights

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLM = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"

CORE = {"maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupSizeX": 256,
        "maxComputeWorkgroupStorageSize": 16384, "maxComputeWorkgroupsPerDimension": 65535,
        "maxStorageBufferBindingSize": 128 << 20}
COMPAT = {**CORE, "maxComputeInvocationsPerWorkgroup": 128, "maxComputeWorkgroupSizeX": 128}
ROOMY = {**CORE, "maxComputeWorkgroupStorageSize": 32768}
H200 = {**CORE, "maxComputeWorkgroupStorageSize": 49152}


def _failures(report):
    return [f"{r['kernel']} | {r['case']}: over={r['error_over_tolerance']:.3g} "
            f"unwritten={r['unwritten']} mismatched={r['mismatched']}" for r in report["failed"]]


@pytest.mark.parametrize("size", ["full", "quick"])
def test_golden_gemm_passes(native_device, run, size):
    model = None
    if size == "full" and SLM.is_file():
        import webslm
        model = webslm.open_model(SLM)
    started = time.perf_counter()
    report = run(golden.run_all(native_device, size, model=model, seed=3, families=["gemm"]))
    seconds = time.perf_counter() - started
    results = report["families"]["gemm"]["results"]
    print(f"gemm {size}: {len(results)} cases in {seconds:.1f} s")
    for line in _failures(report):
        print("FAILED", line)
    assert report["passed"], json.dumps(_failures(report), indent=1)
    assert any(r["kernel"] == "oracle" for r in results)
    if model is not None:
        assert any(r["case"].startswith("real blk.0.ffn_up") for r in results)


def test_every_tile_is_exercised_by_the_full_suite():
    cases = list(gemm_cases._cases(golden.GoldenContext(None, np.random.default_rng(0), "full")))
    assert set(gemm.TILES.values()) <= {case.tile for case in cases}
    shapes = {(case.x.shape[0], case.weights.rows, case.weights.cols) for case in cases}
    assert {m for m, _, _ in shapes} >= {2, 3, 17, 67, 129}
    assert any(k % 32 and k > 32 for _, _, k in shapes)                 # partial last block
    assert (3, 1, 1) in shapes                                          # single element
    encodings = {(c.weights.encoding, c.weights.block, c.weights.zero, c.weights.scale_type) for c in cases}
    assert {b for e, b, *_ in encodings if e == "q4"} == {32, 64, 128, 256}
    assert {b for e, b, *_ in encodings if e == "q8"} == {32, 64, 128, 256}
    assert {"f16", "f32"} <= {e for e, *_ in encodings}
    names = " ".join(case.name for case in cases)
    for word in ("max codes", "min codes", "mixed codes", "constant rows", "alternating signs",
                 "scale 6e-08", "scale 60000", "scale 1e-30", "scale 1e+30", "accumulate",
                 "padding decodes to -inf", "strided", "sections", "sections + accumulate"):
        assert word in names, word
    # every tiled tile meets the tail shapes and two encoding options; every option meets a tiled tile
    for tile in (t for t in gemm.TILES.values() if t.sections):
        mine = [c for c in cases if c.tile == tile]
        assert {(3, 1, 1), (129, 37, 257)} <= {(c.x.shape[0], c.weights.rows, c.weights.cols) for c in mine}
        assert len({c.weights.encoding for c in mine}) >= 2, tile.name
    for config in gemm_cases.CONFIGS:
        assert any(c.tile is not None and c.tile.sections and gemm_cases._tag(config) in c.name for c in cases), config
    # the f16-tile variants meet the adversarial codes and the accumulate path too
    for kind in ("half", "ksplit"):    # f16 tiles and split-K tiles meet adversarial codes and ACCUMULATE
        mine = [c for c in cases if c.tile is not None and c.tile.sections and
                (c.tile.half if kind == "half" else c.tile.ksplit > 1)]
        assert any("max codes" in c.name for c in mine) and any(c.y0 is not None for c in mine), kind


def test_quick_suite_covers_every_tile_the_host_may_choose():
    """Admission's self-test (size quick) must run each tile choose_tile can return on that device."""
    class FakeDevice:
        limits, features = ROOMY, frozenset({"shader-f16"})
    cases = list(gemm_cases._cases(golden.GoldenContext(FakeDevice(), np.random.default_rng(0), "quick")))
    tested = {case.tile for case in cases}
    kernels = {case.tile.kernel(case.weights.encoding) for case in cases if case.tile is not None}
    for m in (1, 17, 64, 128, 512):
        for n in (1, 64, 576, 3072, 16384):
            assert gemm.choose_tile(ROOMY, m, n, FakeDevice.features) in tested, (m, n)
            for encoding in ("q4", "q8", "f16", "q4k", "q6k", "q5"):
                for sections in (False, True):
                    tile = gemm.choose_tile(ROOMY, m, n, FakeDevice.features, need_sections=sections,
                                            encoding=encoding)
                    assert tile.serves(encoding)
                    if encoding != "f16" and not tile.half:   # f16 weights: classic or register, below
                        assert tile.kernel(encoding) in kernels, (m, n, encoding, tile.name)


def test_admissions_self_test_runs_the_tiles_its_plan_compiled():
    """At admission (`planned`: the pipelines the plan compiled) the GEMM cases run the plan's own
    tiles, every one of them and no other; a plan with no GEMM pipeline gets no GEMM case."""
    class FakeDevice:
        limits, features = ROOMY, frozenset({"shader-f16"})
    candidates = gemm.candidates(ROOMY, FakeDevice.features)
    chosen = [candidates[0], candidates[-1]]
    planned = frozenset((tile.kernel("q4"), tuple(sorted({**tile.overrides(), "BLOCK": 32, "ACCUMULATE": 0}.items())))
                        for tile in chosen) | {("rms_norm_vec4", (("WG", 64),))}
    ctx = golden.GoldenContext(FakeDevice(), np.random.default_rng(0), "quick", planned=planned)
    assert {tile for tile, _, _ in gemm_cases.planned_tiles(ctx, split=False)} == set(chosen)
    cases = list(gemm_cases._cases(ctx))
    assert {case.tile for case in cases} == set(chosen)
    assert all("q4/32/min/f16" in case.name for case in cases)
    unplanned = golden.GoldenContext(FakeDevice(), np.random.default_rng(0), "quick",
                                     planned=frozenset({("rms_norm_vec4", (("WG", 64),))}))
    assert list(gemm_cases._cases(unplanned)) == []


def test_the_comparison_rejects_wrong_results():
    rng = np.random.default_rng(5)
    weights = gemm.random_parts(rng, "q4", 19, 97)
    x = rng.standard_normal((17, 97)).astype(np.float32)
    exact, bound, rule = gemm.oracle(weights, x)
    assert golden.compare_bound("gemm", "k", "exact", exact.astype(np.float32), exact, bound, rule).passed
    for what, wrong in gemm.wrong_results(weights, x).items():
        assert not golden.compare_bound("gemm", "k", what, wrong, exact, bound, rule).passed, what
    unwritten = exact.astype(np.float32)
    unwritten[3, 4] = np.nan
    assert golden.compare_bound("gemm", "k", "nan", unwritten, exact, bound, rule).unwritten == 1


def test_decode64_matches_the_artifact_decoder():
    rng = np.random.default_rng(6)
    for enc, block, zero, st in gemm_cases.CONFIGS:
        w = Weights.quantized(rng.standard_normal((5, 77)).astype(np.float32), enc, block or 32,
                                  zero or "min", st or "f16")
        decoded, magnitude = gemm.decode64(w)
        from webslm.artifact import quant
        descriptor = {"block_elements": block, "zero": zero, "scale_type": st} if block else None
        reference = quant.dequantize(enc, (5, 77), descriptor, w.parts)
        # the artifact decodes in f32: at most two roundings, relative to the magnitude
        assert (np.abs(decoded - reference) <= golden.gamma(2) * magnitude).all(), (enc, block, zero, st)
        assert (magnitude >= np.abs(decoded) * (1 - 1e-12)).all()


# -- host-side validation --------------------------------------------------------------------

def _q4(n=40, k=100):
    return gemm.random_parts(np.random.default_rng(0), "q4", n, k)


def test_plan_builds_params_and_grid():
    p = gemm.plan(CORE, _q4(), 17, tile=gemm.TILES["32x32"])
    assert p.kernel == "gemm_q4"
    assert p.overrides["BLOCK"] == 32 and p.overrides["ZERO_MIN"] == 1 and p.overrides["SCALE_F16"] == 1
    tiles_m = -(-17 // p.tile.tm)
    tiles = tiles_m * -(-40 // p.tile.tn)
    assert list(p.params[:7]) == [17, 40, 100, 100, 40, tiles_m, tiles]
    # the classic kernel reads the shared params (gemm_sections.wgsl): one section, split1 = split2 = N
    assert list(p.params[7:13]) == [40, 40, 0, 0, 0, 0]
    assert p.grid == (tiles, 1, 1)
    assert p.binding_bytes["x"] == (16 * 100 + 100) * 4 and p.binding_bytes["y"] == 17 * 40 * 4
    tiled = gemm.plan(CORE, _q4(), 17, tile=gemm.TILES["32x64/4x4/k16/s2"])
    assert tiled.kernel == "gemm_tiled_q4" and tiled.params.size == 16
    # one section: split1 = split2 = N, the rest zero
    assert list(tiled.params[:13]) == [17, 40, 100, 100, 40, 1, 1, 40, 40, 0, 0, 0, 0]


def test_plan_lays_out_column_sections():
    """q | k | v of the planar qkv activation: three [M][width] arrays at their own offsets."""
    w = gemm.random_parts(np.random.default_rng(0), "q4", 24, 64)
    sections = [(0, 0, 16), (16, 1000, 4), (20, 2000, 4)]
    p = gemm.plan(CORE, w, 10, sections=sections, tile=gemm.TILES["32x64/4x4/k16/s2"])
    assert list(p.params[:13]) == [10, 24, 64, 64, 16, 1, 1, 16, 20, 1000, 2000, 4, 4]
    assert p.binding_bytes["y"] == (2000 + 9 * 4 + 4) * 4
    bad = {"overlap": [(0, 0, 16), (16, 100, 4), (20, 2000, 4)],      # section 0 spans floats 0..160
           "not at column 0": [(4, 0, 16)],
           "narrow stride": [(0, 0, 16), (16, 1000, 3), (20, 2000, 4)],
           "too many": [(0, 0, 8), (8, 500, 4), (12, 1000, 4), (16, 2000, 8)],
           "out of order": [(0, 0, 16), (20, 1000, 4), (16, 2000, 4)]}
    for what, layout in bad.items():
        with pytest.raises(GemmError, match="bad-sections"):
            gemm.plan(CORE, w, 10, sections=layout, tile=gemm.TILES["32x64/4x4/k16/s2"])
    with pytest.raises(GemmError, match="bad-sections"):             # the classic kernel has one output
        gemm.plan(CORE, w, 10, sections=sections, tile=gemm.TILES["32x32"])


def test_tile_choice_follows_device_limits():
    for limits in (CORE, COMPAT, ROOMY, H200):
        for features in (frozenset(), frozenset({"shader-f16"})):
            for m, n in [(2, 5), (17, 576), (128, 576), (512, 3072), (512, 28672)]:
                tile = gemm.choose_tile(limits, m, n, features)
                assert tile.admitted(limits, features)
    assert all(gemm.choose_tile(COMPAT, m, 4096).invocations <= 128 for m in (17, 128, 512))
    assert gemm.choose_tile(H200, 512, 28672) == gemm.TILES[gemm.TILE_ORDER["A"][0]]   # big problem, roomy device
    assert gemm.choose_tile(CORE, 512, 28672).workgroup_bytes <= 16384
    assert gemm.choose_tile(CORE, 3, 64).tm == 32                          # short M: short tile
    with pytest.raises(GemmError, match="tile-not-admitted"):
        gemm.choose_tile({**CORE, "maxComputeInvocationsPerWorkgroup": 32}, 64, 64)
    with pytest.raises(GemmError, match="tile-not-admitted"):
        gemm.plan(COMPAT, _q4(), 64, tile=gemm.TILES["128x64"])
    half = gemm.TILES["128x128/8x8/k16/s2/h"]
    with pytest.raises(GemmError, match="tile-not-admitted"):        # f16 tiles need shader-f16
        gemm.plan(ROOMY, _q4(), 64, tile=half)
    assert gemm.plan(ROOMY, _q4(), 64, tile=half, features={"shader-f16"}).kernel == "gemm_tiled_half_q4"


def test_the_knob_names_registered_tiles():
    for tier, names in gemm.TILE_ORDER.items():
        assert names and all(name in gemm.TILES for name in names), tier
        assert any(gemm.TILES[name].sections for name in names), tier      # the stacked q|k|v has a tile
        assert all(not gemm.TILES[name].half for name in names) or tier == "B"
    for name in gemm.CLASSIC_FALLBACK:
        assert not gemm.TILES[name].sections
    # the choice can be steered without editing the module (the sweep's simulation does this)
    assert gemm.choose_tile(H200, 512, 16384, order=("32x64/4x4/k16/s2",)).name == "32x64/4x4/k16/s2"
    assert gemm.choose_tile(H200, 128, 2048, order=("128x128/8x8/k16/s2", "32x64/4x4/k16/s2"),
                            min_workgroups=16).name == "128x128/8x8/k16/s2"


@pytest.mark.parametrize("change, code", [
    (dict(m=0), "dimension-mismatch"),
    (dict(x_stride=102), "dimension-mismatch"),       # not a multiple of 4
    (dict(x_stride=96), "dimension-mismatch"),        # shorter than K
    (dict(y_stride=39), "dimension-mismatch"),
    (dict(m=2 ** 26, x_stride=128), "offset-overflow"),
    (dict(m=2 ** 16, x_stride=1024), "binding-too-large"),   # 256 MiB of x
])
def test_plan_rejects_bad_shapes(change, code):
    args = dict(m=3, x_stride=100, y_stride=40) | change
    with pytest.raises(GemmError, match=code):
        gemm.plan(CORE, _q4(), args["m"], args["x_stride"], args["y_stride"])


def test_plan_rejects_bad_weights():
    w = _q4()
    short = Weights("q4", 40, 100, {**w.parts, "codes": w.parts["codes"][:-16]}, 32, "min", "f16")
    with pytest.raises(GemmError, match="buffer-too-small"):
        gemm.plan(CORE, short, 3)
    no_mins = {"codes": w.parts["codes"], "scales": w.parts["scales"]}
    missing = Weights("q4", 40, 100, no_mins, 32, "min", "f16")
    with pytest.raises(GemmError, match="buffer-too-small"):
        gemm.plan(CORE, missing, 3)
    for bad in (Weights("q3", 4, 4, {}), Weights("q4", 4, 64, {}, 48, "min", "f16"),
                Weights("q4", 4, 64, {}, 32, "none", "f16"), Weights("q8", 4, 64, {}, 32, None, "bf16")):
        with pytest.raises(GemmError, match="bad-encoding"):
            gemm.plan(CORE, bad, 3)
    with pytest.raises(GemmError, match="too-many-workgroups"):
        gemm.plan({**CORE, "maxComputeWorkgroupsPerDimension": 4}, _q4(n=4000), 500)


def test_check_bindings_compares_bound_sizes():
    p = gemm.plan(CORE, _q4(), 3)
    gemm.check_bindings(p, dict(p.binding_bytes))
    with pytest.raises(GemmError, match="buffer-too-small"):
        gemm.check_bindings(p, {**p.binding_bytes, "scales": p.binding_bytes["scales"] - 4})


def test_gemm_rejects_activation_shape_before_dispatch(native_device, run):
    with pytest.raises(GemmError, match="dimension-mismatch"):
        run(gemm.gemm(native_device, _q4(), np.zeros((3, 99), np.float32)))


def test_tiles_fit_their_advertised_budgets():
    assert gemm.TILES["64x64"].workgroup_bytes == 16384 and gemm.TILES["64x64"].invocations == 128
    assert gemm.TILES["32x32"].workgroup_bytes == 8192 and gemm.TILES["32x32"].invocations == 64
    for tile in gemm.TILES.values():
        for encoding in ("q4", "q8", "f16", "f32", "q5", "q4k", "q5k", "q6k"):
            if tile.serves(encoding):
                KERNELS[tile.kernel(encoding)].check_overrides(tile.overrides())
    outer = gemm.OuterTile(16, 8)            # xs and ws, two stages of 16 k each, f32
    assert (outer.name, outer.tm, outer.tn, outer.invocations) == ("64x128/o", 64, 128, 128)
    assert outer.workgroup_bytes == 2 * (64 + 128) * 16 * 4
    assert {e for e in ("q4", "q8", "q5", "q4k", "q5k", "q6k", "f16", "f32") if outer.serves(e)} == set(
        gemm.OUTER_ENCODINGS)
    assert Tile(16, 16, 8).tm == 128 and Tile(16, 16, 8).tn == 64
    big = RegisterTile(16, 8, 8, 16, 2)      # tiles + the 16-byte `red` stub
    assert (big.tm, big.tn, big.invocations, big.workgroup_bytes) == (128, 128, 256, 2 * 256 * 20 * 4 + 16)
    assert RegisterTile(16, 8, 8, 16, 2, half=True).workgroup_bytes == 2 * 256 * 20 * 2 + 16
    split = RegisterTile(8, 4, 4, 16, 2, ksplit=2)
    assert (split.name, split.invocations) == ("32x64/4x4/k16/s2/x2", 256)
    assert split.workgroup_bytes == 2 * 96 * 20 * 4 + 32 * 64 * 4 + 16
    # the WGSL's register arrays: x items ceil(RM BK / 4 WG_X KSPLIT) <= 4, weight items per encoding
    for tile in (t for t in gemm.TILES.values() if isinstance(t, RegisterTile)):
        assert -(-tile.tm * tile.bk // 4 // tile.invocations) <= 4
        for unit, most in ((16, 2), (8, 4), (4, 8)):     # q4/q8, f16, f32 (W_ITEMS_MAX)
            assert -(-tile.tn * tile.bk // unit // tile.invocations) <= most, tile.name
        assert tile.bk // 4 % tile.ksplit == 0
    # the outer kernel's named loads (gemm_outer_main.wgsl `Loads`): x items 2 BK / WG_X <= 8, a
    # whole number of rounds; weight items (units of 16) BK / (2 WG_Y) <= 4
    for tile in (t for t in gemm.TILES.values() if isinstance(t, gemm.OuterTile)):
        assert tile.tm * tile.bk // 4 % tile.invocations == 0 and tile.tm * tile.bk // 4 // tile.invocations <= 8
        assert -(-tile.tn * tile.bk // 16 // tile.invocations) <= 4, tile.name


def test_bench_hook_covers_the_requested_shapes():
    shapes = gemm.BENCH_SHAPES
    assert {s["m"] for s in shapes.values()} == {128, 512}
    assert {(s["n"], s["k"]) for s in shapes.values()} >= {(576, 576), (3072, 576), (576, 1536),
                                                          (2048, 2048), (16384, 2048), (2048, 8192),
                                                          (4096, 4096), (28672, 4096), (4096, 14336)}
    encodings = {(s["encoding"], s["block"], s["scale_type"]) for s in shapes.values()}
    assert encodings == {("q4", 32, "f16"), ("q8", 32, "f16")}


def test_prepare_bench_runs_a_small_shape(native_device, run):
    shape = {"m": 33, "n": 70, "k": 96, "encoding": "q8", "block": 32, "zero": None, "scale_type": "f16"}
    prepared = run(gemm.prepare_bench(native_device, "gemm_q8", shape, np.random.default_rng(0)))
    try:
        assert prepared.flops == 2 * 33 * 70 * 96
        assert prepared.bytes_moved == 70 * 96 + 70 * 3 * 2 + 33 * 96 * 4 + 33 * 70 * 4
        native_device.submit([prepared.dispatch])
        (y,) = run(prepared.read_outputs(native_device))
        assert np.isfinite(y).all()
    finally:
        prepared.release(native_device)
