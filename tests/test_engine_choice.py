"""The engine's choice between the admitted GPU and the CPU path (webslm/engine/choice.py).

The GPU is test_engine.py's FakeGpuBackend (the CPU path dressed as the executor) whose
decode steps take whatever time a test says, on an injected clock; the CPU step is injected
too. No assertion depends on how fast this machine is: the timings are the test's own.
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
from test_engine import FakeGpuBackend, answer, reference, transitions

import webslm
from webslm.admission.admit import STAGES
from webslm.backends.scores import BackendLost
from webslm.cpu import CpuBackend
from webslm.engine import Engine, State
from webslm.engine import choice as choice_module
from webslm.engine.choice import Choice, CpuStep, by_measurement, choose, estimate_cpu_step
from webslm.generate import prompt_ids
from webslm.semantic.sampler import SamplerSettings

GREEDY = SamplerSettings(temperature=0.0, max_tokens=12)


class Clock:
    """A clock that moves only when a fake says a step took time."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedFakeGpu(FakeGpuBackend):
    """FakeGpuBackend whose decode steps take step_s[i] seconds on `clock` (the last value
    repeats); lose_in_step: a step raises BackendLost instead."""

    def __init__(self, model, clock: Clock, step_s, lose_in_step: bool = False, hang: bool = False):
        super().__init__(model)
        self.clock, self.step_s, self.lose_in_step, self.hang = clock, list(step_s), lose_in_step, hang
        self.decode_calls = 0
        self.released = asyncio.Event()
        self.hung_step_ended = False

    async def decode_one(self, token, want, epoch=0):
        self.clock.now += self.step_s[min(self.decode_calls, len(self.step_s) - 1)]
        self.decode_calls += 1
        if self.lose_in_step:
            raise BackendLost("device-lost", "fake gpu", "the fake device was lost")
        if self.hang:                    # until released, as a destroyed device ends its work
            await self.released.wait()
            self.hung_step_ended = True
            raise BackendLost("device-lost", "fake gpu", "destroyed while the step ran")
        return await super().decode_one(token, want, epoch)

    def release(self) -> None:
        self.released.set()
        super().release()


def cpu_taking(seconds: float, calls: list | None = None):
    """An injected CPU step: `seconds`, its calls recorded in `calls`."""
    def cpu_step(model):
        if calls is not None:
            calls.append(model)
        return CpuStep(seconds, seconds / 2, seconds / 2, "injected")
    return cpu_step


def timed_engine(model, step_s, cpu_s, *, fallback=True, events=None, cpu_calls=None, lose_in_step=False,
                 hang=False):
    """An Engine whose GPU is a TimedFakeGpu and whose choice is by measurement, every timing
    injected. Returns (engine, the list the built fake lands in)."""
    clock, built = Clock(), []

    async def build(gpu, model, policy, on_stage):
        for stage in STAGES:
            on_stage(stage)
        backend = TimedFakeGpu(model, clock, step_s, lose_in_step, hang)
        built.append(backend)
        return backend, {"outcome_code": "admitted", "fallback_adapter": fallback}
    engine = Engine(model, gpu=object(), on_event=events.append if events is not None else None,
                    build_gpu_backend=build, gpu_choice=by_measurement(cpu_taking(cpu_s, cpu_calls), clock))
    return engine, built


@pytest.fixture(scope="module")
def model(fixture_slm):
    return webslm.open_model(fixture_slm)


@pytest.fixture(scope="module")
def ids(model):
    return prompt_ids(model, "hi", chat=True)


# -- the rule --------------------------------------------------------------------------------

def test_a_software_gpu_slower_than_the_cpu_is_released_and_the_cpu_answers(model, ids, run):
    events, cpu_calls = [], []
    engine, built = timed_engine(model, step_s=[18.0], cpu_s=0.2, events=events, cpu_calls=cpu_calls)
    assert run(engine.load()) is State.CPU_READY
    fake = built[0]
    assert fake.decode_calls == 1 and fake.live_buffers == 0            # timed once, then released
    assert len(cpu_calls) == 1
    assert engine.backend_kind == "cpu"
    assert transitions(events) == [("Empty", "Probing"), ("Probing", "Preparing"), ("Preparing", "CPUReady")]
    reason = engine.cpu_reason
    assert reason["code"] == "gpu-slower" and reason["stage"] == "choice"
    assert reason["sentence"] == ("the GPU here is a software renderer, 90x slower than the CPU path (one decode "
                                  "step: 18.0 s on the GPU, 200 ms on the CPU): answering on the CPU")
    assert (reason["gpu_step_ms"], reason["cpu_step_ms"]) == (18000.0, 200.0)
    numbers = engine.choice.as_dict()
    assert numbers["backend"] == "cpu" and numbers["ratio"] == 90.0 and numbers["gpu_steps_timed"] == 1
    assert numbers["cost_ms"] == 18000.0 and numbers["skipped"] is None
    assert [e for e in events if e["event"] == "released"] == [
        {"event": "released", "backend": "gpu", "reason": "slower than the CPU path"}]
    assert next(e for e in events if e["event"] == "choice")["backend"] == "cpu"
    assert engine.receipt["outcome_code"] == "admitted"                 # admission's outcome is unchanged
    # the CPU path answers, exactly as generate.py's loop does
    got = run(answer(engine, ids, GREEDY))
    want = reference(model, ids, GREEDY)
    assert got.ids == want.ids and [d.text for d in got.deltas] == [d.text for d in want.deltas]


def test_a_gpu_not_slower_than_the_cpu_is_kept_and_answers_as_before(model, ids, run):
    engine, built = timed_engine(model, step_s=[0.2], cpu_s=0.2)         # equal: the rule keeps the GPU
    assert run(engine.load()) is State.GPU_READY
    fake = built[0]
    assert engine.backend_kind == "gpu" and engine.cpu_reason is None and fake.live_buffers
    assert engine.choice.backend == "gpu" and engine.choice.ratio == 1.0
    assert fake.position == 0                                             # the timed step left no KV row behind
    got = run(answer(engine, ids, GREEDY))
    want = reference(model, ids, GREEDY)
    assert got.ids == want.ids and [d.text for d in got.deltas] == [d.text for d in want.deltas]
    assert fake.decode_calls == 1 + len(got.ids) - 1                      # the timed step, then the answer's


def test_a_gpu_not_software_is_named_plainly():
    slower = Choice("cpu", gpu_step_s=1.25, cpu_step_s=0.37, fallback_adapter=False)
    assert slower.sentence() == ("the GPU here is 3.4x slower than the CPU path (one decode step: 1.2 s on the GPU, "
                                 "370 ms on the CPU): answering on the CPU")


@pytest.mark.parametrize("steps, cpu_s, timed, kept", [
    ([0.5, 0.25], 0.3, 2, "gpu"),    # slower, within 2x: a second look, which is faster than the CPU
    ([0.5, 0.45], 0.3, 2, "cpu"),    # slower both times
    ([0.9, 0.1], 0.3, 1, "cpu"),     # 3x slower: no second look
    ([0.1, 0.9], 0.3, 1, "gpu"),     # faster at once
])
def test_a_close_call_gets_a_second_gpu_step(model, run, steps, cpu_s, timed, kept):
    engine, built = timed_engine(model, step_s=steps, cpu_s=cpu_s)
    run(engine.load())
    assert built[0].decode_calls == timed and engine.choice.gpu_steps_timed == timed
    assert engine.choice.backend == kept == engine.backend_kind
    assert engine.choice.gpu_step_s == pytest.approx(min(steps[:timed]))


def test_a_gpu_step_still_running_after_give_up_cpu_steps_is_not_waited_for(model, run):
    """The GPU step hangs (30 s have gone by on the clock when the wait gives up, after GIVE_UP
    CPU steps of 1 ms): the CPU answers, the numbers say "more than", and releasing the GPU
    ends the step that was left running."""
    events = []
    engine, built = timed_engine(model, step_s=[30.0], cpu_s=0.001, events=events, hang=True)
    assert run(engine.load()) is State.CPU_READY
    fake = built[0]
    assert fake.live_buffers == 0 and fake.hung_step_ended        # released: the step it left ended
    made = engine.choice
    assert made.backend == "cpu" and made.gpu_step_finished is False and made.gpu_steps_timed == 1
    assert engine.cpu_reason["sentence"] == ("the GPU here is a software renderer, more than 30000x slower than the "
                                             "CPU path (one decode step: more than 30.0 s on the GPU, 1.00 ms on "
                                             "the CPU): answering on the CPU")
    assert transitions(events) == [("Empty", "Probing"), ("Probing", "Preparing"), ("Preparing", "CPUReady")]


def test_without_a_choice_the_gpu_is_kept_untimed(model, run):
    clock = Clock()
    built = []

    async def build(gpu, model, policy, on_stage):
        built.append(TimedFakeGpu(model, clock, [50.0]))
        return built[-1], {"outcome_code": "admitted", "fallback_adapter": True}
    engine = Engine(model, gpu=object(), build_gpu_backend=build)
    assert run(engine.load()) is State.GPU_READY
    assert built[0].decode_calls == 0 and engine.choice is None


def test_a_device_lost_while_timing_leaves_a_cpu_engine(model, run):
    events = []
    engine, built = timed_engine(model, step_s=[0.1], cpu_s=0.2, events=events, lose_in_step=True)
    assert run(engine.load()) is State.CPU_READY
    assert engine.cpu_reason["code"] == "device-lost" and built[0].live_buffers == 0
    assert transitions(events)[-1] == ("Preparing", "CPUReady")


def test_choose_reports_what_it_measured(model, run):
    clock = Clock()
    fake = TimedFakeGpu(model, clock, [2.0])
    made = run(choose(fake, model, cpu_taking(0.5), fallback_adapter=True, clock=clock))
    assert made.as_dict() == {"backend": "cpu", "rule": choice_module.RULE, "gpu_step_ms": 2000.0,
                              "cpu_step_ms": 500.0, "gpu_steps_timed": 1, "gpu_step_finished": True,
                              "ratio": 4.0, "skipped": None,
                              "fallback_adapter": True, "cpu_method": "injected", "cost_ms": 2000.0,
                              "remembered_on": None, "gpu_method": None}


# -- the CPU estimate --------------------------------------------------------------------------

def test_the_cpu_estimate_scales_one_layer_and_the_timed_head_rows(model):
    """A clock that advances 1 s per reading: each timed piece takes exactly 1 s, so the
    estimate is n_layers x 1 s + 1 s x vocab / rows timed."""
    ticks = iter(range(10_000))
    a = model.architecture
    rows = max(1, a.vocab // 3)
    step = estimate_cpu_step(model, head_rows=rows, repeats=2, clock=lambda: float(next(ticks)))
    assert step.layer_s == 1.0 and step.head_s == pytest.approx(a.vocab / rows)
    assert step.seconds == pytest.approx(a.n_layers + a.vocab / rows)
    assert f"layer 0 x {a.n_layers}" in step.method


def test_the_timing_backend_is_layer_0_of_the_cpu_path(model):
    full, probe = CpuBackend(model), CpuBackend.for_timing(model, head_rows=5)
    assert probe.arch.n_layers == 1 and probe.arch.vocab == 5 and len(probe.layers) == 1
    assert probe.embedding.shape == (5, model.architecture.hidden) and probe.head is probe.embedding
    for name, weights in vars(full.layers[0]).items():
        if isinstance(weights, np.ndarray):
            assert np.array_equal(weights, getattr(probe.layers[0], name)), name
    assert np.array_equal(probe.output_norm, full.output_norm)
    logits = probe.decode_one(3)                                      # runs the CPU path's own code
    assert logits.shape == (5,) and np.isfinite(logits).all() and probe.position == 1


def test_the_real_estimate_runs_on_the_fixture(model):
    step = estimate_cpu_step(model)
    assert step.seconds > 0 and step.layer_s > 0 and step.head_s > 0
