"""EngineHost: the worker's loaded model and the engine that answers for it.

The worker (worker/worker.mjs) makes one EngineHost for each model the loader accepted
(loader.py) and calls its methods for the page's requests:

    admit(...)        GPU admission on this browser's adapter, then the engine on the admitted
                      session, or on the CPU path with the failure as its reason; unless the
                      page forces the GPU, the engine keeps it only if a decode step there is
                      not slower than on the CPU path (engine/choice.py), and an earlier
                      visit's verdict that it was slower skips admission (engine/verdict.py)
    use_cpu()         the engine on the CPU path, the GPU not tried
    generate(...)     one answer, each committed text delta streamed to the page
    cancel()          stop the answer in progress: nothing commits after it returns
    reset_chat()      forget the conversation the KV cache holds
    engine_status()   the engine's state, backend, tier and CPU reason
    conformance(...)  the GPU executor against the CPU oracle, teacher-forced
    release()         unload: the GPU buffers and device are destroyed now, not at GC

There is at most one engine, and at most one holds the GPU: a new admission unloads the
engine first. Results are JSON strings, so nothing but plain data crosses back to JS.
Requests only tests make (lose-device, kernel-golden, ...) are test_hooks.py's.
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Callable

from ..semantic.tool_stream import ToolStream
from .requests import WorkerRequestFailed, cache_prompt, generation_plan

CONFORMANCE_PROMPT = "What is the capital of France?"
TUNING_MODES = ("auto", "later", "force", "later-force", "off")   # admit's tuning (worker/protocol.mjs)


# Measured launch shapes and variants (backends/gpu/tuning.py), for this worker's lifetime and
# across visits: the worker reads what it kept in the browser's Cache Storage before an
# admission (merge_tuning_cache) and keeps the merged cache after one that measured something
# new (tuning_cache_text; worker/tuning-store.mjs). A model loaded again, or another model of
# the same shapes, on the same adapter and shader bundle, is not measured again.
_TUNING_CACHE: dict[str, dict] = {}


def browser_gpu():
    """This browser's WebGPU (webgpu.browser.BrowserGpu), or None without navigator.gpu."""
    import js
    if getattr(js.navigator, "gpu", None) is None:
        return None
    from ..webgpu.browser import BrowserGpu
    return BrowserGpu()


def merge_tuning_cache(text: str | None) -> int:
    """Add the entries of a kept cache (untrusted JSON text: tuning_cache.parse_cache) that this
    worker does not hold yet; returns how many. Entries are checked again where they are used
    (tuning.tune): one that is not a valid choice is measured afresh."""
    from ..backends.gpu import tuning_cache
    entries = {k: v for k, v in tuning_cache.parse_cache(text).items() if k not in _TUNING_CACHE}
    if len(_TUNING_CACHE) + len(entries) <= tuning_cache.MAX_CACHE_ENTRIES:
        _TUNING_CACHE.update(entries)
        return len(entries)
    return 0


def tuning_cache_text() -> str:
    """The worker's cache as JSON text, for the worker to keep."""
    return json.dumps(_TUNING_CACHE, sort_keys=True)


class EngineHost:
    def __init__(self, model, on_event=None):
        self.model = model           # the ValidatedModel the loader accepted
        self.semantic = None         # webslm.Model over it (semantic_model()), made when first needed
        self.backend = None          # the CPU backend (weights dequantized once), likewise
        self.gpu_session = None      # the admitted GPU session (webslm.admission), if any
        self.engine = None           # the Engine that answers (start_engine), once there is one
        self.gpu_backend = None      # the GPU executor the engine was built on, if any
        self.forced = False          # the page kept the admitted GPU without timing it
        self.lost = None             # {code, sentence} once the GPU was lost
        self.destroyed_after = None  # lose-device: the committed tokens when it destroyed the device
        self._on_event = on_event    # called with each engine event as JSON (the worker posts it)
        # A test hook's check (test_hooks.lose_device), called before an answer's first step
        # and after each of its tokens; None when no hook is armed.
        self.between_steps: Callable[[], None] | None = None
        self._answer_prompt = None   # the prompt length of the answer in progress, if any
        self._answer_epoch = 0       # the ledger's epoch before that answer began

    # -- the model -------------------------------------------------------------------------------
    def semantic_model(self):
        """webslm.Model over the validated artifact (its tokenizer and chat template), made once."""
        from ..model import Model
        if self.semantic is None:
            self.semantic = Model(self.model)
        return self.semantic

    def cpu_backend(self):
        """The CPU backend, built once per model (the weights dequantized to f32) and shared by
        the engine's CPU path and the conformance oracle."""
        from ..cpu import CpuBackend
        if self.backend is None:
            self.backend = CpuBackend(self.semantic_model())
        return self.backend

    # -- admission: which engine answers ---------------------------------------------------------
    async def admit(self, feature_level: str, fault: str | None, user_agent: str, on_stage, on_progress,
                    choice: str = "measure", tuning: str = "auto", verdicts: str | None = None) -> str:
        """GPU admission of the model on this browser's adapter, then the engine for it. The
        engine held so far is unloaded first (its GPU buffers and device are destroyed before a
        second admission allocates); on success the new engine runs on the admitted session
        (start_engine: no second admission), otherwise on the CPU path with the failure as its
        reason. choice "measure": the admitted GPU is kept only if its decode step is not slower
        than the CPU path's (stage "speed"; engine/choice.py); "force": it is kept untimed;
        "remeasure": as "measure", the verdict kept from an earlier visit forgotten first.
        `verdicts`: the verdicts kept across visits (untrusted text, engine/verdict.py; the
        worker reads them from worker/verdict-store.mjs). With "measure", one that says this
        adapter was slower than the CPU path for this model and shader bundle skips admission:
        the engine goes to the CPU path at once (reply: admitted false, `remembered` true).
        The reply is JSON: the tier and receipt, or the stage, code and sentence that failed,
        and the engine's summary (with the choice's numbers); `tuning_new_entries`: how many
        tuning results it added to the worker's cache (the worker keeps the cache when > 0);
        `verdicts_text`: the verdicts to keep, or null when they are unchanged. `tuning`:
        AdmissionPolicy.tuning ("auto": measured here, not on a software adapter; "later": with
        tune_later, the kept results now and the rest measured once the engine is idle,
        tune_later(), where a first look does not show a software adapter; "force": measured
        here, even on a software adapter; "later-force": "later" even on a software adapter,
        for the tests; "off").
        With a `fault` (the tests' named faults) the kept verdicts are neither used nor changed."""
        if choice not in ("measure", "force", "remeasure"):
            raise ValueError(f"choice must be measure, force or remeasure, not {choice!r}")
        if tuning not in TUNING_MODES:
            raise ValueError(f"tuning must be one of {', '.join(TUNING_MODES)}, not {tuning!r}")
        from ..admission.admit import AdmissionFailure, AdmissionPolicy
        from ..admission.admit import admit as run_admission
        from ..admission.receipt import render_text
        from ..admission.tracked import Faults
        from ..engine import verdict
        from ..engine.choice import by_measurement
        faults = Faults.named(fault)           # ValueError for an unknown name: a "failed" reply
        await self.drop_engine()               # the GPU the current engine holds is given back first
        gpu = self.offered_gpu()
        model = self.semantic_model()
        measured = choice != "force"
        key = await self._verdict_key(gpu, feature_level, user_agent) if measured and fault is None else None
        remembered = verdict.remembered(verdicts, key) if choice == "measure" else None
        if remembered is not None:
            await self.start_engine(gpu, remembered=remembered)
            reason = self.engine.cpu_reason
            return json.dumps({"admitted": False, "remembered": True, "stage": reason["stage"], "code": reason["code"],
                               "sentence": reason["sentence"], "stages": [], "seconds": 0.0, "receipt": None,
                               "receipt_text": None, "verdicts_text": None, "engine": self.engine_summary()})

        def kept_verdicts() -> str | None:     # after this load: what the measurement says now
            if key is None:
                return None
            return verdict.updated(verdicts, key, self.engine.choice if self.engine else None,
                                   forget=choice == "remeasure")
        stages = []

        def stage_seen(stage: str) -> None:
            stages.append(stage)
            on_stage(stage)
        started = time.perf_counter()
        # Timed against the CPU path: its step estimated first, so that admission on a software
        # adapter stops before compiling a step that cannot beat it (engine/choice.py).
        measurement = by_measurement() if measured else None
        try:
            policy = AdmissionPolicy(feature_level=feature_level,
                                     tuning={"later": "auto", "later-force": "force"}.get(tuning, tuning),
                                     tune_later=tuning in ("later", "later-force"),
                                     max_step_seconds=measurement.cpu(model).seconds if measurement else None)
            session = await run_admission(gpu, model, policy,
                                          faults=faults,
                                          user_agent=user_agent, on_stage=stage_seen, on_progress=on_progress,
                                          tuning_cache=_TUNING_CACHE)
        except AdmissionFailure as failure:
            seconds = round(time.perf_counter() - started, 3)
            await self.start_engine(gpu, failure=failure, measurement=measurement)
            return json.dumps({"admitted": False, "stage": failure.stage, "code": failure.code,
                               "sentence": failure.sentence, "leaked_buffers": failure.leaked_buffers,
                               "stages": stages, "seconds": seconds,
                               "receipt": failure.receipt.as_dict(), "receipt_text": render_text(failure.receipt),
                               "verdicts_text": kept_verdicts(), "engine": self.engine_summary()})
        seconds = round(time.perf_counter() - started, 3)
        new_entries = session.tuning.cache_entries if session.tuning else {}
        _TUNING_CACHE.update(new_entries)
        self.gpu_session = session
        engine_started = time.perf_counter()
        if measured:
            on_stage("speed")                  # the page shows it; admission's own stages end at publish
        await self.start_engine(gpu, session=session, measure=measured, measurement=measurement)
        return json.dumps({"admitted": True, "tier": session.tier, "features": list(session.features),
                           "feature_level": session.feature_level, "stages": stages,
                           "self_test_cases": session.self_test["cases"], "plan_hash": session.plan.hash,
                           "gpu_bytes": session.plan.total_gpu_bytes, "stage_seconds": session.seconds,
                           "seconds": seconds, "engine_seconds": round(time.perf_counter() - engine_started, 3),
                           "tuning": session.tuning.summary() if session.tuning else None,
                           "tuning_mode": tuning, "tuning_new_entries": len(new_entries),
                           "receipt": session.receipt.as_dict(), "receipt_text": render_text(session.receipt),
                           "verdicts_text": kept_verdicts(), "engine": self.engine_summary()})

    def offered_gpu(self):
        """This browser's WebGPU (browser_gpu). The tests' seam: CPython has no `js` module."""
        return browser_gpu()

    async def _verdict_key(self, gpu, feature_level: str, user_agent: str) -> str | None:
        """The kept verdicts' key for the adapter admission will take (choose_adapter: the
        same request, so the same adapter; no device is made), this browser, model and shader
        bundle (engine/verdict.py); None without an adapter, or when asking for it fails (then
        nothing is looked up or kept, and admission says what is wrong)."""
        from ..engine import verdict
        from ..shader_bundle import bundle_hash
        from ..webgpu.adapters import choose_adapter
        if gpu is None:
            return None
        try:
            adapter = await choose_adapter(gpu, feature_level)
            if adapter is None:
                return None
            return verdict.record_key(adapter.summary(), user_agent, self.model.identity.artifact_sha256, bundle_hash())
        except Exception:   # noqa: BLE001 - a key is a shortcut: without one, admission runs as before
            return None

    async def use_cpu(self) -> str:
        """The engine on the CPU path, the GPU not tried (the page asked for no GPU:
        createEngine({gpu: false}) or ?gpu=0). The engine held so far is unloaded first."""
        from ..admission.admit import AdmissionFailure
        await self.drop_engine()
        await self.start_engine(object(), failure=AdmissionFailure(
            "entry-point", "gpu-disabled", "the GPU was turned off for this page: the model runs on the CPU path"))
        return json.dumps({"engine": self.engine_summary()})

    # -- the engine's lifetime -------------------------------------------------------------------
    async def start_engine(self, gpu, session=None, failure=None, measure: bool = False, remembered=None,
                           measurement=None) -> None:
        """The engine for this model, given one of: an admitted `session` (the engine runs on
        the executor built on it, through Engine's build_gpu_backend seam: admission is not
        repeated; if the build fails, on the CPU path with that reason), or an AdmissionFailure
        (the engine settles on the CPU path with it as the reason). gpu is None where the
        browser has no navigator.gpu: then the engine's own reason is the entry point's.
        measure: the engine times the GPU against the CPU path and keeps the faster.
        remembered: an earlier visit's verdict (engine/verdict.py): the engine goes to the CPU
        path without building anything on the GPU. measurement: the choice.Measurement admission
        was given the CPU step by (its estimate is reused; a "gpu-slower" failure of admission's
        step-floor stage becomes the engine's Choice)."""
        from ..engine import Engine
        from ..engine.choice import by_measurement
        if self.engine is not None:          # admit() dropped it before admitting; a second
            await self.engine.unload()       # engine never shares the GPU with the first
        model = self.semantic_model()

        async def build(_gpu, _model, _policy, _on_stage):
            if failure is not None:
                raise failure
            from ..backends.gpu import GpuBackend
            try:
                backend = await GpuBackend.build(session, model)
            except BaseException:
                self.gpu_session = None      # build destroyed the session
                raise
            self.gpu_backend = backend
            return backend, session.receipt.as_dict()

        self.lost, self.destroyed_after = None, None
        # No navigator.gpu: an engine without a GPU (its reason is the entry point's, as
        # admission's was); otherwise the seam hands over the admitted session or the failure.
        self.engine = Engine(model, gpu=gpu, on_event=self._event, build_gpu_backend=build,
                             cpu_backend=self.cpu_backend,
                             gpu_choice=measurement or (by_measurement() if measure else None),
                             remembered=remembered)
        await self.engine.load()
        self.forced = not measure and self.engine.backend_kind == "gpu"
        if self.engine.backend_kind != "gpu":      # e.g. released: slower than the CPU path
            self.gpu_backend, self.gpu_session = None, None

    async def ensure_engine(self):
        """The engine; a CPU engine when no admission was ever requested for this model."""
        if self.engine is None:
            from ..admission.admit import AdmissionFailure
            await self.start_engine(object(), failure=AdmissionFailure(
                "entry-point", "not-admitted", "no GPU admission was requested for this model: it runs on the CPU path"))
        return self.engine

    async def drop_engine(self) -> None:
        """Unload the engine (an answer in progress is cancelled; the GPU executor, its buffers
        and device are destroyed) and the admitted session."""
        engine, self.engine = self.engine, None
        self.between_steps = None            # a hook armed for this engine's device
        if engine is not None:
            await engine.unload()
        self.gpu_backend = None
        if self.gpu_session is not None:
            self.gpu_session.destroy()       # idempotent: the executor's release destroyed it too
            self.gpu_session = None

    async def release(self) -> None:
        """Unload the engine and free the GPU session deterministically (a model switch, or
        the model unloaded): every GPU buffer and the device are destroyed now, not at GC."""
        await self.drop_engine()

    # -- its state, as the page sees it ----------------------------------------------------------
    def _event(self, event: dict) -> None:
        engine = self.engine
        if event.get("event") == "state":
            if event["to"] == "Lost":
                self.lost = {"code": event.get("code"), "sentence": event.get("sentence")}
            if engine is not None:
                event = {**event, "cpu_reason": self._cpu_reason()}
        if self._on_event is not None:
            self._on_event(json.dumps(event, default=str))

    def _cpu_reason(self) -> dict | None:
        engine = self.engine
        if engine is None:
            return None
        if engine.cpu_reason is not None:
            return engine.cpu_reason
        if self.lost is not None:
            return {"reason": "GPU lost", "stage": "generate", **self.lost}
        return None

    def engine_summary(self) -> dict:
        engine = self.engine
        if engine is None:
            return {"state": "Empty", "backend": None, "cpu_reason": None, "tier": None, "choice": None}
        from ..engine.choice import FORCED
        choice = engine.choice.as_dict() if engine.choice is not None else FORCED.as_dict() if self.forced else None
        return {"state": str(engine.state), "backend": engine.backend_kind, "cpu_reason": self._cpu_reason(),
                "tier": getattr(getattr(self.gpu_backend, "session", None), "tier", None)
                if engine.backend_kind == "gpu" else None,
                "choice": choice}

    def engine_status(self) -> str:
        return json.dumps(self.engine_summary())

    # -- tuning left for when the engine is idle ------------------------------------------------
    async def tune_later(self) -> str:
        """What admission left to measure (tune_later), measured now (Engine.tune_gpu): JSON
        {tuning: the report's summary or null, tuning_new_entries, deferred: still to do (an
        answer stopped it)}. The new results join the worker's cache (the worker keeps it)."""
        engine = self.engine
        report = await engine.tune_gpu(_TUNING_CACHE) if engine is not None else None
        entries = report.cache_entries if report is not None else {}
        _TUNING_CACHE.update(entries)
        gpu = engine._gpu if engine is not None else None
        return json.dumps({"tuning": report.summary() if report is not None else None,
                           "tuning_new_entries": len(entries),
                           "deferred": bool(gpu is not None and getattr(gpu, "tuning_deferred", False))})

    def stop_tuning(self) -> None:
        """A request is waiting: tune_later's stage stops at its next checkpoint."""
        if self.engine is not None:
            self.engine.stop_tuning()

    # -- answers ---------------------------------------------------------------------------------
    def cancel(self) -> bool:
        """Cancel the answer in progress (engine.cancel()): nothing commits after this returns."""
        return bool(self.engine is not None and self.engine.cancel())

    def answer_tokens(self) -> int | None:
        """How many tokens the answer in progress has committed; None between answers."""
        engine = self.engine
        if engine is None or self._answer_prompt is None:
            return None
        # until the answer's ledger generation begins, the ledger still holds the previous one
        begun = engine.ledger.epoch > self._answer_epoch
        return engine.ledger.next_position - self._answer_prompt if begun else 0

    def _between_steps(self) -> None:
        if self.between_steps is not None:
            self.between_steps()

    async def generate(self, request_json: str, on_delta, on_progress=None, stopped=None) -> str:
        """One answer through the engine. on_delta is called with each committed text delta as
        JSON ({text, token_id, backend}), on_progress (if given) while the prompt is read as
        JSON ({phase, done, total, cached}: prompt tokens; Engine.generate); with the
        request's logprobs, each delta carries the logprobs entries of the tokens committed
        since the one before (answer.py); the result is JSON: the text, finish_reason, the
        logprobs entries of every committed token (null without logprobs), usage (with the prompt tokens kept in the KV cache
        from the answer before), timings (engine timings, time to first token, GPU per-step
        overhead), the backend(s) that answered, the committed token ids and the engine
        summary. With tools (semantic/tool_calls.py): tool_calls (null when the answer makes
        no call), content (the text around the calls, or null), and finish_reason
        "tool_calls" when it made one; the deltas are then semantic/tool_stream.py's pieces:
        {text} is content only, and a call streams as {tool_calls: [{index, id, type,
        function: {name, arguments}}]} entries (OpenAI's delta.tool_calls). stopped (the
        worker's): true once the answer was cancelled before it reached the engine, which
        cancel() cannot see; the answer then ends "abort" at once, as one cancelled while it
        waited in the worker's queue: {text: "", finish_reason: "abort", backend: null}."""
        started = time.perf_counter()
        model = self.semantic_model()
        request = json.loads(request_json)
        plan = generation_plan(model, request)                  # RequestError: "bad-field"
        ids, settings = plan.ids, plan.settings
        reuse = cache_prompt(request)
        engine = await self.ensure_engine()
        if stopped is not None and stopped():   # from here to the engine's answer nothing waits
            return json.dumps({"text": "", "finish_reason": "abort", "backend": None})
        gpu = self.gpu_backend if engine.backend_kind == "gpu" else None
        before = dict(gpu.stats) if gpu is not None else None
        backends = [engine.backend_kind]
        pieces, finish, first, logprobs = [], None, None, [] if settings.logprobs else None
        self._answer_prompt, self._answer_epoch = len(ids), engine.ledger.epoch
        report = (lambda progress: on_progress(json.dumps(progress))) if on_progress is not None else None
        salt = f"{settings.seed}:{len(ids)}:{hashlib.sha256(repr(ids).encode()).hexdigest()[:16]}"
        calls_stream = ToolStream(plan.tools, salt) if plan.tools is not None and plan.tools.choice != "none" else None
        try:
            self._between_steps()
            async for delta in engine.generate(ids, settings, on_progress=report, reuse_kv=reuse):
                kind = engine.backend_kind
                if kind != backends[-1]:
                    backends.append(kind)
                if delta.logprobs is not None:
                    logprobs += delta.logprobs
                if delta.text:
                    if first is None:
                        first = time.perf_counter() - started
                    pieces.append(delta.text)
                    shown, calls_now = delta.text, None
                    if calls_stream is not None:
                        shown, calls_now = _merge(calls_stream.feed(delta.text))
                    on_delta(json.dumps({"text": shown, "token_id": delta.token_id, "backend": kind,
                                         **({"tool_calls": calls_now} if calls_now else {}),
                                         **({"logprobs": delta.logprobs} if delta.logprobs is not None else {})}))
                if delta.finish_reason:
                    finish = delta.finish_reason
                else:
                    self._between_steps()
        finally:
            self._answer_prompt = None
        total = time.perf_counter() - started
        t = engine.last_timings
        timings = {"prefill_seconds": round(t.prefill_seconds, 4), "decode_seconds": round(t.decode_seconds, 4),
                   "decode_tokens_per_s": round(t.generated_tokens / max(t.decode_seconds, 1e-9), 3),
                   "time_to_first_token_s": round(first, 4) if first is not None else None,
                   "total_seconds": round(total, 4)}
        if gpu is not None:
            steps = timings["gpu_steps"] = per_step_ms(gpu.stats, before)
            if backends == ["gpu"] and steps["decode_steps"]:
                # the rest of a decode step's time: the engine's loop (sampler, ledger, text),
                # the delta posted to the page, the event loop's turns
                per_step = 1000 * t.decode_seconds / steps["decode_steps"]
                steps["outside_executor_ms"] = round(per_step - steps["prepare_ms"] - steps["run_ms"] - steps["finish_ms"], 3)
        text, calls, content = "".join(pieces), None, None
        if calls_stream is not None:         # the held text streams now, as content or calls
            last, calls, content = calls_stream.end(finish)
            shown, calls_now = _merge(last)
            if shown or calls_now:
                on_delta(json.dumps({"text": shown, "token_id": None, "backend": engine.backend_kind,
                                     **({"tool_calls": calls_now} if calls_now else {})}))
            if calls:                        # the answer is calls (with any text around them)
                finish = "tool_calls"
        return json.dumps({"text": text, "finish_reason": finish, "logprobs": logprobs,
                           **({"tool_calls": calls, "content": content if calls else text} if plan.tools else {}),
                           "usage": {"prompt_tokens": t.prompt_tokens, "completion_tokens": t.generated_tokens,
                                     "prompt_tokens_details": {"cached_tokens": t.cached_tokens}},
                           "timings": timings, "backend": engine.backend_kind, "backends": backends,
                           "token_ids": list(engine.ledger.committed_ids), "engine": self.engine_summary(),
                           "device_destroyed_after": self.destroyed_after})

    def reset_chat(self) -> bool:
        """Forget the conversation the KV cache holds (WebLLM's resetChat): the next answer
        reads its whole prompt. The worker calls it between answers. Whether an engine was there."""
        if self.engine is None:
            return False
        self.engine.prompt_cache.forget()
        return True

    # -- conformance -----------------------------------------------------------------------------
    async def conformance(self, tokens: int) -> str:
        """engine/conformance.py on the engine's GPU executor: the chat-templated "What is the
        capital of France?", teacher-forced for `tokens` positions against the CPU oracle
        (this model's CPU backend), plus the executor's per-step host time in ms."""
        from ..engine import State
        from ..engine.conformance import conformance
        from ..generate import prompt_ids
        engine, backend = self.engine, self.gpu_backend
        if engine is None or engine.backend_kind != "gpu" or backend is None:
            raise WorkerRequestFailed("conformance needs the engine on the GPU")
        if engine.state is not State.GPU_READY:
            raise WorkerRequestFailed(f"conformance needs the engine idle on the GPU; it is {engine.state}")
        model = self.semantic_model()
        ids = prompt_ids(model, CONFORMANCE_PROMPT, chat=True)
        oracle = self.cpu_backend()
        saved, backend.current_epoch = backend.current_epoch, None   # outside any answer's epoch
        before = dict(backend.stats)
        started = time.perf_counter()
        try:
            report = await conformance(model, backend, ids, tokens=tokens, oracle=oracle)
        finally:
            backend.current_epoch = saved
            backend.reset()
        report["prompt"] = CONFORMANCE_PROMPT
        report["seconds"] = round(time.perf_counter() - started, 3)
        report["gpu_steps"] = per_step_ms(backend.stats, before)
        report["tier"] = backend.session.tier
        return json.dumps(report)


def _merge(pieces: list[dict]) -> tuple[str, list[dict] | None]:
    """ToolStream's pieces as one delta: the content joined, and one tool_calls entry per call
    index (a call's start and its first arguments fragment together, as OpenAI streams them)."""
    text, entries = "", {}
    for piece in pieces:
        text += piece.get("text", "")
        for entry in piece.get("tool_calls", ()):
            seen = entries.get(entry["index"])
            if seen is None:
                entries[entry["index"]] = {**entry, "function": dict(entry["function"])}
            else:
                seen["function"]["arguments"] = seen["function"].get("arguments", "") + entry["function"]["arguments"]
    return text, [entries[i] for i in sorted(entries)] or None


def per_step_ms(stats: dict, before: dict | None = None) -> dict:
    """The GPU executor's decode-step stats (since `before`) as milliseconds per step: prepare
    (params, checks, writes), run (bridge calls: encode, submit, GPU, readback), finish
    (scores from the bytes)."""
    before = before or {}
    steps = stats["decode_steps"] - before.get("decode_steps", 0)

    def per(key):
        return round(1000 * (stats[key] - before.get(key, 0.0)) / steps, 3) if steps else None
    return {"decode_steps": steps, "prepare_ms": per("prepare_s"), "run_ms": per("run_s"), "finish_ms": per("finish_s")}
