"""Golden tests of every kernel against the numpy oracle: one suite, run natively and in browsers.

Each kernel family registers a coroutine with `@golden("family", kernels=...)`. It receives a
GoldenContext (device, rng, size, optional real model) and returns GoldenResults, one per
(kernel variant, case). The same coroutines run
- natively on wgpu-native (tests/test_kernels_*.py, size "full"),
- in each browser row's worker (request `kernel-golden`, size "quick"),
- and later inside admission as bounded self-tests.

A result compares the GPU output with a float64 (or exact integer) oracle under a stated
rule; `error_over_tolerance <= 1` passes. Rules, one per family, are listed in
docs/kernels.md. Outputs are poisoned before every run (kernels/runner.py), so `unwritten`
counts elements the kernel never wrote.
"""
from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from typing import Awaitable, Callable

import numpy as np

from ..webgpu.interface import Device
from . import runner
from .registry import KERNELS, CompiledKernel, KernelSpec, capabilities, compile_kernel

# The unit roundoff the bounds use. IEEE round-to-nearest would give 2^-24, but WGSL lets
# "correctly rounded" f32 operations round to either neighbour of the exact result, so one
# rounding may cost a whole ulp: u = 2^-23 keeps every bound valid on every implementation.
F32_UNIT_ROUNDOFF = 2.0 ** -23
F32_TINY = float(np.finfo(np.float32).tiny)


def gamma(n: int) -> float:
    """Higham's gamma(n) = n u / (1 - n u): the relative bound for n f32 roundings
    (u = F32_UNIT_ROUNDOFF)."""
    return n * F32_UNIT_ROUNDOFF / (1 - n * F32_UNIT_ROUNDOFF)


@dataclasses.dataclass(frozen=True)
class GoldenResult:
    family: str
    kernel: str                 # registry name, with overrides, e.g. "matvec_q4[WG=128,ROWS=4]"
    case: str                   # what the inputs were, e.g. "random 300x1000"
    rule: str                   # the tolerance rule applied
    max_abs_error: float
    error_over_tolerance: float  # <= 1 passes
    unwritten: int              # poisoned elements left (NaN / 0xFFFFFFFF)
    mismatched: int = 0         # for exact comparisons: elements that differ

    @property
    def passed(self) -> bool:
        return self.unwritten == 0 and self.mismatched == 0 and self.error_over_tolerance <= 1.0

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "passed": self.passed}


def compare_bound(family: str, kernel: str, case: str, got: np.ndarray, exact: np.ndarray,
                  bound: np.ndarray, rule: str) -> GoldenResult:
    """|got - exact| <= bound elementwise, exact in float64. Non-finite exact values must be
    matched exactly (same infinity, or NaN where the oracle has NaN)."""
    got64 = np.asarray(got, np.float64).reshape(-1)
    exact = np.asarray(exact, np.float64)
    bound = np.broadcast_to(np.asarray(bound, np.float64), exact.shape).reshape(-1)
    exact = exact.reshape(-1)
    nonfinite = ~np.isfinite(exact)
    unwritten = int(np.isnan(got64[~nonfinite]).sum())
    # Where the oracle is not finite the GPU must agree in kind (NaN with NaN, +inf with +inf).
    mismatched = int(np.sum(nonfinite & ~((np.isnan(exact) & np.isnan(got64)) | (exact == got64))))
    finite = ~nonfinite & ~np.isnan(got64)
    error = np.abs(got64[finite] - exact[finite])
    over = error / np.maximum(bound[finite] + F32_TINY, F32_TINY)
    return GoldenResult(family, kernel, case, rule,
                        max_abs_error=float(error.max(initial=0.0)),
                        error_over_tolerance=float(over.max(initial=0.0)),
                        unwritten=unwritten, mismatched=mismatched)


def compare_exact(family: str, kernel: str, case: str, got: np.ndarray, want: np.ndarray,
                  poison_value: int | None = None) -> GoldenResult:
    """Integer outputs (indices, codes, bit patterns) must be identical."""
    got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    unwritten = int(np.sum(got == poison_value)) if poison_value is not None else 0
    mismatched = int(np.sum(got != want)) if got.shape == want.shape else max(got.size, want.size)
    return GoldenResult(family, kernel, case, "exact", 0.0, 0.0, unwritten, mismatched)


def label(spec: KernelSpec, overrides: dict[str, int]) -> str:
    if not overrides:
        return spec.name
    return f"{spec.name}[{','.join(f'{k}={v}' for k, v in sorted(overrides.items()))}]"


# The zero kind of each super-block encoding, as kquant.random_weights takes it.
KQUANT_ZERO = {"q4k": "scaled-min", "q5k": "scaled-min", "q6k": "offset"}


def weight_format(name: str, overrides: dict[str, int]) -> tuple | None:
    """(encoding, block, zero, scale type) of the weights a compiled kernel reads, from its name
    ("matvec_norm_q4_subgroup", "gemm_outer_q8") and overrides (BLOCK, ZERO_MIN, SCALE_F16);
    None for a kernel that reads no weights."""
    from .weights import ENCODINGS
    encoding = next((word for word in reversed(name.split("_")) if word in ENCODINGS), None)
    if encoding is None:
        return None
    if encoding in ("f16", "f32"):
        return (encoding, None, None, None)
    if encoding in KQUANT_ZERO:
        return (encoding, 256, KQUANT_ZERO[encoding], "f16")
    zero = None if encoding == "q8" else "min" if overrides.get("ZERO_MIN", 1) else "offset"
    return (encoding, overrides.get("BLOCK", 32), zero, "f16" if overrides.get("SCALE_F16", 1) else "f32")


@dataclasses.dataclass
class GoldenContext:
    device: Device
    rng: np.random.Generator
    size: str = "full"              # "quick" (browser rows, admission) or "full" (native CI)
    model: object | None = None     # a webslm.Model: real weights to test on, when given
    only: frozenset[str] | None = None   # registry names to test (admission: the plan's); None: all
    _compiled: dict = dataclasses.field(default_factory=dict)
    # The pipelines the plan compiled, (name, sorted override items) (admission's `compiled`):
    # a case then runs only on these (`launches`), and every one of them must be run
    planned: frozenset | None = None
    _ran: set = dataclasses.field(default_factory=set)     # (name, sorted override items) run, shared
    positions: int | None = None    # at admission, the plan's KV capacity: cases past it test nothing it runs

    @property
    def quick(self) -> bool:
        return self.size == "quick"

    def uses(self, name: str) -> bool:
        """Whether kernel `name` is among those this run tests."""
        return self.only is None or name in self.only

    def variants(self, prefix: str) -> list[KernelSpec]:
        """Registered kernels whose name starts with prefix, that this device can run and
        that this run tests."""
        return [spec for name, spec in sorted(KERNELS.items())
                if name.startswith(prefix) and spec.runs_on(capabilities(self.device)) and self.uses(name)]

    def workgroups(self, wanted: int = 256, bytes_per_lane: int = 0, kernel: str | None = None) -> list[int]:
        """The WG values a layer-op golden test runs: the largest the device admits
        (runner.fit_workgroup) in quick runs, else every allowlisted size up to it; at
        admission (`planned`) those the plan compiled `kernel` with."""
        if self.planned is not None and kernel is not None:
            return sorted({dict(items)["WG"] for name, items in self.planned if name == kernel and "WG" in dict(items)})
        largest = runner.fit_workgroup(self.device.limits, wanted, bytes_per_lane)
        return [largest] if self.quick else [s for s in runner.LAYER_WORKGROUP_SIZES if s <= largest]

    def launches(self, name: str, overrides: dict[str, int], launch: tuple[str, ...] = ("WG",)) -> list[dict]:
        """The overrides to run a case of kernel `name` with. Outside admission: `overrides`,
        as the family asks. At admission (`planned`): the plan's own pipelines of `name` that
        agree with `overrides` on every key but the `launch` keys (how the work is cut into
        workgroups, not what is computed), so that the case runs the very pipeline the step
        will, and no other is compiled; none where the plan has no such pipeline (another
        format, mode or size than this model's)."""
        if self.planned is None:
            return [overrides]
        def meaning(items) -> dict:
            return {k: v for k, v in dict(items).items() if k not in launch}
        wanted = meaning(overrides)
        return [dict(items) for planned_name, items in sorted(self.planned)
                if planned_name == name and meaning(items) == wanted]

    def planned_pipeline(self, name: str, overrides: dict[str, int]) -> bool:
        """Whether a case on (name, overrides) runs at all: always outside admission; at
        admission only on a pipeline the plan compiled (`launches` with no launch keys)."""
        return bool(self.launches(name, overrides, launch=()))

    def planned_formats(self, prefix: str) -> list[tuple] | None:
        """At admission, the weight formats (`weight_format`) the plan's `prefix*` pipelines
        read: what a family makes its cases of, so that each of them is tested. None outside
        admission (the family's own list of formats)."""
        if self.planned is None:
            return None
        formats = {weight_format(name, dict(items)) for name, items in self.planned if name.startswith(prefix)}
        return sorted(formats - {None}, key=str)

    async def kernel(self, name: str, **overrides: int) -> CompiledKernel:
        """The kernel compiled once per run: families running together share the compile (a
        task while it is in flight, so a second asker waits for the first's)."""
        key = (name, tuple(sorted(overrides.items())))
        self._ran.add(key)
        if key not in self._compiled:
            self._compiled[key] = asyncio.ensure_future(compile_kernel(self.device, name, **overrides))
        entry = self._compiled[key]
        return await entry if isinstance(entry, asyncio.Future) else entry


# Families run together, each on its own buffers and seeded generator: their compiles (most of
# a self-test's time on a GPU whose driver has cached nothing yet) and GPU work overlap. Each
# case's error scope may then catch another family's error; any error still fails the run.
FAMILIES_AT_ONCE = 4

GoldenFamily = Callable[[GoldenContext], Awaitable[list[GoldenResult]]]
FAMILIES: dict[str, GoldenFamily] = {}
FAMILY_KERNELS: dict[str, tuple[str, ...]] = {}     # family -> the kernels it tests (see covers)


def golden(family: str, kernels: tuple[str, ...]) -> Callable[[GoldenFamily], GoldenFamily]:
    """Register a family; `kernels` names the registry kernels it tests: exact names, or
    prefixes ending in "_" ("matvec_" covers every matvec_* variant)."""
    def register(fn: GoldenFamily) -> GoldenFamily:
        if family in FAMILIES:
            raise ValueError(f"golden family {family!r} registered twice")
        FAMILIES[family] = fn
        FAMILY_KERNELS[family] = kernels
        return fn
    return register


def covers(family: str, name: str) -> bool:
    """Whether golden family `family` tests registry kernel `name`."""
    return any(name == k or (k.endswith("_") and name.startswith(k)) for k in FAMILY_KERNELS[family])


def tested_kernels(report: dict) -> set[str]:
    """The registry kernels a run_all report has results for (names as its labels spell them:
    "matvec_q4_subgroup[ROWS=4,WG=64]", "attention_decode_f16[...] + attention_combine_f16")."""
    words = {w for f in report["families"].values() for r in f["results"]
             for w in re.split(r"[^A-Za-z0-9_]+", r["kernel"])}
    return words & set(KERNELS)


async def run_all(device: Device, size: str = "full", model=None, seed: int = 0,
                  families: list[str] | None = None, on_family=None, kernels=None, compiled=None,
                  positions: int | None = None) -> dict:
    """Every registered family (or the named ones) on one device; a JSON-able report.
    on_family(done, total) is called after each family. `kernels` (registry names): test only
    those, in the families that cover any of them (admission passes the plan's kernels).
    `compiled`: kernels already compiled, by (name, sorted overrides) (admission's): a case
    on one of those runs that very pipeline, and every family shares what the others compiled,
    so a kernel is compiled once per run (on a GPU whose driver caches nothing yet, the
    compiles were most of admission's self-test time), and every case runs on one of those
    (GoldenContext.launches). `positions`: the plan's KV capacity, the longest context a
    case needs to reach."""
    from . import FAMILY_MODULES  # noqa: F401  (importing the package registers every family)
    if size not in ("quick", "full"):
        raise ValueError(f"size must be 'quick' or 'full', not {size!r}")
    unknown = sorted(set(families or ()) - set(FAMILIES))
    if unknown:
        raise ValueError(f"no golden family named {unknown}; known: {sorted(FAMILIES)}")
    only = None if kernels is None else frozenset(kernels)
    report = {"size": size, "seed": seed, "families": {}}
    names = [name for name in families or sorted(FAMILIES)
             if only is None or any(covers(name, kernel) for kernel in only)]
    if only is not None:
        report["kernels"] = sorted(only)
    shared, slots, finished, ran = dict(compiled or {}), asyncio.Semaphore(FAMILIES_AT_ONCE), {}, set()

    async def one(name: str) -> None:
        async with slots:
            started = time.perf_counter()
            context = GoldenContext(device, np.random.default_rng([seed, len(name)]), size, model, only, shared,
                                    frozenset(compiled) if compiled else None, ran, positions)
            results = await FAMILIES[name](context)
            finished[name] = {"seconds": round(time.perf_counter() - started, 3),
                              "results": [r.as_dict() for r in results]}
        if on_family is not None:
            on_family(len(finished), len(names))
    await asyncio.gather(*(one(name) for name in names))
    report["families"] = {name: finished[name] for name in names}      # in name order, however they ran
    every = [r for f in report["families"].values() for r in f["results"]]
    report["cases"] = len(every)
    report["failed"] = [r for r in every if not r["passed"]]
    report["passed"] = bool(every) and not report["failed"]
    if compiled:
        # Every compiled pipeline a family covers must have run: the self-test vouches for the
        # pipelines the step runs, not only for their kernels' names.
        report["untested_pipelines"] = sorted(
            label(KERNELS[name], dict(items)) for name, items in compiled
            if (name, items) not in ran and any(covers(family, name) for family in names))
    return report
