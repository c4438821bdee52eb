"""Engine: one model, answered on the GPU when admission allows it, on the CPU otherwise, and
continued on the CPU when the GPU is lost in the middle of an answer.

The loop is generate.py's made asynchronous: what a chosen token does (EOS, its text, the
ledger, the sampler's commit, stop sequences, max_tokens) is the same `Answer.accept`
(answer.py), so both loops give the same answer, delta for delta. Around it, the three
things a GPU needs:

- What to read back (`want_for`): only the argmax for greedy decoding without penalties,
  logit bias, logprobs or JSON mode, a canonical top-64 when the sampler can prove that is
  enough, else the full row (always with logprobs, whose softmax runs over every token, and
  in JSON mode, whose mask may rule out every one of the top 64).
- Epochs. Every submission carries the ledger's epoch for this answer and every result
  comes back tagged with it. cancel() closes the ledger at once, so nothing commits after
  it returns; the loop checks the epoch before submitting each step and after each result,
  and a result that arrives stale is offered anyway so the ledger counts it, but never shown.
  The GPU executor also reads the ledger's epoch itself (`backend.current_epoch`, set at
  load) and abandons stale work at its submission boundaries (BackendCancelled).
- Cancel that does not wait. Each backend call runs in its own task; cancel() gives the
  step in flight CANCEL_GRACE_S to retire (a fast GPU's result is then discarded, and
  counted, as before), and past that the answer ends at once ("abort", no text) while the
  step retires in the background (CancelPending until it has: a slow software GPU can
  take seconds for one step). Whatever touches the backend next waits for it first
  (idle()). Long work checks the epoch between pieces: the GPU executor between prefill
  chunks, the CPU path every PAUSE_S (backends/cpu_path.py), so it stops soon as well.
- Multi-turn reuse. The backend's KV cache outlives an answer: a new prompt keeps the
  longest prefix it shares with what the cache holds and prefills only the rest
  (prompt_cache.py states when the cache is dropped). The sampler and the ledger never see
  the difference: they only ever see the prompt's ids.
- Progress. While a prompt is read, on_progress (a generate() argument) is told
  {"phase": "prefill" | "replay", "done", "total", "cached"} in prompt tokens.
- Which engine. Admission proves the GPU correct, not fast: with gpu_choice (choice.py) the
  engine times a decode step on the built executor and on the CPU path and keeps the GPU
  only when it is not slower; otherwise it releases it and settles on the CPU path, the
  reason (and the numbers, in `choice`) kept for the page. An earlier visit's verdict
  (`remembered`, verdict.py) settles on the CPU path before admission, which then never runs.
- Device loss (device_loss.py). When the backend raises BackendLost the GPU is released,
  the CPU path is rebuilt from the ledger (prompt + committed ids), the sampler's state is
  checked against the ledger's record, and the same loop carries on at the next position.
  The delivered answer is the committed prefix followed by exactly what a CPU-only run
  would produce from that prefix, because the sampler (seeded by absolute position) only
  ever saw committed tokens.

States and their transitions are engine/states.py; every transition is reported to
on_event as {"event": "state", "from", "to", "reason", ...}, admission's progress as
{"event": "admission-stage", "stage"}.

Everything is plain asyncio (futures, sleep(0)): it runs natively and on Pyodide's loop,
with no threads.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import AsyncIterator, Callable

import numpy as np

from ..answer import Answer, Delta, Timings, check_room
from ..backends.cpu_path import CpuPath
from ..backends.scores import BackendCancelled, BackendLost, Scores, Want
from ..errors import CodedError
from ..request import InvalidRequest, prompt_ids, sampler_settings
from ..semantic.ledger import Ledger
from ..semantic.sampler import Sampler, SamplerSettings
from .choice import Choice, Measurement, admission_policy
from .device_loss import DeviceLoss
from .errors import EngineError
from .prompt_cache import PromptCache
from .tune_later import TuneLater
from .states import GENERATING, READY, State, StateMachine

S = State

# The candidate set asked of the GPU when the sampler can decide from it (docs/sampler.md 7):
# a few hundred bytes of readback instead of the whole row; 64 covers the usual top_k 40/50.
TOP_K_CANDIDATES = 64

# Admission stages after which an adapter and a device exist (admission/admit.py STAGES):
# from the first of them on, the engine is Preparing rather than Probing.
PREPARING_STAGES = ("handlers", "allocate", "step-floor", "tune", "compile", "self-test", "scopes", "publish")

# Offered to the ledger with a result that must be dropped; the ledger checks its shape only.
_NO_HASH = "0" * 64

# How long cancel() lets the step in flight retire before the answer ends without it. Short
# next to the half second a Stop may take; long next to a decode step on a real GPU.
CANCEL_GRACE_S = 0.1

# progress({"phase", "done", "total", "cached"}): a prompt being read (see the module docstring)
ProgressCallback = Callable[[dict], None]


def want_for(sampler: Sampler) -> Want:
    """The least the sampler needs to choose the token at its next position."""
    settings = sampler.settings
    if settings.greedy and not (settings.penalties_active or settings.logit_bias or settings.logprobs
                                or settings.response_format != "text"):
        return Want("argmax")
    if not sampler.needs_full_logits(TOP_K_CANDIDATES):
        return Want("top-k", TOP_K_CANDIDATES)
    return Want("full")


async def admit_and_build(gpu, model, policy, on_stage):
    """The one way onto a GPU: admission, then the executor built on the admitted session.
    Returns (backend, receipt dict); raises AdmissionFailure, BackendLost or EngineError."""
    try:
        from ..backends.gpu import GpuBackend
    except ImportError as exc:        # checked first: admission's self-tests are not free
        raise EngineError("gpu-backend-unavailable", "webslm.backends.gpu",
                          f"the GPU executor is not available ({exc})") from None
    from ..admission.admit import AdmissionPolicy, admit
    from ..backends.gpu import tuning_cache
    cache_file = tuning_cache.cache_path()           # measured mat-vec shapes, kept between runs
    session = await admit(gpu, model, policy or AdmissionPolicy(), on_stage=on_stage,
                          tuning_cache=tuning_cache.read_cache(cache_file))
    tuning_cache.write_cache(cache_file, session.tuning.cache_entries if session.tuning else {})
    try:
        backend = await GpuBackend.build(session, model)
    except BaseException:
        try:
            session.destroy()         # nothing may outlive a failed build
        except Exception:             # noqa: BLE001 - the device may already be gone
            pass
        raise
    return backend, session.receipt.as_dict()


class Engine(DeviceLoss, TuneLater):
    """`Engine(model, gpu=None, policy=None, on_event=None)`; `await load()`; then
    `async for delta in engine.generate(prompt, settings)`. gpu is a webslm.webgpu Gpu
    (None: CPU only); policy an AdmissionPolicy. build_gpu_backend replaces admission and
    the executor (tests, or a worker that admitted already): async (gpu, model, policy,
    on_stage) -> (backend, receipt). cpu_backend, if given, is called (once, when the CPU path
    is first needed) for the webslm.cpu.CpuBackend to wrap, so that a caller that already
    dequantized the weights (the worker) does not hold them twice. reuse_kv=False makes every
    answer prefill its whole prompt (the reference, and benchmarks). gpu_choice: async
    (backend, model, fallback_adapter) -> choice.Choice, run once the executor is built
    (choice.choose: the GPU kept only if its decode step is not slower than the CPU path's;
    None: the GPU kept untimed, as callers that asked for it expect: tests, benchmarks, the
    CLI's --backend native; the worker chooses unless the page forces the GPU). remembered: a
    Choice kept from an earlier visit that sent this adapter to the CPU path (verdict.py):
    load() then settles on the CPU path at once, admission not run; the worker passes it only
    in the default mode (not with ?gpu=force, nor when the user asks to measure again)."""

    def __init__(self, model, gpu=None, policy=None, on_event: Callable[[dict], None] | None = None,
                 *, build_gpu_backend=None, cpu_backend: Callable[[], object] | None = None,
                 reuse_kv: bool = True, gpu_choice=None, remembered: Choice | None = None):
        self.model, self.gpu, self.policy = model, gpu, policy
        self._on_event = on_event
        self._machine = StateMachine(self._event)
        self._build_gpu_backend = build_gpu_backend or admit_and_build
        self._cpu_backend = cpu_backend
        self.ledger = Ledger()               # one per engine: epochs keep rising across answers
        self.cpu_reason: dict | None = None  # why the engine is on the CPU path
        self.receipt: dict | None = None     # the admission receipt (admitted or failed)
        self._gpu_choice = gpu_choice
        self._remembered = remembered
        self.choice: Choice | None = None    # the GPU/CPU timing, when gpu_choice ran
        self.last_timings: Timings | None = None
        self._gpu = None                     # the GPU executor while it is usable
        self._gpu_loss: BackendLost | None = None       # a loss only an abandoned step saw
        self._cpu_path: CpuPath | None = None
        self._backend = None                 # the backend the current answer runs on
        self._run: Answer | None = None
        self._in_flight: asyncio.Task | None = None     # the backend call running now, if any
        self._tuning_stop = False                        # tune_gpu's stage stops at its next checkpoint
        self._wake: asyncio.Future | None = None        # wakes the answer: the call retired, or cancel's grace ran out
        self._starting: _Waiting | None = None          # a generate() waiting to begin its answer
        self.reuse_kv = reuse_kv
        self.prompt_cache = PromptCache()               # what the backend's KV cache holds
        self._progress: ProgressCallback | None = None  # the answer in progress's on_progress

    # -- what the page reads ------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self._machine.state

    @property
    def backend_kind(self) -> str | None:
        """"gpu" while the GPU executor serves answers, "cpu" on the CPU path, None unloaded."""
        if self._gpu is not None:
            return self._gpu.kind
        return None if self.state in (S.EMPTY, S.PROBING, S.PREPARING) else "cpu"

    def _event(self, event: dict) -> None:
        if self._on_event is not None:
            self._on_event(event)

    def _go(self, to: State, reason: str, **details) -> None:
        self._machine.go(to, reason, **details)

    # -- loading and unloading ----------------------------------------------------------------
    async def load(self) -> State:
        """Admit the model on the GPU if one is offered, else (or when admission fails, or
        the device is lost while preparing) settle on the CPU path with the reason."""
        self._machine.require({S.EMPTY}, "load()")
        if self.gpu is None:
            self._settle_on_cpu("no GPU offered", stage="entry-point", code="no-webgpu",
                                sentence="no WebGPU entry point was offered: the model runs on the CPU path")
            return self.state
        if self._remembered is not None:       # an earlier visit measured this GPU slower
            self.choice = self._remembered
            self._event({"event": "choice", **self.choice.as_dict()})
            self._settle_on_cpu("GPU slower than the CPU path on an earlier visit", stage="choice",
                                code="gpu-slower-remembered", sentence=self.choice.sentence(),
                                **_step_ms(self.choice), measured_on=self.choice.remembered_on)
            return self.state
        from ..admission.admit import AdmissionFailure
        self._go(S.PROBING, "load with a GPU")

        def on_stage(stage: str) -> None:
            self._event({"event": "admission-stage", "stage": stage})
            if stage in PREPARING_STAGES and self.state is S.PROBING:
                self._go(S.PREPARING, "adapter/device admitted")
        try:
            policy = admission_policy(self._gpu_choice, self.model, self.policy)
            backend, receipt = await self._build_gpu_backend(self.gpu, self.model, policy, on_stage)
            self.receipt = receipt
            if self.state is S.PROBING:
                self._go(S.PREPARING, "adapter/device admitted")
            choice = await self._choose(backend, receipt)
        except AdmissionFailure as failure:
            self.receipt = failure.receipt.as_dict() if failure.receipt is not None else None
            if failure.step_floor_s is not None and isinstance(self._gpu_choice, Measurement):
                # admission's step-floor stage: the GPU step cannot beat the CPU's (nothing was built)
                self.choice = self._gpu_choice.from_floor(self.model, failure.step_floor_s)
                self._event({"event": "choice", **self.choice.as_dict()})
                return self._slower_than_cpu(self.choice, failure.stage)
            self._settle_on_cpu("admission failure", stage=failure.stage, code=failure.code,
                                sentence=failure.sentence)
        except BackendLost as lost:
            self._settle_on_cpu("device lost while preparing", stage="build", code=lost.code,
                                sentence=lost.sentence)
        except Exception as exc:   # noqa: BLE001 - whatever stops the GPU leaves a CPU engine
            code = exc.code if isinstance(exc, CodedError) else "internal-error"
            self._settle_on_cpu("GPU backend failed", stage="build", code=code,
                                sentence=getattr(exc, "sentence", f"{type(exc).__name__}: {exc}"))
        else:
            if choice is not None and choice.backend == "cpu":
                backend.release()          # its buffers and device: the CPU path answers from now on
                self._event({"event": "released", "backend": "gpu", "reason": "slower than the CPU path"})
                return self._slower_than_cpu(choice, "choice")
            self._gpu, self.receipt, self.cpu_reason = backend, receipt, None
            if hasattr(backend, "current_epoch"):  # lets the executor abandon stale work itself
                backend.current_epoch = lambda: self.ledger.epoch
            if hasattr(backend, "on_lost"):        # a loss while idle leaves the GPU at once
                backend.on_lost(lambda lost, gpu=backend: self._gpu_died(gpu, lost))
            self._go(S.GPU_READY, "all allocations, pipelines, tests pass")
        return self.state

    def _slower_than_cpu(self, choice: Choice, stage: str) -> State:
        self._settle_on_cpu("GPU slower than the CPU path", stage=stage, code="gpu-slower",
                            sentence=choice.sentence(), **_step_ms(choice))
        return self.state

    async def _choose(self, backend, receipt) -> Choice | None:
        """gpu_choice on the built executor (None without one). If it fails the executor is
        released first (nothing outlives a failed load) and the failure is load()'s."""
        if self._gpu_choice is None:
            return None
        try:
            fallback = bool((receipt or {}).get("fallback_adapter", False))
            self.choice = await self._gpu_choice(backend, self.model, fallback)
        except BaseException:
            backend.release()
            raise
        self._event({"event": "choice", **self.choice.as_dict()})
        return self.choice

    def _settle_on_cpu(self, reason: str, **why) -> None:
        """CPUReady with the reason kept in cpu_reason. The CPU path is built here (the
        weights are dequantized once): CPUReady means an answer can start at once."""
        self.cpu_reason = {"reason": reason, **why}
        self._cpu()
        self._go(S.CPU_READY, reason, **why)

    def _cpu(self) -> CpuPath:
        """The CPU path, built on first use and kept: while the GPU serves, no second copy of
        the weights is held; after a loss it is built once and stays."""
        if self._cpu_path is None:
            self._cpu_path = CpuPath(self.model, self._cpu_backend() if self._cpu_backend else None)
            self._cpu_path.current_epoch = lambda: self.ledger.epoch   # it stops stale work itself
        return self._cpu_path

    def _release_gpu(self, why: str) -> None:
        self._gpu_loss = None
        if self._gpu is not None:
            gpu, self._gpu = self._gpu, None
            if self.prompt_cache.backend is gpu:
                self.prompt_cache.forget()
            gpu.release()
            self._event({"event": "released", "backend": "gpu", "reason": why})

    async def use_cpu(self) -> None:
        """Give the GPU back and answer on the CPU path from now on (user disables the GPU)."""
        await self._supersede()
        self._machine.require({S.GPU_READY}, "use_cpu()")
        self._go(S.DESTROYING, "explicit free")
        self._release_gpu("explicit free")
        self.cpu_reason = {"reason": "GPU disabled", "stage": None, "code": "disabled",
                           "sentence": "the GPU was released on request"}
        self._cpu()
        self._go(S.CPU_READY, "resources retired and destroyed")

    async def unload(self) -> None:
        """Cancel any answer, wait for submitted work to retire, release both backends."""
        if self.state is S.EMPTY:
            return
        await self._supersede()
        self._machine.require({S.CPU_READY, S.GPU_READY, S.VISIBLE_FAILURE}, "unload()")
        self._go(S.DESTROYING, "unload")
        self._release_gpu("unload")
        if self._cpu_path is not None:
            self._cpu_path.release()
            self._cpu_path = None
        self._backend, self._run = None, None
        self.prompt_cache.forget()
        self._go(S.EMPTY, "model unloaded")

    async def switch_model(self, model) -> State:
        """Unload this model (every buffer destroyed first), then load `model`."""
        await self.unload()
        self.model, self.receipt, self.cpu_reason, self.choice = model, None, None, None
        return await self.load()

    def acknowledge(self) -> None:
        """The user has seen a VisibleFailure: back to CPUReady."""
        self._machine.require({S.VISIBLE_FAILURE}, "acknowledge()")
        self._go(S.CPU_READY, "user acknowledges or retries")

    # -- cancelling ---------------------------------------------------------------------------
    def cancel(self) -> bool:
        """Cancel the answer in progress, or the one waiting to begin; False if there is none.
        When this returns nothing more commits: the ledger is closed (an answer still waiting
        ends "abort" as it begins). The answer's iterator ends with finish_reason
        "abort" and no more text: at once when no step is in flight, when the step in flight
        retires, or after CANCEL_GRACE_S without it (the step then retires in the background
        and is discarded; the engine stays CancelPending until it has)."""
        run = self._run
        if run is None or not run.current:
            if self._starting is None:
                return False
            self._starting.cancelled = True      # the answer waiting to begin (generate())
            return True
        self.ledger.cancel()
        if self.state in GENERATING:
            self._go(S.CANCEL_PENDING, "user/model/page cancellation", epoch=run.epoch)
        wake = self._wake
        if self._in_flight is None:          # nothing to wait for: the answer ends now
            self._end(run, "abort")
        elif wake is not None and not wake.done():
            wake.get_loop().call_later(CANCEL_GRACE_S, _settle, wake)
        return True

    async def idle(self) -> None:
        """Wait until no backend call is in flight (one abandoned by a cancel included)."""
        while self._in_flight is not None:
            await asyncio.wait([self._in_flight])

    async def _supersede(self) -> None:
        """End the previous answer (a cancel if it is still running or was abandoned by its
        reader) and wait until no step of it is in flight, so the backend is ours alone."""
        run = self._run
        if run is not None and run.current:
            self.cancel()
        await self.idle()
        if run is not None and run.finish_reason is None:
            self._end(run, "abort")
        self._settle_retired()

    # -- one answer ---------------------------------------------------------------------------
    async def generate(self, prompt, settings: SamplerSettings | dict | None = None, chat: bool = True,
                       system: str | None = None, on_progress: ProgressCallback | None = None,
                       reuse_kv: bool | None = None) -> AsyncIterator[Delta]:
        """The answer's text deltas; the last one has finish_reason "stop", "length" or
        "abort". prompt: a string (chat-templated unless chat=False), {role, content}
        messages, or token ids (request.prompt_ids). settings: SamplerSettings, or a dict
        of settings laid over the model's defaults (request.sampler_settings; None: the
        model's defaults). on_progress is told how the prompt's reading goes (module
        docstring). reuse_kv (default: the engine's) keeps what the KV cache shares with the
        prompt. Nothing happens until the first iteration; then an answer still in progress
        is cancelled (this one supersedes it)."""
        try:
            ids = prompt_ids(self.model, prompt, chat, system)
            if not isinstance(settings, SamplerSettings):
                settings = sampler_settings(self.model, settings)
            check_room(self.model, ids, settings)    # before the answer in progress is superseded
        except InvalidRequest as bad:        # the engine's callers match on EngineError codes
            raise EngineError(bad.code, bad.where, bad.sentence) from None
        self._tuning_stop = True                 # a retune in flight stops at its next checkpoint
        # Until its Answer exists this answer waits (for the previous one's step to retire, a
        # retune's checkpoint); a cancel() meanwhile is meant for it (the Stop the user clicked).
        if self._starting is not None:           # one still waiting is superseded as well
            self._starting.cancelled = True
        waiting = self._starting = _Waiting()
        try:
            await self._supersede()
            if self.state is S.VISIBLE_FAILURE:
                self.acknowledge()
            self._machine.require(READY, "generate()")
        finally:
            if self._starting is waiting:
                self._starting = None
        run = self._run = Answer(self.model, ids, settings, self.ledger)
        on_gpu = self.state is S.GPU_READY
        self._backend = self._gpu if on_gpu else self._cpu()
        reuse = self.reuse_kv if reuse_kv is None else reuse_kv
        keep = self.prompt_cache.reusable(self._backend, ids) if reuse else 0
        run.timings.cached_tokens = keep
        self._progress = on_progress
        self._go(S.GENERATING if on_gpu else S.CPU_GENERATING, "begin generation", epoch=run.epoch)
        if waiting.cancelled:                    # stopped while it waited: it ends "abort" with
            self.cancel()                        # no text and no step submitted
        try:
            started = time.perf_counter()
            scores = await self._step(run, "prefill", (ids, keep))
            run.prefilled(started)
            while run.has_room:
                if scores is None:               # cancelled or superseded
                    yield self._end(run, "abort")
                    return
                token = scores.choose(run.sampler, run.allowed())
                # The epoch the scores were computed in: the ledger refuses a stale one.
                delta = run.accept(token, scores.epoch, scores.logits)
                if delta.finish_reason:
                    yield self._end(run, delta.finish_reason, delta.text)
                    return
                if delta.text:
                    yield delta
                scores = await self._step(run, "decode", token)
            yield self._end(run, "length")       # the prompt left no room for a single token
        except Exception:
            self.prompt_cache.forget()           # what the cache holds is no longer certain
            self._end(run, "error")
            raise
        finally:
            self._progress = None
            if run.finish_reason is None:        # the reader stopped early, or the task was
                self._end(run, "abort")          # cancelled: GeneratorExit, CancelledError

    def _report(self, phase: str, done: int, total: int, cached: int = 0) -> None:
        if self._progress is not None:
            self._progress({"phase": phase, "done": int(done), "total": int(total), "cached": int(cached)})

    def _end(self, run: Answer, reason: str, text: str = "") -> Delta:
        """End run (Answer.end: the ledger closed, an answer cancelled meanwhile ends "abort"
        with no text) and, the first time, settle the engine's state."""
        first = run.finish_reason is None
        delta = run.end(reason, text)
        if first:
            self.last_timings = run.timings
            if self._run is run:
                self._settle_after(run.finish_reason)
        return delta

    def _settle_after(self, reason: str) -> None:
        """From Generating/CPUGenerating/CancelPending back to the ready state of the backend
        that is left; a VisibleFailure stays until acknowledged. A cancelled answer whose
        step is still in flight stays CancelPending until it retires (_settle_retired)."""
        if reason == "abort" and self.state in GENERATING:
            self._go(S.CANCEL_PENDING, "cancellation")
        settling = (self.state is S.CANCEL_PENDING and self._in_flight is None) or self.state in GENERATING
        lost = self._dead_gpu() if settling else None
        if lost is not None:                 # never GPUReady on a dead device
            self._leave_dead_gpu(lost, "the device died while the answer ended")
            return
        ready = S.GPU_READY if self._gpu is not None else S.CPU_READY
        if self.state is S.CANCEL_PENDING:
            if self._in_flight is None:
                self._go(ready, "submitted work retires, result discarded")
        elif self.state in GENERATING:
            self._go(ready, "generation completes" if reason != "error" else "generation failed",
                     finish_reason=reason)

    def _settle_retired(self) -> None:
        """The step an ended answer left in flight has retired: CancelPending ends."""
        run = self._run
        if self.state is S.CANCEL_PENDING and self._in_flight is None and (run is None or run.finish_reason):
            self._settle_after("abort")

    # -- one step on the backend --------------------------------------------------------------
    async def _step(self, run: Answer, kind: str, arg) -> Scores | None:
        """Submit one forward step for run: the scores for the sampler's next position, or
        None when the answer was cancelled (before submitting, or while the step ran)."""
        if not run.current:
            return None
        want, expected = want_for(run.sampler), run.sampler.position
        try:
            scores = await self._submit(kind, arg, want, run.epoch)
        except BackendCancelled:
            if run.current:                      # the backend saw an epoch we did not end
                raise
            return None                          # abandoned at a submission boundary, or by cancel()
        except BackendLost as lost:
            scores = await self._fail_over(run, lost, want)
            if scores is None:
                return None
        if not run.current:
            self._discard(scores)
            return None
        if scores.epoch != run.epoch or scores.position != expected:
            self._discard(scores)
            raise EngineError("misplaced-result", f"{self._backend.kind} backend",
                              f"asked for position {expected} in epoch {run.epoch}, got position "
                              f"{scores.position} in epoch {scores.epoch}")
        return scores

    async def _submit(self, kind: str, arg, want: Want, epoch: int) -> Scores:
        """One backend call in a task of its own (_in_flight while it runs, what idle()
        waits for). Its scores; BackendCancelled("abandoned") when cancel()'s grace ran out
        first: the call then retires in the background and its result is discarded."""
        call = asyncio.ensure_future(self._call(kind, arg, want, epoch))
        wake = self._wake = asyncio.get_running_loop().create_future()
        self._in_flight = call
        call.add_done_callback(self._retired)
        call.add_done_callback(lambda _: _settle(wake))
        await wake
        if call.done():
            return call.result()
        call.abandoned = True
        raise BackendCancelled("abandoned", "engine", f"generation {epoch} was cancelled; its step retires unseen")

    async def _call(self, kind: str, arg, want: Want, epoch: int) -> Scores:
        """The backend call itself; afterwards the prompt cache records what it wrote (all,
        part, or none of it: the backend's position says)."""
        backend = self._backend
        if kind == "prefill":
            ids, keep = arg
            start, written = keep, ids[keep:]
        elif kind == "decode":
            start, written = backend.position, [arg]
        else:
            start, written = 0, arg
        try:
            if kind == "prefill":
                if keep:
                    backend.truncate(keep)       # the shared prefix stays, the rest is overwritten
                else:
                    backend.reset()              # an answer that shares nothing starts empty
                self._report("prefill", keep, len(ids), keep)
                scores = await backend.prefill(ids[keep:], want, epoch,
                                               progress=lambda done, _: self._report("prefill", keep + done, len(ids), keep))
                self._report("prefill", len(ids), len(ids), keep)
                return scores
            if kind == "decode":
                return await backend.decode_one(arg, want, epoch)
            self._report("replay", 0, len(arg))
            scores = await backend.rebuild(arg, want, epoch, progress=lambda done, total: self._report("replay", done, total))
            self._report("replay", len(arg), len(arg))
            return scores
        finally:
            self.prompt_cache.wrote(backend, start, written)

    def _retired(self, call: asyncio.Task) -> None:
        """A backend call ended. If cancel() had abandoned it, its result is discarded here
        (a stale result is still offered to the ledger, which counts it) and a CancelPending
        engine becomes ready."""
        if self._in_flight is call:
            self._in_flight = None
        if not getattr(call, "abandoned", False):
            return
        if not call.cancelled():
            error = call.exception()            # retrieved: an abandoned call's failure is nobody's
            if error is None:
                self._discard(call.result())
            elif isinstance(error, BackendLost) and self._gpu is not None and self._backend is self._gpu:
                self._gpu_loss = error          # the engine leaves that GPU as it settles
        self._settle_retired()

    def _discard(self, scores: Scores) -> None:
        """A result nobody may see. It is offered to the ledger all the same, which refuses
        it and counts why (Ledger.dropped), unless its tags would make the ledger accept it
        or reject the call (a backend bug, reported by the caller)."""
        ledger = self.ledger
        would_commit = (scores.epoch == ledger.epoch and ledger.is_open
                        and scores.position == ledger.next_position)
        if scores.epoch <= ledger.epoch and not would_commit:
            top = int(scores.ids[0]) if scores.ids is not None else int(np.argmax(scores.logits))
            ledger.offer(scores.epoch, scores.position, top, _NO_HASH, "")


def _step_ms(choice: Choice) -> dict:
    """The two decode steps behind a choice, as cpu_reason carries them."""
    numbers = choice.as_dict()
    return {"gpu_step_ms": numbers["gpu_step_ms"], "cpu_step_ms": numbers["cpu_step_ms"]}


@dataclasses.dataclass
class _Waiting:
    """A generate() that waits to begin its answer; cancel() (a Stop, or a newer answer) marks it."""
    cancelled: bool = False


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
