"""Admission v1 on wgpu-native: the default model is admitted; every fault case fails at its
stage with its code and leaves nothing allocated; the receipt keeps out what it must."""
import asyncio
import json
import pathlib
import subprocess
import sys

import pytest

import webslm
from webslm.admission.admit import STAGES, AdmissionFailure, AdmissionPolicy, admit, choose_tier
from webslm.admission.pipelines import pipelines
from webslm.admission.receipt import check_privacy
from webslm.admission.tracked import FAULT_OUTCOMES, NAMED_FAULTS, Faults
from webslm.kernels import golden

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLM = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"

EXPECTED = FAULT_OUTCOMES


@pytest.fixture(scope="module")
def model(fixture_slm_path):
    """The default SmolLM2 when set-up built it, else the fixture model (same code paths)."""
    return webslm.open_model(SLM if SLM.exists() else fixture_slm_path)


def test_the_default_model_is_admitted_with_its_tier_and_receipt(native_gpu, model):
    stages, progress = [], []
    session = asyncio.run(admit(native_gpu, model, on_stage=stages.append,
                                on_progress=lambda *p: progress.append(p)))
    try:
        assert stages == list(STAGES)
        # progress within the long stages: counts rise to their totals, one stage at a time
        by_stage = {}
        for stage, done, total in progress:
            by_stage.setdefault(stage, []).append((done, total))
        assert list(by_stage) == ["allocate", "compile", "self-test"]
        for stage, steps in by_stage.items():
            assert [d for d, _ in steps] == sorted(d for d, _ in steps), stage
            assert len({t for _, t in steps}) == 1 and steps[-1][0] == steps[-1][1] > 0, (stage, steps[-3:])
        weights = sum(t.nbytes for t in model.manifest.tensors.values())
        assert by_stage["allocate"][-1][1] <= weights
        assert by_stage["compile"][-1][1] == len(session.pipelines)
        assert session.tier == "C" and session.features == ("shader-f16", "subgroups")   # lavapipe
        assert session.self_test["cases"] > 100
        # the self-tests ran exactly the kernels the plan compiled, each by at least one case
        assert session.self_test["kernels"] == sorted({name for name, _ in pipelines(model, session.device, session.plan)})
        planned = [b.name for b in session.plan.buffers]
        assert sorted(session.buffers) == sorted(planned)
        assert len(session.device.live_buffers) == len(planned)
        receipt = session.receipt.as_dict()
        check_privacy(receipt)
        assert receipt["outcome_code"] == "admitted" and receipt["failure_stage"] is None
        assert receipt["enabled_feature_bits"] == ["shader-f16", "subgroups"]
        assert receipt["model_artifact_hash"] == model.identity.artifact_sha256
        print("\nadmitted:", session.tier, session.seconds)
    finally:
        session.destroy()
    assert session.device.destroyed and not session.device.live_buffers


def test_a_planned_kernel_no_self_test_runs_is_not_admitted(native_gpu, stacked_slm_path, monkeypatch):
    """A kernel the plan runs that no golden case covers (here: the swiglu family gives no
    results) fails admission: nothing runs on the GPU that the oracle did not check there."""
    async def no_cases(ctx):
        return []
    monkeypatch.setitem(golden.FAMILIES, "swiglu", no_cases)
    with pytest.raises(AdmissionFailure) as caught:
        asyncio.run(admit(native_gpu, webslm.open_model(stacked_slm_path)))
    assert (caught.value.stage, caught.value.code) == ("self-test", "self-test-incomplete")
    assert "swiglu" in caught.value.sentence and caught.value.leaked_buffers == 0


@pytest.mark.parametrize("fault", NAMED_FAULTS)
def test_every_fault_fails_at_its_stage_and_leaks_nothing(native_gpu, model, fault):
    with pytest.raises(AdmissionFailure) as caught:
        asyncio.run(admit(native_gpu, model, faults=Faults.named(fault)))
    failure = caught.value
    assert (failure.stage, failure.code) == EXPECTED[fault], failure
    assert failure.leaked_buffers == 0
    receipt = failure.receipt.as_dict()
    check_privacy(receipt)
    assert receipt["outcome_code"] == failure.code and receipt["failure_stage"] == failure.stage
    assert failure.sentence and "Traceback" not in failure.sentence


def test_no_entry_point_fails_first(model):
    with pytest.raises(AdmissionFailure) as caught:
        asyncio.run(admit(None, model))
    assert (caught.value.stage, caught.value.code) == ("entry-point", "no-webgpu")
    assert caught.value.receipt.as_dict()["feature_level"] == "none"


def test_only_validated_models_are_admitted(native_gpu):
    with pytest.raises(AdmissionFailure) as caught:
        asyncio.run(admit(native_gpu, object()))
    assert (caught.value.stage, caught.value.code) == ("artifact", "not-validated")


def test_a_fallback_adapter_can_be_refused(native_gpu, model):
    with pytest.raises(AdmissionFailure) as caught:     # lavapipe is a CPU (fallback) adapter
        asyncio.run(admit(native_gpu, model, AdmissionPolicy(allow_fallback=False)))
    assert (caught.value.stage, caught.value.code) == ("adapter", "fallback-disallowed")


def test_tier_choice_follows_features_and_policy():
    policy = AdmissionPolicy()
    assert choose_tier(frozenset(), policy) == ("A", ())
    assert choose_tier(frozenset({"shader-f16"}), policy) == ("B", ("shader-f16",))
    assert choose_tier(frozenset({"subgroups"}), policy) == ("C", ("subgroups",))
    assert choose_tier(frozenset({"subgroups", "shader-f16"}), AdmissionPolicy(tiers=("A", "B"))) == \
        ("B", ("shader-f16",))


def test_fault_names_are_checked():
    with pytest.raises(ValueError, match="no fault case"):
        Faults.named("meteor-strike")


def test_cli_admit_prints_the_receipt_or_the_failing_stage(native_gpu, gpu_slm_path, fixture_slm_path):
    ok = subprocess.run([sys.executable, "-m", "webslm.cli", "admit", "--model", str(gpu_slm_path),
                         "--backend", "native", "--json"], capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["admitted"] and report["receipt"]["outcome_code"] == "admitted"
    bad = subprocess.run([sys.executable, "-m", "webslm.cli", "admit", "--model", str(gpu_slm_path),
                          "--fault", "compile-failure"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1
    assert "not admitted: pipeline-failed at stage compile" in bad.stderr
    assert "Traceback" not in bad.stderr + bad.stdout


def test_a_model_the_gpu_path_cannot_run_is_refused_before_any_gpu_work(native_gpu, fixture_slm_path):
    """The fixture has q/k/v biases and f16 norms: refused at "derive", before an adapter is
    even requested, with the reason in the sentence (the engine then serves it on the CPU)."""
    out = subprocess.run([sys.executable, "-m", "webslm.cli", "admit", "--model", str(fixture_slm_path),
                          "--json"], capture_output=True, text=True, timeout=600)
    report = json.loads(out.stdout)
    assert out.returncode == 1 and not report["admitted"]
    assert (report["stage"], report["code"]) == ("derive", "unsupported-model")
    assert "biases" in report["sentence"]


def test_every_kernel_fits_the_storage_buffers_admission_asks_for():
    """No kernel binds more storage buffers than admission requests (KERNEL_LIMITS, capped by
    the adapter): a kernel past it would fail to compile on every device, WebGPU's default
    (8) being below what the q5k mat-vec with its norm input binds (9)."""
    from webslm.admission.pipelines import KERNEL_LIMITS
    from webslm.kernels import registry
    most = max(sum("storage" in kind for kind in spec.bindings) for spec in registry.KERNELS.values())
    assert most == KERNEL_LIMITS["maxStorageBuffersPerShaderStage"], most
