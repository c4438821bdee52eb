"""The engine choice kept across visits (webslm/engine/verdict.py): the record's key, its
parsing (the text comes back from browser storage: untrusted), when a kept verdict is used
and when it changes, the engine settling on the CPU path from one without admission, and the
worker's EngineHost.admit deciding with one.

The host's GPU is fake from the adapter down: offered_gpu() hands out a fake adapter (the
key's inputs), admission is replaced by a counting stand-in, and the executor is
test_engine_choice.py's TimedFakeGpu, whose decode steps take what the test says on an
injected clock. No assertion depends on how fast this machine is.
"""
from __future__ import annotations

import json
import types

import pytest
from test_engine import transitions
from test_engine_choice import Clock, TimedFakeGpu, cpu_taking, timed_engine

import webslm
from webslm import worker_api
from webslm.admission.admit import AdmissionFailure
from webslm.engine import Engine, State, verdict
from webslm.engine import choice as choice_module
from webslm.engine.choice import Choice
from webslm.shader_bundle import bundle_hash
from webslm.webgpu.interface import AdapterSummary

TODAY = "2026-12-03"
SWIFTSHADER = AdapterSummary(feature_level="core", features=("shader-f16", "subgroups"), limits={},
                             vendor="google", architecture="swiftshader",
                             description="SwiftShader Device (Subzero) (0x0000C0DE)", is_fallback=True)
CHROME = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/140.0.0.0 Safari/537.36"
SHA = "ab" * 32
SLOWER = Choice("cpu", gpu_step_s=15.234, cpu_step_s=0.2517, gpu_steps_timed=1, fallback_adapter=True)
KEY = verdict.record_key(SWIFTSHADER, CHROME, SHA, "f" * 64)


def record(**changes) -> dict:
    return {"backend": "cpu", "gpu_step_ms": 15000.0, "cpu_step_ms": 250.0, "gpu_step_finished": True,
            "fallback_adapter": True, "day": TODAY, **changes}


def store(**records) -> str:
    return json.dumps(records)


# -- the key ---------------------------------------------------------------------------------

def test_the_key_changes_with_the_adapter_the_browser_the_model_and_the_bundle():
    others = [verdict.record_key(SWIFTSHADER.__class__(**{**vars(SWIFTSHADER), **change}), CHROME, SHA, "f" * 64)
              for change in ({"description": "llvmpipe"}, {"is_fallback": False}, {"vendor": "mesa"},
                             {"architecture": "x"}, {"feature_level": "compatibility"}, {"features": ("subgroups",)})]
    others += [verdict.record_key(SWIFTSHADER, CHROME.replace("/140.", "/141."), SHA, "f" * 64),
               verdict.record_key(SWIFTSHADER, CHROME, "cd" * 32, "f" * 64),
               verdict.record_key(SWIFTSHADER, CHROME, SHA, "e" * 64)]
    assert len({KEY, *others}) == 1 + len(others)
    # a minor browser update keeps it
    assert verdict.record_key(SWIFTSHADER, CHROME.replace("140.0.0.0", "140.0.7339.80"), SHA, "f" * 64) == KEY


@pytest.mark.parametrize("agent, major", [
    (CHROME, "HeadlessChrome/140"),
    ("Mozilla/5.0 (X11; Linux x86_64; rv:153.0) Gecko/20100101 Firefox/153.0", "Firefox/153"),
    ("Mozilla/5.0 (Macintosh) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15", "Version/17"),
    ("", "other"), (None, "other"),
])
def test_the_browser_is_named_by_its_major_version(agent, major):
    assert verdict.browser_major(agent) == major


# -- reading a kept store: untrusted ------------------------------------------------------------

@pytest.mark.parametrize("text", [
    None, 3, "", "not json", "[1, 2]", "null", "[" * 100_000, '"a string"',
    store(**{KEY: record()}) + " " * verdict.MAX_TEXT_CHARS,                 # too long: not parsed
    store(**{KEY: record(backend="gpu")}), store(**{KEY: record(gpu_step_ms="15000")}),
    store(**{KEY: record(gpu_step_ms=True)}), store(**{KEY: record(cpu_step_ms=-1)}),
    store(**{KEY: record(cpu_step_ms=0)}), store(**{KEY: record(gpu_step_ms=1e300)}),
    store(**{KEY: record(gpu_step_finished=1)}), store(**{KEY: record(fallback_adapter="yes")}),
    store(**{KEY: record(day="2026-13-45")}), store(**{KEY: record(day="yesterday")}), store(**{KEY: record(day=20261203)}),
    store(**{KEY: {**record(), "note": "extra"}}), store(**{KEY: {k: v for k, v in record().items() if k != "day"}}),
    store(**{KEY: [record()]}), store(**{KEY.upper(): record()}), store(**{KEY[:-1]: record()}),
    json.dumps({KEY: record()}).replace("15000.0", "NaN"),
    json.dumps({KEY: record()}).replace("15000.0", "Infinity"),
])
def test_a_kept_store_that_is_not_one_gives_no_verdict(text):
    assert verdict.remembered(text, KEY, now=TODAY) is None
    assert KEY not in verdict.parse(text)


def test_a_good_record_survives_among_bad_ones():
    text = store(**{KEY: record(), "b" * 64: record(backend="gpu"), "junk": 3})
    assert verdict.parse(text) == {KEY: record()}


def test_the_kept_verdict_is_a_choice_for_the_page():
    made = verdict.remembered(store(**{KEY: record()}), KEY, now=TODAY)
    assert made.backend == "cpu" and made.remembered_on == TODAY and made.gpu_steps_timed == 0
    assert (made.gpu_step_s, made.cpu_step_s, made.ratio) == (15.0, 0.25, 60.0)
    assert made.sentence() == ("on an earlier visit (2026-12-03) this GPU (a software renderer) answered 60x slower "
                               "than the CPU path (one decode step: 15.0 s on the GPU, 250 ms on the CPU), so it was "
                               "not tried again: answering on the CPU")
    given_up = verdict.remembered(store(**{KEY: record(gpu_step_finished=False, fallback_adapter=False)}), KEY, now=TODAY)
    assert given_up.sentence().startswith("on an earlier visit (2026-12-03) this GPU answered more than 60x slower")
    assert given_up.as_dict()["remembered_on"] == TODAY and "not run" in given_up.as_dict()["skipped"]


def test_another_adapters_record_old_records_and_future_ones_are_not_used():
    other = verdict.record_key(SWIFTSHADER, CHROME, "cd" * 32, "f" * 64)      # another model
    assert verdict.remembered(store(**{other: record()}), KEY, now=TODAY) is None
    assert verdict.remembered(store(**{KEY: record()}), None, now=TODAY) is None
    assert verdict.remembered(store(**{KEY: record(day="2026-09-04")}), KEY, now=TODAY) is not None   # 90 days
    assert verdict.remembered(store(**{KEY: record(day="2026-09-03")}), KEY, now=TODAY) is None       # 91 days
    assert verdict.remembered(store(**{KEY: record(day="2026-12-04")}), KEY, now=TODAY) is None       # tomorrow


# -- changing it ---------------------------------------------------------------------------------

def test_a_measured_cpu_verdict_is_kept_coarse_and_read_back():
    text = verdict.updated(None, KEY, SLOWER, now=TODAY)
    assert json.loads(text) == {KEY: record(gpu_step_ms=15000.0, cpu_step_ms=250.0)}
    assert verdict.remembered(text, KEY, now=TODAY).ratio == 60.0
    assert verdict.updated(text, KEY, SLOWER, now=TODAY) is None                 # the same record: nothing to write


def test_a_measured_gpu_verdict_clears_the_record_and_unmeasured_ones_leave_it():
    other = "c" * 64
    text = store(**{KEY: record(), other: record()})
    faster = Choice("gpu", gpu_step_s=0.01, cpu_step_s=0.25, gpu_steps_timed=1)
    assert json.loads(verdict.updated(text, KEY, faster, now=TODAY)) == {other: record()}
    assert verdict.updated(text, KEY, choice_module.FORCED, now=TODAY) is None   # forced: nothing timed
    assert verdict.updated(text, KEY, None, now=TODAY) is None                   # admission failed
    kept = verdict.remembered(text, KEY, now=TODAY)
    assert verdict.updated(text, KEY, kept, now=TODAY) is None                   # a kept verdict is not new evidence
    assert json.loads(verdict.updated(text, KEY, None, forget=True, now=TODAY)) == {other: record()}
    assert verdict.updated(None, KEY, faster, now=TODAY) is None                 # nothing kept, nothing to clear


def test_the_store_keeps_its_newest_records():
    old = {f"{i:064x}": record(day=f"2026-10-{1 + i % 28:02d}") for i in range(1, verdict.MAX_RECORDS)}
    oldest = f"{0:064x}"
    old[oldest] = record(day="2026-09-30")
    text = verdict.updated(json.dumps(old), KEY, SLOWER, now=TODAY)
    kept = verdict.parse(text)
    assert len(kept) == verdict.MAX_RECORDS and len(text) < verdict.MAX_TEXT_CHARS
    assert set(kept) == {KEY, *old} - {oldest}


# -- the engine ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(fixture_slm):
    return webslm.open_model(fixture_slm)


def test_an_engine_with_a_kept_verdict_goes_to_the_cpu_without_admission(model, run):
    events, built = [], []

    async def build(*_):
        built.append(1)
        raise AssertionError("admission must not run")
    kept = verdict.remembered(store(**{KEY: record()}), KEY, now=TODAY)
    engine = Engine(model, gpu=object(), on_event=events.append, build_gpu_backend=build,
                    gpu_choice=choice_module.by_measurement(), remembered=kept)
    assert run(engine.load()) is State.CPU_READY and built == []
    assert transitions(events) == [("Empty", "CPUReady")]
    assert engine.cpu_reason == {"reason": "GPU slower than the CPU path on an earlier visit", "stage": "choice",
                                 "code": "gpu-slower-remembered", "sentence": kept.sentence(),
                                 "gpu_step_ms": 15000.0, "cpu_step_ms": 250.0, "measured_on": TODAY}
    assert engine.choice is kept and next(e for e in events if e["event"] == "choice")["remembered_on"] == TODAY


def test_an_engine_without_one_measures_as_before(model, run):
    engine, built = timed_engine(model, step_s=[18.0], cpu_s=0.2)
    assert run(engine.load()) is State.CPU_READY and len(built) == 1 and engine.cpu_reason["code"] == "gpu-slower"


# -- the worker's host -----------------------------------------------------------------------------

class FakeAdapter:
    def __init__(self, summary):
        self._summary = summary

    def summary(self):
        return self._summary


class FakeGpu:
    """What choose_adapter asks: an adapter per feature level (no device is ever made from it)."""
    def __init__(self, summary=SWIFTSHADER):
        self.summary, self.requests = summary, 0

    async def request_adapter(self, feature_level):
        self.requests += 1
        return FakeAdapter(self.summary)


class Host:
    """An EngineHost on the fixture with the fake GPU, admission counted (it "admits" unless
    `refuse`), the executor a TimedFakeGpu taking `gpu_step_s` a step, the CPU 0.2 s."""
    def __init__(self, host, monkeypatch):
        self.host, self.admissions, self.gpu_step_s, self.refuse = host, [], 18.0, False
        self.floor_s = None           # admission's step-floor stage: its lower bound (None: it passes)
        clock = Clock()
        session = types.SimpleNamespace(
            tier="C", features=("subgroups",), feature_level="core", self_test={"cases": 3}, seconds={},
            plan=types.SimpleNamespace(hash="p", total_gpu_bytes=1), tuning=None, destroy=lambda: None,
            receipt=types.SimpleNamespace(as_dict=lambda: {"outcome_code": "admitted", "fallback_adapter": True}))

        async def admission(gpu, model, policy, **_):
            self.admissions.append(policy)
            if self.refuse:
                failure = AdmissionFailure("self-test", "self-test-failed", "a kernel disagreed")
                failure.receipt = session.receipt
                raise failure
            if self.floor_s is not None and policy.max_step_seconds is not None and self.floor_s > policy.max_step_seconds:
                failure = AdmissionFailure("step-floor", "gpu-slower", "a decode step here takes at least ...")
                failure.receipt, failure.step_floor_s = session.receipt, self.floor_s
                raise failure
            return session

        async def build(session, model):
            return TimedFakeGpu(model, clock, [self.gpu_step_s])
        from webslm.admission import admit, receipt
        from webslm.backends import gpu
        monkeypatch.setattr(admit, "admit", admission)
        monkeypatch.setattr(receipt, "render_text", lambda r: "receipt")
        monkeypatch.setattr(gpu.GpuBackend, "build", build)
        monkeypatch.setattr(choice_module, "by_measurement", lambda: _measured(clock))
        monkeypatch.setattr(host, "offered_gpu", FakeGpu)
        self.key = verdict.record_key(SWIFTSHADER, CHROME, host.model.identity.artifact_sha256, bundle_hash())

    def admit(self, run, choice="measure", verdicts=None, fault=None) -> dict:
        return json.loads(run(self.host.admit("auto", fault, CHROME, lambda s: None, lambda *a: None,
                                              choice, "auto", verdicts)))


def _measured(clock):
    """choice.by_measurement with the CPU step injected (0.2 s) and the fake's clock."""
    return choice_module.Measurement(cpu_taking(0.2), clock)


@pytest.fixture
def host(fixture_slm, monkeypatch):
    from test_worker_host import load
    loader, _ = load(fixture_slm)
    return Host(worker_api.engine_host(loader, None), monkeypatch)


def test_the_host_keeps_a_measured_cpu_verdict_and_the_next_load_skips_admission(host, run):
    first = host.admit(run)
    assert first["admitted"] and first["engine"]["backend"] == "cpu" and len(host.admissions) == 1
    kept = verdict.parse(first["verdicts_text"])
    assert list(kept) == [host.key] and kept[host.key]["gpu_step_ms"] == 18000.0
    second = host.admit(run, verdicts=first["verdicts_text"])
    assert len(host.admissions) == 1                                   # no second admission
    assert second["admitted"] is False and second["remembered"] is True and second["verdicts_text"] is None
    engine = second["engine"]
    assert engine["state"] == "CPUReady" and engine["backend"] == "cpu"
    assert engine["cpu_reason"]["code"] == second["code"] == "gpu-slower-remembered"
    assert engine["cpu_reason"]["sentence"].startswith("on an earlier visit (") and "90x slower" in second["sentence"]
    assert engine["choice"]["remembered_on"] == kept[host.key]["day"] and engine["choice"]["gpu_steps_timed"] == 0


def test_a_floor_past_the_cpu_step_is_kept_like_a_timed_step(host, run):
    """Admission is handed the CPU step (0.2 s) to beat; its step-floor stage bounds the GPU step at
    9 s and stops: the engine answers on the CPU with that Choice (a lower bound, "more than"),
    the verdict keeps it, and the next load skips admission as after a timed step."""
    host.floor_s = 9.0
    first = host.admit(run)
    assert len(host.admissions) == 1 and host.admissions[0].max_step_seconds == 0.2
    assert first["admitted"] is False and (first["stage"], first["code"]) == ("step-floor", "gpu-slower")
    engine = first["engine"]
    assert engine["backend"] == "cpu" and engine["cpu_reason"]["stage"] == "step-floor"
    assert engine["choice"]["gpu_step_ms"] == 9000.0 and engine["choice"]["gpu_step_finished"] is False
    assert "more than 45x slower" in engine["cpu_reason"]["sentence"], engine["cpu_reason"]
    kept = verdict.parse(first["verdicts_text"])
    assert kept[host.key]["gpu_step_ms"] == 9000.0 and kept[host.key]["gpu_step_finished"] is False
    second = host.admit(run, verdicts=first["verdicts_text"])
    assert len(host.admissions) == 1 and second["remembered"] is True


def test_force_admits_whatever_is_kept_and_leaves_it(host, run):
    text = store(**{host.key: record()})
    forced = host.admit(run, "force", text)
    assert len(host.admissions) == 1 and forced["admitted"] and forced["engine"]["backend"] == "gpu"
    assert forced["verdicts_text"] is None                             # nothing was measured


def test_measuring_again_ignores_the_kept_verdict_and_a_faster_gpu_clears_it(host, run):
    other = "c" * 64
    text = store(**{host.key: record(), other: record()})
    host.gpu_step_s = 0.1                                             # the GPU now wins
    again = host.admit(run, "remeasure", text)
    assert len(host.admissions) == 1 and again["engine"]["backend"] == "gpu"
    assert json.loads(again["verdicts_text"]) == {other: record()}
    host.refuse = True                                                # an admission that fails forgets it too
    failed = host.admit(run, "remeasure", text)
    assert failed["admitted"] is False and json.loads(failed["verdicts_text"]) == {other: record()}
    assert host.admit(run, "measure", text)["verdicts_text"] is None   # the default does not (key: it skips)


def test_another_models_verdict_or_a_test_fault_does_not_skip_admission(host, run):
    other_model = verdict.record_key(SWIFTSHADER, CHROME, "cd" * 32, bundle_hash())
    host.admit(run, verdicts=store(**{other_model: record()}))
    assert len(host.admissions) == 1
    with pytest.raises(ValueError):                                   # an unknown fault name, before any work
        host.admit(run, verdicts=store(**{host.key: record()}), fault="no-such-fault")
    host.refuse = True
    faulted = host.admit(run, verdicts=store(**{host.key: record()}), fault="missing-feature")
    assert len(host.admissions) == 2 and faulted["verdicts_text"] is None


def test_admit_refuses_an_unknown_choice(host, run):
    with pytest.raises(ValueError, match="choice must be measure, force or remeasure"):
        host.admit(run, "fastest")
