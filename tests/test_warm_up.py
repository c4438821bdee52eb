"""The GPU warm-up the page runs beside the model's load (admission/warm_up.py): what it does,
that it never fails a load, and that it leaves no device open. lavapipe is a fallback adapter,
so the full warm-up is asked for with compile_on_fallback."""
import pytest

import webslm
from webslm.admission import warm_up as warm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.admission.tracked import TrackedDevice, open_devices


@pytest.fixture
def made(monkeypatch):
    """The warm-up's devices (a weak set would forget one that was only dropped)."""
    devices = []

    class Kept(TrackedDevice):
        def __init__(self, inner):
            super().__init__(inner)
            devices.append(self)
    monkeypatch.setattr(warm, "TrackedDevice", Kept)
    return devices


def test_a_full_warm_up_compiles_and_runs_the_probe_and_destroys_its_device(native_gpu, run, made):
    report = run(warm.warm_up(native_gpu, compile_on_fallback=True))
    assert report["warmed"] and report["reason"] == "", report
    assert list(report["seconds"]) == ["adapter", "device", "compile", "run", "destroy"]
    assert all(s >= 0 for s in report["seconds"].values())
    assert report["adapter"].startswith("llvmpipe") and report["fallback"]
    assert len(made) == 1 and made[0].destroyed and not made[0].live_buffers


def test_on_a_fallback_adapter_it_stops_after_the_device(native_gpu, run, made):
    """A software renderer's first compile would take the CPU the model's validation uses."""
    report = run(warm.warm_up(native_gpu))
    assert not report["warmed"] and "fallback adapter" in report["reason"], report
    assert list(report["seconds"]) == ["adapter", "device", "destroy"]
    assert len(made) == 1 and made[0].destroyed


def test_without_webgpu_it_says_so():
    import asyncio
    report = asyncio.run(warm.warm_up(None))
    assert report == {"warmed": False, "adapter": None, "fallback": False, "seconds": {},
                      "reason": "no WebGPU entry point"}


def test_a_failure_is_reported_never_raised_and_the_device_is_destroyed(native_gpu, run, monkeypatch, made):
    async def broken(device, name, **overrides):
        raise RuntimeError("the compiler is gone")
    monkeypatch.setattr(warm, "compile_kernel", broken)
    report = run(warm.warm_up(native_gpu, compile_on_fallback=True))
    assert not report["warmed"] and report["reason"] == "RuntimeError: the compiler is gone"
    assert "destroy" in report["seconds"] and len(made) == 1 and made[0].destroyed


def test_a_probe_that_ran_short_is_not_a_warm_gpu(native_gpu, run, monkeypatch):
    async def short(device, kernel, outer, inner):
        return outer * inner - 1, 0
    monkeypatch.setattr(warm.probe, "loop_count", short)
    report = run(warm.warm_up(native_gpu, compile_on_fallback=True))
    assert not report["warmed"] and report["reason"] == "the probe ran 3 of 4 iterations"


def test_admission_after_a_warm_up_admits_as_before(native_gpu, run, gpu_slm_path):
    model = webslm.open_model(gpu_slm_path)

    async def go():
        await warm.warm_up(native_gpu, compile_on_fallback=True)
        session = await admit(native_gpu, model, AdmissionPolicy(tuning="off"))
        try:
            return session.receipt.as_dict()["outcome_code"], open_devices()["devices"]
        finally:
            session.destroy()
    before = open_devices()["devices"]
    outcome, during = run(go())
    assert outcome == "admitted" and during == before + 1     # the warm-up's device is not among them
    assert open_devices()["devices"] == before


def test_a_device_that_will_not_be_destroyed_is_said_not_raised(native_gpu, run, monkeypatch):
    class Stubborn(TrackedDevice):
        def __init__(self, inner):
            super().__init__(inner)
            self.inner_device = inner

        def destroy(self):
            self.inner_device.destroy()
            raise RuntimeError("already lost")
    monkeypatch.setattr(warm, "TrackedDevice", Stubborn)
    report = run(warm.warm_up(native_gpu, compile_on_fallback=True))
    assert report["warmed"] and report["reason"] == "destroy: RuntimeError: already lost", report
