"""The q5 and super-block (q4k, q5k, q6k) kernels on wgpu-native: decode mat-vec (every input
mode, both reductions), prefill GEMM (classic and register tiles, f32 and f16 tiles) and the
embedding gather, against the numpy oracles (kernels/kquant.py terms, quant.dequantize) on
random, adversarial and real (Gemma 3 270M Q4_K_M GGUF) weights.

Tolerances: the families' own rules (docs/kernels.md): mat-vec gamma(2 K_padded + 2) sum(|s c|
+ |zero part|) |x| (+ the norm/swiglu/ACCUMULATE terms), GEMM gamma(K + 2) sum(|s c| + |m|) |x|
(f16 tiles: HALF_RULE), embedding bit-exact (q5 "min" with f32 scales: one rounding, FMA_RULE).
"""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from webslm.kernels import embed as em
from webslm.kernels import gemm as gm
from webslm.kernels import golden, kquant, matvec_cases
from webslm.kernels import matvec as mv
from webslm.kernels import matvec_oracle as mvo
from webslm.kernels.registry import KERNELS
from webslm.kernels.weights import Weights

ROOT = pathlib.Path(__file__).resolve().parents[1]
GEMMA = ROOT / ".assets" / "cache" / "gemma-3-270m-q4_k_m.gguf"
NEW = kquant.ENCODINGS


def new_kernels() -> set[str]:
    """Every registry kernel that reads q5 or a super-block encoding."""
    return {name for name in KERNELS if any(f"_{e}" in name for e in NEW) and not name.startswith("probe")}


def _failures(report) -> str:
    return json.dumps(report["failed"][:5], indent=1)


@pytest.mark.parametrize("size", ["quick", "full"])
def test_every_new_kernel_passes_its_golden_cases(native_device, run, size):
    """Full: every case; quick: the browser rows' and admission's subset, which must still
    reach every kernel (admission refuses a plan whose kernels no self-test ran)."""
    wanted = new_kernels()
    report = run(golden.run_all(native_device, size, seed=11, families=["matvec", "matvec_fused", "gemm", "embed"],
                                kernels=wanted))
    assert report["passed"], _failures(report)
    runnable = {name for name in wanted if KERNELS[name].runs_on(native_device.features)}
    untested = runnable - golden.tested_kernels(report)
    if size == "quick":    # the f16-tile GEMMs are never planned (TILE_ORDER lists no "/h" tile)
        untested = {name for name in untested if not name.startswith("gemm_tiled_half_")}
    assert not untested, sorted(untested)


@pytest.mark.parametrize("encoding, block, zero, scale_type", matvec_cases.PACKED_FORMS)
def test_terms_are_the_cpu_decoder_exactly(encoding, block, zero, scale_type):
    """kquant.terms (float64, exact) rounded to f32 is what quant.dequantize computes: the
    super-blocks' products are exact in f32, so the CPU decoder rounds once (q5 "min" with f32
    scales rounds the product and the sum: within 2^-24 (|s c| + |w|) of it)."""
    rng = np.random.default_rng(3)
    for codes, scales in (("random", "normal"), ("mixed", "extreme"), ("max", "extreme")):
        w = kquant.random_weights(rng, encoding, 5, 512, block, zero, scale_type, codes, scales)
        t, cpu = kquant.terms(w), w.dequantize()
        exact = t.w
        if (zero, scale_type) == ("min", "f32"):
            assert np.all(np.abs(cpu - exact) <= 2.0 ** -24 * (np.abs(t.code) + np.abs(exact)))
        else:
            assert np.array_equal(cpu, exact.astype(np.float32))


@pytest.mark.parametrize("encoding", NEW)
def test_the_bound_catches_wrong_results(encoding):
    """A kernel that drops a sub-block's zero part, reads a neighbour's sub-scale, shifts rows or
    loses the last super-block must fail the mat-vec and GEMM rules."""
    rng = np.random.default_rng(4)
    w = kquant.random_weights(rng, encoding, 6, 512)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    t = kquant.terms(w)
    wrong = {"no zero part": x @ t.code.T, "rows shifted": np.roll(x @ t.w.T, 1, axis=1),
             "last block lost": x[:, :256] @ t.w[:, :256].T,
             "neighbour's scale": x @ (t.w * np.roll(np.abs(t.code) + 1, 32, axis=1) / (np.abs(t.code) + 1)).T}
    for name, oracle in (("matvec", mvo.oracle), ("gemm", lambda w_, x_: gm.oracle(w_, x_))):
        exact, bound, rule = oracle(w, x)
        assert golden.compare_bound(name, "k", "c", exact.astype(np.float32), exact, bound, rule).passed
        for what, y in wrong.items():
            assert not golden.compare_bound(name, "k", what, y, exact, bound, rule).passed, (name, what)


def test_rows_must_hold_whole_blocks_before_any_gpu_work():
    w = kquant.random_weights(np.random.default_rng(5), "q4k", 3, 256)
    with pytest.raises(gm.GemmError, match="whole blocks"):
        gm.plan({"maxStorageBufferBindingSize": 1 << 27, "maxComputeWorkgroupsPerDimension": 65535,
                 "maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupStorageSize": 16384},
                Weights("q4k", 3, 200, w.parts, 256, "scaled-min", "f16"), 4)
    with pytest.raises(ValueError, match="whole blocks"):
        kquant.random_weights(np.random.default_rng(5), "q6k", 3, 300)


# -- real weights: Gemma 3 270M's Q4_K_M GGUF -------------------------------------------------------

def _gemma_tensor(reader, name: str, rows: int | None = None) -> Weights:
    """The first `rows` rows of a GGUF tensor, split into .slm parts by the converter's code."""
    from webslm.artifact.writer import quant_descriptor
    from webslm.convert.gguf_blocks import LOSSLESS, split_blocks
    tensor = next(t for t in reader.tensors if t.name == name)
    raw = np.asarray(tensor.data)[:rows]
    encoding, zero, parts = split_blocks(tensor.tensor_type, raw)
    _, _, block, _ = LOSSLESS[tensor.tensor_type]
    cols = int(tensor.shape[0])
    q = quant_descriptor(encoding, cols, block, zero)
    return Weights(encoding, raw.shape[0], cols, parts, block, zero if zero != "none" else None, q["scale_type"])


@pytest.fixture(scope="module")
def gemma():
    if not GEMMA.exists():
        pytest.skip("the Gemma 3 GGUF is fetched by `python tools/test_data.py gemma3`")
    gguf = pytest.importorskip("gguf")
    return gguf.GGUFReader(str(GEMMA))


# name, rows taken: Q5_0, Q4_K, Q6_K (and Q8_0, the embedding) as Gemma's Q4_K_M stores them
GEMMA_TENSORS = [("blk.0.attn_q.weight", 256), ("blk.0.attn_output.weight", None), ("blk.0.ffn_down.weight", None),
                 ("blk.3.ffn_down.weight", 128), ("token_embd.weight", 512)]


@pytest.mark.parametrize("name, rows", GEMMA_TENSORS)
def test_real_gemma_weights(native_device, run, gemma, name, rows):
    """Each kernel kind on a real tensor: the parts decode like the gguf package, and the
    mat-vec (plain, norm), the GEMM and the gather pass their rules."""
    from gguf.quants import dequantize as gguf_dequantize
    w = _gemma_tensor(gemma, name, rows)
    tensor = next(t for t in gemma.tensors if t.name == name)
    reference = gguf_dequantize(np.asarray(tensor.data)[:w.rows], tensor.tensor_type)
    assert np.array_equal(w.dequantize(), reference.astype(np.float32))
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, w.cols)).astype(np.float32)
    results = []
    for subgroups in (False, True):
        kernel = mv.kernel_name(w.encoding, subgroups)
        if not KERNELS[kernel].runs_on(native_device.features):
            continue
        _, overrides = mv.choose_kernel(native_device, w)
        exact, bound, rule = mvo.oracle(w, x)
        results.append(golden.compare_bound("matvec", kernel, name, run(mv.matvec(native_device, w, x, kernel, overrides)),
                                            exact, bound, rule))
        g = (1 + 0.1 * rng.standard_normal(w.cols)).astype(np.float32)
        kernel = mv.kernel_name(w.encoding, subgroups, "norm")
        _, overrides = mv.choose_kernel(native_device, w, input="norm")
        exact, bound, rule = mvo.fused_oracle(w, 3 * x, "norm", g, 1e-6)
        y = run(mv.matvec(native_device, w, 3 * x, kernel, overrides, input="norm", norm_weight=g, eps=1e-6))
        results.append(golden.compare_bound("matvec", kernel, name + " norm", y, exact, bound, rule))
    xs = rng.standard_normal((19, w.cols)).astype(np.float32)
    for tile in (None, gm.TILES["32x32"], gm.TILES["64x64/4x4/k16/s2"]):
        if tile is not None and not tile.admitted(native_device.limits, native_device.features):
            continue
        exact, bound, rule = gm.oracle(w, xs)
        results.append(golden.compare_bound("gemm", str(tile), name, run(gm.gemm(native_device, w, xs, tile=tile)),
                                            exact, bound, rule))
    table = em.embed_tensor(w.encoding, (w.rows, w.cols), w.descriptor(), w.parts)
    ids = np.array([0, w.rows - 1, w.rows // 2, 7, 7], np.uint32)
    results.append(em.check_embed(table.kernel, name, table, ids, run(em.embed(native_device, ids, table))))
    failed = [r.as_dict() for r in results if not r.passed]
    assert len(results) >= 4 and not failed, failed


# -- admission: which mixes of encodings the GPU step runs ---------------------------------------------

def _synthetic():
    import importlib.util
    spec = importlib.util.spec_from_file_location("synthetic_model", ROOT / "bench" / "synthetic_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("scheme", ["q4k_m", "kmix"])
def test_admission_takes_the_k_quant_mixes(tmp_path, scheme):
    import webslm
    from webslm.admission.pipelines import unsupported
    path = tmp_path / f"{scheme}.slm"
    _synthetic().write_synthetic(path, "kquant", scheme=scheme)
    model = webslm.open_model(path)
    assert {info.encoding for info in model.manifest.tensors.values()} >= (
        {"q4k", "q6k", "f32"} if scheme == "q4k_m" else {"q4k", "q5k", "q6k", "q5", "q8", "f32"})
    assert unsupported(model.manifest) is None


def test_admission_takes_layers_of_one_projection_in_different_row_geometries(tmp_path, monkeypatch):
    """q4k (256-blocks) in layer 0 and q8 (32-blocks) in layer 1 for ffn_down: once refused (one
    launch shape per projection), now each form has its own params slot (program/ops.py
    weight_forms); tests/test_gpu_kquant_native.py runs such a model (kmix_layers) on the GPU."""
    import webslm
    from webslm.admission.pipelines import unsupported
    from webslm.program.ops import weight_forms
    synthetic = _synthetic()
    mix = synthetic.encoding

    def encoding(name, scheme="q4", n_layers=1):
        if name == "blk.1.ffn_down":
            return synthetic.Q8
        return mix(name, "q4k_m", n_layers)
    monkeypatch.setattr(synthetic, "encoding", encoding)
    path = tmp_path / "mixed.slm"
    synthetic.write_synthetic(path, "kquant", scheme="q4k_m")
    manifest = webslm.open_model(path).manifest
    assert manifest.tensors["blk.0.ffn_down"].encoding == "q4k"
    assert unsupported(manifest) is None
    forms = weight_forms(manifest)
    assert forms["blk.0.ffn_down"] == "q4k-256-scaled-min-f16" and forms["blk.1.ffn_down"] == "q8-32-f16"
