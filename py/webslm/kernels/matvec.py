"""Decode mat-vec: y[m] = W x[m] for M = 1 (and a few rows) with W in any .slm encoding:
q4, q8, f16, f32, and q5, q4k, q5k, q6k (GGUF's Q5_0/Q5_1 and K-quants).

Decode is memory-bound: every weight byte is read once per token and used for one
multiply-add, so the kernels are built to stream weights at full width (16-byte loads,
adjacent invocations on adjacent bytes) and dequantize in registers next to the FMA.
The WGSL is assembled from trusted bundle files only (registry "sources"):

    common_quant.wgsl                 exact q4/q8/f16 decoding helpers
    matvec_main.wgsl                  the entry point and work split (shared)
    matvec_reduce_workgroup.wgsl      row sums in workgroup memory     (tiers A, B)
    matvec_reduce_subgroup.wgsl       row sums with subgroupAdd        (tier C: "subgroups")
    matvec_<encoding>.wgsl            weight bindings and one unit's dot products
    matvec_unit32.wgsl                q5, q4k, q5k, q6k: their unit of x (32 values, with sums)
    matvec_input_<input>.wgsl         the activation and output bindings, and what the weights
                                      multiply: x ("plain"), RMSNorm(x) ("norm"),
                                      silu(gate) * up ("swiglu", with silu.wgsl), or bytes
                                      quantized beforehand ("int8": q4 dot4; q8, q4k and
                                      q6k "xq"; PREQUANT_VARIANTS; matvec_prequant.py)
    quant_scales.wgsl, quant_mins.wgsl  q4/q5/q8 scale_at, q4/q5 min_at (f16 or f32 scales)

Variants (registry names; `kernel_name`): `matvec_<enc>[_subgroup]` (input "plain", INPUT 0),
`matvec_norm_<enc>[_subgroup]` (INPUT 1) and `matvec_swiglu_<enc>[_subgroup]` (INPUT 2): the
input mode changes the bindings, so it is a registry entry, not an override. Each takes the
override ACCUMULATE 0|1 (y += W x: the residual add of the attention output and FFN down
projections) besides WG, ROWS and the encoding's BLOCK, SCALE_F16, ZERO_MIN. Where <enc> is
followed by a variant (`VARIANTS`), the weights are the same parts, read another way:
    q4_dot4, q8_dot4   int8 activations and dot4I8Packed (matvec_int8_x.wgsl): the
                       activation is rounded to bytes per unit, a stated error (`int8_error`),
                       64 times smaller with the override RESIDUAL=1 (a second byte); needs
                       the WGSL language feature packed_4x8_integer_dot_product
    f16_wide           one 16-byte load per 8 values, no clamps or masks: K % 8 == 0 only
`choose_kernel` picks among them by `TUNING` (a `Tuning`, set from bench/matvec_sweep.py).

Bindings (index order; runner.prepare and the executor bind in this order):
    0 params (uniform, `params`: 8 words)
    1 .. P   the weight parts (weights.PART_NAMES: q4 codes, scales, mins; q8 codes, scales;
             f16/f32 data)
    plain    P+1 x [M][x_stride] f32            P+2 y (storage)
    norm     P+1 x [M][x_stride] f32, P+2 g [K rounded up to 4] f32 (the norm weight),
             P+3 y (storage)
    swiglu   P+1 h [M][x_stride] f32 (gate at 0.., up at up_offset..), P+2 y (storage)
y is read_write; with ACCUMULATE it is read, so it must not alias an input (`check_no_alias`;
WebGPU's usage scopes refuse a buffer bound both read-only and writable in one dispatch).
Every input mode supports any M (grid z): the norm's 1/rms is computed per row.

Weights are bound exactly as the artifact stores their parts (docs/slm-format.md): no
repacking, so the bytes on the GPU are the bytes the artifact hash covers.

Host side (below): `weights.Weights` describes a tensor's parts (shared with gemm.py),
`units` counts a row's steps, `choose_kernel` picks the variant and overrides for a device,
`check_shapes` validates before any dispatch, `params` and `grid` build the launch, `plan`
does all of it at once, and `matvec` runs one product. The oracle and its error bounds
are matvec_oracle.py, the golden tests matvec_cases.py; the benchmark hook closes this file.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import numpy as np

from ..artifact import quant
from ..artifact.format import BLOCK_ELEMENTS, blocks_per_row, row_stride
from ..webgpu.interface import Device
from . import kquant, runner
from .golden import GoldenContext
from .registry import QUANT_SOURCES, KernelSpec, capabilities, compile_kernel, register
from .weights import ENCODINGS, PART_NAMES, Weights

UNIT_ELEMENTS = {"q4": 32, "q8": 16, "f16": 8, "f32": 4,    # weights one invocation step covers
                 "q5": 32, "q4k": 32, "q5k": 32, "q6k": 32}
UNIT32 = ("q5", "q4k", "q5k", "q6k")      # the encodings that read x through matvec_unit32.wgsl
WORKGROUP_SIZES = (32, 64, 128, 256)
ROWS_PER_WORKGROUP = (1, 2, 4, 8, 16)
UNITS_PER_INVOCATION = 4
# Per encoding, its kernel variants besides the plain one ("": matvec_<enc>.wgsl): the file
# matvec_<enc>_<variant>.wgsl replaces it, binding the same weight parts (module docstring).
VARIANTS = {"q4": ("dot4",), "q8": ("dot4",), "f16": ("wide",), "f32": (), "q5": (), "q4k": (), "q5k": (),
            "q6k": ()}
DOT4_FEATURE = "packed_4x8_integer_dot_product"     # the WGSL language feature dot4 needs
# Per encoding, the variant whose weight file multiplies activations quantized once (input
# "int8", matvec_prequant.py): q4's dot4 file serves both; "xq" files serve only that input.
PREQUANT_VARIANTS = {"q4": "dot4", "q8": "xq", "q4k": "xq", "q6k": "xq"}
# input mode -> INPUT number (docs); "int8": activations quantized beforehand (matvec_prequant.py)
INPUTS = {"plain": 0, "norm": 1, "swiglu": 2, "int8": 3}
# The activation bindings of each input mode, after the weight parts (y follows them).
INPUT_BINDINGS = {"plain": ("x",), "norm": ("x", "norm_weight"), "swiglu": ("h",), "int8": ("xq",)}


class MatvecShapeError(ValueError):
    """A mat-vec the kernels cannot serve, refused before any GPU work. `problem` names it:
    "encoding", "input", "empty", "stride", "grid", "offset-overflow", "binding-size", "eps",
    "up-offset", "norm-weight", "accumulate", "alias", "shape", "workgroup", "variant"."""

    def __init__(self, problem: str, message: str):
        super().__init__(f"{problem}: {message}")
        self.problem = problem


def kernel_name(encoding: str, subgroups: bool, input: str = "plain", variant: str = "") -> str:
    if input not in INPUTS:
        raise MatvecShapeError("input", f"mat-vec input must be one of {sorted(INPUTS)}, not {input!r}")
    known = VARIANTS.get(encoding, ()) + ((PREQUANT_VARIANTS[encoding],) if input == "int8" and
                                          encoding in PREQUANT_VARIANTS else ())
    if variant and variant not in known:
        raise MatvecShapeError("variant", f"{encoding} has no mat-vec variant {variant!r} "
                                          f"(it has {list(known)})")
    mode = "" if input == "plain" else f"{input}_"
    return f"matvec_{mode}{encoding}" + (f"_{variant}" if variant else "") + ("_subgroup" if subgroups else "")


def input_of(name: str) -> str:
    """The input mode of a mat-vec registry name."""
    for mode in ("norm", "swiglu", "int8"):
        if name.startswith(f"matvec_{mode}_"):
            return mode
    return "plain"


def _sources(encoding: str, input: str, variant: str, subgroups: bool) -> tuple[str, ...]:
    """The bundle files of one mat-vec kernel, in order (module docstring)."""
    reduce = "matvec_reduce_subgroup.wgsl" if subgroups else "matvec_reduce_workgroup.wgsl"
    weights_file = f"matvec_{encoding}" + (f"_{variant}" if variant else "") + ".wgsl"
    q4_dot4 = encoding == "q4" and variant == "dot4"
    return ((("enable_subgroups.wgsl",) if subgroups else ())
            + ("common_quant.wgsl", "matvec_params.wgsl", "matvec_main.wgsl", weights_file)
            + (("int8_unit.wgsl",) if q4_dot4 or input == "int8" else ())
            + (("int8_pack.wgsl", "int8_quads.wgsl", "matvec_q4_dot4_x.wgsl") if q4_dot4 and input != "int8" else ())
            + (("matvec_unit32.wgsl",) if encoding in UNIT32 and input != "int8" else ())
            + (f"matvec_input_{input}.wgsl", reduce)
            + (("matvec_int8_x.wgsl",) if variant == "dot4" or input == "int8" else ())
            + (("silu.wgsl",) if input == "swiglu" else ())
            + QUANT_SOURCES.get(encoding, ()))


def _specs():
    for input in INPUTS:
        for encoding in ENCODINGS:
            for variant in ("", *VARIANTS[encoding], "xq"):
                if input == "int8" and variant != PREQUANT_VARIANTS.get(encoding):
                    continue                   # pre-quantized activations: PREQUANT_VARIANTS only
                if input != "int8" and variant == "xq":
                    continue
                for subgroups in (False, True):
                    overrides = {"WG": WORKGROUP_SIZES, "ROWS": ROWS_PER_WORKGROUP, "ACCUMULATE": (0, 1)}
                    if encoding in ("q4", "q8", "q5"):
                        overrides |= {"BLOCK": BLOCK_ELEMENTS, "SCALE_F16": (0, 1)}
                    if encoding in ("q4", "q5"):
                        overrides |= {"ZERO_MIN": (0, 1)}
                    if variant == "dot4" or input == "int8":
                        overrides |= {"RESIDUAL": (0, 1)}
                    if input == "int8":
                        overrides |= {"ROW_NORM": (0, 1)}      # a norm from the units' squares (matvec_prequant "xq2s")
                    yield KernelSpec(
                        name=kernel_name(encoding, subgroups, input, variant),
                        sources=_sources(encoding, input, variant, subgroups),
                        entry_point="main",
                        bindings=("uniform",) + ("read-only-storage",) * (len(PART_NAMES[encoding])
                                                                          + len(INPUT_BINDINGS[input]))
                        + ("storage",),
                        overrides=overrides,
                        requires=(frozenset({"subgroups"}) if subgroups else frozenset())
                        | (frozenset({DOT4_FEATURE}) if variant in ("dot4", "xq") else frozenset()),
                    )


register(*_specs())


# -- host side ------------------------------------------------------------------------------

def units(weights: Weights) -> int:
    """Steps of UNIT_ELEMENTS weights per row, padding included."""
    if weights.block:
        return weights.blocks * weights.block // UNIT_ELEMENTS[weights.encoding]
    return -(-weights.cols // UNIT_ELEMENTS[weights.encoding])


def _quads(n: int) -> int:
    """n rounded up to a multiple of 4 (whole vec4s)."""
    return -(-n // 4) * 4


@dataclasses.dataclass(frozen=True)
class Tuning:
    """How `choose_kernel` shapes a launch when the caller leaves it open. bench/matvec_sweep.py
    times every (variant, WG, ROWS) on the shapes of interest, scores candidate Tunings
    against those timings and prints the best as a Tuning(...) line: set TUNING to it."""
    activations: str = "f32"    # q4, q8: "int8" / "int8x2" take the dot4 variants (RESIDUAL 0 / 1)
                                # where the WGSL has them; "f32" the exact kernels
    wide_f16: bool = True       # f16 with K % 8 == 0: the f16_wide variant (same numerics)
    units_per_invocation: int = UNITS_PER_INVOCATION   # WG: largest allowlisted <= units / this (>= 32)
    rows: int = 4               # ROWS, the rows per workgroup, halved while the grid has
    min_workgroups: int = 0     # fewer workgroups than this (0: never)


# The engine's choice. Tier rules hold whatever it says: subgroup sums only where the device
# has subgroups (tier C), dot4 only where its WGSL has packed_4x8_integer_dot_product, and
# workgroup memory within the device's limit (compatibility devices: 16 KiB). int8 activations
# stay off until measured and checked on the target (`webslm conformance`): they trade
# exactness for speed (docs/kernels.md).
# From the H200 sweep of 2026-12-02 (bench/results/matvec_sweep_h200.json), the best rule with exact
# (f32) activations: 1.37x the per-shape best summed over the sweep's shapes, against 1.47x for
# Tuning(). The int8 rules score 1.24-1.32x but move logits (docs/kernels.md): not the default.
TUNING = Tuning(activations="f32", wide_f16=True, units_per_invocation=8, rows=4, min_workgroups=1024)
# Per encoding, where a sweep of that encoding's kernels found a better rule than TUNING's
# (`tuning_for`). q5 and the K-quants read 32-value units with their sub-block scales, more
# work a unit than q4: from the K-quant sweep (matvec_sweep_kquant_h200.json), 2 units an
# invocation and 512 workgroups scored 1.22x the per-shape best against 1.31x for TUNING, and
# in the engine (bench/engine.py --matvec-tuning, same run) see docs/RESULTS.md.
KQUANT_TUNING = Tuning(activations="f32", wide_f16=True, units_per_invocation=2, rows=4, min_workgroups=512)
TUNINGS: dict[str, Tuning] = {encoding: KQUANT_TUNING for encoding in ("q5", "q4k", "q5k", "q6k")}
ACTIVATIONS = ("f32", "int8", "int8x2")


def tuning_for(encoding: str) -> Tuning:
    """The rule `choose_kernel` follows for an encoding when the caller gives none."""
    return TUNINGS.get(encoding, TUNING)


def variant_of(name: str) -> str:
    """The variant of a mat-vec registry name ("" for the plain kernels)."""
    parts = name.removesuffix("_subgroup").split("_")
    return parts[-1] if parts[-1] in {v for vs in VARIANTS.values() for v in vs} | {"xq"} else ""


def check_variant(device: Device, weights: Weights, variant: str) -> None:
    """A variant must exist for the encoding, have its WGSL language feature, and fit K."""
    if variant and variant not in VARIANTS.get(weights.encoding, ()):
        raise MatvecShapeError("variant", f"{weights.encoding} has no mat-vec variant {variant!r}")
    if variant == "dot4" and DOT4_FEATURE not in capabilities(device):
        raise MatvecShapeError("variant", f"dot4 needs the WGSL language feature {DOT4_FEATURE}")
    if variant == "wide" and weights.cols % 8:
        raise MatvecShapeError("variant", f"f16_wide reads whole 16-byte runs: cols {weights.cols} % 8 != 0")


def workgroup_bytes(rows_per_group: int, workgroup: int) -> int:
    """Workgroup memory of a mat-vec: the row sums [ROWS][WG] f32 and the 256-slot total of the
    norm input (matvec_reduce_*.wgsl), plus the subgroup reduction's two counters."""
    return 4 * rows_per_group * workgroup + 4 * 256 + 8


def choose_kernel(device: Device, weights: Weights, workgroup: int | None = None,
                  rows_per_group: int | None = None, input: str = "plain", accumulate: bool = False,
                  variant: str | None = None, tuning: Tuning | None = None) -> tuple[str, dict[str, int]]:
    """The kernel and overrides for this device: subgroup sums when the device has them; the
    variant, workgroup size and rows per workgroup by `tuning` (default `tuning_for`) unless the
    caller gives them; never more invocations or workgroup memory than the limits admit.
    `input` picks the input mode ("plain", "norm", "swiglu"); `accumulate` adds ACCUMULATE=1
    (left out when False, the WGSL default 0)."""
    tuning = tuning or tuning_for(weights.encoding)
    if tuning.activations not in ACTIVATIONS:
        raise MatvecShapeError("variant", f"activations must be one of {ACTIVATIONS}, not {tuning.activations!r}")
    if variant is None:
        if (weights.encoding in ("q4", "q8") and tuning.activations != "f32"
                and DOT4_FEATURE in capabilities(device)):
            variant = "dot4"
        elif weights.encoding == "f16" and tuning.wide_f16 and weights.cols % 8 == 0:
            variant = "wide"
        else:
            variant = ""
    check_variant(device, weights, variant)
    if rows_per_group is None:
        rows_per_group = tuning.rows
        while rows_per_group > 1 and -(-weights.rows // rows_per_group) < tuning.min_workgroups:
            rows_per_group //= 2
    if rows_per_group not in ROWS_PER_WORKGROUP:
        raise MatvecShapeError("workgroup", f"rows per workgroup {rows_per_group} is not one of {ROWS_PER_WORKGROUP}")
    wanted = workgroup or max(32, units(weights) // tuning.units_per_invocation)
    limits = {"maxComputeWorkgroupStorageSize": 16384, **device.limits}     # WebGPU's minimum if not given
    size = runner.largest_workgroup(limits, WORKGROUP_SIZES, wanted, lambda wg: workgroup_bytes(rows_per_group, wg))
    if size is None:
        raise MatvecShapeError("workgroup", f"no mat-vec workgroup size fits "
                                            f"{min(wanted, runner.max_invocations(limits))} invocations and "
                                            f"{limits['maxComputeWorkgroupStorageSize']} bytes of workgroup memory")
    overrides = {"WG": size, "ROWS": rows_per_group, **weights.overrides()}
    if variant == "dot4":
        overrides["RESIDUAL"] = int(tuning.activations == "int8x2")
    if accumulate:
        overrides["ACCUMULATE"] = 1
    return kernel_name(weights.encoding, "subgroups" in device.features, input, variant), overrides


@dataclasses.dataclass(frozen=True)
class Choice:
    """A launch shape measured for one mat-vec form on one device (backends/gpu/tuning.py):
    what `choose_kernel` takes as variant, workgroup and rows_per_group instead of the rule."""
    variant: str
    workgroup: int
    rows: int

    def as_dict(self) -> dict:
        return {"variant": self.variant, "WG": self.workgroup, "ROWS": self.rows}

    @classmethod
    def from_dict(cls, data) -> "Choice":
        """From cached JSON (untrusted: a stale or edited cache): typed, or MatvecShapeError."""
        try:
            variant, workgroup, rows = data["variant"], data["WG"], data["ROWS"]
        except (TypeError, KeyError):
            raise MatvecShapeError("workgroup", f"a cached mat-vec choice must have variant, WG and ROWS: "
                                                f"{data!r}"[:200]) from None
        if (not isinstance(variant, str) or workgroup not in WORKGROUP_SIZES or rows not in ROWS_PER_WORKGROUP
                or isinstance(workgroup, bool) or isinstance(rows, bool)):
            raise MatvecShapeError("workgroup", f"not a mat-vec choice: {data!r}"[:200])
        return cls(variant, workgroup, rows)


def form_key(weights: Weights, input: str, accumulate: bool) -> str:
    """What a measured Choice depends on besides the device and the shader bundle: the
    encoding with its block form, the shape, the input mode and ACCUMULATE. Layers that
    share a form share the key (and the choice)."""
    form = ",".join(f"{k}={v}" for k, v in sorted(weights.overrides().items()))
    return f"{weights.encoding}[{form}] {weights.rows}x{weights.cols} {input}" + (" +y" if accumulate else "")


def workgroup_candidates(device: Device, weights: Weights, rows_per_group: int) -> list[int]:
    """The allowlisted workgroup sizes worth timing for a row length: at most one idle
    invocation step per row (WG <= units, at least 32), within the device's limits."""
    limits = {"maxComputeWorkgroupStorageSize": 16384, **device.limits}
    fits = [wg for wg in WORKGROUP_SIZES
            if wg <= runner.max_invocations(limits)
            and workgroup_bytes(rows_per_group, wg) <= limits["maxComputeWorkgroupStorageSize"]]
    return [wg for wg in fits if wg == 32 or wg <= units(weights)]


def check_shapes(device: Device, weights: Weights, m: int, x_stride: int, input: str = "plain",
                 eps: float | None = None, up_offset: int | None = None,
                 norm_elements: int | None = None) -> None:
    """Everything the kernel's addressing assumes, checked before any GPU work
    (MatvecShapeError, a ValueError). x_stride is the row stride of the bound activations:
    x for "plain" and "norm", the gate|up row h for "swiglu". `norm_elements`, when given, is
    how many f32 the norm weight's binding holds (it must cover cols rounded up to 4)."""
    if weights.encoding not in ENCODINGS:
        raise MatvecShapeError("encoding", f"mat-vec has no {weights.encoding!r} encoding")
    if input not in INPUTS or input == "int8":     # "int8" is no op's mode: matvec_prequant.plan makes it
        raise MatvecShapeError("input", f"mat-vec input must be one of {sorted(set(INPUTS) - {'int8'})}, "
                                        f"not {input!r}")
    if weights.rows < 1 or weights.cols < 1 or m < 1:
        raise MatvecShapeError("empty", f"empty mat-vec: rows={weights.rows} cols={weights.cols} m={m}")
    if x_stride % 4 or x_stride < weights.cols:
        raise MatvecShapeError("stride", f"x_stride {x_stride} must be a multiple of 4 and >= cols {weights.cols}")
    if m > device.limits["maxComputeWorkgroupsPerDimension"]:
        raise MatvecShapeError("grid", f"{m} activation rows exceed the grid's z limit")
    if input == "norm":
        if eps is None or not (np.isfinite(eps) and eps > 0 and np.float32(eps) > 0):
            raise MatvecShapeError("eps", f"the norm input needs eps, a positive finite f32, got {eps!r}")
        if weights.cols >= 2 ** 24:
            raise MatvecShapeError("shape", f"the norm input divides by cols as f32: {weights.cols} >= 2^24")
        if norm_elements is not None and norm_elements < _quads(weights.cols):
            raise MatvecShapeError("norm-weight", f"the norm weight binding holds {norm_elements} f32; the kernel "
                                                  f"reads {_quads(weights.cols)} (cols rounded up to 4)")
    elif eps is not None:
        raise MatvecShapeError("eps", f"eps is for the norm input, not {input!r}")
    if input == "swiglu":
        if up_offset is None or up_offset % 4 or up_offset < weights.cols:
            raise MatvecShapeError("up-offset", f"the swiglu input needs up_offset (F'), a multiple of 4 >= "
                                                f"cols {weights.cols}, got {up_offset!r}")
        if x_stride < up_offset + _quads(weights.cols):
            raise MatvecShapeError("stride", f"a gate|up row of x_stride {x_stride} floats does not hold up at "
                                             f"{up_offset}..{up_offset + _quads(weights.cols) - 1}")
    elif up_offset is not None:
        raise MatvecShapeError("up-offset", f"up_offset is for the swiglu input, not {input!r}")
    widest = max(weights.rows * units(weights) * UNIT_ELEMENTS[weights.encoding], m * x_stride, m * weights.rows)
    if widest >= runner.U32_LIMIT:
        raise MatvecShapeError("offset-overflow", f"mat-vec addresses {widest} elements, past u32 indexing")
    for name, part in weights.parts.items():
        try:
            runner.check_binding_size(device.limits, f"weight part {name} (split the tensor: memory planner)",
                                      len(memoryview(part).cast("B")))
        except ValueError as exc:
            raise MatvecShapeError("binding-size", str(exc)) from None


def params(weights: Weights, x_stride: int, y_stride: int, input: str = "plain",
           eps: float | None = None, up_offset: int | None = None) -> np.ndarray:
    """The uniform block, 8 u32 words: rows, cols, blocks, units, row_words, x_stride, y_stride,
    aux (input "norm": eps as f32 bits; "swiglu": up_offset; "plain": 0)."""
    aux = {"plain": 0, "norm": float(np.float32(eps)) if eps is not None else 0.0,
           "swiglu": int(up_offset or 0)}[input]
    return runner.params_words(weights.rows, weights.cols, weights.blocks, units(weights),
                               weights.row_words, x_stride, y_stride, aux)


def grid(device: Device, weights: Weights, rows_per_group: int, m: int) -> tuple[int, int, int]:
    """ceil(rows / ROWS) workgroups (2-D past the x limit), times m in z."""
    groups = -(-weights.rows // rows_per_group)
    gx, gy, _ = runner.workgroup_grid(groups, device.limits["maxComputeWorkgroupsPerDimension"])
    return (gx, gy, m)


class MatvecPlan(NamedTuple):
    kernel: str                      # registry name (kernel_name)
    overrides: dict[str, int]
    params: np.ndarray               # the uniform block (params)
    grid: tuple[int, int, int]
    inputs: tuple[str, ...]          # what binds after the weight parts, in order, then y


def plan(device: Device, weights: Weights, m: int, x_stride: int, y_stride: int, input: str = "plain",
         accumulate: bool = False, eps: float | None = None, up_offset: int | None = None,
         norm_elements: int | None = None, workgroup: int | None = None,
         rows_per_group: int | None = None, variant: str | None = None) -> MatvecPlan:
    """check_shapes, choose_kernel, params and grid in one call: a validated launch."""
    check_shapes(device, weights, m, x_stride, input, eps, up_offset, norm_elements)
    name, overrides = choose_kernel(device, weights, workgroup, rows_per_group, input, accumulate, variant)
    return MatvecPlan(name, overrides, params(weights, x_stride, y_stride, input, eps, up_offset),
                      grid(device, weights, overrides["ROWS"], m), INPUT_BINDINGS[input])


def check_no_alias(inputs: Sequence, output) -> None:
    """The output binding (a webgpu.interface.BufferBinding) must not share a buffer with any
    input binding: y is read_write (ACCUMULATE reads it), the inputs read-only, and WebGPU
    refuses one buffer bound both ways in a dispatch (usage scopes) even at disjoint ranges."""
    for i, binding in enumerate(inputs):
        if binding.buffer is output.buffer:
            raise MatvecShapeError("alias", f"the output shares its buffer with input binding {i}")


def padded_activations(x: np.ndarray, fill: float = np.nan) -> tuple[np.ndarray, int]:
    """x [M, K] -> ([M, x_stride] f32, x_stride) with x_stride a multiple of 4. The padding
    holds `fill` (NaN in tests: the kernels must mask it, never multiply it)."""
    m, k = x.shape
    stride = -(-k // 4) * 4
    out = np.full((m, stride), fill, np.float32)
    out[:, :k] = x
    return out, stride


def _as_array(part) -> np.ndarray:
    return np.frombuffer(memoryview(part).cast("B"), np.uint8)


def padded_norm_weight(norm_weight: np.ndarray, cols: int, fill: float = np.nan) -> np.ndarray:
    """The norm weight [cols] padded to whole vec4s with `fill` (NaN in tests: never used)."""
    g = np.asarray(norm_weight, np.float32).reshape(-1)
    if g.size != cols:
        raise MatvecShapeError("norm-weight", f"the norm weight has {g.size} elements, the weights {cols} columns")
    out = np.full(_quads(cols), fill, np.float32)
    out[:cols] = g
    return out


async def matvec(ctx_or_device, weights: Weights, x: np.ndarray, name: str | None = None,
                 overrides: dict[str, int] | None = None, *, input: str = "plain",
                 norm_weight: np.ndarray | None = None, eps: float | None = None,
                 up_offset: int | None = None, y0: np.ndarray | None = None) -> np.ndarray:
    """y [M, rows] once, on fresh buffers (tests, self-tests), validated before any dispatch:
        "plain"   x [M, cols]:            y = x W^T
        "norm"    x [M, cols], norm_weight [cols], eps:  y = RMSNorm(x) W^T
        "swiglu"  x = h [M, 2 F'] (gate | up, F' >= cols, F' % 4 == 0; up_offset defaults to
                  F' = h.shape[1] // 2):  y = (silu(h[:, :cols]) * h[:, F':F'+cols]) W^T
    y0 [M, rows] turns on ACCUMULATE (y = y0 + ...); without it the output is poisoned."""
    ctx = ctx_or_device if isinstance(ctx_or_device, GoldenContext) else GoldenContext(ctx_or_device, None)
    device = ctx.device
    x = np.atleast_2d(np.asarray(x, np.float32))
    if name is not None and input_of(name) != input:
        raise MatvecShapeError("input", f"{name} has input {input_of(name)!r}, not {input!r}")
    if name is not None:
        check_variant(device, weights, variant_of(name))
    accumulate = y0 is not None
    if input == "swiglu":
        up_offset = x.shape[1] // 2 if up_offset is None else up_offset
        xs, stride = x, x.shape[1]
        if stride % 4:
            raise MatvecShapeError("stride", f"h rows of {stride} floats are not whole vec4s")
    else:
        if x.shape[1] != weights.cols:
            raise MatvecShapeError("shape", f"x has {x.shape[1]} columns, the weights {weights.cols}")
        xs, stride = padded_activations(x)
    inputs = [*weights.bindings(), xs]
    if input == "norm":
        if norm_weight is None:
            raise MatvecShapeError("norm-weight", "the norm input needs norm_weight")
        inputs.append(padded_norm_weight(norm_weight, weights.cols))
    elif norm_weight is not None:
        raise MatvecShapeError("norm-weight", f"norm_weight is for the norm input, not {input!r}")
    m = x.shape[0]
    check_shapes(device, weights, m, stride, input, eps, up_offset, _quads(weights.cols) if input == "norm" else None)
    if name is None:
        name, overrides = choose_kernel(device, weights, input=input, accumulate=accumulate)
    if bool(overrides.get("ACCUMULATE", 0)) != accumulate:
        raise MatvecShapeError("accumulate", f"ACCUMULATE={overrides.get('ACCUMULATE', 0)} needs y0 "
                                             f"{'given' if overrides.get('ACCUMULATE', 0) else 'absent'}")
    if accumulate:
        y0 = np.asarray(y0, np.float32)
        if y0.shape != (m, weights.rows):
            raise MatvecShapeError("shape", f"y0 has shape {y0.shape}, expected {(m, weights.rows)}")
        output = y0.reshape(-1).copy()
    else:
        output = (m * weights.rows, np.float32)
    kernel = await ctx.kernel(name, **overrides)
    (y,) = await runner.run_once(
        device, kernel, params(weights, stride, weights.rows, input, eps, up_offset),
        inputs, [output], grid(device, weights, overrides["ROWS"], m))
    return y.reshape(m, weights.rows)


# -- the swiglu input layout ----------------------------------------------------------------

def gate_up_row(gate: np.ndarray, up: np.ndarray, up_offset: int, fill: float = np.nan) -> np.ndarray:
    """h [M, 2 up_offset]: gate at 0.., up at up_offset.., the rest `fill` (NaN in tests:
    the padding between and after must never be used)."""
    gate, up = np.atleast_2d(gate), np.atleast_2d(up)
    m, k = gate.shape
    h = np.full((m, 2 * up_offset), fill, np.float32)
    h[:, :k] = gate
    h[:, up_offset:up_offset + k] = up
    return h


# -- benchmark hook -------------------------------------------------------------------------

BENCH_SHAPES = {
    "smollm2 q/o 576x576": {"rows": 576, "cols": 576},
    "smollm2 gate+up 3072x576": {"rows": 3072, "cols": 576},
    "smollm2 down 576x1536": {"rows": 576, "cols": 1536},
    "smollm2 head 49152x576": {"rows": 49152, "cols": 576},
    "llama1b q 2048x2048": {"rows": 2048, "cols": 2048, "big": True},
    "llama1b gate+up 16384x2048": {"rows": 16384, "cols": 2048, "big": True},
    "llama1b down 2048x8192": {"rows": 2048, "cols": 8192, "big": True},
    "square 4096x4096": {"rows": 4096, "cols": 4096},
    "llama8b gate 14336x4096": {"rows": 14336, "cols": 4096, "big": True},
    "llama8b down 4096x14336": {"rows": 4096, "cols": 14336, "big": True},
}
# An encoding, optionally with overrides to sweep: "q4" or "q4/WG=256/ROWS=2", and an input mode:
# "q4/input=norm" (RMSNorm fused), "q4/input=swiglu/ACCUMULATE=1" (the fused down projection).
BENCH_NAMES = ("q4", "q8", "f16", "f32", "q4/input=norm", "q4/input=swiglu/ACCUMULATE=1")


def random_weights_fast(rng, encoding: str, rows: int, cols: int, block: int = 32,
                        zero: str = "min", scale_type: str = "f16") -> Weights:
    """Random parts of the right sizes without quantizing (benchmarks on big shapes); q5 and
    the super-blocks by kquant.random_weights (q5: block 32, `zero` "min" or else "offset")."""
    if encoding in kquant.ENCODINGS:
        q5_zero = "min" if zero == "min" else "offset"
        return kquant.random_weights(rng, encoding, rows, cols, block if encoding == "q5" else None,
                                     q5_zero if encoding == "q5" else None, scale_type)
    blocks = blocks_per_row(cols, block)
    stride = row_stride(encoding, cols, block)
    codes = rng.integers(0, 256, rows * stride, dtype=np.uint8).tobytes()
    if encoding in ("f16", "f32"):
        dtype = np.float16 if encoding == "f16" else np.float32
        data = (rng.standard_normal(rows * stride // dtype().itemsize) * 0.02).astype(dtype).tobytes()
        return Weights(encoding, rows, cols, {"data": data})
    scale_dtype = quant.SCALE_DTYPES[scale_type]
    scales = (rng.random(rows * blocks) * 0.01 + 0.001).astype(scale_dtype).tobytes()
    mins = (-rng.random(rows * blocks) * 0.05).astype(scale_dtype).tobytes()
    parts = {"codes": codes, "scales": scales}
    if encoding == "q4" and zero == "min":
        parts["mins"] = mins
    return Weights(encoding, rows, cols, parts, block, zero if encoding == "q4" else None, scale_type)


async def prepare_bench(device: Device, name: str, shape: dict, rng,
                        overrides: dict[str, int] | None = None) -> runner.Prepared:
    """`name` is an encoding, optionally with overrides ("q4/WG=256/ROWS=2"), an input mode
    ("q4/input=norm", "q4/input=swiglu/ACCUMULATE=1") and a variant ("q4/variant=dot4",
    "q4/variant=" for the plain kernel; by default TUNING's choice); subgroups follow the
    device. bench/matvec_sweep.py sweeps all of them at once."""
    encoding, *settings = name.split("/")
    pairs = dict(item.split("=") for item in settings)
    input = pairs.pop("input", "plain")
    variant = pairs.pop("variant", None)
    overrides = {**{k: int(v) for k, v in pairs.items()}, **(overrides or {})}
    weights = random_weights_fast(rng, encoding, shape["rows"], shape["cols"])
    accumulate = bool(overrides.get("ACCUMULATE", 0))
    chosen, chosen_overrides = choose_kernel(device, weights, input=input, accumulate=accumulate, variant=variant)
    overrides = {**chosen_overrides, **overrides}
    kernel = await compile_kernel(device, chosen, **overrides)
    x, stride = padded_activations(rng.standard_normal((1, weights.cols)).astype(np.float32), 0.0)
    inputs, eps, up_offset = [x], None, None
    if input == "norm":
        eps = 1e-5
        inputs.append(padded_norm_weight(1 + 0.1 * rng.standard_normal(weights.cols), weights.cols, 0.0))
    elif input == "swiglu":
        up_offset = stride
        x = gate_up_row(rng.standard_normal((1, weights.cols)), rng.standard_normal((1, weights.cols)), up_offset, 0.0)
        inputs, stride = [x], 2 * up_offset
    check_shapes(device, weights, 1, stride, input, eps, up_offset)
    y = rng.standard_normal(weights.rows).astype(np.float32) if accumulate else (weights.rows, np.float32)
    prepared = runner.prepare(device, kernel, params(weights, stride, weights.rows, input, eps, up_offset),
                              [*weights.bindings(), *inputs], [y],
                              grid(device, weights, overrides["ROWS"], 1))
    prepared.bytes_moved = (weights.nbytes + sum(a.nbytes for a in inputs) + weights.rows * 4
                            * (2 if accumulate else 1))
    prepared.flops = 2 * weights.rows * weights.cols
    return prepared
