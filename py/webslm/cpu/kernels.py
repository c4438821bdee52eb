"""Finding a build of qmatmul.c (the quantized matrix products) for this process.

    native (CPython): build/libwebslm_qmatmul.so next to this file, loaded with ctypes
                      (tools/build_kernels.py makes it; WEBSLM_QMATMUL_LIB names another file)
    Pyodide:          the worker instantiates build/webslm_qmatmul.wasm on Pyodide's own memory
                      and registers its exports as the JS module "webslm_qmatmul" before it
                      imports webslm (worker/qmatmul.mjs)
    neither:          None; qmatrix.py then decodes strips of rows with numpy instead

WEBSLM_QMATMUL=off (native) turns the kernel off, for comparisons. The build in use is
reported by describe() (the worker's status, bench/cpu.py).

Every entry point takes addresses: numpy arrays' data pointers, which under Pyodide are
offsets in the Wasm heap the .wasm module shares. The callers (qmatrix.py) pass C-contiguous
arrays of the right dtypes and shapes; nothing here checks them again.
"""
from __future__ import annotations

import ctypes
import os
import pathlib
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

LIBRARY = pathlib.Path(__file__).with_name("build") / "libwebslm_qmatmul.so"


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class Kernels:
    """The three entry points of qmatmul.c, called on numpy arrays, and how rows of W are
    shared among threads (natively; the Pyodide worker has one)."""

    def __init__(self, q8, q4, block_sums, name: str, threads: int = 1):
        self._q8, self._q4, self._block_sums = q8, q4, block_sums
        self.name, self.threads = name, threads
        self._pool = ThreadPoolExecutor(threads) if threads > 1 else None

    # Below this many weights a product runs on one thread: handing work to a thread costs
    # ~30-50 us in CPython, more than a small product.
    THREAD_MIN_WEIGHTS = 1 << 20

    def _split(self, call, n: int, k: int) -> None:
        """call(j0, j1) over the rows of W, split among the threads when the matrix is large."""
        if self._pool is None or n * k < self.THREAD_MIN_WEIGHTS:
            call(0, n)
            return
        edges = [n * t // self.threads for t in range(self.threads + 1)]
        for f in [self._pool.submit(call, a, b) for a, b in zip(edges, edges[1:]) if b > a]:
            f.result()

    def q8_matmul(self, x, codes, scales, y, block: int) -> None:
        """y [m, n] = x [m, nblocks*block] . codes [n, nblocks*block] int8 with scales [n, nblocks]."""
        m, n, nblocks = x.shape[0], codes.shape[0], scales.shape[1]
        cb, sb = codes.strides[0], scales.strides[0]

        def call(j0, j1):
            self._q8(address(x), m, address(codes) + j0 * cb, address(scales) + j0 * sb,
                     j1 - j0, nblocks, block, address(y) + 4 * j0, n)
        self._split(call, n, x.shape[1])

    def q4_matmul(self, x, codes, scales, mins, xsums, y, block: int) -> None:
        """y [m, n] = x (de-interleaved) . q4 codes [n, nblocks*block/2]; mins None: "offset"."""
        m, n, nblocks = x.shape[0], codes.shape[0], scales.shape[1]
        cb, sb = codes.strides[0], scales.strides[0]

        def call(j0, j1):
            self._q4(address(x), m, address(codes) + j0 * cb, address(scales) + j0 * sb,
                     0 if mins is None else address(mins) + j0 * sb, 0 if xsums is None else address(xsums),
                     j1 - j0, nblocks, block, address(y) + 4 * j0, n)
        self._split(call, n, x.shape[1])

    def block_sums(self, x, block: int) -> np.ndarray:
        """[m, nblocks] sums of each block of x [m, nblocks*block], in the kernel's order."""
        out = np.empty((x.shape[0], x.shape[1] // block), np.float32)
        self._block_sums(address(x), x.shape[0], out.shape[1], block, address(out))
        return out


def _native() -> Kernels | None:
    if os.environ.get("WEBSLM_QMATMUL", "").lower() == "off":
        return None
    path = pathlib.Path(os.environ.get("WEBSLM_QMATMUL_LIB", LIBRARY))
    if not path.is_file():
        return None
    lib = ctypes.CDLL(str(path))
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.webslm_q8_matmul.argtypes = [p, i, p, p, i, i, i, p, i]
    lib.webslm_q4_matmul.argtypes = [p, i, p, p, p, p, i, i, i, p, i]
    lib.webslm_block_sums.argtypes = [p, i, i, i, p]
    for f in (lib.webslm_q8_matmul, lib.webslm_q4_matmul, lib.webslm_block_sums):
        f.restype = None
    threads = int(os.environ.get("WEBSLM_CPU_THREADS", min(os.cpu_count() or 1, 4)))
    return Kernels(lib.webslm_q8_matmul, lib.webslm_q4_matmul, lib.webslm_block_sums,
                   f"native {path.name}", max(1, threads))


def _pyodide() -> Kernels | None:
    try:
        import webslm_qmatmul        # registered by the worker when the .wasm loaded
    except ImportError:
        return None
    return Kernels(webslm_qmatmul.webslm_q8_matmul, webslm_qmatmul.webslm_q4_matmul,
                   webslm_qmatmul.webslm_block_sums, "wasm simd128 webslm_qmatmul.wasm")


_loaded: list = []


def kernels() -> Kernels | None:
    """The build for this process (found once), or None."""
    if not _loaded:
        _loaded.append(_pyodide() if sys.platform == "emscripten" else _native())
    return _loaded[0]


def describe() -> str:
    k = kernels()
    return "numpy (no qmatmul build)" if k is None else f"{k.name}, {k.threads} thread(s)"
