"""ModelLoader: validates a .slm as the worker streams its bytes in.

The worker feeds each chunk it reads (from the network, a picked file or Cache Storage) as
it arrives, so a bad file is rejected as early as its bytes allow and the download can stop
there. Nothing is loaded until finish() accepts the whole file; then the worker makes an
EngineHost (engine_host.py) for `loader.model` and lets the loader go.

Replies are JSON strings: an artifact error is {"code", "where", "sentence"}, the validator's
own words, for the page to explain.
"""
from __future__ import annotations

import json
import time

from ..artifact import ArtifactError, Validator


class ModelLoader:
    def __init__(self, expected_bytes: int | None = None):
        """expected_bytes: the file's real size where the worker knows it (a picked file, a
        cached one, this site's own download), else None (validate.Validator)."""
        self._validator = Validator(expected_bytes=expected_bytes)
        self._seconds = 0.0          # time spent validating (hashing, parsing), not fetching
        self.model = None            # the ValidatedModel, once finish() accepted the file

    def feed(self, chunk) -> str | None:
        """Validate the next chunk (a JS Uint8Array, copied in): None, or the artifact error
        as JSON once the bytes so far cannot be a valid file."""
        started = time.perf_counter()
        try:
            self._validator.feed(chunk.to_memoryview())
        except ArtifactError as exc:
            return artifact_error(exc)
        finally:
            self._seconds += time.perf_counter() - started
        return None

    def finish(self) -> str:
        """The end of the file: {"model": summary} once the whole file is valid (self.model is
        set then), else {"error": artifact error}."""
        started = time.perf_counter()
        try:
            self.model = self._validator.finish()
        except ArtifactError as exc:
            return json.dumps({"error": json.loads(artifact_error(exc))})
        self._seconds += time.perf_counter() - started
        return json.dumps({"model": model_summary(self.model, self._seconds)})


def model_summary(model, validation_seconds: float) -> dict:
    """What the page shows of a validated model (and the worker checks its sha256 against)."""
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
