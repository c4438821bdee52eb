"""Admission's step-floor stage: on a software adapter, a GPU that cannot beat the CPU path's step is
let go before the step's pipelines are compiled (backends/gpu/step_floor.py, engine/choice.py).

lavapipe is this machine's native adapter and says it is a fallback, as SwiftShader does in
Chromium (where the compile stage took 31.5 s of a first visit). The CPU step is injected
(choice.Measurement's seam), so the rule's outcome does not depend on this machine's speed;
the floor itself is measured on the device.
"""
from __future__ import annotations

import asyncio

import pytest

import webslm
from webslm.admission import pipelines as pipeline_set
from webslm.admission.admit import STAGES, AdmissionFailure, AdmissionPolicy, admit
from webslm.backends.gpu import step_floor as step_floor_module
from webslm.engine import Engine, verdict
from webslm.engine.choice import FLOOR_METHOD, CpuStep, by_measurement, time_gpu_step
from webslm.engine.states import State
from webslm.webgpu import native

pytestmark = pytest.mark.usefixtures("self_test_once")


@pytest.fixture(scope="module")
def model(stacked_slm_path):
    return webslm.open_model(stacked_slm_path)


def _fallback(gpu) -> bool:
    async def ask():
        adapter = await gpu.request_adapter("core")
        return adapter is not None and adapter.summary().is_fallback
    return asyncio.run(ask())


@pytest.fixture
def software_gpu(native_gpu):
    if not _fallback(native_gpu):
        pytest.skip("the native adapter is not a software (fallback) one: the step-floor stage does not run")
    return native_gpu


def _counting_compiles(monkeypatch) -> list:
    calls = []
    real = pipeline_set.compile

    async def counted(device, name, overrides):
        calls.append((name, tuple(sorted(overrides.items()))))
        return await real(device, name, overrides)
    monkeypatch.setattr(pipeline_set, "compile", counted)
    return calls


def test_a_step_that_cannot_beat_the_cpu_fails_at_the_step_floor_stage_with_nothing_compiled(
        software_gpu, model, monkeypatch):
    """max_step_seconds below any GPU step: admission stops at "step-floor" with "gpu-slower", its
    lower bound attached, nothing leaked, and the compile stage never ran."""
    compiles, stages = _counting_compiles(monkeypatch), []
    with pytest.raises(AdmissionFailure) as caught:
        asyncio.run(admit(software_gpu, model, AdmissionPolicy(max_step_seconds=1e-9), on_stage=stages.append))
    failure = caught.value
    assert (failure.stage, failure.code) == ("step-floor", "gpu-slower"), failure
    assert failure.step_floor_s > 1e-9 and failure.leaked_buffers == 0
    assert "at least" in failure.sentence and "not compiled" in failure.sentence
    assert stages[-1] == "step-floor" and "compile" not in stages and compiles == []
    assert failure.receipt.as_dict()["failure_stage"] == "step-floor"


def test_a_step_that_may_beat_the_cpu_is_admitted_and_its_floor_is_below_the_real_step(
        software_gpu, model, monkeypatch):
    """With a step to beat that the floor stays under, admission goes on through every stage;
    the pipeline the step-floor stage compiled is not compiled again; and the floor is a lower
    bound of the built executor's decode step, timed the way the engine's choice times it.

    Both are timings, and a busy CPU only adds to a timing: in a CI run whose browser suite
    shared the two cores, admission's floor read 16.5 ms against a 9.0 ms step timed seconds
    later. So the bound is checked on floors and steps timed in turn, the least of each, where
    both see the same load."""
    compiles, stages, floors = _counting_compiles(monkeypatch), [], []
    real_floor = step_floor_module.step_floor

    async def kept(*args, **kwargs):
        floors.append(await real_floor(*args, **kwargs))
        return floors[-1]
    monkeypatch.setattr(step_floor_module, "step_floor", kept)

    async def go():
        session = await admit(software_gpu, model, AdmissionPolicy(max_step_seconds=1e6), on_stage=stages.append)
        planned = set(session.kernels)
        from webslm.backends.gpu import GpuBackend
        backend = await GpuBackend.build(session, model)
        try:
            again, steps = [], []
            for _ in range(4):
                bound = await real_floor(session.device, model, session.plan, session.buffers, beat=1e6)
                again.append(bound.seconds)
                steps.append((await time_gpu_step(backend))[0])
            return session.step_floor_s, again, steps, planned
        finally:
            backend.release()
    floor, again, steps, planned = asyncio.run(go())
    assert stages == list(STAGES)
    assert floor is not None and floor > 0
    assert 0 < min(again) <= min(steps), (again, steps)
    # under the limit, every mat-vec form was timed; the compile stage compiled every planned
    # pipeline but those the step-floor stage had
    (timed,) = floors
    assert "decode mat-vec forms" in timed.what and timed.seconds == floor, timed
    assert len(timed.compiled) >= 2 and set(timed.compiled) <= planned, (timed.compiled, planned)
    assert len(compiles) == len(set(compiles)) == len(planned) - len(timed.compiled), (compiles, planned)


@pytest.mark.parametrize("beat, outcome", [(0.5, "alone"), (2.0, "forms"), (5.0, "admitted")])
def test_the_costliest_form_decides_first_and_every_mat_vec_form_next(software_gpu, model, monkeypatch, beat, outcome):
    """The floor's two rounds with injected GPU seconds (the costliest form 1 s, every form
    3 s): past the first, admission stops there; past the second only, it stops after timing
    every form; under both it goes on. The pipelines are really compiled and launched."""
    injected = iter([1.0, 3.0])
    real_timed = step_floor_module._timed

    async def timed(stage, groups, samples=1):
        await real_timed(stage, groups, samples)
        return next(injected)
    monkeypatch.setattr(step_floor_module, "_timed", timed)
    compiles = _counting_compiles(monkeypatch)

    async def go():
        try:
            session = await admit(software_gpu, model, AdmissionPolicy(max_step_seconds=beat))
        except AdmissionFailure as failure:
            return failure
        session.destroy()
        return session
    result = asyncio.run(go())
    if outcome == "admitted":
        assert result.step_floor_s == 3.0 and compiles, result
        return
    assert (result.stage, result.code, result.leaked_buffers) == ("step-floor", "gpu-slower", 0), result
    assert result.step_floor_s == (1.0 if outcome == "alone" else 3.0) and compiles == []
    assert ("mat-vec alone" if outcome == "alone" else "decode mat-vec forms") in result.sentence, result.sentence


def test_the_engine_records_the_floor_as_its_choice_and_the_verdict_keeps_it(software_gpu, model):
    """Engine.load with a measured choice whose CPU step is faster than any GPU: the CPU path
    answers, the reason is admission's step-floor stage, the Choice's GPU figure is the floor (a
    lower bound: "more than"), and the kept verdict stores it like a timed step."""
    cpu_calls = []

    def cpu_step(m):
        cpu_calls.append(m)
        return CpuStep(1e-9, 1e-9, 0.0, "injected")
    engine = Engine(model, gpu=software_gpu, gpu_choice=by_measurement(cpu_step))
    assert asyncio.run(engine.load()) is State.CPU_READY
    reason, choice = engine.cpu_reason, engine.choice
    assert (reason["code"], reason["stage"]) == ("gpu-slower", "step-floor"), reason
    assert choice.backend == "cpu" and choice.gpu_method == FLOOR_METHOD and not choice.gpu_step_finished
    assert choice.gpu_steps_timed == 0 and choice.gpu_step_s > 1e-9 and "more than" in reason["sentence"]
    assert len(cpu_calls) == 1                                   # estimated once, before admission
    key = "a" * 64
    kept = verdict.updated(None, key, choice, now="2026-12-04")
    assert kept is not None and verdict.parse(kept)[key]["gpu_step_finished"] is False
    asyncio.run(engine.unload())


def test_a_hardware_adapter_skips_the_step_floor_stage(native_gpu, model, monkeypatch):
    """An adapter that does not say it is a fallback is never judged by the floor: its real
    step is timed after admission, as before."""
    monkeypatch.setattr(native.NativeAdapter, "summary", _not_fallback(native.NativeAdapter.summary))
    session = asyncio.run(admit(native_gpu, model, AdmissionPolicy(max_step_seconds=1e-9)))
    try:
        assert session.step_floor_s is None
    finally:
        session.destroy()


def _not_fallback(summary):
    import dataclasses

    def patched(self):
        return dataclasses.replace(summary(self), is_fallback=False)
    return patched
