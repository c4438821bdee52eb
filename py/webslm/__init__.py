"""webslm: quantized small language models in the browser on WebGPU, driven from Python.

The same package runs in CPython (CLI, tests, native GPU through wgpu-native) and inside a
Pyodide Web Worker (the chat page, GPU through navigator.gpu).
"""
__version__ = "0.1.0"


def open_model(source):
    """Validate a .slm file (a path, or its bytes) and return the ValidatedModel.

    Raises webslm.artifact.errors.ArtifactError (with .code, .where, .sentence) on any defect."""
    from .artifact.validate import validate_bytes, validate_file
    if isinstance(source, (bytes, bytearray, memoryview)):
        return validate_bytes(source)
    return validate_file(source)
