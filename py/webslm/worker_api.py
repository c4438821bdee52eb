"""What the Web Worker calls in Python (worker/worker.mjs). Results are JSON strings, so
nothing but plain data crosses back to JS."""
from __future__ import annotations

import json
import platform
import sys
import time

import numpy as np

from . import __version__, gpu_smoke, shader_bundle
from .artifact import ArtifactError, Validator
from .webgpu.adapters import choose_adapter


def status() -> str:
    bundle = shader_bundle.load()
    return json.dumps({
        "python": platform.python_version(),
        "platform": sys.platform,
        "numpy": np.__version__,
        "numpy_check": float(np.square(np.arange(10.0)).sum()),   # proves numpy runs, not just imports
        "webslm": __version__,
        "shader_bundle_hash": bundle.bundle_hash,
        "shader_bundle_origin": bundle.origin,
    })


async def gpu_probe(feature_level: str, seed: int) -> str:
    from .webgpu.browser import BrowserGpu  # needs Pyodide and the worker's bridge module
    return json.dumps(await gpu_smoke.probe(BrowserGpu(), feature_level, seed))


async def kernel_golden(feature_level: str, size: str, loader) -> str:
    """The kernel golden suite on this browser's adapter (a fresh device with every optional
    feature it offers, so each tier's variants run), optionally on the loaded model's weights."""
    from .kernels import golden
    from .webgpu.browser import BrowserGpu
    adapter = await choose_adapter(BrowserGpu(), feature_level)
    if adapter is None:
        return json.dumps({"outcome": "no-webgpu-adapter"})
    from .kernels.registry import KERNEL_FEATURES
    features = sorted(KERNEL_FEATURES & adapter.features)
    device = await adapter.request_device(features=features)
    errors = []
    device.on_uncaptured_error(errors.append)
    model = None
    if loader is not None:
        from .model import Model
        model = loader.semantic = loader.semantic or Model(loader.model)
    started = time.perf_counter()
    try:
        report = await golden.run_all(device, size, model=model)
    finally:
        device.destroy()
    report["seconds"] = round(time.perf_counter() - started, 3)
    report["features"] = features
    report["feature_level"] = adapter.feature_level
    report["gpu_errors"] = [{"kind": e.kind, "message": e.message} for e in errors]
    report["outcome"] = "passed" if report["passed"] and not errors else "failed"
    return json.dumps(report)


async def admit(loader, feature_level: str, fault: str | None, user_agent: str, on_stage, on_progress) -> str:
    """GPU admission of the loaded model on this browser's adapter, then the loader's engine
    for it. The engine the loader held is unloaded first (its GPU buffers and device are
    destroyed before a second admission allocates); on success the new engine runs on the
    admitted session (ModelLoader.start_engine: no second admission), otherwise on the CPU
    path with the failure as its reason. The reply is JSON: the tier and receipt, or the
    stage, code and sentence that failed, and the engine's summary."""
    from .admission.admit import AdmissionFailure, AdmissionPolicy
    from .admission.admit import admit as run_admission
    from .admission.receipt import render_text
    from .admission.tracked import Faults
    from .model import Model
    faults = Faults.named(fault)           # ValueError for an unknown name: a "failed" reply
    await loader.drop_engine()             # the GPU the current engine holds is given back first
    gpu = None
    import js
    if getattr(js.navigator, "gpu", None) is not None:
        from .webgpu.browser import BrowserGpu
        gpu = BrowserGpu()
    model = loader.semantic = loader.semantic or Model(loader.model)
    stages = []

    def stage_seen(stage: str) -> None:
        stages.append(stage)
        on_stage(stage)
    started = time.perf_counter()
    try:
        session = await run_admission(gpu, model, AdmissionPolicy(feature_level=feature_level), faults=faults,
                                      user_agent=user_agent, on_stage=stage_seen, on_progress=on_progress)
    except AdmissionFailure as failure:
        seconds = round(time.perf_counter() - started, 3)
        await loader.start_engine(gpu, failure=failure)
        return json.dumps({"admitted": False, "stage": failure.stage, "code": failure.code,
                           "sentence": failure.sentence, "leaked_buffers": failure.leaked_buffers,
                           "stages": stages, "seconds": seconds,
                           "receipt": failure.receipt.as_dict(), "receipt_text": render_text(failure.receipt),
                           "engine": loader.engine_summary()})
    seconds = round(time.perf_counter() - started, 3)
    loader.gpu_session = session
    engine_started = time.perf_counter()
    await loader.start_engine(gpu, session=session)
    return json.dumps({"admitted": True, "tier": session.tier, "features": list(session.features),
                       "feature_level": session.feature_level, "stages": stages,
                       "self_test_cases": session.self_test["cases"], "plan_hash": session.plan.hash,
                       "gpu_bytes": session.plan.total_gpu_bytes, "stage_seconds": session.seconds,
                       "seconds": seconds, "engine_seconds": round(time.perf_counter() - engine_started, 3),
                       "receipt": session.receipt.as_dict(), "receipt_text": render_text(session.receipt),
                       "engine": loader.engine_summary()})


async def use_cpu(loader) -> str:
    """The loader's engine on the CPU path, the GPU not tried (the page asked for no GPU:
    createEngine({gpu: false}) or ?gpu=0). The engine it held is unloaded first."""
    from .admission.admit import AdmissionFailure
    await loader.drop_engine()
    await loader.start_engine(object(), failure=AdmissionFailure(
        "entry-point", "gpu-disabled", "the GPU was turned off for this page: the model runs on the CPU path"))
    return json.dumps({"engine": loader.engine_summary()})


class ModelLoader:
    """Validates a .slm as the worker streams it in; the worker keeps the model it returns.

    feed() takes each fetched chunk (a JS Uint8Array) and copies it into the validator,
    which rejects a bad file as early as its bytes allow: feed() and finish() return None /
    a summary on success and the artifact error as JSON ({"code", "where", "sentence"}) on
    rejection, so the worker can stop the download and the page can explain the error."""

    def __init__(self, on_event=None):
        self._validator = Validator()
        self._seconds = 0.0          # time spent validating (hashing, parsing), not fetching
        self.model = None            # the ValidatedModel, once finish() accepted the file
        self.semantic = None         # webslm.Model over it, made on the first generation
        self.backend = None          # the CPU backend (weights dequantized once), likewise
        self.gpu_session = None      # the admitted GPU session (webslm.admission), if any
        self.engine = None           # the Engine that answers (start_engine), once there is one
        self.gpu_backend = None      # the GPU executor the engine was built on, if any
        self.lost = None             # {code, sentence} once the GPU was lost
        self.destroyed_after = None  # lose-device: the committed tokens when it destroyed the device
        self._on_event = on_event    # called with each engine event as JSON (the worker posts it)
        self._lose_after = None      # lose-device: committed answer tokens, then device.destroy()
        self._answer_prompt = None   # the prompt length of the answer in progress, if any
        self._answer_epoch = 0       # the ledger's epoch before that answer began

    async def release(self) -> None:
        """Unload the engine and free the GPU session deterministically (a model switch, or
        the loader dropped): every GPU buffer and the device are destroyed now, not at GC."""
        await self.drop_engine()

    # -- the engine ------------------------------------------------------------------------------
    def _model(self):
        from .model import Model
        if self.semantic is None:
            self.semantic = Model(self.model)
        return self.semantic

    def cpu_backend(self):
        """The CPU backend, built once per model (the weights dequantized to f32) and shared by
        the engine's CPU path and the conformance oracle."""
        from .cpu import CpuBackend
        if self.backend is None:
            self.backend = CpuBackend(self._model())
        return self.backend

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

    async def start_engine(self, gpu, session=None, failure=None) -> None:
        """The engine for this model, given one of: an admitted `session` (the engine runs on
        the executor built on it, through Engine's build_gpu_backend seam: admission is not
        repeated; if the build fails, on the CPU path with that reason), or an AdmissionFailure
        (the engine settles on the CPU path with it as the reason). gpu is None where the
        browser has no navigator.gpu: then the engine's own reason is the entry point's."""
        from .engine import Engine
        if self.engine is not None:          # admit() dropped it before admitting; a second
            await self.engine.unload()       # engine never shares the GPU with the first
        model = self._model()

        async def build(_gpu, _model, _policy, _on_stage):
            if failure is not None:
                raise failure
            from .backends.gpu import GpuBackend
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
                             cpu_backend=self.cpu_backend)
        await self.engine.load()

    async def ensure_engine(self):
        """The engine; a CPU engine when no admission was ever requested for this model."""
        if self.engine is None:
            from .admission.admit import AdmissionFailure
            await self.start_engine(object(), failure=AdmissionFailure(
                "entry-point", "not-admitted", "no GPU admission was requested for this model: it runs on the CPU path"))
        return self.engine

    async def drop_engine(self) -> None:
        """Unload the engine (an answer in progress is cancelled; the GPU executor, its buffers
        and device are destroyed) and the admitted session."""
        engine, self.engine = self.engine, None
        self._lose_after = None
        if engine is not None:
            await engine.unload()
        self.gpu_backend = None
        if self.gpu_session is not None:
            self.gpu_session.destroy()       # idempotent: the executor's release destroyed it too
            self.gpu_session = None

    def engine_summary(self) -> dict:
        engine = self.engine
        if engine is None:
            return {"state": "Empty", "backend": None, "cpu_reason": None, "tier": None}
        return {"state": str(engine.state), "backend": engine.backend_kind, "cpu_reason": self._cpu_reason(),
                "tier": getattr(getattr(self.gpu_backend, "session", None), "tier", None)
                if engine.backend_kind == "gpu" else None}

    def engine_status(self) -> str:
        return json.dumps(self.engine_summary())

    def cancel(self) -> bool:
        """Cancel the answer in progress (engine.cancel()): nothing commits after this returns."""
        return bool(self.engine is not None and self.engine.cancel())

    async def generate(self, request_json: str, on_delta) -> str:
        """One answer through the engine. on_delta is called with each committed text delta as
        JSON ({text, token_id, backend}); the result is JSON: the text, finish_reason, usage,
        timings (engine timings, time to first token, GPU per-step overhead), the backend(s)
        that answered, the committed token ids and the engine summary."""
        started = time.perf_counter()
        model = self._model()
        messages, settings = generation_request(model, json.loads(request_json))
        text = model.chat_template.render(messages, add_generation_prompt=True)
        ids = model.tokenizer.encode(text, add_special=False)
        engine = await self.ensure_engine()
        gpu = self.gpu_backend if engine.backend_kind == "gpu" else None
        before = dict(gpu.stats) if gpu is not None else None
        backends = [engine.backend_kind]
        pieces, finish, first = [], None, None
        self._answer_prompt, self._answer_epoch = len(ids), engine.ledger.epoch
        try:
            self._lose_device_if_due()
            async for delta in engine.generate(ids, settings):
                kind = engine.backend_kind
                if kind != backends[-1]:
                    backends.append(kind)
                if delta.text:
                    if first is None:
                        first = time.perf_counter() - started
                    pieces.append(delta.text)
                    on_delta(json.dumps({"text": delta.text, "token_id": delta.token_id, "backend": kind}))
                if delta.finish_reason:
                    finish = delta.finish_reason
                else:
                    self._lose_device_if_due()
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
        return json.dumps({"text": "".join(pieces), "finish_reason": finish,
                           "usage": {"prompt_tokens": t.prompt_tokens, "completion_tokens": t.generated_tokens},
                           "timings": timings, "backend": engine.backend_kind, "backends": backends,
                           "token_ids": list(engine.ledger.committed_ids), "engine": self.engine_summary(),
                           "device_destroyed_after": self.destroyed_after})

    # -- test hooks and measurements ---------------------------------------------------------------
    def lose_device(self, after_tokens: int) -> str:
        """Test hook: destroy the admitted GPU device (as a driver reset would) once the answer
        in progress (or, if none, the next one) has committed `after_tokens` tokens; 0 means
        before its first step. The engine sees the loss at its next step and continues on the
        CPU path."""
        engine = self.engine
        if engine is None or engine.backend_kind != "gpu" or self.gpu_backend is None:
            raise WorkerRequestFailed("the engine is not on the GPU: there is no device to lose")
        self._lose_after = int(after_tokens)
        armed_state = str(engine.state)
        if self._answer_prompt is not None:
            self._lose_device_if_due()
        return json.dumps({"armed": True, "after_tokens": int(after_tokens), "state": armed_state})

    def _lose_device_if_due(self) -> None:
        due, engine = self._lose_after, self.engine
        if due is None or engine is None or self._answer_prompt is None or self.gpu_backend is None:
            return
        # until the answer's ledger generation begins, the ledger still holds the previous one
        begun = engine.ledger.epoch > self._answer_epoch
        committed = engine.ledger.next_position - self._answer_prompt if begun else 0
        if committed >= due:
            self._lose_after = None
            self.destroyed_after = committed
            self.gpu_backend.device.inner.destroy()     # TrackedDevice.inner: the browser device

    async def conformance(self, tokens: int) -> str:
        """engine/conformance.py on the engine's GPU executor: the chat-templated "What is the
        capital of France?", teacher-forced for `tokens` positions against the CPU oracle
        (the loader's CPU backend), plus the executor's per-step host time in ms."""
        from .engine import State
        from .engine.conformance import conformance
        from .generate import prompt_ids
        engine, backend = self.engine, self.gpu_backend
        if engine is None or engine.backend_kind != "gpu" or backend is None:
            raise WorkerRequestFailed("conformance needs the engine on the GPU")
        if engine.state is not State.GPU_READY:
            raise WorkerRequestFailed(f"conformance needs the engine idle on the GPU; it is {engine.state}")
        model = self._model()
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

    def feed(self, chunk) -> str | None:
        started = time.perf_counter()
        try:
            self._validator.feed(chunk.to_memoryview())
        except ArtifactError as exc:
            return artifact_error(exc)
        finally:
            self._seconds += time.perf_counter() - started
        return None

    def finish(self) -> str:
        started = time.perf_counter()
        try:
            self.model = self._validator.finish()
        except ArtifactError as exc:
            return json.dumps({"error": json.loads(artifact_error(exc))})
        self._seconds += time.perf_counter() - started
        return json.dumps({"model": model_summary(self.model, self._seconds)})

    def tokenizer_check(self, chars: int) -> str:
        """Encode the fixed corpus with this model's tokenizer: the ids' digest (compared with
        CPython's by the tests) and the throughput (bench/tokenizer.py)."""
        from .semantic.corpus import corpus, ids_digest, measure
        from .semantic.tokenizer import Tokenizer
        tokenizer = Tokenizer.from_manifest(self.model.manifest.tokenizer)
        texts = corpus(chars)
        return json.dumps({"digest": ids_digest(tokenizer, texts), "measure": measure(tokenizer, texts)})


def model_summary(model, validation_seconds: float) -> dict:
    a = model.architecture
    return {
        "artifact_sha256": model.identity.artifact_sha256,
        "layout_hash": model.identity.layout_hash,
        "bytes": model.nbytes,
        "tensors": len(model.manifest.tensors),
        "architecture": {"family": a.family, "n_layers": a.n_layers, "hidden": a.hidden, "n_heads": a.n_heads,
                         "n_kv_heads": a.n_kv_heads, "vocab": a.vocab, "context_length": a.context_length},
        "encodings": sorted({i.encoding for i in model.manifest.tensors.values()}),
        "generation": dict(model.manifest.generation),      # the model's sampling defaults
        "validation_seconds": round(validation_seconds, 3),
    }


def artifact_error(exc: ArtifactError) -> str:
    return json.dumps({"code": exc.code, "where": exc.where, "sentence": exc.sentence})


def sampler_check() -> str:
    """The sampler's cross-platform reference vectors (compared with CPython's by the tests)."""
    from .semantic.sampler_vectors import reference_run
    return json.dumps(reference_run())


ROLES = ("system", "user", "assistant")
SETTING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed", "stop")


class RequestError(ValueError):
    """A page request that is well-formed JSON but not a valid generation request."""


class WorkerRequestFailed(RuntimeError):
    """A valid request the worker cannot serve in its current state (the reply's "failed")."""


CONFORMANCE_PROMPT = "What is the capital of France?"


def _messages(value) -> list[dict]:
    if not isinstance(value, list) or not 1 <= len(value) <= 256:
        raise RequestError("messages must be a list of 1 to 256 messages")
    for n, message in enumerate(value):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise RequestError(f"messages[{n}] must be {{role, content}}")
        if message["role"] not in ROLES or not isinstance(message["content"], str) or len(message["content"]) > 100_000:
            raise RequestError(f"messages[{n}]: role must be one of {ROLES}, content a string of at most 100000 characters")
    return value


def generation_request(model, request: dict):
    """(messages, SamplerSettings) of a page's generation request {messages, settings}, the
    settings merged over the model's defaults; RequestError if it is not valid."""
    from .semantic.sampler import SamplerError, SamplerSettings
    if not isinstance(request, dict) or set(request) - {"messages", "settings"}:
        raise RequestError("a generation request is {messages, settings}")
    messages = _messages(request.get("messages"))
    settings = request.get("settings") or {}
    if not isinstance(settings, dict) or set(settings) - set(SETTING_KEYS):
        raise RequestError(f"settings may only have {', '.join(SETTING_KEYS)}")
    defaults = model.manifest.generation
    merged = {"temperature": defaults["temperature"], "top_p": defaults["top_p"], "top_k": defaults["top_k"],
              "min_p": defaults["min_p"], "repetition_penalty": defaults["repetition_penalty"],
              "max_tokens": defaults["max_new_tokens"], **settings}
    merged["stop"] = tuple(merged.get("stop", ()))
    try:
        return messages, SamplerSettings(**merged)
    except (SamplerError, TypeError) as exc:
        raise RequestError(f"settings: {exc}") from None


def per_step_ms(stats: dict, before: dict | None = None) -> dict:
    """The GPU executor's decode-step stats (since `before`) as milliseconds per step: prepare
    (params, checks, writes), run (bridge calls: encode, submit, GPU, readback), finish
    (scores from the bytes)."""
    before = before or {}
    steps = stats["decode_steps"] - before.get("decode_steps", 0)
    per = lambda key: round(1000 * (stats[key] - before.get(key, 0.0)) / steps, 3) if steps else None  # noqa: E731
    return {"decode_steps": steps, "prepare_ms": per("prepare_s"), "run_ms": per("run_s"), "finish_ms": per("finish_s")}
