"""Choices measured after admission, taken into the admitted session under admission's rules.

AdmissionPolicy.tune_later (the worker's admit `tuning: "later"`) admits a model on the cached tuning
results and the rule for the rest, so that a first visit on a device is not kept waiting for
the tuning stage's compiles (2-7 s on the H200). The executor measures those forms once the
model is ready (GpuBackend.retune, between answers). What it measured may use pipelines the
admission never compiled nor self-tested (a pre-quantized mat-vec where the rule used an exact
one, or another launch shape of a tested kernel): `adopt` runs their golden self-tests, as
admission does, on those very pipelines, before the session takes the choices. (A choice the
stage measured was also checked against the rule's output on the model's own weights,
tuning.py.)
"""
from __future__ import annotations

from ..errors import CodedError


class RetuneRejected(CodedError):
    """The measured choices need a kernel whose self-tests failed: the session keeps its own."""

    def __init__(self, sentence: str):
        super().__init__("self-test-failed", "retune", sentence)


async def adopt(session, model, report, self_test_size: str = "quick") -> list[str]:
    """Give `session` the tuning `report`'s choices and their pipelines compiled (the stage's
    reused), after the golden self-tests of every pipeline they use that the session's
    admission did not compile, run on those pipelines as admission's are. Returns the names of
    their kernels; raises RetuneRejected, leaving the session as it was, when a case fails or
    a new pipeline was run by none."""
    from ..kernels import golden
    from . import pipelines as pipeline_set
    used = pipeline_set.pipelines(model, session.device, session.plan, report.choices)
    new = {}                               # (name, sorted overrides) -> compiled: the pipelines added
    for name, overrides in used:           # compiled as admission would (the stage's reused)
        key = (name, tuple(sorted(overrides.items())))
        if key not in session.kernels:
            new[key] = report.compiled.get(key) or await pipeline_set.compile(session.device, name, overrides)
    names = sorted({name for name, _ in new})
    if new:
        result = await golden.run_all(session.device, self_test_size, kernels=set(names), compiled=new,
                                      positions=session.plan.as_dict()["policy"]["context_capacity"])
        if not result["passed"] or result["untested_pipelines"]:
            failed = len(result["failed"])
            untested = result["untested_pipelines"]
            raise RetuneRejected(f"the measured choices use {', '.join(names)}: {failed} self-test(s) failed"
                                 + (f", none ran {', '.join(untested[:3])}" if untested else ""))
    session.kernels.update(new)
    report.compiled = {}
    session.tuning = report
    return names
