"""Split K across workgroups for the prefill GEMM (kernels/gemm_split.py) on wgpu-native.

- The golden family "gemm_split" (both launches against gemm_oracle's bound: every KPARTS,
  encodings, odd tails and an empty part, ACCUMULATE, q|k|v sections, extreme codes).
- The host rule: when it splits, how far, and what it never does.
- The engine with split GEMMs in its prefill follows the CPU oracle (the tiny models have too
  few K steps to split under the shipped rule, so the test lowers MIN_WORKGROUPS and
  MIN_STEPS_PER_PART until it does, and checks that it did).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.backends.gpu import GpuBackend
from webslm.backends.scores import Want
from webslm.cpu import CpuBackend
from webslm.generate import prompt_ids
from webslm.kernels import gemm, gemm_split, golden
from webslm.program.fusion import ALL

H200 = {"maxComputeInvocationsPerWorkgroup": 1024, "maxComputeWorkgroupSizeX": 1024,
        "maxComputeWorkgroupStorageSize": 49152, "maxComputeWorkgroupsPerDimension": 65535,
        "maxStorageBufferBindingSize": 1 << 31}
FEATURES = frozenset({"shader-f16", "subgroups"})
LOGIT_TOLERANCE = 2e-3            # tests/test_gpu_engine_native.py's bound


@pytest.mark.parametrize("size", ["full", "quick"])
def test_golden_gemm_split_passes(native_device, run, size):
    report = run(golden.run_all(native_device, size, seed=5, families=["gemm_split"]))
    results = report["families"]["gemm_split"]["results"]
    failed = [f"{r['kernel']} | {r['case']}: over={r['error_over_tolerance']:.3g}" for r in report["failed"]]
    assert report["passed"], json.dumps(failed, indent=1)
    names = " ".join(r["case"] for r in results)
    if size == "full":
        for part in ("parts 2", "parts 4", "parts 8", "an empty part", "accumulate", "sections + accumulate",
                     "q4k", "q6k", "q5", "max codes", "min codes"):
            assert part in names, part
    assert len(results) >= (27 if size == "full" else 2)


def _tiles(m, n, tile, parts):
    return -(-m // tile.tm) * -(-n // tile.tn) * parts


@pytest.mark.parametrize("m,n,k", [(128, 2048, 8192), (128, 2048, 2048), (128, 576, 1536), (512, 576, 1536)])
def test_the_split_fills_the_gpu_where_the_tiles_alone_do_not(m, n, k):
    tile, parts = gemm_split.choose_tile(H200, m, n, k, FEATURES, "q4", 1 << 21)
    assert isinstance(tile, gemm.OuterTile) and parts in gemm_split.KPARTS
    assert _tiles(m, n, tile, 1) < gemm.MIN_WORKGROUPS <= _tiles(m, n, tile, parts)
    assert -(-k // tile.bk) >= parts * gemm_split.MIN_STEPS_PER_PART
    assert gemm_split.partial_floats(m, n, parts) <= 1 << 21


def test_the_split_leaves_what_fills_the_gpu_and_never_overflows_its_room():
    # Llama-3.2-1B gate|up at 128 tokens: 128 outer tiles, no split (the tile of before).
    tile, parts = gemm_split.choose_tile(H200, 128, 16384, 2048, FEATURES, "q4", 1 << 21)
    assert parts == 1 and tile == gemm.choose_tile(H200, 128, 16384, FEATURES, encoding="q4")
    # no room for partial sums: no split, whatever the shape
    assert gemm_split.choose_tile(H200, 128, 2048, 8192, FEATURES, "q4", 0)[1] == 1
    # f16 weights have no outer tile: never split
    tile, parts = gemm_split.choose_tile(H200, 128, 2048, 8192, FEATURES, "f16", 1 << 21)
    assert parts == 1 and not isinstance(tile, gemm.OuterTile)
    # too few K steps for two parts of MIN_STEPS_PER_PART
    assert gemm_split.choose_parts(gemm.TILES["128x128/o"], 128, 2048, 16 * 15, 1 << 21) == 1
    with pytest.raises(gemm.GemmError):
        p = gemm.plan(H200, gemm.random_parts(np.random.default_rng(0), "f16", 64, 64), 8, tile=gemm.TILES["32x32"])
        gemm_split.split(H200, p, 8, 64, 2, False)


def test_the_policy_off_is_the_tile_choice_of_before(monkeypatch):
    monkeypatch.setattr(gemm_split, "POLICY", "off")
    for m, n, k in [(128, 2048, 8192), (512, 576, 1536), (128, 16384, 2048)]:
        tile, parts = gemm_split.choose_tile(H200, m, n, k, FEATURES, "q4", 1 << 21)
        assert parts == 1 and tile == gemm.choose_tile(H200, m, n, FEATURES, encoding="q4")


def test_an_engine_with_split_prefill_gemms_follows_the_cpu_oracle(native_gpu, stacked_slm_path, run, monkeypatch):
    monkeypatch.setattr(gemm, "MIN_WORKGROUPS", 8)
    monkeypatch.setattr(gemm_split, "MIN_STEPS_PER_PART", 1)
    model = webslm.open_model(stacked_slm_path)
    ids = prompt_ids(model, "hi there, a few more words to read", chat=True)

    async def go():
        session = await admit(native_gpu, model, AdmissionPolicy(fusions=ALL, tuning="off"))
        split = sorted({(n, dict(o)["KPARTS"]) for n, o in session.kernels if n == "gemm_reduce"})
        backend = await GpuBackend.build(session, model)
        forward = backend.forward
        split_now = [launch.label for op in forward.programs["prefill"].ops if op.kind == "matmul"
                     for launch in forward.lowering.lower(op, "prefill", len(ids), 0) if launch.kernel == "gemm_reduce"]
        assert split_now, "this prompt's prefill splits no GEMM"
        cpu = CpuBackend(model)
        try:
            got, want = (await backend.prefill(ids, Want("full"))).logits, cpu.prefill(ids)
            errors = [float(np.abs(got - want).max()) / float(np.abs(want).max())]
            for _ in range(3):
                token = int(np.argmax(want))
                got, want = (await backend.decode_one(token, Want("full"))).logits, cpu.decode_one(token)
                errors.append(float(np.abs(got - want).max()) / float(np.abs(want).max()))
            return split, errors
        finally:
            backend.release()
    split, errors = run(go())
    assert split, "the rule split no prefill GEMM: the test checks nothing"
    assert max(errors) <= LOGIT_TOLERANCE, errors
