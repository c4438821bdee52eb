"""webslm: quantized small language models in the browser on WebGPU, driven from Python.

The same package runs in CPython (CLI, tests, native GPU through wgpu-native) and inside a
Pyodide Web Worker (the chat page, GPU through navigator.gpu).
"""
__version__ = "0.1.0"


def open_model(source):
    """Validate a .slm file (a path, or its bytes) and return the Model: the validated
    artifact (manifest, identity, tensors) with its tokenizer and chat template.

    Raises webslm.artifact.ArtifactError (with .code, .where, .sentence) on any defect."""
    from .artifact.validate import validate_bytes, validate_file
    from .model import Model
    if isinstance(source, (bytes, bytearray, memoryview)):
        return Model(validate_bytes(source))
    return Model(validate_file(source))


def __getattr__(name):
    """webslm.Sampler, webslm.SamplerSettings, webslm.Ledger (the semantic host's entry points)
    and webslm.Engine, imported on first use so that `import webslm` stays light."""
    if name in ("Sampler", "SamplerSettings"):
        from .semantic import sampler
        return getattr(sampler, name)
    if name == "Ledger":
        from .semantic.ledger import Ledger
        return Ledger
    if name == "Engine":
        from .engine import Engine
        return Engine
    raise AttributeError(f"module 'webslm' has no attribute {name!r}")
