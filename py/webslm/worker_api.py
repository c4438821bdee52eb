"""What the Web Worker (worker/worker.mjs) calls in Python: the one module it imports.

    status()                     the boot check: Python, numpy, webslm and the shader bundle
    ModelLoader(expected_bytes)  a model's bytes validated as they stream in (worker/loader.py)
    engine_host(loader, ...)     the EngineHost of the model a loader accepted; the worker calls
                                 its methods: admit, use_cpu, generate, cancel, engine_status,
                                 conformance, release (worker/engine_host.py)
    prepare_gpu(feature_level)   the GPU's first-use costs paid while the model loads
                                 (admission/warm_up.py)
    merge_tuning_cache(text), tuning_cache_text()
                                 the tuning cache the worker keeps across visits
                                 (worker/engine_host.py, worker/tuning-store.mjs)
    gpu_probe, kernel_golden, sampler_check, tokenizer_check, lose_device, memory_status
                                 requests only tests make (worker/test_hooks.py)

Results are JSON strings, so nothing but plain data crosses back to JS. A Python exception
becomes the request's error reply (worker.mjs: pythonCall; worker/requests.py).
"""
from __future__ import annotations

import json
import platform
import sys

import numpy as np

from . import __version__, shader_bundle
from .cpu import kernels as cpu_kernels
from .worker.engine_host import EngineHost, browser_gpu, merge_tuning_cache, tuning_cache_text
from .worker.loader import ModelLoader
from .worker.test_hooks import gpu_probe, kernel_golden, lose_device, memory_status, sampler_check, tokenizer_check

__all__ = ["EngineHost", "ModelLoader", "engine_host", "gpu_probe", "kernel_golden", "lose_device",
           "memory_status", "merge_tuning_cache", "prepare_gpu", "sampler_check", "status", "tokenizer_check", "tuning_cache_text"]


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
        "cpu_kernel": cpu_kernels.describe(),       # what the CPU path's products run on
    })


async def prepare_gpu(feature_level: str) -> str:
    """The GPU's first-use costs paid now, beside the model's download (admission/warm_up.py):
    its report as JSON. Asked for once per worker, before the first admission, which waits
    for it (worker.mjs)."""
    from .admission.warm_up import warm_up
    return json.dumps(await warm_up(browser_gpu(), feature_level))


def engine_host(loader: ModelLoader, on_event) -> EngineHost:
    """The engine host of the model `loader` accepted (its finish() returned the model).
    on_event is called with each engine event as JSON; the worker posts it to the page."""
    if loader.model is None:
        raise ValueError("the loader has not accepted a model")
    return EngineHost(loader.model, on_event)
