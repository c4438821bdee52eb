"""The engine (webslm.engine): its state machine, what it asks backends for, loading on the
GPU or the CPU, and answers identical to generate.py's loop.

The GPU is played by FakeGpuBackend: the CPU path dressed as the executor (kind "gpu"),
which yields to the event loop inside every step (so a cancel can interleave), can be lost
at a chosen position, can add tiny noise to its logits (another device's rounding), and
counts live "buffers" so that a test can see release() happen. test_engine_loss.py and
test_conformance.py import it from here.

The reference for every answer is generate.py's synchronous loop on a fresh CpuBackend.
The fixture model's vocabulary has one row more than its tokenizer has tokens; sampling can
pick that padding id, which is committed with no text (test_answer.py picks it on purpose).
"""
from __future__ import annotations

import asyncio
import dataclasses
import sys

import numpy as np
import pytest

import webslm
from webslm.admission.admit import STAGES, AdmissionPolicy, admit
from webslm.backends.cpu_path import CpuPath, CpuPathError
from webslm.backends.scores import BackendCancelled, BackendLost, Want
from webslm.cpu import CpuBackend
from webslm.cpu.backend import CpuBackendError
from webslm.engine import TOP_K_CANDIDATES, TRANSITIONS, Engine, EngineError, State, StateError, StateMachine, want_for
from webslm.generate import Delta, generate, prompt_ids
from webslm.semantic.ledger import Ledger
from webslm.semantic.sampler import Sampler, SamplerSettings
from webslm.webgpu.interface import Gpu

GREEDY = SamplerSettings(temperature=0.0)


def sampled(seed: int, **more) -> SamplerSettings:
    return SamplerSettings(temperature=0.8, top_k=40, seed=seed, **more)


# -- the fake GPU and the reference --------------------------------------------------------------

class FakeGpuBackend(CpuPath):
    """The CPU path playing the GPU executor (see the module docstring)."""

    kind = "gpu"
    BUFFERS = 4

    def __init__(self, model, *, lose_at: int | None = None, noise: float = 0.0, yields: int = 2,
                 check_epoch: bool = True, on_call=None):
        super().__init__(model)
        self.live_buffers = self.BUFFERS
        self.lose_at, self.noise, self.yields, self.check_epoch = lose_at, noise, yields, check_epoch
        self.on_call = on_call            # on_call(fake, result_position): a test's hook
        self.lost = False
        self.wants: list[tuple[int, Want]] = []
        self.current_epoch = None         # set by the engine, as for the real executor

    async def _enter(self, result_position: int, want: Want, epoch: int) -> None:
        assert self.live_buffers, "the fake GPU was used after release()"
        for _ in range(self.yields):
            await asyncio.sleep(0)
        if self.on_call is not None:
            self.on_call(self, result_position)
        if self.lost or (self.lose_at is not None and result_position >= self.lose_at):
            self.lost = True
            raise BackendLost("device-lost", "fake gpu", "the fake device was lost")
        if self.check_epoch and self.current_epoch is not None and epoch != self.current_epoch():
            raise BackendCancelled("stale-epoch", "epoch", f"generation {epoch} was cancelled")
        self.wants.append((result_position, want))

    def _check_epoch(self, epoch):
        """The CPU path's own epoch check, made only when this fake abandons stale work."""
        if self.check_epoch:
            super()._check_epoch(epoch)

    async def prefill(self, ids, want, epoch=0, progress=None):
        await self._enter(self.position + len(ids), want, epoch)
        return await super().prefill(ids, want, epoch, progress)

    async def decode_one(self, token, want, epoch=0):
        await self._enter(self.position + 1, want, epoch)
        return await super().decode_one(token, want, epoch)

    async def rebuild(self, ids, want, epoch=0, progress=None):
        await self._enter(len(ids), want, epoch)
        return await super().rebuild(ids, want, epoch, progress)

    def _scores(self, logits, want, epoch):
        if self.noise:   # deterministic per position: the same device rounds the same way
            wobble = np.random.default_rng(self.position).standard_normal(logits.size)
            logits = (logits + self.noise * wobble).astype(np.float32)
        return super()._scores(logits, want, epoch)

    def release(self) -> None:
        self.live_buffers = 0
        super().release()


def fake_gpu(**fake):
    """A build_gpu_backend for Engine: walks admission's stages, then builds a FakeGpuBackend.
    The backends it built are in .built."""
    built = []

    async def build(gpu, model, policy, on_stage):
        for stage in STAGES:
            on_stage(stage)
            await asyncio.sleep(0)
        backend = FakeGpuBackend(model, **fake)
        built.append(backend)
        return backend, {"outcome_code": "admitted"}
    build.built = built
    return build


def gpu_engine(model, events: list | None = None, **fake):
    build = fake_gpu(**fake)
    engine = Engine(model, gpu=object(), on_event=events.append if events is not None else None,
                    build_gpu_backend=build)
    return engine, build


@dataclasses.dataclass
class Outcome:
    deltas: list
    ids: tuple
    finish: str


def reference(model, ids, settings) -> Outcome:
    """generate.py's loop on a fresh CpuBackend."""
    ledger = Ledger()
    deltas = list(generate(model, CpuBackend(model), list(ids), settings, ledger=ledger))
    return Outcome(deltas, ledger.committed_ids, deltas[-1].finish_reason)


async def answer(engine, ids, settings) -> Outcome:
    deltas = [delta async for delta in engine.generate(list(ids), settings, chat=False)]
    return Outcome(deltas, engine.ledger.committed_ids, deltas[-1].finish_reason)


def transitions(events) -> list[tuple[str, str]]:
    return [(e["from"], e["to"]) for e in events if e["event"] == "state"]


@pytest.fixture(scope="module")
def model(fixture_slm):
    return webslm.open_model(fixture_slm)


@pytest.fixture(scope="module")
def ids(model):
    return prompt_ids(model, "hi", chat=True)


# -- the state machine ---------------------------------------------------------------------------

REPORT = [  # the design report's diagram, transition for transition
    ("CPUReady", "Probing"), ("Probing", "Preparing"), ("Probing", "CPUReady"),
    ("Preparing", "GPUReady"), ("Preparing", "CPUReady"), ("GPUReady", "Generating"),
    ("Generating", "GPUReady"), ("Generating", "CancelPending"), ("CancelPending", "GPUReady"),
    ("Generating", "Lost"), ("Lost", "CPURebuild"), ("CPURebuild", "CPUGenerating"),
    ("CPURebuild", "VisibleFailure"), ("CPUGenerating", "CPUReady"), ("GPUReady", "Destroying"),
    ("Destroying", "CPUReady"), ("VisibleFailure", "CPUReady"),
]


def test_the_table_holds_every_transition_of_the_report():
    table = {(a.value, b.value) for a, b in TRANSITIONS}
    assert set(REPORT) <= table


@pytest.mark.parametrize("pair", sorted(TRANSITIONS, key=lambda p: (p[0].value, p[1].value)),
                         ids=lambda p: f"{p[0].value}->{p[1].value}")
def test_every_allowed_transition_moves_and_reports(pair):
    events = []
    machine = StateMachine(events.append, initial=pair[0])
    machine.go(pair[1], "because", code="x")
    assert machine.state is pair[1]
    assert events == [{"event": "state", "from": pair[0].value, "to": pair[1].value,
                       "reason": "because", "code": "x"}]


def test_every_other_transition_is_rejected():
    rejected = 0
    for a in State:
        for b in State:
            if (a, b) in TRANSITIONS:
                continue
            events = []
            machine = StateMachine(events.append, initial=a)
            with pytest.raises(StateError) as info:
                machine.go(b, "not allowed")
            assert info.value.code == "illegal-transition" and info.value.where == f"{a}->{b}"
            assert machine.state is a and events == []
            rejected += 1
    assert rejected == len(State) ** 2 - len(TRANSITIONS)


def test_every_state_is_reachable_and_none_is_a_dead_end():
    def reach(start, step):
        seen, todo = {start}, [start]
        while todo:
            for nxt in step(todo.pop()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen
    assert reach(State.EMPTY, lambda s: [b for a, b in TRANSITIONS if a is s]) == set(State)
    assert reach(State.EMPTY, lambda s: [a for a, b in TRANSITIONS if b is s]) == set(State)


def test_require_names_the_operation():
    machine = StateMachine()
    with pytest.raises(StateError) as info:
        machine.require({State.GPU_READY}, "generate()")
    assert info.value.code == "wrong-state" and info.value.where == "generate()"


# -- what the engine asks a backend for ----------------------------------------------------------

@pytest.mark.parametrize("settings, history, kind", [
    (GREEDY, [1, 2, 3], "argmax"),
    (SamplerSettings(temperature=0.0, repetition_penalty=1.1), [1, 2, 3], "top-k"),
    (SamplerSettings(temperature=0.0, repetition_penalty=1.1), list(range(70)), "full"),
    (sampled(1), [1, 2, 3], "top-k"),
    (SamplerSettings(temperature=0.8, top_k=0), [1, 2, 3], "full"),
    (SamplerSettings(temperature=0.8, top_k=100), [1, 2, 3], "full"),
    (SamplerSettings(temperature=0.8, top_k=40, frequency_penalty=-0.5), [1, 2, 3], "full"),
])
def test_want_is_the_least_the_sampler_needs(settings, history, kind):
    want = want_for(Sampler(settings, 300, history=history))
    assert want.kind == kind
    if kind == "top-k":
        assert want.k == TOP_K_CANDIDATES


# -- the CPU path --------------------------------------------------------------------------------

def test_cpu_path_is_the_cpu_backend_behind_the_async_surface(model, ids, run):
    path, cpu = CpuPath(model), CpuBackend(model)
    assert path.kind == "cpu"
    first = run(path.prefill(ids, Want("full"), epoch=7))
    np.testing.assert_array_equal(first.logits, cpu.prefill(ids))
    assert (first.position, first.epoch, first.sequence) == (len(ids), 7, 1)
    top = run(path.decode_one(5, Want("top-k", 10), epoch=7))
    full = cpu.decode_one(5)
    assert top.ids.tolist() == np.argsort(-full.astype(np.float64), kind="stable")[:10].tolist()
    np.testing.assert_array_equal(top.values, full[top.ids])
    assert (top.position, top.sequence) == (len(ids) + 1, 2)
    best = run(path.rebuild(ids + [5, 6], Want("argmax"), epoch=8))
    assert best.ids.tolist() == [int(np.argmax(cpu.rebuild(ids + [5, 6])))]
    assert (best.position, best.epoch, best.sequence, path.position) == (len(ids) + 2, 8, 3, len(ids) + 2)
    path.reset()
    assert path.position == 0
    path.release()
    path.release()
    with pytest.raises(CpuPathError) as info:
        run(path.prefill(ids, Want("full")))
    assert info.value.code == "released"


# -- loading -------------------------------------------------------------------------------------

def test_without_a_gpu_the_engine_settles_on_the_cpu_path(model, run):
    events = []
    engine = Engine(model, on_event=events.append)
    assert engine.state is State.EMPTY and engine.backend_kind is None
    assert run(engine.load()) is State.CPU_READY
    assert engine.backend_kind == "cpu" and engine.receipt is None
    assert engine.cpu_reason["code"] == "no-webgpu" and engine.cpu_reason["stage"] == "entry-point"
    assert transitions(events) == [("Empty", "CPUReady")] and events[0]["code"] == "no-webgpu"
    with pytest.raises(StateError):
        run(engine.load())


def test_with_a_gpu_the_engine_probes_prepares_and_is_ready(model, run):
    events = []
    engine, build = gpu_engine(model, events)
    assert run(engine.load()) is State.GPU_READY
    assert engine.backend_kind == "gpu" and engine.receipt == {"outcome_code": "admitted"}
    assert engine.cpu_reason is None
    assert [e["stage"] for e in events if e["event"] == "admission-stage"] == list(STAGES)
    assert transitions(events) == [("Empty", "Probing"), ("Probing", "Preparing"), ("Preparing", "GPUReady")]
    preparing = events.index(next(e for e in events if e.get("to") == "Preparing"))
    assert events[preparing - 1] == {"event": "admission-stage", "stage": "handlers"}
    assert build.built[0].current_epoch() == engine.ledger.epoch


class NoAdapterGpu(Gpu):
    async def request_adapter(self, feature_level: str = "core"):
        return None


async def admission_only(gpu, model, policy, on_stage):
    await admit(gpu, model, policy or AdmissionPolicy(), on_stage=on_stage)
    raise AssertionError("admission cannot succeed without an adapter")


def test_an_admission_failure_leaves_a_cpu_engine_with_the_reason(gpu_slm_path, run):
    model = webslm.open_model(gpu_slm_path)       # one the GPU path could run (the fixture is refused earlier)
    events = []
    engine = Engine(model, gpu=NoAdapterGpu(), on_event=events.append, build_gpu_backend=admission_only)
    assert run(engine.load()) is State.CPU_READY
    assert engine.cpu_reason == {"reason": "admission failure", "stage": "adapter", "code": "no-adapter",
                                 "sentence": "the browser offers no WebGPU adapter"}
    assert engine.receipt["outcome_code"] == "no-adapter" and engine.receipt["failure_stage"] == "adapter"
    assert transitions(events) == [("Empty", "Probing"), ("Probing", "CPUReady")]
    assert events[-1]["code"] == "no-adapter" and events[-1]["stage"] == "adapter"


@pytest.mark.parametrize("error, code", [
    (BackendLost("device-lost", "gpu", "gone"), "device-lost"),
    (RuntimeError("recording failed"), "internal-error"),
])
def test_a_failure_while_preparing_leaves_a_cpu_engine(model, run, error, code):
    async def build(gpu, model, policy, on_stage):
        on_stage("handlers")
        raise error
    events = []
    engine = Engine(model, gpu=object(), on_event=events.append, build_gpu_backend=build)
    assert run(engine.load()) is State.CPU_READY
    assert engine.cpu_reason["code"] == code and engine.backend_kind == "cpu"
    assert transitions(events) == [("Empty", "Probing"), ("Probing", "Preparing"), ("Preparing", "CPUReady")]


def test_without_the_gpu_executor_admission_is_not_even_started(model, run, monkeypatch):
    monkeypatch.setitem(sys.modules, "webslm.backends.gpu", None)     # import fails
    events = []
    engine = Engine(model, gpu=NoAdapterGpu(), on_event=events.append)
    assert run(engine.load()) is State.CPU_READY
    assert engine.cpu_reason["code"] == "gpu-backend-unavailable"
    assert not [e for e in events if e["event"] == "admission-stage"]


# -- answers -------------------------------------------------------------------------------------

def answer_settings(model, ids):
    """Greedy, seeded sampling, the model's own defaults, a short max_tokens, and a stop
    sequence taken from the greedy answer (so it fires and must be held back)."""
    greedy_text = "".join(d.text for d in reference(model, ids, GREEDY).deltas)
    defaults = model.manifest.generation
    return [GREEDY, sampled(3), sampled(11), SamplerSettings(max_tokens=5, temperature=0.8, top_k=40, seed=4),
            SamplerSettings(temperature=defaults["temperature"], top_k=defaults["top_k"], top_p=defaults["top_p"],
                            min_p=defaults["min_p"], repetition_penalty=defaults["repetition_penalty"], seed=2),
            SamplerSettings(temperature=0.0, stop=(greedy_text[6:9],)),
            SamplerSettings(temperature=0.0, repetition_penalty=1.3, max_tokens=20)]


@pytest.mark.parametrize("on_gpu", [False, True], ids=["cpu", "fake-gpu"])
def test_answers_are_generate_py_answers(model, ids, run, on_gpu):
    engine = gpu_engine(model)[0] if on_gpu else Engine(model)
    run(engine.load())
    finishes = set()
    for settings in answer_settings(model, ids):
        expected = reference(model, ids, settings)
        got = run(answer(engine, ids, settings))
        assert got == expected
        finishes.add(got.finish)
        timings = engine.last_timings
        assert timings.prompt_tokens == len(ids) and timings.generated_tokens == len(got.ids)
        assert engine.state is (State.GPU_READY if on_gpu else State.CPU_READY)
        assert not engine.ledger.is_open
    assert {"stop", "length"} <= finishes


def test_the_gpu_is_asked_for_no_more_than_the_sampler_needs(model, ids, run):
    engine, build = gpu_engine(model)
    run(engine.load())
    fake = build.built[0]
    for settings, kind in [(GREEDY, "argmax"), (sampled(3), "top-k"),
                           (SamplerSettings(temperature=0.8, top_k=0, seed=3), "full")]:
        fake.wants.clear()
        run(answer(engine, ids, settings))
        assert fake.wants and {want.kind for _, want in fake.wants} == {kind}
        positions = [p for p, _ in fake.wants]
        assert positions == list(range(len(ids), len(ids) + len(positions)))


def test_prompts_as_text_messages_or_ids(model, ids, run):
    engine = Engine(model)
    run(engine.load())

    async def committed(prompt, **kw):
        return [d async for d in engine.generate(prompt, GREEDY, **kw)], engine.ledger.committed_ids
    from_ids = run(committed(ids))
    assert run(committed("hi")) == from_ids
    assert run(committed([{"role": "user", "content": "hi"}])) == from_ids
    with_system = run(committed("hi", system="be brief"))
    assert run(committed([{"role": "user", "content": "hi"}], system="be brief")) == with_system
    plain = prompt_ids(model, "hi", chat=False)
    assert run(committed("hi", chat=False))[1] == reference(model, plain, GREEDY).ids
    for bad in ([], [1.5], ["hi"], [True]):
        with pytest.raises(EngineError) as info:
            run(committed(bad))
        assert info.value.code == "bad-prompt"


def test_generate_needs_a_loaded_engine(model, ids, run):
    engine = Engine(model)

    async def first():
        return [d async for d in engine.generate(ids, GREEDY)]
    with pytest.raises(StateError) as info:
        run(first())
    assert info.value.code == "wrong-state"


def test_a_reader_that_stops_early_leaves_a_clean_engine(model, ids, run):
    events = []
    engine, _ = gpu_engine(model, events)
    expected = reference(model, ids, GREEDY)

    async def scenario():
        await engine.load()
        async for delta in engine.generate(ids, GREEDY):
            if delta.text:
                break
        return await answer(engine, ids, GREEDY)
    assert run(scenario()) == expected
    assert engine.state is State.GPU_READY
    assert ("Generating", "CancelPending") in transitions(events)


def test_an_error_mid_answer_returns_the_engine_to_ready(model, ids, run):
    events = []
    engine = Engine(model, on_event=events.append)
    run(engine.load())
    too_long = (ids * 8)[: model.architecture.context_length + 1]
    with pytest.raises(CpuBackendError):
        run(answer(engine, too_long, GREEDY))
    assert engine.state is State.CPU_READY and not engine.ledger.is_open
    assert events[-1]["to"] == "CPUReady" and events[-1]["finish_reason"] == "error"
    assert run(answer(engine, ids, GREEDY)) == reference(model, ids, GREEDY)


def test_unload_switch_and_use_cpu_release_the_gpu(model, ids, run):
    events = []
    engine, build = gpu_engine(model, events)
    run(engine.load())
    first = build.built[0]
    run(engine.switch_model(model))
    second = build.built[1]
    assert first.live_buffers == 0 and second.live_buffers == FakeGpuBackend.BUFFERS
    assert engine.state is State.GPU_READY
    run(engine.use_cpu())
    assert second.live_buffers == 0 and engine.state is State.CPU_READY and engine.backend_kind == "cpu"
    assert run(answer(engine, ids, GREEDY)) == reference(model, ids, GREEDY)
    run(engine.unload())
    run(engine.unload())                 # unloading twice is harmless
    assert engine.state is State.EMPTY and engine.backend_kind is None
    assert transitions(events)[-6:] == [
        ("GPUReady", "Destroying"), ("Destroying", "CPUReady"), ("CPUReady", "CPUGenerating"),
        ("CPUGenerating", "CPUReady"), ("CPUReady", "Destroying"), ("Destroying", "Empty")]
    assert [e["reason"] for e in events if e["event"] == "released"] == ["unload", "explicit free"]


def test_engine_is_exported_lazily():
    assert webslm.Engine is Engine
    assert isinstance(Delta("x"), Delta)
