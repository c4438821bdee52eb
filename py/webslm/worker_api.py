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
    adapter = await gpu_smoke.choose_adapter(BrowserGpu(), feature_level)
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


async def admit(loader, feature_level: str, fault: str | None, user_agent: str, on_stage) -> str:
    """GPU admission of the loaded model on this browser's adapter. On success the session is
    kept on the loader (replacing, and destroying, an earlier one) for the GPU engine; the
    reply is JSON: the tier and receipt, or the stage, code and sentence that failed."""
    from .admission.admit import AdmissionFailure, AdmissionPolicy
    from .admission.admit import admit as run_admission
    from .admission.receipt import render_text
    from .admission.tracked import Faults
    from .model import Model
    faults = Faults.named(fault)           # ValueError for an unknown name: a "failed" reply
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
                                      user_agent=user_agent, on_stage=stage_seen)
    except AdmissionFailure as failure:
        return json.dumps({"admitted": False, "stage": failure.stage, "code": failure.code,
                           "sentence": failure.sentence, "leaked_buffers": failure.leaked_buffers,
                           "stages": stages, "seconds": round(time.perf_counter() - started, 3),
                           "receipt": failure.receipt.as_dict(), "receipt_text": render_text(failure.receipt)})
    if getattr(loader, "gpu_session", None) is not None:
        loader.gpu_session.destroy()
    loader.gpu_session = session
    return json.dumps({"admitted": True, "tier": session.tier, "features": list(session.features),
                       "feature_level": session.feature_level, "stages": stages,
                       "self_test_cases": session.self_test["cases"], "plan_hash": session.plan.hash,
                       "gpu_bytes": session.plan.total_gpu_bytes, "stage_seconds": session.seconds,
                       "seconds": round(time.perf_counter() - started, 3),
                       "receipt": session.receipt.as_dict(), "receipt_text": render_text(session.receipt)})


class ModelLoader:
    """Validates a .slm as the worker streams it in; the worker keeps the model it returns.

    feed() takes each fetched chunk (a JS Uint8Array) and copies it into the validator,
    which rejects a bad file as early as its bytes allow: feed() and finish() return None /
    a summary on success and the artifact error as JSON ({"code", "where", "sentence"}) on
    rejection, so the worker can stop the download and the page can explain the error."""

    def __init__(self):
        self._validator = Validator()
        self._seconds = 0.0          # time spent validating (hashing, parsing), not fetching
        self.model = None            # the ValidatedModel, once finish() accepted the file
        self.semantic = None         # webslm.Model over it, made on the first generation
        self.backend = None          # the CPU backend (weights dequantized once), likewise
        self.gpu_session = None      # the admitted GPU session (webslm.admission), if any

    def release(self) -> None:
        """Free the GPU session deterministically (a model switch, or the loader dropped)."""
        if self.gpu_session is not None:
            self.gpu_session.destroy()
            self.gpu_session = None

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

    def start_generation(self, request_json: str):
        """A CPU generation for a page request ({messages, settings}); see Generation."""
        from .model import Model
        if self.semantic is None:
            self.semantic = Model(self.model)
        return Generation(self, self.semantic, json.loads(request_json))

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


def _messages(value) -> list[dict]:
    if not isinstance(value, list) or not 1 <= len(value) <= 256:
        raise RequestError("messages must be a list of 1 to 256 messages")
    for n, message in enumerate(value):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise RequestError(f"messages[{n}] must be {{role, content}}")
        if message["role"] not in ROLES or not isinstance(message["content"], str) or len(message["content"]) > 100_000:
            raise RequestError(f"messages[{n}]: role must be one of {ROLES}, content a string of at most 100000 characters")
    return value


class Generation:
    """One answer on the CPU path, advanced one token per step() so the worker can post each
    delta and notice an abort between tokens. The backend (weights dequantized once) is kept
    on the loader for the next answer."""

    def __init__(self, loader: "ModelLoader", model, request: dict):
        from .cpu import CpuBackend
        from .generate import Timings, generate
        from .semantic.ledger import Ledger
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
            sampler_settings = SamplerSettings(**merged)
        except (SamplerError, TypeError) as exc:
            raise RequestError(f"settings: {exc}") from None
        if loader.backend is None:
            loader.backend = CpuBackend(model.artifact)
        text = model.chat_template.render(messages, add_generation_prompt=True)
        self.prompt_ids = model.tokenizer.encode(text, add_special=False)
        self.timings, self.ledger = Timings(), Ledger()
        self._steps = generate(model, loader.backend, self.prompt_ids, sampler_settings,
                               ledger=self.ledger, timings=self.timings)

    def step(self) -> str:
        """The next delta as JSON: {"text", "finish_reason"} (finish_reason null until the end)."""
        delta = next(self._steps)
        result = {"text": delta.text, "finish_reason": delta.finish_reason}
        if delta.finish_reason:
            t = self.timings
            result["usage"] = {"prompt_tokens": t.prompt_tokens, "completion_tokens": t.generated_tokens}
            result["timings"] = {"prefill_seconds": round(t.prefill_seconds, 4), "decode_seconds": round(t.decode_seconds, 4),
                                 "decode_tokens_per_s": round(t.generated_tokens / max(t.decode_seconds, 1e-9), 3)}
        return json.dumps(result)
