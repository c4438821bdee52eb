"""Admission's tuning stage: the decode step's mat-vecs timed in a few launch shapes on this
device, and the fastest kept (issue 16, "variant choice by measurement at admission").

Why measure: the best workgroup size and rows per workgroup of a mat-vec depend on the GPU
(how many cores, how many bytes it wants in flight) and on the shape; one length rule
(`matvec.TUNING`) was 1.37x off the per-shape best on the H200 and cannot be right on every
laptop GPU too. So, once the weights are on the GPU and before the pipelines are compiled,
each mat-vec *form* of the decode program (matvec.form_key: encoding, shape, input mode,
ACCUMULATE; layers of one form share it) is run as the engine runs it (tuning_stage.Stage:
the program lowered with the choices tried, and its launches timed):

    every form:      the rule's launch timed (its pipeline is needed anyway)
    then, while the budget lasts, the forms that cost the step most first, in two phases
    (_FormSearch): every form's likeliest win first, then the rest of every form's ladder:
                     ROWS in 1..16 at the rule's WG, then every sensible WG at the best
                     ROWS (at most 8 launch shapes), and the same for int8 (below)
        each shape:  compiled; checked once against the rule's output (a wrong launch is
                     never chosen); timed as dependent dispatches over the form's layers'
                     own weights, the median of ROUNDS rounds of >= ROUND_SECONDS
        keep:        the fastest, if it beats the rule by more than NOISE (else the rule),
                     after the finalists are timed again side by side (_runoff)

The shapes above are of the rule's variant (f32 activations, exact): such a choice changes
summation order, not numerics class. The check against the rule is a differential one: both
are exact f32 mat-vecs, so they may differ by a few rounding errors of sum |w x|;
CHECK_RELATIVE is far above that and far below what a wrong row, column or reduction gives.

Then, for q4, q4k, q6k and q8 forms on a device whose WGSL has packed dot products (unless the caller
says int8=False: AdmissionPolicy.int8_activations), the pre-quantized path
(kernels/matvec_prequant.py: a quantizer launch, then a packed-dot mat-vec on activations
as two int8 bytes each, variant "xq2"; a norm form also "xq2s", its 1/rms from the units'
squares instead of the quantizer's header), timed as its two dispatches per op, checked with
INT8_CHECK_RELATIVE, and kept only where it beats the best exact choice by NOISE: a stated
error (matvec_oracle.fused_oracle int8=2), taken only where it pays. Not llama.cpp's one byte
("xq"): on real weights that changed greedy tokens (matvec_prequant's docstring). The last
word is the whole step's (_step_check): timed with the int8 forms and without, side by side,
they stay only if the step is STEP_GAIN faster with them. At the dispatch floor (SmolLM2's
forms on the H200) a form can win alone and lose in the step: its extra dispatch costs more
than it saves. Where decode attention can quantize for the o projection (the fusion rule
quantize-into-attention, kernels/attention_xq.py), the int8 step is timed that way and with
the separate quantize_x too, and the faster is kept (attention_xq.CHOICE).

Where measuring cannot pay, the rule stands and the report says why: a software adapter (the
rule's dispatch takes more than timing.SLOW_DISPATCH_SECONDS), or the budget (BUDGET_SECONDS) spent.
A cache (form results keyed by adapter, shader bundle and form: tuning_cache.py) makes a
second admission on the same device free. With `measure=False` (AdmissionPolicy.tune_later,
the worker's admit tuning "later", the page's default) admission takes only what the cache holds
and the rule for the rest, and the executor measures those forms once the model is ready
(GpuBackend.retune, at the conversation's first free KV row): a first visit is not kept waiting
for the stage's compiles (2-7 s on the H200). It still takes the first look at a rule: an
adapter that looks slow keeps the rule at once and defers nothing. The native engine keeps it in a JSON file, the
browser's worker in Cache Storage; the caller owns it (it is untrusted input: an entry that
is not a valid choice is measured afresh).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Awaitable, Callable, Mapping

import numpy as np

from ...kernels import attention, attention_xq, matvec, matvec_prequant
from ...kernels.registry import KernelError
from . import timing, tuning_attention
from .tuning_cache import cache_key
from .tuning_stage import Stage

SLOW_REASON = (f"a rule dispatch takes over {timing.SLOW_DISPATCH_SECONDS * 1e3:g} ms here (a software adapter): "
               f"measuring cannot pay")
BUDGET_SECONDS = 4.0           # the stage's compiles and checks; forms not reached keep the rule
NOISE = 0.10                   # a shape must beat the rule by this much: smaller wins were not real (docs/kernels.md)
CHECK_RELATIVE = 1e-3          # |y - y_rule| <= this * max|y_rule| (+ a tiny absolute floor)
INT8_CHECK_RELATIVE = {        # the same for int8 activations (matvec_prequant.VARIANTS): one byte's
    "xq": 3e-2,                # rounding (<= 1/128 of a unit's largest |x| per value) moves y by ~1%
    "xq2": 2e-3,               # of max|y| on random x; two bytes' 64 times less
    "xq2s": 2e-3,              # two bytes, the norm's 1/rms from the units' squares (matvec_prequant.SQUARES)
}
XQ_SHAPES = ((32, 2), (32, 4), (32, 8), (32, 16))   # pre-quantized (WG, ROWS) first tried; then WG at the best ROWS


@dataclasses.dataclass
class TuningReport:
    """What the stage did: the choices (form -> Choice, only where one beat the rule), per form
    the rule's and the chosen time in us, how many shapes were tried, and why nothing was
    measured when that is so."""
    choices: dict[str, matvec.Choice]
    forms: dict[str, dict]
    source: str                   # "measured", "cached", "rule" (see `reason`), "off", "pinned", "deferred"
    reason: str = ""
    seconds: float = 0.0
    cache_entries: dict[str, dict] = dataclasses.field(default_factory=dict)   # new, for the caller to keep
    step_us: dict[str, float] = dataclasses.field(default_factory=dict)        # _step_check's two steps
    settles: list = dataclasses.field(default_factory=list)      # Stage.settle: (seconds, first, last round, trip)
    looks_us: list = dataclasses.field(default_factory=list)     # looks_slow's looks at the rule, us a dispatch
    compiled: dict = dataclasses.field(default_factory=dict, repr=False)  # (name, overrides) -> kernel, for reuse
    later: dict | None = None     # "deferred": tune()'s arguments for GpuBackend.retune to measure with

    def summary(self) -> dict:
        """Receipt-safe: counts and the choices, no adapter text."""
        return {"source": self.source, "reason": self.reason, "seconds": round(self.seconds, 3),
                "forms": len(self.forms), "cached": sum(bool(f.get("cached")) for f in self.forms.values()),
                "changed": len(self.choices), "step_us": dict(self.step_us),
                "settles": [list(s) for s in self.settles], "looks_us": list(self.looks_us),
                "choices": {form: choice.as_dict() for form, choice in sorted(self.choices.items())}}


def _agrees(y: np.ndarray, reference: np.ndarray, relative: float = CHECK_RELATIVE) -> bool:
    if not np.all(np.isfinite(y)):
        return False
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    return bool(np.all(np.abs(y - reference) <= relative * scale + 1e-30))


def _lowers(stage: Stage, key: str, ops: list, choice: matvec.Choice) -> bool:
    """Whether a cached choice is a launch this form has on this device: it lowers (the host's
    checks, no GPU work). A cache is untrusted; an edited or stale entry (a variant the form's
    encoding lacks, "xq2s" on a form without a norm) is measured afresh, not compiled."""
    stage.lowering.choices[key] = choice
    try:
        stage.lowering.lower(ops[0], "decode", 1, 0)
        return True
    except (matvec.MatvecShapeError, KernelError):
        return False
    finally:
        stage.lowering.choices.pop(key, None)


def _rule_choice(device, weights, op) -> matvec.Choice:
    name, overrides = matvec.choose_kernel(device, weights, input=op.option("input", "plain"),
                                           accumulate=bool(op.option("accumulate")))
    return matvec.Choice(matvec.variant_of(name), overrides["WG"], overrides["ROWS"])


async def tune(device, model, plan, buffers, *, cache: Mapping[str, dict] | None = None,
               device_identity: str = "", bundle_hash: str = "",
               checkpoint: Callable[[], Awaitable[None]] | None = None,
               budget_seconds: float = BUDGET_SECONDS, clock: Callable[[], float] = time.perf_counter,
               force: bool = False, int8: bool = True, pin_int8: str | None = None,
               measure: bool = True, position: int = 0, kernels: Mapping | None = None) -> TuningReport:
    """Measure the decode mat-vec forms of an admitted model's plan on `device` (its weights
    already in `buffers`); return the choices. `force` measures even on a slow adapter (tests).
    `int8`: q4, q4k, q6k and q8 forms may also take pre-quantized int8 activations where measured faster.
    `pin_int8` (a matvec_prequant.VARIANTS name): nothing timed; every form the pre-quantized
    path serves takes that variant (checked once against the rule like any choice), the rest
    keep the rule; no cache read or written. It is how the int8 numerics are judged on a whole
    model (`webslm conformance --matvec int8|int8-1`).
    `measure=False`: nothing timed; the cached forms take their entries, the others the rule,
    and when any was left the report is "deferred", `later` holding what a retune passes back.
    The activations and outputs the stage writes are the plan's own decode regions: nothing
    in them is live between steps. Its whole-step timing runs decode steps at `position` (< the
    cache's capacity), which write that row of every layer's KV cache: 0 at admission; a
    retune on a live session passes the first row its conversation does not hold, so the
    rows before it are kept (the next step overwrites that row). `kernels`: pipelines compiled
    already, by (name, sorted overrides) (a retune passes its session's: the rule's are there)."""
    began = clock()
    stage = Stage(device, model, plan, buffers, checkpoint, clock, position, kernels)
    forms = stage.forms()
    if pin_int8:
        return await _pinned_int8(stage, forms, began, pin_int8)
    report = TuningReport({}, {}, "measured")
    cache = cache or {}
    pending = []
    for key, ops in forms.items():
        cached = cache.get(cache_key(device_identity, bundle_hash, key, int8))
        try:
            choice = matvec.Choice.from_dict(cached["choice"]) if cached else None
        except (matvec.MatvecShapeError, TypeError, KeyError):
            choice = None
        if choice is not None and not _lowers(stage, key, ops, choice):
            choice = None                          # not a launch this form has here: measured afresh
        if cached and (choice is not None or cached.get("choice") is None):
            report.forms[key] = {**{k: v for k, v in cached.items() if k != "choice"}, "cached": True}
            if choice is not None:
                report.choices[key] = choice
        else:
            pending.append((key, ops))
    output_form = stage.output_form()
    output_key = cache_key(device_identity, bundle_hash, output_form, int8) if output_form else None
    if output_key in cache:        # the step's attention-output choice, measured on an earlier visit
        try:
            kept = cache[output_key].get("choice")
            if kept is not None and not attention_xq.OutputChoice.from_dict(kept).quantize:
                report.choices[attention_xq.CHOICE] = attention_xq.OutputChoice(False)
        except (attention.KvShapeError, AttributeError):
            pass                   # not a choice: the default (lowering's) until measured again
    if not pending:
        report.source = "cached"
    if not measure:
        if pending and not force and await _slow_adapter(stage, pending[0][1]):
            # Measuring would not pay later either (a software adapter keeps the rule), so
            # nothing is deferred: no retune runs beside the page's requests.
            await _prefill_attention(stage, report, cache, device_identity, bundle_hash, int8, force, measure=False)
            stage.release()
            report.source, report.reason = "rule", SLOW_REASON
            report.seconds = clock() - began
            report.looks_us = [round(seconds * 1e6, 1) for seconds in stage.looks]
            report.compiled = dict(stage.forward._compiled)
            return report
        return await _deferred(stage, report, pending, cache, began, device_identity=device_identity,
                         bundle_hash=bundle_hash, budget_seconds=budget_seconds, force=force, int8=int8)
    try:
        # First the rule's time of every form (its pipeline is compiled anyway), so that the
        # budget goes to the forms that cost the step most.
        rules = await _rule_times(stage, pending, force)
        if rules is None:                         # a slow adapter: the rule stands for every form
            report.source, report.reason = "rule", SLOW_REASON
            pending = []
        if checkpoint is not None:
            await checkpoint()
        await _prefill_attention(stage, report, cache, device_identity, bundle_hash, int8, force,
                                 measure=rules is not None)
        pending.sort(key=lambda item: -rules[item[0]][1] * len(item[1]))
        searches = {key: _FormSearch(stage, ops, *rules[key], int8, seed) for seed, (key, ops) in enumerate(pending)}
        deadline = began + budget_seconds
        for round_ in range(_FormSearch.ROUNDS):
            for search in searches.values():      # compile and check: the GPU mostly idle
                await search.prepare(round_, deadline)
                if checkpoint is not None:
                    await checkpoint()
            if any(search.ready for search in searches.values()):
                await stage.settle(_costliest(stage, pending))
                for search in searches.values():  # then time, back to back
                    await search.time_ready()
        if any(search.cut for search in searches.values()):
            report.reason = (f"budget of {budget_seconds} s spent: the forms that cost the step least "
                             f"were searched less or not at all")
        exact: dict[str, matvec.Choice | None] = {}      # form -> its best exact choice (None: the rule)
        searched = {key: search for key, search in searches.items() if search.searched}
        if searched:
            await stage.settle(_costliest(stage, pending))
        for key, search in searches.items():
            rule, rule_seconds = rules[key]
            if key not in searched:
                report.forms[key] = {"rule": rule.as_dict(), "rule_us": round(rule_seconds * 1e6, 2), "searched": False}
                continue
            finalists = search.finalists()
            form = search.finish(await _runoff(stage, search.ops, finalists) if len(finalists) > 1 else {})
            choice, exact[key] = form.pop("choice"), form.pop("exact")
            report.forms[key] = form
            if choice is not None:
                report.choices[key] = choice
        measured = {key for key, _ in pending if key in report.forms and "rule_us" in report.forms[key]}
        if any(report.choices.get(key) is not None and report.choices[key].variant in matvec_prequant.VARIANTS
               for key in measured):
            await _step_check(report, exact, lambda choices: stage.seconds_per_step(choices),
                              stage.quantizes_outputs)
            if "int8 unfused" in report.step_us and output_key is not None:
                output = report.choices.get(attention_xq.CHOICE)
                report.cache_entries[output_key] = {"step_us": dict(report.step_us),
                                                    "choice": output.as_dict() if output is not None else None}
        # Cached as finally chosen: a later admission takes them unmeasured. A form the budget
        # cut short is kept too (its entry says "cut"): else every visit would measure it again
        # and the budget would never reach the forms after it; a form never searched is not.
        for key in measured:
            if report.forms[key].get("searched", True):
                choice = report.choices.get(key)
                report.cache_entries[cache_key(device_identity, bundle_hash, key, int8)] = {
                    **report.forms[key], "choice": choice.as_dict() if choice is not None else None}
    finally:
        stage.release()           # also when a checkpoint stops admission here
    report.seconds = clock() - began
    report.settles = list(stage.settles)
    report.looks_us = [round(seconds * 1e6, 1) for seconds in stage.looks]
    report.compiled = dict(stage.forward._compiled)
    return report


async def _prefill_attention(stage: Stage, report: TuningReport, cache: Mapping[str, dict], device_identity: str,
                             bundle_hash: str, int8: bool, force: bool, measure: bool = True) -> None:
    """The prefill attention variant (tuning_attention.py), from the cache or (`measure`)
    measured; into the report's choices under attention.PREFILL_CHOICE when it is not the rule's."""
    form = tuning_attention.form_key(stage.lowering.shape)
    key = cache_key(device_identity, bundle_hash, form, int8)
    cached = cache.get(key)
    if cached is not None:
        try:
            choice = attention.PrefillChoice.from_dict(cached["choice"]) if cached.get("choice") is not None else None
        except (attention.KvShapeError, KeyError):
            cached = None                          # not a choice: measured afresh
    if cached is not None:
        report.forms[form] = {**{k: v for k, v in cached.items() if k != "choice"}, "cached": True}
    elif not measure:               # a slow adapter: the rule
        return
    else:
        choice, entry = await tuning_attention.measure(stage.device, stage.lowering.shape, stage.lowering.chunk,
                                                       stage.clock, NOISE, force)
        report.forms[form] = entry
        if entry.get("searched", True):
            report.source = "measured"
            report.cache_entries[key] = {**entry, "choice": choice.as_dict() if choice is not None else None}
    if choice is not None:
        report.choices[attention.PREFILL_CHOICE] = choice


async def _deferred(stage: Stage, report: TuningReport, pending: list, cache: Mapping[str, dict], began: float,
                    **arguments) -> TuningReport:
    """tune(measure=False): the cache's choices (the prefill attention's too), the rule for
    every form not cached; "deferred" when anything is left to measure."""
    await _prefill_attention(stage, report, cache, arguments["device_identity"], arguments["bundle_hash"],
                             arguments["int8"], arguments["force"], measure=False)
    stage.release()
    if pending or tuning_attention.form_key(stage.lowering.shape) not in report.forms:
        report.source = "deferred"
        report.reason = (f"{len(pending)} form(s) measured once the model is ready (GpuBackend.retune); "
                         f"the rule until then")
        report.later = arguments
    report.seconds = stage.clock() - began
    return report


async def _pinned_int8(stage: Stage, forms: dict[str, list], began: float, variant: str) -> TuningReport:
    """Every served form on the pre-quantized path (`variant`) at its second launch shape, if
    it agrees with the rule within the int8 tolerance (else the rule, counted as rejected)."""
    if variant not in matvec_prequant.VARIANTS:
        raise ValueError(f"pin_int8 must be one of {sorted(matvec_prequant.VARIANTS)}, not {variant!r}")
    report = TuningReport({}, {}, "pinned", f"int8 activations ({variant}) pinned on every form the "
                                            f"pre-quantized path serves")
    try:
        for key, ops in forms.items():
            weights = stage.lowering.matvec_form(ops[0])[1]
            rule = _rule_choice(stage.device, weights, ops[0])
            entry = {"rule": rule.as_dict(), "searched": False}
            if matvec_prequant.serves(stage.device, weights):
                stage.fill_inputs(ops)
                await stage.launches(ops, None)
                reference = await stage.output(ops)
                norm = ops[0].option("input") == "norm"       # "xq2s": norm forms; the others "xq2"
                pinned = matvec.Choice(variant if norm or variant not in matvec_prequant.SQUARES
                                       else matvec_prequant.VARIANT, *XQ_SHAPES[1])
                await stage.launches(ops, pinned)
                if _agrees(await stage.output(ops), reference, INT8_CHECK_RELATIVE[pinned.variant]):
                    report.choices[key] = pinned
                else:
                    entry["rejected"] = 1
                stage.lowering.choices.pop(key, None)
            report.forms[key] = entry
    finally:
        stage.release()
    report.seconds = stage.clock() - began
    report.compiled = dict(stage.forward._compiled)
    return report


async def _rule_times(stage: Stage, pending: list, force: bool) -> dict[str, tuple[matvec.Choice, float]] | None:
    """form -> (the rule's Choice, its seconds a dispatch): every rule compiled first, then
    timed in one burst after the clocks settle; None when a first look (4 dispatches and a
    round trip: cheap on any adapter) shows a slow adapter."""
    launched = {}
    for key, ops in pending:
        weights = stage.lowering.matvec_form(ops[0])[1]
        stage.fill_inputs(ops)                   # timed on random activations, as every shape is
        launched[key] = (_rule_choice(stage.device, weights, ops[0]), await stage.launches(ops, None))
        await stage.checkpoint_now()             # a compile a form: where a retune is stopped
        if not force and len(launched) == 1:
            dispatches = launched[key][1]
            one = dispatches[:len(dispatches) // len(ops)]
            if await timing.looks_slow(functools.partial(_look, stage, ops[:1] * 4, one * 4)):
                return None
    if pending:
        await stage.settle(_costliest(stage, pending))
    out = {}
    for key, ops in pending:
        dispatches = await stage.launches(ops, None)     # recorded again: params as the rule says
        out[key] = (launched[key][0], await stage.seconds_per_op(ops, dispatches))
        await stage.checkpoint_now()
    return out


async def _slow_adapter(stage: Stage, ops: list) -> bool:
    """Whether the rule of the form `ops` looks slow here (timing.looks_slow): a software
    adapter, where measuring cannot pay. Its pipeline is compiled for the look; admission takes
    it from the report (`compiled`)."""
    stage.fill_inputs(ops)
    dispatches = await stage.launches(ops, None)
    one = dispatches[:len(dispatches) // len(ops)]
    return await timing.looks_slow(functools.partial(_look, stage, ops[:1] * 4, one * 4))


async def _look(stage: Stage, ops: list, dispatches: list) -> float:
    """One look at a rule for timing.looks_slow: one submission's seconds a dispatch, kept in `looks`."""
    stage.looks.append(await stage.seconds_per_op(ops, dispatches, rounds=0))
    return stage.looks[-1]


def _costliest(stage: Stage, pending: list) -> list:
    """The ops of the form with the most weight bytes over its layers: what settle() runs (on
    the rule's launch) to wake the GPU's clocks before a timing burst."""
    def size(item):
        weights = stage.lowering.matvec_form(item[1][0])[1]
        return weights.rows * weights.cols * len(item[1])
    return max(pending, key=size)[1]


class _FormSearch:
    """One form's search, in rounds: each round's shapes are compiled and checked for every
    form first, then timed for every form in one burst on a GPU whose clocks have settled
    (Stage.settle). Measured on the H200: compiling between timings left the GPU idle most of
    the stage, its clocks low (a decode step timed there took 15.9 ms; 6.4 ms in the engine
    right after), and one form's rule measured 9.6 us in one admission and 20.8 in the next.
    And rounds, not each form's whole ladder in turn: the last order spent an 8B model's 4 s
    budget on its costliest form, and the other four kept their rule (158 tok/s, where all
    five measured gave 220). Round by round:

        round 0  the likeliest win: where the pre-quantized path serves the form, int8 at
                 XQ_SHAPES[1] (what won at every large form measured on the H200), for a norm
                 form in both of its ways to 1/rms ("xq2", "xq2s"); else ROWS in 1..16 at the
                 rule's WG
        round 1  the int8 ROWS ladder (XQ_SHAPES; a norm form's in both ways), then the exact
                 one (ROWS at the rule's WG)
        round 2  every sensible WG at the best ROWS, int8 and exact

    A shape the limits refuse is skipped; one that disagrees with the rule's output is
    rejected, never chosen. The form's inputs are written again (the same values) whenever a
    round checks its shapes: other forms' checks write the shared activation regions."""

    ROUNDS = 3

    def __init__(self, stage: Stage, ops: list, rule: matvec.Choice, rule_seconds: float, int8: bool, seed: int):
        self.stage, self.ops, self.rule, self.seed = stage, ops, rule, seed
        self.key, self.weights = stage.lowering.matvec_form(ops[0])
        self.int8 = int8 and matvec_prequant.serves(stage.device, self.weights)
        self.norm = ops[0].option("input") == "norm"     # may take "xq2s" (matvec_prequant.SQUARES)
        self.times: dict[matvec.Choice, float] = {rule: rule_seconds}
        self.refused: list = []
        self.rejected: list = []
        self.ready: list[matvec.Choice] = []     # compiled and checked, not yet timed
        self.reference: np.ndarray | None = None
        self.cut = False                          # the budget ended it before its last round did

    def candidates(self, round_: int) -> list[tuple[matvec.Choice, float]]:
        """Round `round_`'s shapes with the check's tolerance (rounds 2 read the times so far)."""
        rule = self.rule
        variants = [matvec_prequant.VARIANT] + (sorted(matvec_prequant.SQUARES) if self.norm else [])
        xq = [[(matvec.Choice(variant, wg, rows), INT8_CHECK_RELATIVE[variant]) for wg, rows in XQ_SHAPES]
              for variant in variants]
        rows_ladder = [(dataclasses.replace(rule, rows=rows), CHECK_RELATIVE) for rows in matvec.ROWS_PER_WORKGROUP]
        if round_ == 0:
            return [ladder[1] for ladder in xq] if self.int8 else rows_ladder
        if round_ == 1:
            return ([shape for ladder in xq for shape in ladder] + rows_ladder) if self.int8 else []
        out = []
        for int8 in (True, False):
            best = self._best(int8)               # None: no int8 shape passed (or none served)
            for workgroup in matvec.workgroup_candidates(self.stage.device, self.weights, best.rows) if best else ():
                out.append((dataclasses.replace(best, workgroup=workgroup),
                            INT8_CHECK_RELATIVE[best.variant] if int8 else CHECK_RELATIVE))
        return out

    def _best(self, int8: bool) -> matvec.Choice | None:
        timed = {c: t for c, t in self.times.items() if (c.variant in matvec_prequant.VARIANTS) == int8}
        return min(timed, key=timed.get) if timed else None

    async def prepare(self, round_: int, deadline: float) -> None:
        """Compile and check the round's new shapes until the deadline (then the search is cut)."""
        todo = [(c, r) for c, r in self.candidates(round_)
                if c not in self.times and c not in self.refused and c not in self.rejected]
        if not todo:
            return
        self.stage.fill_inputs(self.ops, self.seed)
        if self.reference is None:
            self.stage.lowering.choices.pop(self.key, None)
            self.reference = await self.stage.output(self.ops)
        for choice, relative in todo:
            if self.stage.clock() > deadline:
                self.cut = True
                return
            await self._check(choice, relative)

    async def _check(self, choice: matvec.Choice, relative: float) -> None:
        if choice in self.ready:
            return
        try:
            await self.stage.launches(self.ops, choice)          # compiles the shape's kernels
        except matvec.MatvecShapeError:
            self.refused.append(choice)           # the device's limits refuse this shape
            return
        if not _agrees(await self.stage.output(self.ops), self.reference, relative):
            self.rejected.append(choice)
            return
        self.ready.append(choice)

    async def time_ready(self) -> None:
        """Time the shapes checked since the last burst (each recorded again: the launches
        share the ops' params slots, which a choice may change)."""
        for choice in list(self.ready):
            dispatches = await self.stage.launches(self.ops, choice)
            self.times[choice] = await self.stage.seconds_per_op(self.ops, dispatches)
            self.ready.remove(choice)
            await self.stage.checkpoint_now()

    @property
    def searched(self) -> bool:
        return len(self.times) + len(self.refused) + len(self.rejected) > 1

    def finalists(self) -> list[matvec.Choice]:
        """The rule, the best exact shape and the best int8 shape, for the runoff."""
        return [self.rule] + [c for c in (self._best(False), self._best(True)) if c is not None and c != self.rule]

    def finish(self, runoff: dict) -> dict:
        """The choice, from the runoff's times (the finalists timed again side by side:
        whatever was timed last in the rounds was favoured by clocks still moving). A shape must
        beat the rule by NOISE; int8 must beat the exact choice by NOISE."""
        best, fastest_int8 = self._best(False), self._best(True)     # the finalists: chosen among them only
        times, rule = self.times, self.rule
        times.update(runoff)
        chosen = best if best != rule and times[best] < (1 - NOISE) * times[rule] else rule
        exact_choice = chosen
        if fastest_int8 is not None and times[fastest_int8] < (1 - NOISE) * times[chosen]:
            chosen = fastest_int8
        self.stage.lowering.choices.pop(self.key, None)
        return {"rule": rule.as_dict(), "rule_us": round(times[rule] * 1e6, 2),
                "chosen_us": round(times[chosen] * 1e6, 2), "tried": len(times), "refused": len(self.refused),
                "rejected": len(self.rejected), **({"cut": True} if self.cut else {}),
                "choice": chosen if chosen != rule else None, "exact": exact_choice if exact_choice != rule else None}


STEP_GAIN = 0.03               # the whole step with int8 forms must be this much faster than without


async def _step_check(report: TuningReport, exact: Mapping[str, matvec.Choice | None],
                      seconds_per_step: Callable[[dict], Awaitable[float]],
                      quantizes_outputs: Callable[[dict], bool] = lambda choices: False) -> None:
    """Keep the int8 choices only if the whole decode step is faster with them. Each int8
    form was timed alone, its quantizer and mat-vec as dependent dispatches; in the step its
    extra dispatch can cost more than that shows. Measured on the H200: SmolLM2's shape kept
    one or two forms on int8 and its step was 5-10% slower. The two steps (every choice, and
    the int8 forms on their best exact choice) are timed in pairs of rounds, forward and
    reversed (as the runoff); if the int8 step does not win by STEP_GAIN, the int8 forms go
    back to their exact choice and the report says so.
    Where a launch would quantize another op's input in the int8 step (`quantizes_outputs`:
    decode attention for o, quantize-into-attention, kernels/attention_xq.py; a mat-vec for its
    readers, quantize-into-matmul, kernels/matvec_quantize_out.py), that step is also timed with
    the separate quantize_x launches instead ("int8 unfused"), and the faster is the int8 step:
    where it is the unfused one, attention_xq.CHOICE says so among the choices.
    Where a norm-input form took "xq2" and its readers' producers could quantize for it on
    "xq2s" (quantize-into-matmul, kernels/matvec_quantize_out.py, which needs the norm from the
    units' squares), the step with those forms on "xq2s" is timed too ("int8 squares"): each
    form alone does not show the launch its producer then saves."""
    keys = [key for key, choice in report.choices.items()
            if isinstance(choice, matvec.Choice) and choice.variant in matvec_prequant.VARIANTS]
    with_int8 = {key: choice for key, choice in report.choices.items() if key != attention_xq.CHOICE}
    without = {key: choice for key, choice in with_int8.items() if key not in keys}
    without |= {key: exact[key] for key in keys if exact.get(key) is not None}
    steps = {"int8": with_int8, "exact": without}
    squares = _on_squares(with_int8)
    if squares != with_int8 and quantizes_outputs(squares):
        steps["int8 squares"] = squares
    if quantizes_outputs(with_int8):
        steps["int8 unfused"] = with_int8 | {attention_xq.CHOICE: attention_xq.OutputChoice(False)}
    times = dict(zip(steps, await timing.alternating([lambda c=c: seconds_per_step(c) for c in steps.values()])))
    report.step_us = {name: round(seconds * 1e6, 1) for name, seconds in times.items()}
    fastest = min((name for name in times if name != "exact"), key=lambda name: times[name])
    report.choices = dict(steps[fastest])
    step_int8, step_exact = times[fastest], times["exact"]
    if step_int8 >= (1 - STEP_GAIN) * step_exact:
        report.choices = without
        for key in keys:
            report.forms[key]["step_dropped"] = True
        dropped = (f"int8 forms dropped: the decode step took {step_int8 * 1e6:.0f} us with them, "
                   f"{step_exact * 1e6:.0f} us without")
        report.reason = f"{report.reason}; {dropped}" if report.reason else dropped   # a spent budget stays said


def _on_squares(choices: dict) -> dict:
    """`choices` with every norm-input form on two-byte int8 activations ("xq2") moved to the
    same launch on "xq2s" (its 1/rms from the units' squares: matvec_prequant.SQUARES)."""
    squares = next(iter(matvec_prequant.SQUARES))
    return {key: dataclasses.replace(choice, variant=squares)
            if isinstance(choice, matvec.Choice) and choice.variant == matvec_prequant.VARIANT
            and key.split()[2] == "norm" else choice
            for key, choice in choices.items()}


async def _runoff(stage: Stage, ops: list, finalists: list) -> dict:
    """Seconds per op of each finalist (the first is the rule), timed in turn
    (timing.alternating). Each round records its finalist again: the launches share the ops'
    params slots, which a choice may change (Stage._write_params)."""
    def contender(choice):
        async def one_round() -> float:
            await stage.checkpoint_now()
            dispatches = await stage.launches(ops, choice)
            return await stage.seconds_per_op(ops, dispatches, rounds=1)
        return one_round
    seconds = await timing.alternating([contender(None if i == 0 else c) for i, c in enumerate(finalists)])
    return dict(zip(finalists, seconds))
