"""The CPU path's quantized products (py/webslm/cpu/qmatmul.c through qmatrix.py) against
the format's own decoding, and its arithmetic against the statement in qmatmul.c's header.

Two oracles:
  reference   float64 x . dequantize(W)^T (artifact.quant: the format's decoding); the kernel
              must be within an f32 rounding bound of it, relative to sum |x| |terms|
  emulation   the header's order of f32 operations replayed in numpy, with the lane layout
              derived here from the header's description (not from qmatrix.prepare); the
              kernel must equal it bit for bit
on random data, adversarial codes and scales, odd tails, every block size, and the default
model's real weights. Needs the native build (tools/build_kernels.py; ./dev does it).
"""
from __future__ import annotations

import pathlib
import tracemalloc

import numpy as np
import pytest

from webslm.artifact import quant
from webslm.artifact.format import blocks_per_row
from webslm.artifact.validate import validate_bytes
from webslm.cpu import CpuBackend, kernels
from webslm.cpu.qmatrix import Products, QuantizedMatrix, StripMatrix, weight_matrix

KERNEL = kernels.kernels()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="no native qmatmul build: run tools/build_kernels.py")
DEFAULT_MODEL = pathlib.Path(__file__).resolve().parents[1] / ".assets/site/models/smollm2-135m-instruct-q4.slm"
EPS = float(np.finfo(np.float32).eps)


# -- building matrices --------------------------------------------------------------------

def arrays_of(encoding: str, rows: int, parts: dict, scale_type: str) -> dict:
    """{part: [rows, ...] array} as ValidatedModel.tensor_arrays lays them out."""
    scale = np.dtype("<f2" if scale_type == "f16" else "<f4")
    dtypes = {"codes": np.int8 if encoding == "q8" else np.uint8, "scales": scale, "mins": scale}
    return {p: np.frombuffer(b, dtypes[p]).reshape(rows, -1) for p, b in parts.items()}


def matrix(encoding, zero, w, block, scale_type="f16", parts=None, kernel=KERNEL) -> QuantizedMatrix:
    rows, cols = w.shape
    if parts is None:
        parts = (quant.quantize_q8(w, block, scale_type) if encoding == "q8"
                 else quant.quantize_q4(w, block, zero, scale_type))
    descriptor = {"block_elements": block, "scale_type": scale_type, "zero": zero}
    return QuantizedMatrix(encoding, (rows, cols), descriptor, arrays_of(encoding, rows, parts, scale_type), kernel)


def natural_codes(m: QuantizedMatrix) -> np.ndarray:
    """[N, nblocks*block] the integer each code stands for in the header (q8: code; q4 offset:
    code - 8; q4 min: code), in element order."""
    if m.encoding == "q8":
        return m.codes.astype(np.int32)
    codes = quant.unpack_nibbles(m.codes).astype(np.int32)
    return codes - 8 if m.mins is None else codes


def reference(m: QuantizedMatrix, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 x . dequantize(W)^T, and the scale of its terms: |x| . (|scale * c| + |min|)^T."""
    parts = {p: a.tobytes() for p, a in m.arrays.items()}
    w = quant.dequantize(m.encoding, m.shape, m.quant, parts).astype(np.float64)
    k = m.shape[1]
    c = np.abs(natural_codes(m)[:, :k].astype(np.float64))
    scales = np.repeat(np.abs(m.scales.astype(np.float64)), m.block, axis=1)[:, :k]
    size = scales * c
    if m.mins is not None:
        size += np.repeat(np.abs(m.mins.astype(np.float64)), m.block, axis=1)[:, :k]
    xd = x.astype(np.float64)
    return xd @ w.T, np.abs(xd) @ size.T


def within_bound(m, x, got):
    """|got - reference| <= (sequential f32 steps) * eps * the terms' scale, per element."""
    want, size = reference(m, x)
    steps = m.nblocks + m.block // 32 + 16
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= steps * EPS * size + 1e-30).all(), f"worst {np.max(err / np.maximum(size, 1e-30)):.3g} of the terms"
    return float(np.max(err / np.maximum(size, 1e-30)))


# -- the header's arithmetic, replayed -------------------------------------------------------

def lane_order(encoding: str) -> np.ndarray:
    """perm[4k + l] = the element (within 32) in lane l of group k: q4 nibble k of 32-bit lane
    l is element 8l + k; q8 byte k of lane l of the h-th 16 bytes is element 16h + 4l + k."""
    if encoding == "q4":
        return np.array([8 * lane + k for k in range(8) for lane in range(4)])
    return np.array([16 * h + 4 * lane + k for h in range(2) for k in range(4) for lane in range(4)])


def emulate(m: QuantizedMatrix, x: np.ndarray) -> np.ndarray:
    f = np.float32
    rows, k = x.shape
    n, nb, block = m.shape[0], m.nblocks, m.block
    chunks = block // 32
    padded = np.zeros((rows, nb * block), f)
    padded[:, :k] = x
    perm = lane_order(m.encoding)
    xg = padded.reshape(rows, nb, chunks, 32)[..., perm].reshape(rows, 1, nb, chunks, 8, 4)
    cg = natural_codes(m).reshape(n, nb, chunks, 32)[..., perm].reshape(1, n, nb, chunks, 8, 4).astype(f)
    g = xg * cg                                                         # [M, N, nb, chunks, 8, 4]
    p = ((g[..., 0, :] + g[..., 1, :]) + (g[..., 2, :] + g[..., 3, :])) + \
        ((g[..., 4, :] + g[..., 5, :]) + (g[..., 6, :] + g[..., 7, :]))   # [M, N, nb, chunks, 4]
    d = p[..., 0, :]
    for c in range(1, chunks):
        d = d + p[..., c, :]
    a = np.zeros((rows, n, 4), f)
    for b in range(nb):
        a = a + m.scales[None, :, b, None] * d[:, :, b]
    y = (a[..., 0] + a[..., 2]) + (a[..., 1] + a[..., 3])
    if m.mins is not None:
        xs = ((xg[..., 0, :] + xg[..., 1, :]) + (xg[..., 2, :] + xg[..., 3, :])) + \
             ((xg[..., 4, :] + xg[..., 5, :]) + (xg[..., 6, :] + xg[..., 7, :]))
        s = xs[..., 0, :]
        for c in range(1, chunks):
            s = s + xs[..., c, :]
        xsum = (s[..., 0] + s[..., 2]) + (s[..., 1] + s[..., 3])         # [M, 1, nb]
        t = np.zeros((rows, n), f)
        for b in range(nb):
            t = t + m.mins[None, :, b] * xsum[:, :, b]
        y = y + t
    return y


KINDS = [("q8", None, "f16"), ("q8", None, "f32"), ("q4", "offset", "f16"), ("q4", "min", "f16"), ("q4", "min", "f32")]


@pytest.mark.parametrize("encoding,zero,scale_type", KINDS)
@pytest.mark.parametrize("block,cols", [(32, 64), (32, 77), (64, 200), (128, 130), (256, 600)])
def test_random_matrices_match_both_oracles(encoding, zero, scale_type, block, cols):
    rng = np.random.default_rng(block * 1000 + cols)
    w = (rng.standard_normal((37, cols)) * rng.uniform(0.01, 3, (37, 1))).astype(np.float32)
    m = matrix(encoding, zero, w, block, scale_type)
    for rows in (1, 3, 4, 9):
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        got = m.matmul(x)
        assert got.dtype == np.float32 and got.shape == (rows, 37)
        within_bound(m, x, got)
        assert np.array_equal(got, emulate(m, x)), "the kernel's arithmetic is not the header's"
        # an output does not depend on the other rows of the call
        assert np.array_equal(np.concatenate([m.matmul(x[i:i + 1]) for i in range(rows)]), got)


@pytest.mark.parametrize("encoding,zero", [("q8", None), ("q4", "offset"), ("q4", "min")])
def test_extreme_codes_and_scales(encoding, zero):
    """Every code at its extremes (q8 -128 and 127, q4 0 and 15), scales from f16's largest
    normal to its smallest subnormal, mins of both signs, x over many magnitudes, a tail."""
    rng = np.random.default_rng(7)
    rows, cols, block = 12, 100, 32
    nb = blocks_per_row(cols, block)
    if encoding == "q8":
        codes = rng.choice(np.array([-128, 127, -127, 0], np.int8), (rows, nb * block))
    else:
        codes = quant.pack_nibbles(rng.choice(np.array([0, 15, 8, 7]), (rows, nb * block)))
    real = np.arange(nb * block) < cols
    if encoding == "q8":
        codes = np.where(real, codes, 0).astype(np.int8)
    else:
        codes = quant.pack_nibbles(np.where(real, quant.unpack_nibbles(codes), 0))
    scales = rng.choice(np.array([65504, 2 ** -24, 1.0, 3e-3, -0.5], np.float16), (rows, nb))
    parts = {"codes": codes.tobytes(), "scales": scales.tobytes()}
    if zero == "min":
        parts["mins"] = rng.choice(np.array([-65504, 65504, 2 ** -24, -1.5], np.float16), (rows, nb)).tobytes()
    m = matrix(encoding, zero, np.zeros((rows, cols), np.float32), block, "f16", parts)
    x = (rng.standard_normal((5, cols)) * 10.0 ** rng.integers(-6, 4, (5, cols))).astype(np.float32)
    got = m.matmul(x)
    assert np.isfinite(got).all()
    within_bound(m, x, got)
    assert np.array_equal(got, emulate(m, x))


# Rows shared among threads two ways: Python helper threads (kernels.Kernels.run), or the
# native build's own pool (qmatmul_pool.c), which every CPython CPU path with 2+ threads uses.
SHARING = [pytest.param(False, id="python-helpers"),
           pytest.param(True, id="pool", marks=pytest.mark.skipif(
               KERNEL is None or KERNEL._shared is None, reason="the native build has no pool (qmatmul_pool.c)"))]


def two_threads(threshold: int = 0, pool: bool = False, threads: int = 2) -> kernels.Kernels:
    k = kernels.Kernels(KERNEL._q8, KERNEL._q4, KERNEL._prepare, f"{threads} threads", threads=threads,
                        shared=KERNEL._shared if pool else None)
    k.THREAD_MIN_WEIGHTS = k.SHARED_MIN_WEIGHTS = threshold
    return k


@pytest.mark.parametrize("pool", SHARING)
def test_threads_split_rows_without_changing_a_bit(pool):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((301, 256)).astype(np.float32)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    one = kernels.Kernels(KERNEL._q8, KERNEL._q4, KERNEL._prepare, "1 thread", threads=1)
    two = two_threads(0, pool)
    for encoding, zero in (("q8", None), ("q4", "min"), ("q4", "offset")):
        a, b = matrix(encoding, zero, w, 32, kernel=one), matrix(encoding, zero, w, 32, kernel=two)
        assert np.array_equal(a.matmul(x), b.matmul(x))


@pytest.mark.skipif(KERNEL is None or KERNEL._shared is None, reason="the native build has no pool")
@pytest.mark.parametrize("encoding,zero", [("q8", None), ("q4", "min"), ("q4", "offset")])
def test_the_pool_gives_the_same_bits_in_any_number_of_parts(encoding, zero):
    """qmatmul_pool.c cuts W's rows into `parts` ranges, one a thread (helpers started as a
    call needs them, up to 7): every part count, with fewer rows than parts, 1, 2 and 5 rows
    of x (pairs and a lone row of x), an odd row count of W (a lone row of W in a part), gives
    the single-thread kernel's bits."""
    rng = np.random.default_rng(8)
    for n in (1, 3, 7, 64, 301):
        w = rng.standard_normal((n, 160)).astype(np.float32)
        one = matrix(encoding, zero, w, 32, kernel=KERNEL)
        for m in (1, 2, 5):
            x = rng.standard_normal((m, 160)).astype(np.float32)
            want = one.matmul(x)
            assert np.array_equal(want, emulate(one, x))
            for parts in (2, 3, 4, 8, 9):
                got = matrix(encoding, zero, w, 32, kernel=two_threads(0, True, parts)).matmul(x)
                assert np.array_equal(got, want), (n, m, parts)


@pytest.mark.skipif(KERNEL is None or KERNEL._shared is None, reason="the native build has no pool")
def test_a_forked_child_starts_its_own_pool():
    """The pool's helper threads do not survive a fork: a child that shares a product after
    its parent did starts its own helpers (the pid check) instead of waiting forever for
    threads that are not there."""
    import os
    import select
    rng = np.random.default_rng(9)
    w = rng.standard_normal((301, 96)).astype(np.float32)
    x = rng.standard_normal((1, 96)).astype(np.float32)
    pooled = matrix("q4", "min", w, 32, kernel=two_threads(0, True))
    want = pooled.matmul(x)                       # the parent's helpers are running now
    read, write = os.pipe()
    child = os.fork()
    if child == 0:                                # the child: one product, its bytes to the pipe
        try:
            os.write(write, pooled.matmul(x).tobytes())
        finally:
            os._exit(0)
    os.close(write)
    came = select.select([read], [], [], 60)[0]
    try:
        assert came, "the child's product did not come within 60 s"
        got = np.frombuffer(os.read(read, want.nbytes), np.float32).reshape(want.shape)
    finally:
        os.close(read)
        if not came:
            os.kill(child, 9)
        os.waitpid(child, 0)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("pool", SHARING)
@pytest.mark.parametrize("encoding,zero", [("q8", None), ("q4", "min"), ("q4", "offset")])
@pytest.mark.parametrize("rows", [1, 5])
def test_products_split_or_not_equal_each_matrix_alone(encoding, zero, rows, pool):
    """A layer's Products (x prepared once, outputs kept, rows split among threads, a matrix
    of one row among them) give each matrix's own matmul, bit for bit."""
    rng = np.random.default_rng(5)
    shapes = [(301, 96), (64, 96), (1, 96)]
    ws = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    x = rng.standard_normal((rows, 96)).astype(np.float32)
    alone = [matrix(encoding, zero, w, 32, kernel=KERNEL).matmul(x) for w in ws]
    for kernel in (KERNEL, two_threads(0, pool), two_threads(1 << 40, pool)):
        products = Products(f"test-{encoding}-{zero}", *[matrix(encoding, zero, w, 32, kernel=kernel) for w in ws])
        for _ in range(2):                         # the second call reuses the outputs
            got = products(x)
            assert all(np.array_equal(a, b) for a, b in zip(got, alone))


def test_products_of_one_role_for_two_models_keep_their_own_widths():
    """The kernel object is shared by every model in the process, and outputs are kept per
    role: a second model whose "down" has other widths must get its own arrays (the full
    suite once ran a tiny Gemma 3 after a model with another width: its FFN came out 48 wide
    instead of 64)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    first = Products("down", matrix("q8", None, rng.standard_normal((48, 64)).astype(np.float32), 32, kernel=KERNEL))
    second = Products("down", matrix("q8", None, rng.standard_normal((64, 64)).astype(np.float32), 32, kernel=KERNEL))
    for _ in range(2):
        (a,) = first(x)
        a = a.copy()                 # valid until the next call of this role: keep it
        (b,) = second(x)
        assert a.shape == (2, 48) and b.shape == (2, 64)
        assert np.array_equal(a, first.matrices[0].matmul(x)) and np.array_equal(b, second.matrices[0].matmul(x))


@pytest.mark.parametrize("pool", SHARING)
def test_products_from_two_threads_at_once(pool):
    """Backends in two threads share the kernel object: one caller's work on the helper
    never mixes with the other's (the pool: a caller that finds it busy computes alone), and
    each thread keeps its own outputs."""
    import threading
    rng = np.random.default_rng(6)
    kernel = two_threads(0, pool)
    ws = [rng.standard_normal((200, 64)).astype(np.float32) for _ in range(2)]
    products = Products("shared", *[matrix("q4", "min", w, 32, kernel=kernel) for w in ws])
    xs = [rng.standard_normal((3, 64)).astype(np.float32) for _ in range(2)]
    want = [[m.matmul(x) for m in products.matrices] for x in xs]
    failures = []

    def work(i):
        for _ in range(200):
            got = products(xs[i])
            if not all(np.array_equal(a, b) for a, b in zip(got, want[i])):
                failures.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_a_failing_job_on_the_helper_is_raised_to_the_caller():
    kernel = two_threads(0)
    ran = []

    def fail():
        raise ValueError("in the helper")
    with pytest.raises(ValueError, match="in the helper"):
        kernel.run([lambda: ran.append(0), fail])
    kernel.run([lambda: ran.append(1), lambda: ran.append(2)])        # still usable
    assert sorted(ran) == [0, 1, 2]


# -- the default model's real weights -------------------------------------------------------

@pytest.fixture(scope="module")
def default_model():
    if not DEFAULT_MODEL.is_file():
        pytest.skip("the default model is not set up (tools/assets.py)")
    return validate_bytes(bytearray(DEFAULT_MODEL.read_bytes()))


def test_real_weights(default_model):
    rng = np.random.default_rng(11)
    names = [f"blk.{i}.{n}" for i in (0, 29) for n in
             ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")] + ["token_embd"]
    for name in names:
        m = weight_matrix(default_model, name)
        assert isinstance(m, QuantizedMatrix), name
        x = rng.standard_normal((3, m.shape[1])).astype(np.float32)
        if name == "token_embd":
            m = m.row_slice(2048)
        got = m.matmul(x)
        worst = within_bound(m, x, got)
        assert worst < 1e-5, name
        some = m.row_slice(48)
        assert np.array_equal(some.matmul(x), emulate(some, x)), name
        assert np.array_equal(got[:, :48], some.matmul(x)), name


def test_the_cpu_path_holds_under_2_bytes_a_weight(default_model):
    a = default_model.architecture
    backend = CpuBackend(default_model)
    weights = sum(int(np.prod(t.shape)) for t in default_model.manifest.tensors.values())
    kv = backend._k.nbytes + backend._v.nbytes
    held = backend.memory_bytes() - kv
    print(f"held {held / 2 ** 20:.1f} MiB for {weights / 1e6:.1f}M weights: {held / weights:.3f} bytes a weight")
    assert held <= 2 * weights
    # a decode step's temporaries: no f32 matrix is made (the largest is [V] logits)
    backend.prefill([1, 2, 3])
    tracemalloc.start()
    backend.decode_one(4)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"decode step peak {peak / 2 ** 20:.2f} MiB")
    assert peak < 8 * a.vocab * 4


def test_kernel_and_numpy_strips_agree_on_the_real_model(default_model):
    """The two ways of computing (the kernel; decoding strips for numpy) differ only in f32
    summation order: the same greedy tokens, logits within 1e-3 (they are O(10))."""
    ids = [1, 504, 3458, 282, 4649, 314, 253, 1017, 28]        # any ids in the vocabulary
    fast, strips = CpuBackend(default_model), CpuBackend(default_model, use_kernel=False)
    assert isinstance(fast.layers[0].q, QuantizedMatrix) and type(strips.layers[0].q) is StripMatrix
    a, b = fast.prefill(ids), strips.prefill(ids)
    assert np.abs(a - b).max() < 1e-3
    for _ in range(3):
        token = int(a.argmax())
        assert token == int(b.argmax())
        a, b = fast.decode_one(token), strips.decode_one(token)
        assert np.abs(a - b).max() < 1e-3
