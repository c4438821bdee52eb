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


class ModelLoader:
    """Validates a .slm as the worker streams it in; the worker keeps the model it returns.

    feed() takes each fetched chunk (a JS Uint8Array) and copies it into the validator,
    which rejects a bad file as early as its bytes allow: feed() and finish() return None /
    a summary on success and the artifact error as JSON ({"code", "where", "sentence"}) on
    rejection, so the worker can stop the download and the page can explain the error."""

    def __init__(self):
        self._validator = Validator()
        self._seconds = 0.0          # time spent validating (hashing, parsing), not fetching
        self.model = None

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
        "validation_seconds": round(validation_seconds, 3),
    }


def artifact_error(exc: ArtifactError) -> str:
    return json.dumps({"code": exc.code, "where": exc.where, "sentence": exc.sentence})


def sampler_check() -> str:
    """The sampler's cross-platform reference vectors (compared with CPython's by the tests)."""
    from .semantic.sampler_vectors import reference_run
    return json.dumps(reference_run())
