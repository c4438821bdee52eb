"""Finding a build of qmatmul.c (the quantized matrix products) for this process.

    native (CPython): build/libwebslm_qmatmul.so next to this file, loaded with ctypes
                      (tools/build_kernels.py makes it; WEBSLM_QMATMUL_LIB names another file)
    Pyodide:          the worker instantiates build/webslm_qmatmul.wasm on Pyodide's own memory
                      and registers its exports as the JS module "webslm_qmatmul" before it
                      imports webslm (worker/qmatmul.mjs)
    neither:          None; qmatrix.py then decodes strips of rows with numpy instead

WEBSLM_QMATMUL=off (native) turns the kernel off, for comparisons; WEBSLM_CPU_POOL=off keeps
it but shares products among Python threads instead of the build's own pool
(qmatmul_pool.c). The build in use is
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
import threading
from functools import partial

import numpy as np

LIBRARY = pathlib.Path(__file__).with_name("build") / "libwebslm_qmatmul.so"


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class _Helper:
    """A thread that runs one job at a time for the thread that hands it over. Handing over
    and waiting go through two locks: ~10 us of CPU natively (the kernel call releases the
    GIL, so both threads then compute), where a ThreadPoolExecutor future costs several
    times that, too much for the ~120 products of a decode step that are worth splitting."""

    def __init__(self):
        self._go, self._done = threading.Lock(), threading.Lock()
        self._go.acquire()
        self._done.acquire()
        self._job, self._error = None, None
        threading.Thread(target=self._loop, name="webslm-qmatmul", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            try:
                self._job()
            except BaseException as error:  # noqa: BLE001 -- re-raised in the waiting thread
                self._error = error
            self._done.release()

    def start(self, job) -> None:
        self._job = job
        self._go.release()

    def wait(self) -> None:
        self._done.acquire()
        self._job, error, self._error = None, self._error, None
        if error is not None:
            raise error


class Kernels:
    """qmatmul.c's entry points as the CPU path calls them, and how rows of W are shared
    among threads (natively; the Pyodide worker has one). Its scratch arrays (x' and block
    sums, and the outputs of qmatrix.Products) are allocated once per layout and thread and
    reused, so that a product costs Python no more than it must: asking numpy for an array's
    address costs ~2 us natively and several under Pyodide, and a decode step makes ~200
    products. They are per thread so that backends in two threads never share one."""

    def __init__(self, q8, q4, prepare, name: str, threads: int = 1, shared=None):
        self._q8, self._q4, self._prepare = q8, q4, prepare
        self.name, self.threads = name, threads
        # (q8, q4): the native build's products shared among its own pool of threads
        # (qmatmul_pool.c), taking one more argument, the number of parts; None: the
        # helpers below share them instead
        self._shared = shared
        self._local = threading.local()   # .scratch: layout -> (rows, x', address, sums, address)
        #                                   .outputs: key -> (rows, [arrays], [addresses])
        self._helpers: list[_Helper] = []   # threads - 1 of them, started on first use
        self._helpers_pid = None            # ... in this process (a forked child starts its own)
        self._busy = threading.Lock()       # held while one caller's work is on the helpers

    def _store(self, name: str) -> dict:
        store = getattr(self._local, name, None)
        if store is None:
            store = {}
            setattr(self._local, name, store)
        return store

    # Below this many products (rows of x times weights) a call runs on one thread. A hand-
    # off (_Helper) costs ~10 us of CPU, but on this shared 2-core machine (load 5-10) the
    # helper is often not scheduled at once: splitting every layer product of 2^18+ weights
    # decoded slower in both wall and CPU seconds than one thread (bench notes in
    # docs/RESULTS.md), so a decode step splits only gate|up (1.8M) and the head (28M), and
    # a prompt's chunks split everything.
    THREAD_MIN_WEIGHTS = 1 << 20
    # The same with the native build's pool (qmatmul_pool.c), which hands a part over in
    # under a microsecond: every layer product of SmolLM2 in decode (331,776 weights and up)
    # is split (measured: bench/cpu_threads.py, docs/RESULTS.md).
    SHARED_MIN_WEIGHTS = 1 << 18

    def run(self, jobs: list) -> None:
        """Run jobs (callables, at most `threads` of them) at once: the first on this thread,
        the others on helper threads; all are done on return. Another thread's call that
        finds the helpers busy runs its jobs one after the other instead (backends in two
        threads share this object)."""
        if len(jobs) == 1 or not self._busy.acquire(blocking=False):
            for job in jobs:
                job()
            return
        try:
            if self._helpers_pid != os.getpid():
                self._helpers = [_Helper() for _ in range(self.threads - 1)]
                self._helpers_pid = os.getpid()
            started = []
            try:
                for helper, job in zip(self._helpers, jobs[1:]):
                    helper.start(job)
                    started.append(helper)
                jobs[0]()
            finally:
                for helper in started:
                    helper.wait()
        finally:
            self._busy.release()

    def shares(self, n: int) -> list[tuple[int, int]]:
        """Rows 0..n of W as `threads` consecutive ranges (some empty when n < threads)."""
        edges = [n * t // self.threads for t in range(self.threads + 1)]
        return list(zip(edges, edges[1:]))

    def prepare(self, x: np.ndarray, nblocks: int, block: int, q4: bool, sums: bool) -> tuple[int, int]:
        """x [m, k] -> the addresses of x' [m, nblocks*block] and (sums: q4 "min") its block
        sums [m, nblocks] (0 without), in this thread's scratch arrays for this layout: valid
        until the next prepare of the same layout in this thread."""
        x = np.ascontiguousarray(x, np.float32)          # x itself when it already is
        m, k = x.shape
        key = (nblocks, block, q4, sums)
        scratch = self._store("scratch")
        held = scratch.get(key)
        if held is None or held[0] < m:
            xp, xs = np.empty(m * nblocks * block, np.float32), np.empty(m * nblocks, np.float32)
            held = scratch[key] = (m, xp, address(xp), xs, address(xs) if sums else 0)
        self._prepare(address(x), m, k, k, nblocks, block, int(q4), held[2], held[4])
        return held[2], held[4]

    def outputs(self, key, m: int, widths: list[int]) -> tuple[list[np.ndarray], list[int]]:
        """Arrays [m, n] f32 for each n in widths, and their addresses, kept under `key` in
        this thread and handed out again on the next call with that key and those widths
        (qmatrix.Products). The kernel object is shared by every model in the process, so two
        models' products of one role meet here: other widths get new arrays."""
        store = self._store("outputs")
        held = store.get(key)
        if held is None or held[0] < m or held[3] != tuple(widths):
            arrays = [np.empty((m, n), np.float32) for n in widths]
            held = store[key] = (m, arrays, [address(a) for a in arrays], tuple(widths))
        return ([a if len(a) == m else a[:m] for a in held[1]]), held[2]

    def matmul(self, w, m: int, xp_at: int, sums_at: int, y: np.ndarray) -> None:
        """y [m, n] = x' . W^T for a QuantizedMatrix w (the addresses of its codes, scales and
        mins are taken once, when it is made) and x' from prepare()."""
        n, ya = w.shape[0], address(y)
        if not self.threaded(m * n * w.nblocks * w.block):
            self._rows(w, m, xp_at, sums_at, ya, 0, n)          # the common case: no closure
        elif self._shared is not None:
            self._rows(w, m, xp_at, sums_at, ya, 0, n, self.threads)
        else:
            self.run([partial(self._rows, w, m, xp_at, sums_at, ya, a, b) for a, b in self.shares(n) if b > a])

    def threaded(self, weights: int) -> bool:
        """Whether a product of this many weights (rows of x times weights) is split."""
        least = self.THREAD_MIN_WEIGHTS if self._shared is None else self.SHARED_MIN_WEIGHTS
        return self.threads > 1 and weights >= least

    def _rows(self, w, m: int, xp_at: int, sums_at: int, ya: int, j0: int, j1: int, parts: int = 0) -> None:
        """Rows j0..j1 of W (columns j0..j1 of y); `parts` > 0: on the native pool, in that
        many parts."""
        n, cb, sb = w.shape[0], w.codes.strides[0], w.scales.strides[0]
        q8, q4, more = (self._q8, self._q4, ()) if not parts else (*self._shared, (parts,))
        if w.encoding == "q8":
            q8(xp_at, m, w.codes_at + j0 * cb, w.scales_at + j0 * sb, j1 - j0, w.nblocks, w.block, ya + 4 * j0, n,
               *more)
        else:
            q4(xp_at, m, w.codes_at + j0 * cb, w.scales_at + j0 * sb, w.mins_at and w.mins_at + j0 * sb,
               sums_at, j1 - j0, w.nblocks, w.block, ya + 4 * j0, n, *more)


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
    lib.webslm_prepare.argtypes = [p, i, i, i, i, i, i, p, p]
    for f in (lib.webslm_q8_matmul, lib.webslm_q4_matmul, lib.webslm_prepare):
        f.restype = None
    shared = None
    if hasattr(lib, "webslm_q4_matmul_shared") and os.environ.get("WEBSLM_CPU_POOL", "").lower() != "off":
        lib.webslm_q8_matmul_shared.argtypes = [*lib.webslm_q8_matmul.argtypes, i]
        lib.webslm_q4_matmul_shared.argtypes = [*lib.webslm_q4_matmul.argtypes, i]
        lib.webslm_q8_matmul_shared.restype = lib.webslm_q4_matmul_shared.restype = None
        shared = (lib.webslm_q8_matmul_shared, lib.webslm_q4_matmul_shared)
    threads = max(1, int(os.environ.get("WEBSLM_CPU_THREADS", min(os.cpu_count() or 1, 4))))
    name = f"native {path.name}"
    if shared and threads > 1:
        name += f" (pool; {_one_blas_thread()})"
    return Kernels(lib.webslm_q8_matmul, lib.webslm_q4_matmul, lib.webslm_prepare, name, threads, shared)


def _one_blas_thread() -> str:
    """numpy's OpenBLAS held to one thread (process-wide), what it says. Its threads spin
    for a while after each call, also after the small matrix products of a decode step's
    attention, on the cores the pool's helpers need; the CPU path's big products are the
    pool's (docs/RESULTS.md, "Both cores"). Through threadpoolctl (the `cpu` extra) when
    installed."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return "numpy's BLAS threads as they were: threadpoolctl is not installed"
    ThreadpoolController().select(internal_api="openblas").limit(limits=1)
    return "numpy's OpenBLAS on one thread"


def _pyodide() -> Kernels | None:
    try:
        import webslm_qmatmul        # registered by the worker when the .wasm loaded
    except ImportError:
        return None
    return Kernels(webslm_qmatmul.webslm_q8_matmul, webslm_qmatmul.webslm_q4_matmul,
                   webslm_qmatmul.webslm_prepare, "wasm simd128 webslm_qmatmul.wasm")


_loaded: list = []


def kernels() -> Kernels | None:
    """The build for this process (found once), or None."""
    if not _loaded:
        _loaded.append(_pyodide() if sys.platform == "emscripten" else _native())
    return _loaded[0]


def describe() -> str:
    k = kernels()
    return "numpy (no qmatmul build)" if k is None else f"{k.name}, {k.threads} thread(s)"
