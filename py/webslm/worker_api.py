"""What the Web Worker calls in Python (worker/worker.mjs). Results are JSON strings, so
nothing but plain data crosses back to JS."""
from __future__ import annotations

import json
import platform
import sys

import numpy as np

from . import __version__, gpu_smoke, shader_bundle


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
