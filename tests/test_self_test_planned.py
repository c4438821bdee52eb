"""Admission's self-test runs the plan's own pipelines: each case on a pipeline the plan
compiled (its launch shape from the plan, its weight formats and head dims the model's), no
pipeline compiled for the self-test alone, and every planned pipeline run by some case."""
import asyncio
import pathlib

import numpy as np
import pytest

import webslm
from webslm.admission.admit import AdmissionFailure, admit
from webslm.kernels import golden
from webslm.kernels.golden import GoldenContext, weight_format
from webslm.kernels.matvec import kernel_name
from webslm.kernels.registry import compile_kernel

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLM = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"


@pytest.fixture(scope="module")
def model(fixture_slm_path):
    """The default SmolLM2 when set-up built it, else the fixture model (same code paths)."""
    return webslm.open_model(SLM if SLM.exists() else fixture_slm_path)


def _key(name: str, overrides: dict) -> tuple:
    return (name, tuple(sorted(overrides.items())))


def test_admission_compiles_nothing_for_its_self_test_and_runs_every_planned_pipeline(native_gpu, model,
                                                                                      monkeypatch):
    compiled_by_the_self_test, reports = [], []
    original_compile, original_run_all = golden.compile_kernel, golden.run_all

    async def counting(device, name, **overrides):
        compiled_by_the_self_test.append(_key(name, overrides))
        return await original_compile(device, name, **overrides)

    async def keep(*args, **kwargs):
        reports.append(await original_run_all(*args, **kwargs))
        return reports[-1]
    monkeypatch.setattr(golden, "compile_kernel", counting)
    monkeypatch.setattr(golden, "run_all", keep)
    session = asyncio.run(admit(native_gpu, model))
    try:
        assert compiled_by_the_self_test == []
        (report,) = reports
        assert report["untested_pipelines"] == [] and report["passed"]
        assert report["cases"] > 100
    finally:
        session.destroy()


def test_a_planned_pipeline_no_case_runs_is_not_admitted(native_gpu, model, monkeypatch):
    """The kernel's name tested is not enough: a pipeline of it that no case ran (here every
    family but the first match of each launch is turned away) fails admission."""
    launches = GoldenContext.launches

    def first_only(self, name, overrides, launch=("WG",)):
        return launches(self, name, overrides, launch)[:1] if name.startswith("matvec_") else \
            launches(self, name, overrides, launch)
    monkeypatch.setattr(GoldenContext, "launches", first_only)
    session_or_failure = None
    try:
        session_or_failure = asyncio.run(admit(native_gpu, model))
    except AdmissionFailure as failure:
        session_or_failure = failure
    if not isinstance(session_or_failure, AdmissionFailure):
        planned = [key for key in session_or_failure.kernels if key[0].startswith("matvec_")]
        session_or_failure.destroy()
        pytest.skip(f"this model's plan has one mat-vec pipeline of each meaning ({len(planned)} in all)")
    failure = session_or_failure
    assert (failure.stage, failure.code) == ("self-test", "self-test-incomplete"), failure
    assert "planned pipeline" in failure.sentence and failure.leaked_buffers == 0


def test_a_weight_format_no_fixed_case_has_is_tested_in_that_format(native_device, run):
    """A q4 mat-vec of block 128, offset zero, f32 scales on 2 rows a workgroup of 64: the
    cases are made of the planned format (random, adversarial, extreme codes), at its shape."""
    name = kernel_name("q4", "subgroups" in native_device.features)
    overrides = {"WG": 64, "ROWS": 2, "BLOCK": 128, "SCALE_F16": 0, "ZERO_MIN": 0}
    kernel = run(compile_kernel(native_device, name, **overrides))
    report = run(golden.run_all(native_device, "quick", kernels={name}, compiled={_key(name, overrides): kernel}))
    assert report["passed"], report["failed"]
    assert report["untested_pipelines"] == []
    results = [r for f in report["families"].values() for r in f["results"]]
    assert {r["kernel"] for r in results} == {golden.label(kernel.spec, overrides)}
    cases = [r["case"] for r in results]
    assert any(c.startswith("random") for c in cases) and any("codes" in c for c in cases)
    assert any(c.startswith(("constant", "huge", "tiny")) for c in cases)
    assert all("q4/128/offset/f32" in c for c in cases if c.startswith(("random", "constant", "huge")))


def test_a_planned_pipeline_outside_every_case_is_reported_untested(native_device, run):
    """The rows prefill kernel at head_dim 80 (HD4 = 20, past its 64): no case can run it, so
    the report names it (the pipeline is never run, so a stand-in object is enough here)."""
    key = _key("attention_prefill_rows_f16", {"HD4": 20})
    report = run(golden.run_all(native_device, "quick", kernels={key[0]}, compiled={key: object()}))
    assert report["untested_pipelines"] == ["attention_prefill_rows_f16[HD4=20]"]


def test_launches_keep_the_meaning_and_take_the_plan_s_launch_shape(native_device):
    planned = frozenset({_key("matvec_q4", {"WG": 32, "ROWS": 1, "BLOCK": 32, "SCALE_F16": 1, "ZERO_MIN": 1}),
                         _key("matvec_q4", {"WG": 64, "ROWS": 2, "BLOCK": 32, "SCALE_F16": 1, "ZERO_MIN": 1}),
                         _key("matvec_q4", {"WG": 32, "ROWS": 4, "BLOCK": 32, "SCALE_F16": 1, "ZERO_MIN": 0}),
                         _key("gemm_outer_q8", {"WG_X": 8, "WG_Y": 8, "BLOCK": 32, "SCALE_F16": 0})})
    context = GoldenContext(native_device, np.random.default_rng(0), "quick", planned=planned)
    asked = {"WG": 128, "ROWS": 4, "BLOCK": 32, "SCALE_F16": 1, "ZERO_MIN": 1}
    assert context.launches("matvec_q4", asked, ("WG", "ROWS")) == [
        {"WG": 32, "ROWS": 1, "BLOCK": 32, "SCALE_F16": 1, "ZERO_MIN": 1},
        {"WG": 64, "ROWS": 2, "BLOCK": 32, "SCALE_F16": 1, "ZERO_MIN": 1}]
    assert context.launches("matvec_q4", {**asked, "ACCUMULATE": 1}, ("WG", "ROWS")) == []   # another meaning
    assert context.launches("matvec_q4", asked, ()) == []          # no launch key: only the exact pipeline
    assert not context.planned_pipeline("matvec_q8", asked)
    assert context.planned_formats("matvec_") == [("q4", 32, "min", "f16"), ("q4", 32, "offset", "f16")]
    assert context.planned_formats("gemm_") == [("q8", 32, None, "f32")]
    outside = GoldenContext(native_device, np.random.default_rng(0), "quick")
    assert outside.launches("matvec_q4", asked, ("WG", "ROWS")) == [asked] and outside.planned_formats("x") is None


def test_weight_formats_are_read_from_names_and_overrides():
    assert weight_format("matvec_norm_q4_subgroup", {"BLOCK": 64, "ZERO_MIN": 0, "SCALE_F16": 0}) == \
        ("q4", 64, "offset", "f32")
    assert weight_format("matvec_int8_q4k_xq_subgroup", {"ROWS": 4}) == ("q4k", 256, "scaled-min", "f16")
    assert weight_format("embed_q8", {"BLOCK": 32, "SCALE_F16": 1}) == ("q8", 32, None, "f16")
    assert weight_format("matvec_f16_wide", {}) == ("f16", None, None, None)
    assert weight_format("rms_norm_vec4", {"WG": 128}) is None
