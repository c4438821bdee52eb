"""Admission `tiny-gpu-admission-v1`: the one way a model gets onto a GPU.

A model may run on a GPU only after this transaction has proved, on this device, that it
fits and computes correctly. It is the design report's 16 steps (../shared/seeds/
webgpu-backend-design-report.txt, "Admission"), grouped into named stages; a failure at any
stage is an `AdmissionFailure(stage, code)` and leaves nothing allocated:

    entry-point   1  the WebGPU entry point exists (navigator.gpu / wgpu-native)
    artifact      2  the model is a validated artifact (webslm.open_model / the worker's loader)
    derive        3  requirements and the pipeline set, from the manifest alone
    adapter       4-5  one adapter of the policy's feature level; a fallback only if allowed
    tier          6  features and limits compared; the tier chosen; the memory plan made for
                     these limits (a tensor too large for a binding is split or rejected)
    device        7  a device with exactly the chosen features and the plan's limits
    handlers      8  device.lost and uncaptured-error handlers and the epoch, at once
    allocate      9-10  error scopes pushed; every planned buffer created, weights uploaded in
                     the plan's bounded chunks (no probing loops); the scopes popped and checked here,
                     then pushed again around tuning, compilation and the self-tests
    step-floor    (ours) on a software (fallback) adapter, given a step to beat (the engine's CPU
                     estimate, max_step_seconds): a lower bound of the decode step measured on one
                     pipeline (backends/gpu/step_floor.py); past the limit, "gpu-slower" before the
                     other pipelines are compiled (SwiftShader: 31.5 s of compiles)
    tune          (ours) the decode mat-vecs timed in a few launch shapes on the uploaded
                     weights, the fastest kept (backends/gpu/tuning.py); cached per adapter;
                     with tune_later, the cache only, the rest measured after (retune.py)
    compile       11  every mandatory pipeline compiled asynchronously from trusted WGSL
    self-test     12-13  the kernel golden suite (size "quick") against the numpy oracle, on the
                         kernels the plan runs, attention up to the plan's KV capacity; one no
                         case ran fails admission; a failure on an adapter that stops long
                         shader loops early (kernels/probe.py loop_limit) is "loop-limit"
    scopes        14  the error scopes popped: any captured or uncaptured error rejects
    publish       15  atomic: epoch current, device alive, every resource present
                  16  the privacy-minimized receipt (admission/receipt.py)

Between stages a checkpoint notices cancellation (the caller's `Cancel`) and device loss
(the lost promise), so neither can be missed while a long step runs.

Where this departs from the report, and why:
- Tier choice: every kernel has a tier-A variant, so "the lowest tier that satisfies the
  model" would always be A and never use f16 or subgroups. We take the highest tier the
  adapter offers among those the policy allows (`AdmissionPolicy.tiers`), and
  `min_tier` rejects adapters below what a policy demands. The self-tests then run the
  variants the plan compiled (subgroup ones included on tier C), so a broken subgroup path
  fails admission, and a variant the model never runs costs no time.
- Step 2 is done before admission (the validator streams the file); admission checks that
  it receives a validated model and does not re-validate bytes.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from ..errors import CodedError
from ..webgpu.adapters import choose_adapter, tier_for
from ..webgpu.interface import DeviceRequestError, Gpu, PipelineError
from .tracked import Faults, TrackedDevice

STAGES = ("entry-point", "artifact", "derive", "adapter", "tier", "device", "handlers",
          "allocate", "step-floor", "tune", "compile", "self-test", "scopes", "publish")
TUNING_MODES = ("auto", "off", "force", "int8", "int8-1", "int8-s")
PINNED_INT8 = {"int8": "xq2", "int8-1": "xq", "int8-s": "xq2s"}   # tuning mode -> the pre-quantized variant it pins
TIER_ORDER = ("A", "B", "C")
COMPILE_AT_ONCE = 16            # pipeline compiles in flight together in the compile stage
TIER_FEATURE = {"B": "shader-f16", "C": "subgroups"}


class AdmissionFailure(CodedError):
    """Admission stopped at `stage` for `code`; nothing it allocated is left."""

    def __init__(self, stage: str, code: str, sentence: str):
        super().__init__(code, stage, sentence)
        self.stage = stage
        self.receipt = None          # the failure receipt, attached before it is raised
        self.leaked_buffers = 0      # buffers still alive after cleanup (must be 0)
        self.step_floor_s = None     # "gpu-slower" at the step-floor stage: the GPU step's lower bound


class Cancel:
    """The caller's cancellation flag, checked at every stage boundary."""

    def __init__(self):
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclasses.dataclass(frozen=True)
class AdmissionPolicy:
    feature_level: str = "auto"             # "auto" | "core" | "compatibility"
    tiers: tuple[str, ...] = ("A", "B", "C")  # tiers the policy allows
    min_tier: str = "A"                     # reject an adapter that cannot reach this tier
    allow_fallback: bool = True             # a software adapter (SwiftShader) may be admitted
    self_test_size: str = "quick"
    context: int | None = None              # KV capacity in tokens (None: the planner's default)
    kv_dtype: str | None = None             # "f32" | "f16" (None: f16 when the tier has it)
    fusions: tuple[str, ...] | None = None  # program/fusion.py rules (None: its DEFAULT; (): the reference program)
    prefill_chunk: int | None = None        # tokens per prefill submit (None: the planner's default)
    tuning: str = "auto"                    # mat-vec launch shapes: "auto" measure (not on a software
                                            # adapter), "off" the rule, "force" measure anyway (tests),
                                            # "int8" ("int8-1") every form the pre-quantized path serves
                                            # on two (one) byte activations, unmeasured (their numerics
                                            # on a model: `webslm conformance --matvec`); "int8-s" as
                                            # "int8" with the norm forms' 1/rms from the units' squares
    tuning_budget_s: float = 4.0            # the tuning stage's time; forms not reached keep the rule
    tune_later: bool = False                # measure once the model is ready (GpuBackend.retune), not
                                            # here: the cache's results and the rule until then
                                            # (admission/retune.py; the worker's admit tuning "later")
    max_step_seconds: float | None = None   # the engine's CPU decode step (engine/choice.py): on a
                                            # software adapter whose step cannot beat it, "gpu-slower"
                                            # at the step-floor stage, before compiling
    int8_activations: bool = True           # tuning may give q4 mat-vecs int8 activations where measured
                                            # faster (llama.cpp's mat-vec numerics); False: all exact


@dataclasses.dataclass
class AdmittedGpuSession:
    """What admission publishes: the device, its tier, the plan, the live resources."""
    device: TrackedDevice
    tier: str
    features: tuple[str, ...]
    feature_level: str
    plan: Any
    buffers: dict[str, Any]
    pipelines: dict[str, Any]      # PipelineKey digest -> compiled kernel (admission/pipeline_key.py)
    self_test: dict
    receipt: Any
    seconds: dict[str, float]
    epoch: int
    kernels: dict = dataclasses.field(default_factory=dict)   # (name, sorted overrides) -> the same kernels
    tuning: Any = None             # backends/gpu/tuning.TuningReport: the measured mat-vec choices
    step_floor_s: float | None = None   # the step-floor stage's lower bound of a decode step

    @property
    def choices(self) -> dict:
        """matvec.form_key -> matvec.Choice: the launch shapes the session's lowering uses."""
        return dict(self.tuning.choices) if self.tuning is not None else {}

    def destroy(self) -> None:
        # The device first: it runs down what the session queued (natively, steps encoded ahead
        # are submitted, not dropped) while its buffers still exist; destroying it destroys them.
        self.device.destroy()
        for buffer in self.buffers.values():
            self.device.destroy_buffer(buffer)
        self.buffers.clear()


_epochs = iter(range(1, 1 << 62))


def choose_tier(offered: frozenset[str], policy: AdmissionPolicy) -> tuple[str, tuple[str, ...]]:
    """(tier, features to request): the highest allowed tier whose features the adapter has.
    B needs shader-f16, C needs subgroups; C also takes shader-f16 when it is there."""
    features = tuple(sorted(TIER_FEATURE[t] for t in ("B", "C")
                            if t in policy.tiers and TIER_FEATURE[t] in offered))
    return tier_for(features), features


async def admit(gpu: Gpu | None, model, policy: AdmissionPolicy = AdmissionPolicy(), *,
                faults: Faults = Faults(), cancel: Cancel | None = None,
                user_agent: str = "native", on_stage=None, on_progress=None,
                tuning_cache: dict | None = None) -> AdmittedGpuSession:
    """Run the transaction; return the published session or raise AdmissionFailure.

    on_stage(stage) is called as each stage begins; on_progress(stage, done, total) within
    the long ones: "allocate" (weight bytes uploaded), "compile" (pipelines compiled) and
    "self-test" (kernel families checked); "step-floor" (0 of 1, then 1 of 1) only where that
    stage runs (on a software adapter given a step to beat); "tune" (under a second where it
    measures, its pipelines are then not compiled again) reports only its start.
    `tuning_cache` (untrusted, the caller's): earlier tuning results by tuning_cache.cache_key; the
    new ones are in the session's `tuning.cache_entries` for the caller to keep."""
    if policy.tuning not in TUNING_MODES:
        raise ValueError(f"AdmissionPolicy.tuning must be one of {TUNING_MODES}, not {policy.tuning!r}")
    run = _Admission(gpu, model, policy, faults, cancel or Cancel(), user_agent, on_stage, on_progress)
    run.tuning_cache = tuning_cache
    return await run.run()


class _Admission:
    def __init__(self, gpu, model, policy, faults, cancel, user_agent, on_stage, on_progress):
        self.gpu, self.model, self.policy, self.faults = gpu, model, policy, faults
        self.cancel, self.user_agent, self.on_stage = cancel, user_agent, on_stage
        self.on_progress = on_progress or (lambda stage, done, total: None)
        self.stage = "entry-point"
        self.device: TrackedDevice | None = None
        self.adapter = None
        self.buffers: dict[str, Any] = {}
        self.lost_task = None
        self.errors: list = []
        self.scopes_pushed = 0
        self.seconds: dict[str, float] = {}
        self.stage_started: float | None = None
        self.step_floor_s: float | None = None    # the step-floor stage's lower bound, where it ran
        self.tier, self.features, self.plan = None, (), None
        self.device_limits: dict[str, int] = {}   # what the device was created with (for the receipt)
        self.tuning_cache: dict | None = None

    # -- the transaction ---------------------------------------------------------------------
    async def run(self) -> AdmittedGpuSession:
        try:
            return await self._stages()
        except AdmissionFailure as failure:
            failure.leaked_buffers = await self._release()
            failure.receipt = self._receipt(failure.code, failure.stage)
            raise
        except Exception as exc:           # a bug or an unexpected platform error: still typed
            failure = AdmissionFailure(self.stage, "internal-error", f"{type(exc).__name__}: {exc}")
            failure.leaked_buffers = await self._release()
            failure.receipt = self._receipt(failure.code, failure.stage)
            raise failure from exc

    async def _stages(self) -> AdmittedGpuSession:
        from ..kernels import golden
        from ..kernels.registry import KERNELS
        from . import pipelines as pipeline_set
        from .pipeline_key import pipeline_key

        await self._enter("entry-point")
        if self.gpu is None:
            self._fail("no-webgpu", "this environment has no WebGPU entry point (navigator.gpu is "
                                    "missing): the model runs on the CPU path")

        await self._enter("artifact")
        identity = getattr(self.model, "identity", None)
        if identity is None or not hasattr(self.model, "manifest"):
            self._fail("not-validated", "admission takes only a validated model (webslm.open_model)")

        await self._enter("derive")
        reason = pipeline_set.unsupported(self.model.manifest)
        if reason:
            self._fail("unsupported-model", f"the GPU path cannot run this model: {reason}")

        await self._enter("adapter")
        self.adapter = await choose_adapter(self.gpu, self.policy.feature_level)
        if self.adapter is None:
            self._fail("no-adapter", "the browser offers no WebGPU adapter")
        summary = self.adapter.summary()
        if summary.is_fallback and not self.policy.allow_fallback:
            self._fail("fallback-disallowed", "only a software fallback adapter is available and the "
                                              "policy does not admit one")

        await self._enter("tier")
        offered = frozenset(self.adapter.features) - self.faults.hide_features
        limits = {**self.adapter.limits, **self.faults.limit_overrides}
        self.tier, self.features = choose_tier(offered, self.policy)
        min_tier = max(self.policy.min_tier, self.faults.require_tier or "A", key=TIER_ORDER.index)
        if TIER_ORDER.index(self.tier) < TIER_ORDER.index(min_tier):
            needed = [TIER_FEATURE[t] for t in TIER_ORDER[1:TIER_ORDER.index(min_tier) + 1]]
            self._fail("missing-feature", f"the policy needs tier {min_tier} "
                                          f"({', '.join(needed)}); the adapter offers tier {self.tier}")
        self.plan = self._plan(limits)
        device_limits = pipeline_set.device_limits(self.plan, limits, self.adapter.feature_level)

        await self._enter("device")
        try:
            inner = await self.adapter.request_device(self.features, device_limits)
        except DeviceRequestError as exc:
            self._fail("device-request-failed", f"the adapter refused the device: {exc}")
        self.device = TrackedDevice(inner, self.faults)
        self.device_limits = dict(self.device.limits)

        await self._enter("handlers")
        self.lost_task = asyncio.ensure_future(self.device.lost())
        self.device.on_uncaptured_error(self.errors.append)
        epoch = next(_epochs)

        await self._enter("allocate")
        self._push_scopes()
        await self._allocate()
        allocation_errors = await self._pop_scopes()     # an allocation failure is named here,
        if allocation_errors:                            # not after minutes of self-tests
            kind = allocation_errors[0].kind
            self._fail("out-of-memory" if kind == "out-of-memory" else "allocation-failed",
                       f"creating the planned buffers failed ({kind} error)")
        self._push_scopes()                              # tune, compile and self-test run in scopes too

        await self._enter("step-floor")
        early = await self._step_floor()

        await self._enter("tune")
        tuning = await self._tune()
        compiled_before = {**early, **tuning.compiled}     # (the step-floor and tuning stages compiled these)

        await self._enter("compile")
        pipelines, kernels = {}, {}      # PipelineKey digest (and name + overrides) -> compiled kernel
        key_facts = self._pipeline_key_facts()
        mandatory = pipeline_set.pipelines(self.model, self.device, self.plan, tuning.choices)
        # COMPILE_AT_ONCE compiles in flight together: the browser's createComputePipelineAsync
        # and the native device (worker threads) compile them in parallel, where one after
        # another a first visit's cold driver cache cost 3-4.5 s on the H200.
        slots, done = asyncio.Semaphore(COMPILE_AT_ONCE), 0

        async def compile_one(name: str, overrides: dict):
            nonlocal done
            compiled = compiled_before.get((name, tuple(sorted(overrides.items()))))
            if compiled is None:
                async with slots:
                    compiled = await pipeline_set.compile(self.device, name, overrides)
            done += 1
            self.on_progress("compile", done, len(mandatory))
            return compiled
        try:
            compiled_all = await asyncio.gather(*(compile_one(name, overrides) for name, overrides in mandatory))
        except PipelineError as exc:
            self._fail("pipeline-failed", f"a mandatory pipeline did not compile: {exc}")
        for (name, overrides), compiled in zip(mandatory, compiled_all):
            key = pipeline_key(KERNELS[name], overrides, **key_facts)
            pipelines[key.digest()] = kernels[(name, tuple(sorted(overrides.items())))] = compiled
        await self._checkpoint()

        await self._enter("self-test")
        # The golden cases of the kernels the plan runs (not of every variant the device could):
        # what admission vouches for is this model's step, and the rest only costs time.
        report = await golden.run_all(self.device, self.policy.self_test_size, kernels={name for name, _ in mandatory},
                                      compiled=kernels,
                                      positions=self.plan.as_dict()["policy"]["context_capacity"],
                                      on_family=lambda done, total: self.on_progress("self-test", done, total))
        if not report["passed"]:
            first = report["failed"][0] if report["failed"] else {}
            failed = (f"{len(report['failed'])} of {report['cases']} kernel self-tests disagree with the CPU "
                      f"oracle (first: {first.get('kernel')} on {first.get('case')})")
            limit = await self._loop_limit(report["failed"])
            if limit is not None:
                capacity = self.plan.as_dict()["policy"]["context_capacity"]
                self._fail("loop-limit", f"this adapter stops a shader's loops after {limit} iterations (a "
                                         f"software renderer's limit), and {failed}: a KV capacity below "
                                         f"{capacity} positions may pass (AdmissionPolicy.context)")
            self._fail("self-test-failed", failed)
        untested = sorted({name for name, _ in mandatory} - golden.tested_kernels(report))
        if untested:
            self._fail("self-test-incomplete", f"no self-test ran the planned kernel(s) {', '.join(untested)}")
        if report["untested_pipelines"]:
            self._fail("self-test-incomplete", f"no self-test ran the planned pipeline(s) "
                                               f"{', '.join(report['untested_pipelines'][:3])}")
        self_test = {"cases": report["cases"], "families": sorted(report["families"]),
                     "size": report["size"], "kernels": report["kernels"],
                     # seconds each family took (they run concurrently): where the stage's time goes
                     "family_seconds": {name: f["seconds"] for name, f in report["families"].items()}}

        await self._enter("scopes")
        captured = await self._pop_scopes() + self.errors
        if captured:
            kind = "out-of-memory" if any(e.kind == "out-of-memory" for e in captured) else "gpu-error"
            self._fail(kind, f"the GPU reported {len(captured)} error(s) during admission "
                             f"({captured[0].kind})")

        await self._enter("publish")
        missing = [name for name, buffer in self.buffers.items() if buffer is None]
        if missing:
            self._fail("resource-missing", f"planned buffers missing: {missing[:3]}")
        session = AdmittedGpuSession(
            device=self.device, tier=self.tier, features=self.features,
            feature_level=self.adapter.feature_level, plan=self.plan, buffers=self.buffers,
            pipelines=pipelines, self_test=self_test, receipt=self._receipt("admitted", None),
            seconds=self.seconds, epoch=epoch, kernels=kernels, tuning=tuning, step_floor_s=self.step_floor_s)
        tuning.compiled = {}             # the session holds the kernels it uses; drop the rest
        self.device = None          # ownership moves to the session: nothing to release
        return session

    # -- stages' helpers ---------------------------------------------------------------------
    async def _enter(self, stage: str) -> None:
        """Close the previous stage's clock, then run the checkpoint for the new one."""
        now = time.perf_counter()
        if self.stage_started is not None:
            self.seconds[self.stage] = round(now - self.stage_started, 4)
        self.stage_started = now
        self.stage = stage
        if self.on_stage is not None:
            self.on_stage(stage)
        if self.faults.cancel_at == stage:
            self.cancel.cancel()
        if self.faults.lose_device_at == stage and self.device is not None:
            self.device.inner.destroy()           # as a driver reset would
        await self._checkpoint()

    async def _checkpoint(self) -> None:
        if self.cancel.cancelled:
            self._fail("cancelled", "admission was cancelled")
        if self.lost_task is not None:
            if not self.lost_task.done():
                await asyncio.sleep(0)            # let a pending lost notification arrive
            if self.faults.lose_device_at == self.stage and not self.lost_task.done():
                await asyncio.wait([self.lost_task], timeout=1.0)
            if self.lost_task.done():
                self._fail("device-lost", "the GPU device was lost during admission")

    def _pipeline_key_facts(self) -> dict:
        """Everything but the kernel that goes into each PipelineKey on this device."""
        from .pipeline_key import native_backend_class, tensor_layout_profile_hash
        from .receipt import browser_engine_bucket
        native = self.user_agent in (None, "native")
        api = None
        if native:      # "llvmpipe (LLVM 15) (Vulkan, CPU)": the coarse API only, kept local
            api = self.adapter.summary().description.rsplit("(", 1)[-1].split(",")[0]
        return {"device_features": self.features, "device_limits": self.device_limits,
                "feature_level": self.adapter.feature_level,
                "browser_bucket": browser_engine_bucket(None if native else self.user_agent),
                "backend_class": native_backend_class(api),
                "tensor_layout_hash": tensor_layout_profile_hash(self.model.manifest.tensors.values()),
                "implicit_enables": frozenset(self.device.implicit_wgsl_enables)}

    def _push_scopes(self) -> None:
        for scope in ("out-of-memory", "validation"):
            self.device.push_error_scope(scope)
            self.scopes_pushed += 1

    async def _pop_scopes(self) -> list:
        captured = []
        while self.scopes_pushed:
            error = await self.device.pop_error_scope()
            self.scopes_pushed -= 1
            if error is not None:
                captured.append(error)
        return captured

    async def _loop_limit(self, failed: list[dict]) -> int | None:
        """Why the self-test failed, when it is this: the iterations the adapter lets a shader's
        loops run (kernels/probe.py loop_limit), asked only when every failed case is one at the
        plan's KV capacity (the longest loops); None otherwise, when the adapter runs every
        loop, or when the probe cannot say."""
        from ..kernels.attention_cases import AT_CAPACITY
        from ..kernels.probe import loop_limit
        from ..kernels.registry import KernelError
        from ..kernels.runner import KernelRunError
        if not failed or not all(str(case.get("case", "")).startswith(AT_CAPACITY) for case in failed):
            return None
        try:
            return await loop_limit(self.device)
        except (KernelError, KernelRunError, PipelineError):   # the probe only words the failure
            return None

    def _fail(self, code: str, sentence: str):
        raise AdmissionFailure(self.stage, code, sentence)

    def _plan(self, limits: dict[str, int]):
        from ..plan import PlanPolicy, PlanRejected, plan_memory
        kv_dtype = self.policy.kv_dtype or ("f16" if "shader-f16" in self.features else "f32")
        settings = {"kv_dtype": kv_dtype, "fusions": self.policy.fusions}
        if self.policy.prefill_chunk is not None:
            settings["prefill_chunk"] = self.policy.prefill_chunk
        if self.policy.context:
            settings["context_capacity"] = min(self.policy.context, self.model.manifest.architecture.context_length)
        try:
            return plan_memory(self.model.manifest, limits, PlanPolicy(**settings))
        except PlanRejected as exc:
            self._fail("limit-too-small", f"the model does not fit this adapter's limits: {exc.sentence}")

    async def _step_floor(self) -> dict:
        """The step-floor stage: on a software adapter with a step to beat, the step's lower bound
        (step_floor) against policy.max_step_seconds; the pipelines it compiled. A bound past
        it fails admission ("gpu-slower"; the failure carries `step_floor_s`)."""
        limit = self.policy.max_step_seconds
        if limit is None or not self.adapter.summary().is_fallback:
            return {}
        from ..backends.gpu.step_floor import step_floor
        self.on_progress("step-floor", 0, 1)          # it runs (the page shows the step only then)
        floor = await step_floor(self.device, self.model, self.plan, self.buffers, beat=limit)
        self.step_floor_s = floor.seconds
        self.on_progress("step-floor", 1, 1)
        if floor.seconds > limit:
            failure = AdmissionFailure(self.stage, "gpu-slower", (
                f"a decode step here takes at least {floor.seconds:.2f} s (the software adapter's "
                f"{floor.what}), more than the CPU path's {limit:.2f} s: the step's other pipelines "
                f"were not compiled"))
            failure.step_floor_s = floor.seconds
            raise failure
        return floor.compiled

    async def _tune(self):
        """The tuning stage (backends/gpu/tuning.py): the rule where the policy says "off"."""
        from ..backends.gpu import tuning
        from ..shader_bundle import bundle_hash
        if self.policy.tuning == "off":
            return tuning.TuningReport({}, {}, "off", "the admission policy turned tuning off")
        summary = self.adapter.summary()
        if summary.is_fallback and self.policy.tuning == "auto":
            return tuning.TuningReport({}, {}, "rule", "a software (fallback) adapter: measuring cannot pay")
        identity = "/".join([summary.description, summary.vendor, summary.architecture, *self.features])
        return await tuning.tune(self.device, self.model, self.plan, self.buffers, cache=self.tuning_cache,
                                 device_identity=identity, bundle_hash=bundle_hash(),
                                 checkpoint=self._checkpoint, force=self.policy.tuning == "force",
                                 budget_seconds=self.policy.tuning_budget_s, int8=self.policy.int8_activations,
                                 pin_int8=PINNED_INT8.get(self.policy.tuning),
                                 measure=not self.policy.tune_later)

    async def _allocate(self) -> None:
        from . import pipelines as pipeline_set
        buffers = list(pipeline_set.planned_buffers(self.plan))
        total = sum(region.source["length"] for *_, contents in buffers for region in contents)
        uploaded = 0
        for name, size, usage, contents in buffers:
            buffer = self.device.create_buffer(size, usage, name)
            self.buffers[name] = buffer
            for offset, chunk in pipeline_set.contents_chunks(self.model, contents, self.plan.upload_chunk):
                self.device.write_buffer(buffer, offset, chunk)
                uploaded = min(total, uploaded + chunk.size)     # the last piece carries padding
                self.on_progress("allocate", uploaded, total)
            await self._checkpoint()

    async def _release(self) -> int:
        """Destroy what this admission created; return how many buffers are still alive."""
        if self.device is None:
            return 0
        for buffer in self.buffers.values():
            self.device.destroy_buffer(buffer)
        self.buffers.clear()
        leaked = len(self.device.live_buffers)
        self.device.destroy()
        if self.lost_task is not None and not self.lost_task.done():
            self.lost_task.cancel()
        self.device = None
        return leaked

    def _receipt(self, outcome: str, stage: str | None):
        from .receipt import build_receipt
        summary = self.adapter.summary() if self.adapter is not None else None
        return build_receipt(
            adapter=summary, user_agent=self.user_agent, requested_features=self.features,
            limits=self.device_limits, outcome=outcome,
            model=self.model if getattr(self.model, "identity", None) is not None else None,
            failure_stage=stage, feature_level=summary.feature_level if summary else None)
