"""Embedding gather with dequantization (shaders/embed.wgsl): registry entries, host side,
golden tests, bench hook.

    embed_<encoding>   ids [T] u32 -> out [T, D] f32 = token_embd[ids] decoded exactly as
                       artifact/quant.py dequantize does, from the artifact's parts as uploaded:
                       f32, f16, q8, q4 (embed.wgsl), q5, q4k, q5k, q6k (embed_kquant.wgsl,
                       entry points added to embed.wgsl's, three more bindings)

`EmbedTensor` holds token_embd's parts (bytes, as the artifact stores them) with what the
kernel needs to know; `plan_embed` checks every id < vocab and every size before dispatch.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..artifact import format as fmt
from ..artifact.quant import dequantize, encode_f16, encode_f32, quantize_q4, quantize_q8
from ..webgpu.interface import Device
from . import kquant, runner
from .golden import (F32_UNIT_ROUNDOFF, GoldenContext, GoldenResult, compare_bound, compare_exact, golden,
                     label)
from .registry import QUANT_SOURCES, CompiledKernel, KernelSpec, compile_kernel, register

SOURCES = ("common_quant.wgsl", "embed.wgsl", *QUANT_SOURCES["q4"])   # embed.wgsl declares scales and mins
BLOCKS = fmt.BLOCK_ELEMENTS                     # 32, 64, 128, 256
WORKGROUP_SIZES = runner.LAYER_WORKGROUP_SIZES
QUANT_OVERRIDES = {"WG": WORKGROUP_SIZES, "BLOCK": BLOCKS, "SCALE_F16": (0, 1)}
# Bindings: params, out, then the read-only inputs ids, words (data or codes), scales, mins:
# run_once takes inputs (ids, words[, scales[, mins]]) and outputs (out,).
_BASE = ("uniform", "storage", "read-only-storage", "read-only-storage")
# q5 and the super-blocks bind six part slots: codes, scales, mins, high_bits, sub_scales,
# sub_mins (EmbedTensor.binding_parts: a slot an encoding lacks binds another part again).
PACKED_SOURCES = SOURCES + ("embed_kquant.wgsl",)
PACKED_KERNELS = {("q5", "offset"): "embed_q5_offset", ("q5", "min"): "embed_q5_min",
                  ("q4k", "scaled-min"): "embed_q4k", ("q5k", "scaled-min"): "embed_q5k", ("q6k", "offset"): "embed_q6k"}
register(
    *(KernelSpec(name, PACKED_SOURCES, name, _BASE + ("read-only-storage",) * 5, QUANT_OVERRIDES)
      for name in PACKED_KERNELS.values()),
    KernelSpec("embed_f32", SOURCES, "embed_f32", _BASE, {"WG": WORKGROUP_SIZES}),
    KernelSpec("embed_f16", SOURCES, "embed_f16", _BASE, {"WG": WORKGROUP_SIZES}),
    KernelSpec("embed_q8", SOURCES, "embed_q8", _BASE + ("read-only-storage",), QUANT_OVERRIDES),
    KernelSpec("embed_q4_offset", SOURCES, "embed_q4_offset", _BASE + ("read-only-storage",), QUANT_OVERRIDES),
    KernelSpec("embed_q4_min", SOURCES, "embed_q4_min", _BASE + ("read-only-storage",) * 2, QUANT_OVERRIDES),
)
VALUES_PER_WORD = {"f32": 1, "f16": 2, "q8": 4, "q4": 8, "q5": 8, "q4k": 8, "q5k": 8, "q6k": 8}


# -- host side ------------------------------------------------------------------------------

class EmbedTensor(NamedTuple):
    """token_embd as the GPU takes it: its parts' bytes unchanged, and the facts to decode them."""
    encoding: str                 # "f32" | "f16" | "q8" | "q4" | "q5" | "q4k" | "q5k" | "q6k"
    vocab: int
    dim: int
    block: int | None             # quantized: block_elements
    scale_type: str | None        # quantized: "f16" | "f32"
    zero: str                     # "none" | "offset" | "min" | "scaled-min"
    parts: dict[str, np.ndarray]  # part name -> uint8 bytes ("data" or "codes", "scales", ...)

    @property
    def kernel(self) -> str:
        if (self.encoding, self.zero) in PACKED_KERNELS:
            return PACKED_KERNELS[(self.encoding, self.zero)]
        return {"f32": "embed_f32", "f16": "embed_f16", "q8": "embed_q8"}.get(
            self.encoding, f"embed_q4_{self.zero}")

    @property
    def part_order(self) -> tuple[str, ...]:
        return fmt.PARTS[(self.encoding, self.zero)]

    @property
    def binding_parts(self) -> tuple[str, ...]:
        """The parts bound after ids, in binding order: the file order for f32..q4; for q5 and
        the super-blocks six slots (codes, scales, mins, high_bits, sub_scales, sub_mins), a
        part the encoding lacks replaced by one it has (never read: embed_kquant.wgsl)."""
        if (self.encoding, self.zero) not in PACKED_KERNELS:
            return self.part_order
        have = set(self.part_order)
        slots = [("codes",), ("scales",), ("mins", "scales"), ("high_bits", "codes"),
                 ("sub_scales", "scales"), ("sub_mins", "sub_scales", "scales")]
        return tuple(next(name for name in slot if name in have) for slot in slots)

    @property
    def quant(self) -> dict | None:
        """The fields quant.dequantize reads (the oracle's view of the descriptor)."""
        if self.block is None:
            return None
        out = {"block_elements": self.block, "scale_type": self.scale_type, "zero": self.zero}
        if self.encoding in fmt.SUB_SCALE_TYPES:
            out |= {"sub_scale_type": fmt.SUB_SCALE_TYPES[self.encoding], "min_type": "f16"}
        return out

    def dequantize(self) -> np.ndarray:
        return dequantize(self.encoding, (self.vocab, self.dim), self.quant, self.parts)


def embed_tensor(encoding: str, shape: tuple[int, int], quant: dict | None, parts: dict) -> EmbedTensor:
    """An EmbedTensor from a tensor's descriptor and parts (bytes-like), lengths checked."""
    vocab, dim = shape
    block = quant["block_elements"] if quant else None
    scale_type = quant["scale_type"] if quant else None
    zero = quant["zero"] if quant else "none"
    if (encoding, zero) not in fmt.PARTS:
        raise ValueError(f"no embedding kernel for encoding {encoding!r} with zero {zero!r}")
    scale_bytes = 2 if scale_type == "f16" else 4
    want = fmt.part_lengths(encoding, zero, vocab, dim, block, scale_bytes)
    arrays = {}
    for part, length in want.items():
        if part not in parts or len(parts[part]) != length:
            got = len(parts[part]) if part in parts else None
            raise ValueError(f"token_embd part {part!r} has {got} bytes, expected {length}")
        arrays[part] = np.frombuffer(parts[part], np.uint8)
    return EmbedTensor(encoding, vocab, dim, block, scale_type, zero, arrays)


def model_embedding(model) -> EmbedTensor:
    """token_embd of a webslm.Model (or ValidatedModel), its parts viewed without a copy."""
    info = model.manifest.tensors["token_embd"]
    quant = None if info.quant is None else {"block_elements": info.quant.block_elements,
                                             "scale_type": info.quant.scale_type, "zero": info.quant.zero}
    return embed_tensor(info.encoding, info.shape, quant, model.tensor_parts("token_embd"))


class EmbedPlan(NamedTuple):
    kernel: str
    overrides: dict[str, int]
    params: np.ndarray             # tokens, dim, vocab, row_words, blocks, groups_per_token
    grid: tuple[int, int, int]


def check_ids(ids: np.ndarray, vocab: int) -> np.ndarray:
    """ids as u32 [T]; ValueError naming the first position whose id is not < vocab."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size < 1 or ids.dtype.kind not in "iu":
        raise ValueError(f"token ids must be a non-empty 1-D integer array, got {ids.dtype} {ids.shape}")
    bad = np.flatnonzero((ids < 0) | (ids >= vocab))
    if bad.size:
        raise ValueError(f"token id {int(ids[bad[0]])} at position {int(bad[0])} is not < vocab {vocab}")
    return ids.astype(np.uint32)


def plan_embed(limits: dict[str, int], ids: np.ndarray, tensor: EmbedTensor,
               workgroup: int | None = None) -> EmbedPlan:
    """Validate a gather of `ids` from `tensor` and build its launch."""
    ids = check_ids(ids, tensor.vocab)
    tokens = ids.size
    row_bytes = fmt.row_stride(tensor.encoding, tensor.dim, tensor.block)
    row_words = row_bytes // 4
    blocks = fmt.blocks_per_row(tensor.dim, tensor.block) if tensor.block else 0
    for part in tensor.part_order:
        runner.check_binding_size(limits, f"token_embd {part}", tensor.parts[part].size)
    runner.check_binding_size(limits, f"embeddings out [{tokens}, {tensor.dim}] f32", tokens * tensor.dim * 4)
    wg = runner.layer_workgroup(limits, workgroup, tensor.dim)      # one invocation per output column
    groups_per_token = -(-tensor.dim // wg)
    grid = runner.workgroup_grid(tokens * groups_per_token, limits["maxComputeWorkgroupsPerDimension"])
    overrides = {"WG": wg}
    if tensor.block:
        overrides.update(BLOCK=tensor.block, SCALE_F16=int(tensor.scale_type == "f16"))
    params = runner.params_words(tokens, tensor.dim, tensor.vocab, row_words, blocks, groups_per_token)
    return EmbedPlan(tensor.kernel, overrides, params, grid)


async def embed(device: Device, ids: np.ndarray, tensor: EmbedTensor,
                kernel: CompiledKernel | None = None) -> np.ndarray:
    """out [T, D] f32 for ids [T] on fresh buffers."""
    ids = check_ids(ids, tensor.vocab)
    plan = plan_embed(device.limits, ids, tensor, kernel.overrides.get("WG") if kernel else None)
    if kernel is None:
        kernel = await compile_kernel(device, plan.kernel, **plan.overrides)
    elif kernel.spec.name != plan.kernel or any(kernel.overrides.get(k) != v for k, v in plan.overrides.items()):
        raise ValueError(f"{kernel.spec.name}{kernel.overrides} cannot decode this tensor: "
                         f"it needs {plan.kernel}{plan.overrides}")
    inputs = [ids] + [tensor.parts[p] for p in tensor.binding_parts]
    out, = await runner.run_once(device, kernel, plan.params, inputs,
                                 [(ids.size * tensor.dim, np.float32)], plan.grid)
    return out.reshape(ids.size, tensor.dim)


# -- the oracle and its rule ----------------------------------------------------------------------

U = F32_UNIT_ROUNDOFF
NAN_BITS = int(np.array(np.nan, np.float32).view(np.uint32))      # run_once's poison
FMA_RULE = ("q4/q5 min, f32 scales: |err| <= 2u (|scale code| + |value|) (the product may be fused "
            "with + min); value = quant.dequantize")


def q4_products(tensor: EmbedTensor, ids: np.ndarray) -> np.ndarray:
    """|scale * code| per element of the gathered rows (float64), for the FMA allowance (q4, q5)."""
    from ..artifact.quant import SCALE_DTYPES, unpack_codes
    blocks = fmt.blocks_per_row(tensor.dim, tensor.block)
    codes = unpack_codes(tensor.encoding, tensor.parts, tensor.vocab, blocks * tensor.block)[ids].astype(np.float64)
    scales = np.frombuffer(tensor.parts["scales"], SCALE_DTYPES[tensor.scale_type]).reshape(tensor.vocab, blocks)
    scales = np.repeat(scales[ids].astype(np.float64), tensor.block, axis=1)
    return np.abs(scales * codes)[:, :tensor.dim]


def check_embed(kernel: str, case: str, tensor: EmbedTensor, ids: np.ndarray, got: np.ndarray) -> GoldenResult:
    """Bit-exact against quant.dequantize, except q4/q5 "min" with f32 scales (see FMA_RULE).
    q4k/q5k/q6k are bit-exact too: their products are exact in f32 (embed_kquant.wgsl)."""
    want = tensor.dequantize()[np.asarray(ids)]
    if tensor.zero == "min" and tensor.scale_type == "f32":
        bound = 2 * U * (q4_products(tensor, ids) + np.abs(want.astype(np.float64)))
        return compare_bound("embed", kernel, case, got, want, bound, FMA_RULE)
    got_bits = np.ascontiguousarray(got, np.float32).view(np.uint32)
    return compare_exact("embed", kernel, case, got_bits, want.view(np.uint32), poison_value=NAN_BITS)


# -- golden cases ---------------------------------------------------------------------------------

def _rows(rng: np.random.Generator, vocab: int, dim: int, big: float, small: float) -> np.ndarray:
    """[vocab, dim] weights with adversarial rows 1-6 (constant, zero, huge, tiny, alternating,
    a spike in the last column) and normal rows elsewhere."""
    w = rng.standard_normal((vocab, dim))
    w[1] = 3.5
    w[2] = 0.0
    w[3] = big * np.sign(rng.standard_normal(dim))
    w[4] *= small
    w[5] = np.where(np.arange(dim) % 2 == 0, 1.0, -1.0) * np.linspace(0.1, 9, dim)
    w[6] = 1e-3 * w[6]
    w[6, -1] = 50.0
    return w.astype(np.float32)


def make_tensor(rng: np.random.Generator, encoding: str, vocab: int, dim: int, block: int | None = None,
                zero: str = "none", scale_type: str | None = None) -> EmbedTensor:
    """A random token_embd in one encoding, encoded by artifact/quant.py; row 7 holds the
    extreme codes (q8 -128/127, q4 0/15), which the quantizers alone never produce."""
    f16 = scale_type == "f16" or encoding == "f16"
    # f16 scales: the largest row must keep q4 "min" mins (-big) and scales finite in f16.
    w = _rows(rng, vocab, dim, big=3e4 if f16 else 1e30, small=1e-6 if f16 else 1e-30)
    if encoding == "f32":
        w[7, :3] = [1e-40, -3.4e38, -0.0][:dim]                     # a subnormal, the range's edge
        parts = encode_f32(w)
    elif encoding == "f16":
        w[7, :3] = [1e-7, -65504, -0.0][:dim]                       # an f16 subnormal, f16's edge
        parts = encode_f16(w)
    elif encoding == "q8":
        parts = quantize_q8(w, block, scale_type)
    else:
        parts = quantize_q4(w, block, zero, scale_type)
    parts = {k: np.frombuffer(v, np.uint8).copy() for k, v in parts.items()}
    if encoding in ("q8", "q4"):
        codes = parts["codes"].reshape(vocab, -1)
        stride = fmt.row_stride(encoding, dim, block)
        real = np.arange(stride) < (dim if encoding == "q8" else dim // 2)
        extreme = np.where(np.arange(stride) % 2 == 0, 0x80, 0x7F) if encoding == "q8" else \
            np.full(stride, 0xF0)                                   # nibbles 0 (low), 15 (high)
        codes[7] = np.where(real, extreme, codes[7])                # tail padding stays code 0
    quant = {"block_elements": block, "scale_type": scale_type, "zero": zero} if block else None
    return embed_tensor(encoding, (vocab, dim), quant, parts)


def embed_cases(rng: np.random.Generator, quick_only: bool) -> list[tuple[str, EmbedTensor]]:
    """One tensor per (encoding, block, scale type); dims leave tails of 1..3 values."""
    cases = []
    specs = [("f32", None, "none", None, 67), ("f16", None, "none", None, 67), ("f16", None, "none", None, 1)]
    for block in BLOCKS:
        for scale in ("f16", "f32"):
            dim = 2 * block + 3 if block < 256 else block + 1
            specs += [("q8", block, "none", scale, dim), ("q4", block, "offset", scale, dim),
                      ("q4", block, "min", scale, dim)]
    specs += [("q8", 32, "none", "f16", 5), ("q4", 32, "min", "f16", 1)]
    if quick_only:
        specs = [s for s in specs if s[1] in (None, 32) and s[3] in (None, "f16")]
    for encoding, block, zero, scale, dim in specs:
        tensor = make_tensor(rng, encoding, 37, dim, block, zero, scale)
        what = encoding if block is None else f"{encoding} {zero} b{block} {scale} scales"
        cases.append((f"{what} 37x{dim}", tensor))
    return cases + packed_cases(rng, quick_only)


def packed_cases(rng: np.random.Generator, quick_only: bool) -> list[tuple[str, EmbedTensor]]:
    """q5 and the super-blocks (kquant.random_weights): every form, random and extreme codes
    (rows of all-max and all-min codes; sub-scales at 0/63, int8 -128/127) with ordinary and
    extreme f16 scales (+-65504, +-2^-24, zeros)."""
    forms = [("q5", 32, "offset", "f16", 96), ("q5", 64, "min", "f32", 128), ("q5", 256, "min", "f16", 256),
             ("q4k", 256, "scaled-min", "f16", 512), ("q5k", 256, "scaled-min", "f16", 256),
             ("q6k", 256, "offset", "f16", 512)]
    cases = []
    for encoding, block, zero, scale_type, dim in forms:
        for codes, scales in [("mixed", "extreme")] if quick_only else [("random", "normal"), ("max", "extreme"),
                                                                           ("mixed", "extreme")]:
            w = kquant.random_weights(rng, encoding, 37, dim, block, zero, scale_type, codes, scales)
            tensor = embed_tensor(encoding, (37, dim), w.descriptor(), w.parts)
            cases.append((f"{encoding} {zero} b{block} {scale_type} scales, {codes} codes, {scales} scales 37x{dim}",
                          tensor))
    return cases


def _ids(rng: np.random.Generator, vocab: int) -> np.ndarray:
    """0, vocab - 1, every adversarial row, a repeat, and random ids."""
    return np.concatenate([[0, vocab - 1, 1, 2, 3, 4, 5, 6, 7, 7], rng.integers(0, vocab, 5)]).astype(np.uint32)


@golden("embed", kernels=("embed_",))
async def golden_embed(ctx: GoldenContext) -> list[GoldenResult]:
    results = []
    limits = ctx.device.limits
    runnable = {spec.name for spec in ctx.variants("embed_")}
    for case, tensor in embed_cases(ctx.rng, ctx.quick):
        if tensor.kernel not in runnable:
            continue
        ids = _ids(ctx.rng, tensor.vocab)
        plan = plan_embed(limits, ids, tensor)
        sizes = [plan.overrides["WG"]]
        if not ctx.quick and tensor.block in (None, 32) and tensor.scale_type in (None, "f16"):
            sizes = ctx.workgroups()
        for overrides in (o for wg in sizes for o in ctx.launches(plan.kernel, {**plan.overrides, "WG": wg})):
            kernel = await ctx.kernel(plan.kernel, **overrides)
            got = await embed(ctx.device, ids, tensor, kernel)
            results.append(check_embed(label(kernel.spec, kernel.overrides), case, tensor, ids, got))
    tensor = make_tensor(ctx.rng, "q8", 37, 70, 32, "none", "f16")
    ids = np.array([5, 36], np.uint32)
    plan = plan_embed(limits, ids, tensor)
    for overrides in ctx.launches(plan.kernel, plan.overrides):
        results.append(await _guard_case(ctx, overrides, tensor, ids))
    if ctx.model is not None:
        tensor = model_embedding(ctx.model)
        ids = np.concatenate([[0, tensor.vocab - 1, tensor.vocab // 2],
                              ctx.rng.integers(0, tensor.vocab, 5)]).astype(np.uint32)
        got = await embed(ctx.device, ids, tensor)
        what = tensor.encoding if tensor.block is None else f"{tensor.encoding} b{tensor.block}"
        results.append(check_embed(tensor.kernel, f"model token_embd ({what}) {tensor.vocab}x{tensor.dim}",
                                   tensor, ids, got))
    return results


async def _guard_case(ctx: GoldenContext, overrides: dict, tensor, ids: np.ndarray) -> GoldenResult:
    """The kernel's own guard: ids 5 and 37 of a 37-row table, the second past the end (as if
    it got past the host): its row must come out zero."""
    plan = plan_embed(ctx.device.limits, ids, tensor, overrides["WG"])
    kernel = await ctx.kernel(plan.kernel, **plan.overrides)
    got, = await runner.run_once(ctx.device, kernel, plan.params,
                                 [np.array([5, 37], np.uint32), *(tensor.parts[p] for p in tensor.part_order)],
                                 [(2 * 70, np.float32)], plan.grid)
    want = np.stack([tensor.dequantize()[5], np.zeros(70, np.float32)])
    return compare_exact("embed", label(kernel.spec, kernel.overrides), "id = vocab in the kernel: zeros",
                         got.view(np.uint32), want.view(np.uint32), poison_value=NAN_BITS)


# -- benchmark hook -----------------------------------------------------------------------------

# (prepare_bench also takes the q5/super-block kernels, embed_q6k, ..., on shapes whose dim is a
# multiple of 256: not SmolLM2's 576, so they are not in the default list)
BENCH_KERNELS = ("embed_f32", "embed_f16", "embed_q8", "embed_q4_offset", "embed_q4_min")
BENCH_SHAPES: dict[str, dict] = runner.bench_shapes(
    {model: {"vocab": vocab, "dim": dim, "block": 32, "scale_type": "f16"}
     for model, vocab, dim in (("smollm2-135m", 49152, 576), ("llama-3.2-1b", 128256, 2048),
                               ("llama-3-8b", 128256, 4096))})


def _random_parts(rng: np.random.Generator, encoding: str, zero: str, shape: dict) -> dict[str, np.ndarray]:
    """Random bytes of the right lengths (any byte pattern decodes; scales kept finite f16/f32)."""
    vocab, dim, block = shape["vocab"], shape["dim"], shape.get("block")
    scale_bytes = 2 if shape.get("scale_type", "f16") == "f16" else 4
    lengths = fmt.part_lengths(encoding, zero, vocab, dim, block if encoding in ("q8", "q4") else None, scale_bytes)
    parts = {}
    for part, length in lengths.items():
        if part in ("scales", "mins") or encoding in ("f16", "f32"):
            dtype = np.float16 if (scale_bytes == 2 and part != "data") or encoding == "f16" else np.float32
            values = (0.01 * rng.standard_normal(length // np.dtype(dtype).itemsize)).astype(dtype)
            parts[part] = values.view(np.uint8)
        else:
            parts[part] = rng.integers(0, 256, length, dtype=np.uint8)
    return parts


async def prepare_bench(device: Device, name: str, shape: dict, rng: np.random.Generator) -> runner.Prepared:
    packed = {kernel: form for form, kernel in PACKED_KERNELS.items()}
    if name in packed:      # q5 and the super-blocks: parts made by kquant.py
        encoding, zero = packed[name]
        w = kquant.random_weights(rng, encoding, shape["vocab"], shape["dim"], zero=zero)
        tensor = embed_tensor(encoding, (shape["vocab"], shape["dim"]), w.descriptor(), w.parts)
    else:
        encoding = {"embed_f32": "f32", "embed_f16": "f16", "embed_q8": "q8"}.get(name, "q4")
        zero = name.removeprefix("embed_q4_") if encoding == "q4" else "none"
        block = shape["block"] if encoding in ("q8", "q4") else None
        scale_type = shape["scale_type"] if block else None
        quant = {"block_elements": block, "scale_type": scale_type, "zero": zero} if block else None
        tensor = embed_tensor(encoding, (shape["vocab"], shape["dim"]), quant,
                              _random_parts(rng, encoding, zero, shape))
    ids = rng.integers(0, shape["vocab"], shape["tokens"]).astype(np.uint32)
    plan = plan_embed(device.limits, ids, tensor)
    kernel = await compile_kernel(device, plan.kernel, **plan.overrides)
    inputs = [ids] + [tensor.parts[p] for p in tensor.binding_parts]
    prepared = runner.prepare(device, kernel, plan.params, inputs, [(ids.size * tensor.dim, np.float32)], plan.grid)
    row_bytes = sum(tensor.parts[p].size for p in tensor.part_order) // tensor.vocab
    prepared.bytes_moved = ids.size * (4 + row_bytes + 4 * tensor.dim)
    prepared.flops = ids.size * tensor.dim * (0 if encoding in ("f32", "f16") else 1 if zero != "min" else 2)
    return prepared
