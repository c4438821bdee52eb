"""Weight matrices of the CPU path, kept as the artifact stores them.

A matrix W [N, K] (N outputs, K inputs) is one tensor of the .slm. The CPU path never makes
an f32 copy of a whole one; it needs two things from it:

    W.matmul(x)   x [M, K] f32 -> x . W^T [M, N] f32     every projection and the LM head
    W.rows(ids)   -> W[ids] [len(ids), K] f32           the embedding lookup

QuantizedMatrix (q8; q4 "offset" and "min"): numpy views of the artifact's codes (no copy) and
its scales (and mins) widened once to f32 (exact; 4 bytes a block of 32 or more, so q8 holds
~1.13 bytes a weight and q4 ~0.63-0.75). Products run in qmatmul.c's kernel when a build of
it is loaded (kernels.py), which defines their arithmetic (its header): every output element
is computed by the same f32 operations in the same order whatever M, the thread count or the
platform (CPython's native build and Pyodide's Wasm build agree bit for bit).

StripMatrix (every other encoding, and q8/q4 without a kernel build): decodes strips of rows
with the format's own dequantizer (quant.dequantize, bit-identical to decoding the whole
tensor) and multiplies each strip with numpy; the temporary stays under STRIP_BYTES (f32
tensors: a view, no copy). Its strips are the same for every encoding, so a model computes
exactly the same through it as the same model stored as the f32 values its codes decode to.

Both compute x . W^T with every product accumulated in f32; they differ from each other (and
from decoding the whole matrix first) only in the order of the f32 sums.
"""
from __future__ import annotations

import dataclasses
from functools import partial

import numpy as np

from ..artifact import quant
from .kernels import address, kernels

STRIP_BYTES = 4 << 20          # a decoded strip's f32 size at most (StripMatrix)


class StripMatrix:
    """Any tensor of the format, decoded strip by strip."""

    def __init__(self, encoding: str, shape: tuple[int, int], quant_descriptor: dict | None,
                 arrays: dict[str, np.ndarray]):
        self.encoding, self.shape, self.quant = encoding, shape, quant_descriptor
        self.arrays = arrays                                  # {part: [rows, ...] view of the artifact}
        self.strip = max(1, STRIP_BYTES // (4 * shape[1]))    # rows decoded at once

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def _decode(self, rows) -> np.ndarray:
        """W[rows] as f32; rows a slice or an index array."""
        parts = {part: np.ascontiguousarray(a[rows]) for part, a in self.arrays.items()}
        count = next(iter(parts.values())).shape[0]
        return quant.dequantize(self.encoding, (count, self.shape[1]), self.quant, parts)

    def rows(self, ids) -> np.ndarray:
        return self._decode(np.asarray(ids, np.int64))

    def matmul(self, x: np.ndarray) -> np.ndarray:
        n = self.shape[0]
        out = np.empty((len(x), n), np.float32)
        for a in range(0, n, self.strip):
            w = self._decode(slice(a, a + self.strip))               # [strip, K] (f32: a view)
            out[:, a:a + len(w)] = (w @ x[0])[None] if len(x) == 1 else x @ w.T   # one row: mat-vec
        return out

    def row_slice(self, count: int) -> "StripMatrix":
        """The first `count` rows (a view; CpuBackend.for_timing)."""
        return StripMatrix(self.encoding, (count, self.shape[1]), self.quant,
                           {p: a[:count] for p, a in self.arrays.items()})


class QuantizedMatrix(StripMatrix):
    """q8 or q4: products in qmatmul.c; rows() as StripMatrix."""

    KINDS = ("q8", "q4")

    def __init__(self, encoding, shape, quant_descriptor, arrays, kernel):
        super().__init__(encoding, shape, quant_descriptor, arrays)
        self.kernel = kernel
        self.block = quant_descriptor["block_elements"]
        self.codes = arrays["codes"]                                      # [N, blocks*block(/2)]
        self.scales = np.ascontiguousarray(arrays["scales"], np.float32)  # [N, blocks] exact widening
        mins = arrays.get("mins")
        self.mins = None if mins is None else np.ascontiguousarray(mins, np.float32)
        self.nblocks = self.scales.shape[1]
        self._addresses()

    def _addresses(self) -> None:
        """The data addresses the kernel is called with (fixed: the arrays never move)."""
        self.codes_at, self.scales_at = address(self.codes), address(self.scales)
        self.mins_at = 0 if self.mins is None else address(self.mins)

    def kernel_call(self, j0: int = 0, j1: int | None = None, parts: int = 0):
        """f(x' address, m, block sums' address, y address): columns j0..j1 of y [m, N] =
        x' . (rows j0..j1 of W)^T on this thread, or with `parts` on the native build's pool
        of threads (kernels.Kernels), the kernel's other arguments bound now (Products). y is
        the address of column 0."""
        n = self.shape[0]
        j1 = n if j1 is None else j1
        nblocks, block, rows, skip = self.nblocks, self.block, j1 - j0, 4 * j0
        codes, scales = self.codes_at + j0 * self.codes.strides[0], self.scales_at + j0 * self.scales.strides[0]
        mins = self.mins_at and self.mins_at + j0 * self.scales.strides[0]
        q8, q4 = self.kernel._shared if parts else (self.kernel._q8, self.kernel._q4)
        more = (parts,) if parts else ()
        if self.encoding == "q8":
            return lambda xp, m, sums, y: q8(xp, m, codes, scales, rows, nblocks, block, y + skip, n, *more)
        return lambda xp, m, sums, y: q4(xp, m, codes, scales, mins, sums, rows, nblocks, block, y + skip, n, *more)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes + (0 if self.mins is None else self.mins.nbytes)

    def layout(self) -> tuple:
        """What prepare() depends on: matrices of one layout share a prepared x."""
        return self.nblocks, self.block, self.encoding == "q4", self.mins is not None

    def prepare(self, x: np.ndarray) -> tuple[int, int, int]:
        """x [M, K] -> (M, and the addresses of x' and its block sums) as the kernel reads
        them: x zero-padded to whole blocks, then permuted inside every 32 values to meet
        the codes' groups (qmatmul.c: webslm_prepare)."""
        return (len(x), *self.kernel.prepare(x, *self.layout()))

    def matmul(self, x: np.ndarray, prepared: tuple | None = None) -> np.ndarray:
        m, xp_at, sums_at = self.prepare(x) if prepared is None else prepared
        out = np.empty((m, self.shape[0]), np.float32)
        self.kernel.matmul(self, m, xp_at, sums_at, out)
        return out

    def row_slice(self, count: int) -> "QuantizedMatrix":
        view = QuantizedMatrix.__new__(QuantizedMatrix)
        vars(view).update(vars(self))
        view.shape = (count, self.shape[1])
        view.arrays = {p: a[:count] for p, a in self.arrays.items()}
        view.codes, view.scales = self.codes[:count], self.scales[:count]
        view.mins = None if self.mins is None else self.mins[:count]
        view._addresses()
        return view


def weight_matrix(model, name: str, use_kernel: bool = True) -> StripMatrix:
    """The tensor `name` of a validated model as the CPU path holds it; use_kernel=False
    takes StripMatrix whatever the encoding."""
    info = model.manifest.tensors[name]
    shape = tuple(info.shape) if len(info.shape) == 2 else (1, info.shape[0])
    descriptor = None if info.quant is None else dataclasses.asdict(info.quant)
    arrays = model.tensor_arrays(name)
    kernel = kernels() if use_kernel else None
    if kernel is not None and info.encoding in QuantizedMatrix.KINDS:
        return QuantizedMatrix(info.encoding, shape, descriptor, arrays, kernel)
    return StripMatrix(info.encoding, shape, descriptor, arrays)


class Products:
    """x . W^T for the matrices of a layer that take the same x (q, k, v; gate, up; o; down),
    as the forward pass calls them: ~7 times a layer, ~200 times a decode step, where Python's
    own work per product (preparing x, allocating the result, taking addresses, ctypes'
    argument conversion) was a large part of the step. Here, when every matrix is a
    QuantizedMatrix of one layout (the kernel's case):
      - x is prepared once for all of them;
      - each kernel call's arguments other than x and the row count are worked out once;
      - the results are written into arrays the kernel object keeps per thread under `role`
        (kernels.Kernels.outputs), shared by every layer's Products of that role.
    So a result is valid only until the next call of a Products of the same role in the same
    thread: the forward pass consumes each (copies, adds, writes it to the cache) before then,
    and holds none across its pauses. A group of Kernels.THREAD_MIN_WEIGHTS or more (times
    the rows of x; SHARED_MIN_WEIGHTS with the native pool) is split among threads, each
    taking a consecutive share of every matrix's rows (with the pool: of each matrix in
    turn). An output's arithmetic is the kernel's whatever the split, so the values are those
    of w.matmul(x), bit for bit. Otherwise (StripMatrix), multiply()."""

    def __init__(self, role: str, *matrices: StripMatrix):
        self.role, self.matrices = role, matrices
        layouts = {w.layout() if isinstance(w, QuantizedMatrix) else None for w in matrices}
        self.kernel = matrices[0].kernel if len(layouts) == 1 and None not in layouts else None
        if self.kernel is None:
            return
        self.layout = matrices[0].layout()
        self.widths = [w.shape[0] for w in matrices]
        self.weights = sum(w.shape[0] * w.nblocks * w.block for w in matrices)   # a row of x's worth
        self.calls = [(w.kernel_call(), i) for i, w in enumerate(matrices)]
        # split among threads: each matrix's rows in `threads` consecutive shares, so that
        # every thread gets the same work whatever the sizes (q vs k, v)
        ranges = [self.kernel.shares(n) for n in self.widths]              # [matrix][thread]
        self.split = [[(w.kernel_call(*ranges[i][t]), i) for i, w in enumerate(matrices) if ranges[i][t][1] > ranges[i][t][0]]
                      for t in range(self.kernel.threads)]
        # or, with the native build's pool, each matrix's product shared there
        self.pooled = (None if self.kernel._shared is None or self.kernel.threads < 2 else
                       [(w.kernel_call(parts=self.kernel.threads), i) for i, w in enumerate(matrices)])

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        kernel = self.kernel
        if kernel is None:
            return multiply(x, *self.matrices)
        m = len(x)
        xp_at, sums_at = kernel.prepare(x, *self.layout)
        outs, at = kernel.outputs((self.role, self.layout), m, self.widths)
        threaded = kernel.threaded(m * self.weights)
        if threaded and self.pooled:
            _run_calls(self.pooled, xp_at, m, sums_at, at)
        elif threaded and len(self.split) > 1:
            kernel.run([partial(_run_calls, share, xp_at, m, sums_at, at) for share in self.split])
        else:
            _run_calls(self.calls, xp_at, m, sums_at, at)
        return outs


def _run_calls(calls: list, xp_at: int, m: int, sums_at: int, at: list[int]) -> None:
    """Products.__call__'s kernel calls for one thread: (call, which output) pairs."""
    for call, i in calls:
        call(xp_at, m, sums_at, at[i])


def multiply(x: np.ndarray, *matrices: StripMatrix) -> list[np.ndarray]:
    """x . W^T for several matrices of the same input (q, k, v; gate, up): x is prepared for
    the kernel once per layout."""
    prepared: dict = {}
    out = []
    for w in matrices:
        if isinstance(w, QuantizedMatrix):
            key = w.layout()
            if key not in prepared:
                prepared[key] = w.prepare(x)
            out.append(w.matmul(x, prepared[key]))
        else:
            out.append(w.matmul(x))
    return out
