"""webslm: quantized small language models in the browser on WebGPU, driven from Python.

The same package runs in CPython (CLI, tests, native GPU through wgpu-native) and inside a
Pyodide Web Worker (the chat page, GPU through navigator.gpu).
"""
__version__ = "0.1.0"
