"""Requests only the tests and benchmarks make: they check this browser's Python, GPU and
model against CPython's answers, or break something on purpose. The page never sends them.

    gpu_probe        the foundation's GPU probe (gpu_smoke.py) on this browser's adapter
    kernel_golden    the kernel golden suite (kernels/golden.py), optionally on the model's weights
    sampler_check    the sampler's cross-platform reference vectors
    tokenizer_check  the fixed corpus through the model's tokenizer: digest and throughput
    lose_device      destroy the GPU device mid-answer, as a driver reset would
    memory_status    the admitted GPU devices and buffers still open, Python's live objects

Each takes the EngineHost (engine_host.py) where it needs the loaded model; results are
JSON strings.
"""
from __future__ import annotations

import json
import time

from ..webgpu.adapters import choose_adapter
from .requests import WorkerRequestFailed


async def gpu_probe(feature_level: str, seed: int) -> str:
    from .. import gpu_smoke
    from ..webgpu.browser import BrowserGpu  # needs Pyodide and the worker's bridge module
    return json.dumps(await gpu_smoke.probe(BrowserGpu(), feature_level, seed))


async def kernel_golden(feature_level: str, size: str, host) -> str:
    """The kernel golden suite on this browser's adapter (a fresh device with every optional
    feature it offers, so each tier's variants run), on the loaded model's weights too when
    `host` is given."""
    from ..kernels import golden
    from ..kernels.registry import KERNEL_FEATURES
    from ..webgpu.browser import BrowserGpu
    adapter = await choose_adapter(BrowserGpu(), feature_level)
    if adapter is None:
        return json.dumps({"outcome": "no-webgpu-adapter"})
    features = sorted(KERNEL_FEATURES & adapter.features)
    from ..admission.pipelines import kernel_limits
    device = await adapter.request_device(features=features, limits=kernel_limits(adapter.summary().limits))
    errors = []
    device.on_uncaptured_error(errors.append)
    model = host.semantic_model() if host is not None else None
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


def sampler_check() -> str:
    """The sampler's cross-platform reference vectors (compared with CPython's by the tests)."""
    from ..semantic.sampler_vectors import reference_run
    return json.dumps(reference_run())


def tokenizer_check(host, chars: int) -> str:
    """Encode the fixed corpus with the model's tokenizer: the ids' digest (compared with
    CPython's by the tests) and the throughput (bench/tokenizer.py)."""
    from ..semantic.corpus import corpus, ids_digest, measure
    from ..semantic.tokenizer import Tokenizer
    tokenizer = Tokenizer.from_manifest(host.model.manifest.tokenizer)
    texts = corpus(chars)
    return json.dumps({"digest": ids_digest(tokenizer, texts), "measure": measure(tokenizer, texts)})


def lose_device(host, after_tokens: int) -> str:
    """Destroy the admitted GPU device (as a driver reset would) once the answer in progress
    (or, if none, the next one) has committed `after_tokens` tokens; 0 means before its first
    step. The engine sees the loss at its next step and continues on the CPU path; the
    answer's result says after how many tokens it happened (device_destroyed_after)."""
    engine = host.engine
    if engine is None or engine.backend_kind != "gpu" or host.gpu_backend is None:
        raise WorkerRequestFailed("the engine is not on the GPU: there is no device to lose")
    armed_state = str(engine.state)
    host.between_steps = _DeviceLoss(host, int(after_tokens))
    host.between_steps()                     # an answer in progress may be that far already
    return json.dumps({"armed": True, "after_tokens": int(after_tokens), "state": armed_state})


class _DeviceLoss:
    """The armed lose-device hook: the host calls it between an answer's steps."""

    def __init__(self, host, after_tokens: int):
        self.host, self.after_tokens = host, after_tokens

    def __call__(self) -> None:
        host = self.host
        committed = host.answer_tokens()
        if committed is None or host.gpu_backend is None or committed < self.after_tokens:
            return
        host.between_steps = None            # once
        host.destroyed_after = committed
        host.gpu_backend.device.inner.destroy()     # TrackedDevice.inner: the browser device


def memory_status() -> str:
    """What a long session could leak: admitted GPU devices not destroyed and their buffers
    (admission/tracked.py), and Python's live objects after a collection. (The Wasm heap,
    which only grows, is measured by the worker.)"""
    import gc

    from ..admission.tracked import open_devices
    gc.collect()
    return json.dumps({"gpu": open_devices(), "python_objects": len(gc.get_objects())})
