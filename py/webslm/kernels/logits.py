"""Logits reductions on the GPU (shaders/logits.wgsl): argmax and top-k over f32 logits [V],
so a decode step reads back 12 bytes (argmax) or 8k + 4 bytes (top-k) instead of 4V.

Each reduction is two dispatches of one submit: pass 1 ("partial") lets G workgroups reduce
one chunk of the vocabulary each to its best k entries; pass 2 ("merge") lets one workgroup
reduce the G k partial entries to the best k. The result is exactly the sampler's
canonical top-k (semantic/sampler.py `canonical_top_k`, docs/sampler.md section 7):

    order    value descending, then index ascending (lowest index wins every tie);
             -0.0 == +0.0; +inf ranks first; NaN ranks last, below -inf
    result   u32 words [2k + 1]: indices of ranks 0..k-1, then their logits' bits exactly as
             stored (NaN payloads and -0.0 kept), then the number of NaN logits

A non-zero NaN count means the model produced NaN: the engine must fail visibly (the
sampler refuses NaN and +inf as `bad-logits`; +inf is visible as the top value).

Variants (registry names; the host picks by device):
    logits_argmax_partial / _merge               workgroup tree          tiers A, B
    logits_argmax_partial_subgroups / _merge_subgroups   subgroup ops    tier C
    logits_topk_partial / _merge                 filtered bitonic sort   all tiers
Overrides: WG (64, 128, 256: the largest the device admits) and, for top-k, KMAX (64, 128,
256: the smallest >= k). MAX_K = 256 covers top_k plus a penalty window's distinct tokens
(sampler.needs_full_logits: K - |P| >= top_k).

Host side, in order: choose() the variant, compile_kernels(), plan() (every size check,
before any dispatch), allocate() + dispatches() for the engine's own buffers, and the
one-shot reduce() / argmax() / topk() for tests. Golden tests and the benchmark hook close
the file.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..semantic.sampler import canonical_top_k
from ..webgpu.interface import BufferBinding, BufferUsage, Device, Dispatch
from . import runner
from .golden import GoldenContext, GoldenResult, compare_exact, golden, label
from .registry import KERNELS, CompiledKernel, KernelSpec, compile_kernel, register

WORKGROUP_SIZES = (64, 128, 256)
CAPACITIES = (64, 128, 256)          # KMAX: top-k capacity of one compiled kernel
MAX_K = max(CAPACITIES)
TILE = 1024                          # logits.wgsl: top-k working set (entries)
LOAD = 512                           # logits.wgsl: top-k entries read per step
ARGMAX_GROUPS = 256                  # pass-1 workgroups argmax aims for
POISON = 0xFFFFFFFF


class LogitsShapeError(ValueError):
    """A logits reduction was asked for with sizes the kernels cannot take (found before any
    GPU work): vocab 0 or past 2^32 or past the device's binding size, k outside [1, MAX_K]
    or above the vocabulary or the kernel's capacity, a chunk the kernels cannot split."""


def _specs():
    wg = {"WG": WORKGROUP_SIZES}
    argmax_bindings = ("uniform", "read-only-storage", "storage")
    merge_bindings = ("uniform", "read-only-storage", "read-only-storage", "storage")
    subgroup_sources = ("enable_subgroups.wgsl", "logits.wgsl", "logits_subgroups.wgsl")
    subgroups = frozenset({"subgroups"})
    yield KernelSpec("logits_argmax_partial", ("logits.wgsl",), "argmax_partial", argmax_bindings, wg)
    yield KernelSpec("logits_argmax_merge", ("logits.wgsl",), "argmax_merge", merge_bindings, wg)
    yield KernelSpec("logits_argmax_partial_subgroups", subgroup_sources, "argmax_partial_subgroups",
                     argmax_bindings, wg, subgroups)
    yield KernelSpec("logits_argmax_merge_subgroups", subgroup_sources, "argmax_merge_subgroups",
                     merge_bindings, wg, subgroups)
    topk = {**wg, "KMAX": CAPACITIES}
    yield KernelSpec("logits_topk_partial", ("logits.wgsl",), "topk_partial", argmax_bindings, topk)
    yield KernelSpec("logits_topk_merge", ("logits.wgsl",), "topk_merge", merge_bindings, topk)


register(*_specs())


# -- choosing and compiling -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LogitsChoice:
    """Which pair of kernels, with which overrides (the same for both passes)."""
    op: str                          # "argmax" or "topk"
    partial: str                     # registry names
    merge: str
    overrides: dict

    @property
    def workgroup(self) -> int:
        return self.overrides["WG"]

    @property
    def capacity(self) -> int:
        return self.overrides.get("KMAX", 1)

    def label(self) -> str:
        return f"{label(KERNELS[self.partial], self.overrides)} + {self.merge}"


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def workgroup_storage(op: str, workgroup: int) -> int:
    """Workgroup memory one pass uses, in bytes (argmax: three trees or three atomics)."""
    return 3 * 4 * workgroup if op == "argmax" else 2 * 4 * TILE + 12


def choose(device: Device, op: str, k: int = 1, *, subgroups: bool | None = None,
           workgroup: int | None = None) -> LogitsChoice:
    """The variant for this device: the largest allowlisted workgroup its limits admit (or
    `workgroup`), subgroup argmax when the device has subgroups (or as `subgroups` says), and
    for top-k the smallest capacity >= k."""
    if op not in ("argmax", "topk"):
        raise LogitsShapeError(f"logits reduction must be 'argmax' or 'topk', not {op!r}")
    limits = device.limits
    ceiling = runner.max_invocations(limits)
    if workgroup is None:
        workgroup = runner.largest_workgroup(limits, WORKGROUP_SIZES, ceiling, lambda size: workgroup_storage(op, size))
        if workgroup is None:
            raise LogitsShapeError(f"no logits workgroup size fits {ceiling} invocations")
    elif workgroup not in WORKGROUP_SIZES or workgroup > ceiling:
        raise LogitsShapeError(f"workgroup {workgroup!r} is not one of {WORKGROUP_SIZES} within {ceiling}")
    if workgroup_storage(op, workgroup) > limits["maxComputeWorkgroupStorageSize"]:
        raise LogitsShapeError(f"{op} needs {workgroup_storage(op, workgroup)} bytes of workgroup memory")
    if op == "argmax":
        if subgroups is None:
            subgroups = "subgroups" in device.features
        if subgroups and "subgroups" not in device.features:
            raise LogitsShapeError("subgroup argmax asked for on a device without subgroups")
        suffix = "_subgroups" if subgroups else ""
        return LogitsChoice(op, f"logits_argmax_partial{suffix}", f"logits_argmax_merge{suffix}",
                            {"WG": workgroup})
    _check_k(k, MAX_K)
    capacity = min(c for c in CAPACITIES if c >= k)
    return LogitsChoice(op, "logits_topk_partial", "logits_topk_merge", {"WG": workgroup, "KMAX": capacity})


@dataclasses.dataclass(frozen=True)
class LogitsKernels:
    choice: LogitsChoice
    partial: CompiledKernel
    merge: CompiledKernel


async def compile_kernels(ctx_or_device, choice: LogitsChoice) -> LogitsKernels:
    """Both passes compiled (through the golden context's cache when given one)."""
    if isinstance(ctx_or_device, GoldenContext):
        compile_one = lambda name: ctx_or_device.kernel(name, **choice.overrides)  # noqa: E731
    else:
        compile_one = lambda name: compile_kernel(ctx_or_device, name, **choice.overrides)  # noqa: E731
    return LogitsKernels(choice, await compile_one(choice.partial), await compile_one(choice.merge))


# -- planning: every size check, before any dispatch -----------------------------------------

def _check_k(k, capacity: int) -> None:
    if not _is_int(k):
        raise LogitsShapeError(f"k must be an int, not {type(k).__name__}")
    if not 1 <= k <= capacity:
        raise LogitsShapeError(f"k = {k} is outside [1, {capacity}]")


@dataclasses.dataclass(frozen=True)
class LogitsPlan:
    """The two dispatches' sizes and the buffers' layout (docs/kernels.md "logits").

    Buffers: params (uniform, `params`), logits [vocab] f32 (read), partials [partials_words]
    u32 (scratch, never read back), result [result_words] u32. The engine copies
    `result_bytes` from offset 0 of result to a readback buffer; within it, indices start at
    `index_offset`, value bits at `value_offset`, the NaN count at `nan_count_offset`."""
    op: str
    vocab: int
    k: int
    workgroup: int
    chunk: int                       # logits per pass-1 workgroup
    groups: int                      # pass-1 workgroups
    partial_grid: tuple
    merge_grid: tuple = (1, 1, 1)

    @property
    def params(self) -> np.ndarray:
        return runner.params_words(self.vocab, self.k, self.chunk, self.groups)

    @property
    def logits_bytes(self) -> int:
        return 4 * self.vocab

    @property
    def partials_words(self) -> int:
        return 2 * self.groups * self.k + self.groups

    @property
    def result_words(self) -> int:
        return 2 * self.k + 1

    @property
    def result_bytes(self) -> int:
        return 4 * self.result_words

    index_offset = 0

    @property
    def value_offset(self) -> int:
        return 4 * self.k

    @property
    def nan_count_offset(self) -> int:
        return 8 * self.k

    def decode(self, words: np.ndarray) -> "LogitsResult":
        words = np.asarray(words, np.uint32).reshape(-1)[: self.result_words]
        k = self.k
        return LogitsResult(words[:k].astype(np.int64), words[k:2 * k].copy(), int(words[2 * k]), words.copy())


def default_chunk(op: str, vocab: int, k: int, workgroup: int) -> int:
    """Logits per pass-1 workgroup. Argmax: about ARGMAX_GROUPS workgroups (pass 2 is one
    cheap stride). Top-k: pass 1 streams chunk / LOAD steps and pass 2 streams G k / LOAD,
    so chunk ~ sqrt(V k) balances the two."""
    if op == "argmax":
        return _round_up(-(-vocab // ARGMAX_GROUPS), workgroup)
    return _round_up(math.isqrt(vocab * k) + 1, LOAD)


def _round_up(n: int, unit: int) -> int:
    """The least positive multiple of unit that is >= n."""
    return max(unit, -(-n // unit) * unit)


def plan(device: Device, choice: LogitsChoice, vocab: int, k: int = 1, chunk: int | None = None) -> LogitsPlan:
    """Validate every size the kernels' addressing assumes and lay out both passes."""
    limits = device.limits
    if not _is_int(vocab):
        raise LogitsShapeError(f"vocab must be an int, not {type(vocab).__name__}")
    if vocab < 1:
        raise LogitsShapeError(f"vocab = {vocab}: there is nothing to reduce")
    if vocab >= runner.U32_LIMIT - 1:
        raise LogitsShapeError(f"vocab = {vocab} is past u32 indexing (index 2^32 - 1 means 'no entry')")
    binding = min(limits["maxStorageBufferBindingSize"], limits.get("maxBufferSize", 2 ** 64))
    if 4 * vocab > binding:
        raise LogitsShapeError(f"{4 * vocab} bytes of logits exceed the device's binding size {binding}")
    _check_k(k, choice.capacity)
    if k > vocab:
        raise LogitsShapeError(f"k = {k} exceeds the vocabulary ({vocab})")
    unit = choice.workgroup if choice.op == "argmax" else LOAD
    if chunk is None:
        chunk = default_chunk(choice.op, vocab, k, choice.workgroup)
    elif not _is_int(chunk) or chunk < unit or chunk % unit:
        raise LogitsShapeError(f"chunk {chunk!r} must be a positive multiple of {unit}")
    chunk = min(int(chunk), _round_up(vocab, unit))             # one workgroup covers it all
    if chunk >= 2 ** 31:
        raise LogitsShapeError(f"chunk {chunk} would wrap the kernels' u32 offsets")
    groups = -(-vocab // chunk)
    try:
        grid = runner.workgroup_grid(groups, limits["maxComputeWorkgroupsPerDimension"])
    except ValueError as exc:
        raise LogitsShapeError(str(exc)) from None
    result = LogitsPlan(choice.op, int(vocab), int(k), choice.workgroup, chunk, groups, grid)
    if 4 * result.partials_words > binding:
        raise LogitsShapeError(f"{groups} partial lists of {k} exceed the binding size: use a larger chunk")
    return result


# -- binding for the engine, and the one-shot run --------------------------------------------

@dataclasses.dataclass(frozen=True)
class LogitsResult:
    indices: np.ndarray              # [k] int64, rank order
    value_bits: np.ndarray           # [k] u32, the logits' bits as stored
    nan_count: int
    words: np.ndarray                # the raw result words [2k + 1]

    @property
    def values(self) -> np.ndarray:
        return self.value_bits.view(np.float32)


@dataclasses.dataclass(frozen=True)
class LogitsBuffers:
    params: object
    partials: object
    result: object


def allocate(device: Device, logits_plan: LogitsPlan) -> LogitsBuffers:
    """The reduction's own buffers, params written; the result is COPY_SRC for readback."""
    params = device.create_buffer(16, BufferUsage.UNIFORM | BufferUsage.COPY_DST, "logits params")
    device.write_buffer(params, 0, logits_plan.params)
    partials = device.create_buffer(4 * logits_plan.partials_words, runner.STORAGE,
                                    "logits partials [2 G k + G] u32")
    result = device.create_buffer(logits_plan.result_bytes, runner.STORAGE, "logits result [2 k + 1] u32")
    return LogitsBuffers(params, partials, result)


def dispatches(device: Device, logits_plan: LogitsPlan, kernels: LogitsKernels, buffers: LogitsBuffers,
               logits) -> list[Dispatch]:
    """Both passes, in order, for one submit. `logits` is a buffer or a BufferBinding of
    exactly 4 * vocab bytes (e.g. the LM head's output row)."""
    logits = logits if isinstance(logits, BufferBinding) else BufferBinding(logits, 0, logits_plan.logits_bytes)
    partial = device.create_bind_group(kernels.partial.bind_group_layout, [
        BufferBinding(buffers.params), logits, BufferBinding(buffers.partials)], "logits pass 1")
    merge = device.create_bind_group(kernels.merge.bind_group_layout, [
        BufferBinding(buffers.params), logits, BufferBinding(buffers.partials), BufferBinding(buffers.result)],
        "logits pass 2")
    return [Dispatch(kernels.partial.pipeline, [partial], logits_plan.partial_grid),
            Dispatch(kernels.merge.pipeline, [merge], logits_plan.merge_grid)]


def checked_logits(logits) -> np.ndarray:
    array = np.asarray(logits)
    if array.dtype != np.float32 or array.ndim != 1:
        raise LogitsShapeError(f"logits must be a 1-D float32 array, not {array.dtype} {array.shape}")
    return np.ascontiguousarray(array)


async def reduce(device: Device, kernels: LogitsKernels | None, logits, k: int = 1,
                 chunk: int | None = None) -> LogitsResult:
    """One reduction on fresh buffers, partials and result poisoned with 0xFFFFFFFF (an
    unwritten partial would rank first and show in the result), GPU errors raised."""
    logits = checked_logits(logits)
    if kernels is None:
        kernels = await compile_kernels(device, choose(device, "topk" if k > 1 else "argmax", k))
    logits_plan = plan(device, kernels.choice, logits.size, k, chunk)
    device.push_error_scope("validation")
    made = []
    try:
        buffers = allocate(device, logits_plan)
        made += [buffers.params, buffers.partials, buffers.result]
        device.write_buffer(buffers.partials, 0, runner.poison(logits_plan.partials_words, np.uint32))
        device.write_buffer(buffers.result, 0, runner.poison(logits_plan.result_words, np.uint32))
        source = device.create_buffer(logits.nbytes, runner.STORAGE, "logits [V] f32")
        made.append(source)
        device.write_buffer(source, 0, logits)
        device.submit(dispatches(device, logits_plan, kernels, buffers, source))
        raw = await device.read_buffer(buffers.result, 0, logits_plan.result_bytes)
    finally:
        error = await device.pop_error_scope()
        for buffer in made:
            device.destroy_buffer(buffer)
    if error is not None:
        raise runner.KernelRunError(f"{kernels.choice.label()}: GPU {error.kind} error: {error.message}")
    return logits_plan.decode(np.frombuffer(raw, np.uint32))


async def argmax(device: Device, kernels: LogitsKernels | None, logits) -> tuple[int, np.float32]:
    """(index, value) of the first maximum; NaN only if every logit is NaN (see reduce() for
    the NaN count)."""
    result = await reduce(device, kernels, logits, 1)
    return int(result.indices[0]), result.values[0]


async def topk(device: Device, kernels: LogitsKernels | None, logits, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices [k], values [k] f32) in rank order: canonical_top_k(logits, k) and its logits."""
    result = await reduce(device, kernels, logits, k)
    return result.indices, result.values


# -- the oracle and the golden tests ---------------------------------------------------------

def oracle(logits: np.ndarray, k: int, order: np.ndarray | None = None) -> np.ndarray:
    """The result words [2k + 1] the kernels must produce: the sampler's canonical top-k (its
    sort puts NaN last, in index order: our NaN rule), the logits' bits, the NaN count."""
    if order is None:
        with np.errstate(invalid="ignore"):      # casting a signalling NaN to float64
            order = canonical_top_k(logits, k)
    order = order[:k]
    bits = logits.view(np.uint32)
    return np.concatenate([order.astype(np.uint32), bits[order], [np.uint32(np.isnan(logits).sum())]])


def _from_bits(bits) -> np.ndarray:
    return np.asarray(bits, np.uint32).view(np.float32)


NAN_PATTERNS = (0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFBFFFFF)


def adversarial_cases(rng: np.random.Generator, size: int):
    """(label, logits) pairs for the order's corner cases on one vocabulary size."""
    v = size
    normal = lambda: rng.standard_normal(v).astype(np.float32)  # noqa: E731
    x = normal()
    x[rng.choice(v, min(v, 50), replace=False)] = x.max() + 1
    yield "50 tied maxima", x
    yield "few distinct values (ties everywhere)", rng.integers(-3, 4, v).astype(np.float32)
    yield "all equal", np.full(v, 0.25, np.float32)
    yield "all -inf", np.full(v, -np.inf, np.float32)
    x = normal()
    x[rng.random(v) < 0.5] = -np.inf
    yield "half -inf", x
    x = np.full(v, -np.inf, np.float32)
    x[-1] = -1e30
    yield "-inf except the last", x
    x = normal()
    x[[v - 1, 3 * v // 4, 17, 5]] = [np.inf, np.inf, np.inf, -np.inf]
    yield "+inf at 17, 3v/4, v-1", x
    x = normal()
    x[np.argmax(x)] = np.nan
    x[0] = np.nan
    x.view(np.uint32)[rng.choice(v, 60, replace=False)] = rng.choice(NAN_PATTERNS, 60)
    yield "NaN payloads, at 0 and at the old maximum", x
    yield "all NaN", _from_bits(rng.choice(NAN_PATTERNS, v))
    x = _from_bits(rng.choice(NAN_PATTERNS, v))
    x[rng.random(v) < 0.01] = -np.inf
    yield "NaN and a few -inf", x
    signs = rng.integers(0, 2, v, dtype=np.uint32) << 31
    x = _from_bits(rng.integers(1, 0x800000, v, dtype=np.uint32) | signs)
    x[rng.choice(v, 5, replace=False)] = 0.0
    yield "denormals of both signs and zeros", x
    for first, second in ((-0.0, 0.0), (0.0, -0.0)):
        x = -np.abs(normal()) - np.float32(1)
        x[[5, 9, 20]] = [first, second, first]
        yield f"zeros {first:+} at 5, {second:+} at 9 (all else negative)", x
    x = normal()
    x[0] = x.max() + 1
    yield "maximum at index 0", x
    x = normal()
    x[-1] = x.max() + 1
    yield "maximum at the last index", x
    yield "ascending (every top-k step sorts)", np.arange(v, dtype=np.float32) * np.float32(2.0 ** -20)
    yield "descending", -np.arange(v, dtype=np.float32) * np.float32(2.0 ** -20)
    huge = np.float32(np.finfo(np.float32).max)
    yield "huge magnitudes and infinities", rng.choice(
        np.array([huge, -huge, np.inf, -np.inf, np.nextafter(huge, 0), 1.0], np.float32), v)


def _runs(ctx: GoldenContext) -> tuple[list, list]:
    """(choice, k, chunk) runs. `host`: the host's own choices (chunk None), argmax with and
    without subgroups, top-k at several k. `variants` (full size only): every workgroup size
    with the most pass-1 groups (chunk = the smallest unit: many partial lists, a long
    merge) and a single pass-1 group (chunk past V: one long filtered stream)."""
    device = ctx.device
    subgroups = (False, True) if "logits_argmax_partial_subgroups" in {s.name for s in ctx.variants("logits_")} \
        else (False,)
    host = [(choose(device, "argmax", subgroups=sg), 1, None) for sg in subgroups]
    host += [(choose(device, "topk", k), k, None) for k in ((1, 40, 64) if ctx.quick else (1, 40, 64, 128, 256))]
    host = [run for run in host if ctx.uses(run[0].partial)]
    if ctx.quick:
        return host, []
    ceiling = device.limits["maxComputeInvocationsPerWorkgroup"]
    variants = []
    for workgroup in (w for w in WORKGROUP_SIZES if w <= ceiling):
        variants += [(choose(device, "argmax", subgroups=sg, workgroup=workgroup), 1, workgroup) for sg in subgroups]
        variants.append((choose(device, "topk", 40, workgroup=workgroup), 40, LOAD))
    variants += [(choose(device, "argmax", subgroups=False), 1, 2 ** 20), (choose(device, "topk", 64), 64, 2 ** 20)]
    return host, variants


def _cases(ctx: GoldenContext, host: list, variants: list):
    """(label, logits, runs). Small vocabularies take every run; the large ones (seconds of
    sorting on a 2-core software adapter) take argmax and top-k 40/64, and one long merge."""
    rng = ctx.rng
    small = (1, 7, 1000, 4099)
    for v in small:
        yield f"random normal V={v}", rng.standard_normal(v).astype(np.float32), host + variants
    for name, x in adversarial_cases(rng, 1000 if ctx.quick else 4099):
        yield f"{name} V={x.size}", x, host + variants
    if ctx.quick:
        return
    argmax_runs = [run for run in host if run[0].op == "argmax"]
    k64 = [run for run in host if run[1] == 64]
    for v in (49152, 128256, 1000003):
        x = rng.standard_normal(v).astype(np.float32)
        yield f"random normal V={v}", x, argmax_runs + k64 + ([] if v > 2 ** 17 else
                                                           [run for run in host if run[1] == 40])
    yield ("random normal V=128256", rng.standard_normal(128256).astype(np.float32),
           [(choose(ctx.device, "topk", 40), 40, LOAD)])
    wanted = ("50 tied maxima", "NaN payloads", "zeros -0.0", "maximum at the last", "ascending")
    for name, x in adversarial_cases(rng, 49157):
        if name.startswith(wanted):
            yield f"{name} V={x.size}", x, argmax_runs + k64


@golden("logits", kernels=("logits_",))
async def golden_logits(ctx: GoldenContext) -> list[GoldenResult]:
    host, variants = _runs(ctx)
    results = []
    for case, x, runs in _cases(ctx, host, variants):
        with np.errstate(invalid="ignore"):      # casting a signalling NaN to float64
            order = canonical_top_k(x, MAX_K)
        for choice, k, chunk in runs:
            if k > x.size:
                continue
            kernels = await compile_kernels(ctx, choice)
            got = await reduce(ctx.device, kernels, x, k, chunk)
            note = f" k={k}" + (f" chunk={chunk}" if chunk else "")
            results.append(compare_exact("logits", choice.label() + note, case,
                                         got.words, oracle(x, k, order), POISON))
    return results


# -- benchmark hook ---------------------------------------------------------------------------

BENCH_SHAPES = {
    "smollm2 vocab 49152": {"vocab": 49152},
    "llama3 vocab 128256": {"vocab": 128256},
}
BENCH_KERNELS = {            # name -> (op, k, subgroups)
    "argmax": ("argmax", 1, False),
    "argmax_subgroups": ("argmax", 1, True),
    "topk40": ("topk", 40, None),
    "topk64": ("topk", 64, None),
    "topk256": ("topk", 256, None),
}


@dataclasses.dataclass
class PreparedPasses(runner.Prepared):
    """runner.Prepared for a two-pass reduction: `dispatches` holds both passes, to be
    submitted together, in order; `dispatch` is pass 1 alone (runner.Prepared has room for
    one dispatch only)."""
    dispatches: tuple = ()


async def prepare_bench(device: Device, name: str, shape: dict, rng,
                        overrides: dict[str, int] | None = None) -> PreparedPasses:
    """Random logits of the shape's vocabulary, bound to fresh buffers with the host's
    choice of kernels. bytes_moved = logits read + result written (the partials are a few
    KiB that stay in cache)."""
    op, k, subgroups = BENCH_KERNELS[name]
    choice = choose(device, op, k, subgroups=subgroups)
    if overrides:
        choice = dataclasses.replace(choice, overrides={**choice.overrides, **overrides})
    kernels = await compile_kernels(device, choice)
    logits = rng.standard_normal(shape["vocab"]).astype(np.float32)
    logits_plan = plan(device, choice, logits.size, k)
    buffers = allocate(device, logits_plan)
    source = device.create_buffer(logits.nbytes, runner.STORAGE, "logits [V] f32")
    device.write_buffer(source, 0, logits)
    passes = dispatches(device, logits_plan, kernels, buffers, source)
    return PreparedPasses(
        kernel=kernels.partial, dispatch=passes[0],
        buffers=[buffers.params, buffers.partials, buffers.result, source],
        outputs=[(buffers.result, np.dtype(np.uint32), logits_plan.result_words)],
        bytes_moved=logits_plan.logits_bytes + logits_plan.result_bytes,
        dispatches=tuple(passes))
