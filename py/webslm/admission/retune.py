"""Choices measured after admission, taken into the admitted session under admission's rules.

AdmissionPolicy.tune_later (the worker's admit `tuning: "later"`) admits a model on the cached tuning
results and the rule for the rest, so that a first visit on a device is not kept waiting for
the tuning stage's compiles (2-7 s on the H200). The executor measures those forms once the
model is ready (GpuBackend.retune, between answers). What it measured may use kernels the
admission never compiled nor self-tested (a pre-quantized mat-vec where the rule used an
exact one): `adopt` runs their golden self-tests, as admission would have, before the session
takes the choices. A choice the stage measured was already checked against the rule's output
on the model's own weights (tuning.py), so launch shapes of kernels already tested need no
further test.
"""
from __future__ import annotations

from ..errors import CodedError


class RetuneRejected(CodedError):
    """The measured choices need a kernel whose self-tests failed: the session keeps its own."""

    def __init__(self, sentence: str):
        super().__init__("self-test-failed", "retune", sentence)


async def adopt(session, model, report, self_test_size: str = "quick") -> list[str]:
    """Give `session` the tuning `report`'s choices and their kernels compiled (the stage's
    reused), after the golden self-tests of every kernel they use that the session's admission
    did not test. Returns those kernels' names; raises RetuneRejected, leaving the session as
    it was, when one fails or no case covers it."""
    from ..kernels import golden
    from . import pipelines as pipeline_set
    used = pipeline_set.pipelines(model, session.device, session.plan, report.choices)
    tested = {name for name, _ in session.kernels}
    new = sorted({name for name, _ in used} - tested)
    if new:
        result = await golden.run_all(session.device, self_test_size, kernels=set(new))
        untested = sorted(set(new) - golden.tested_kernels(result))
        if not result["passed"] or untested:
            failed = len(result["failed"])
            raise RetuneRejected(f"the measured choices use {', '.join(new)}: {failed} self-test(s) failed"
                                 + (f", none ran {', '.join(untested)}" if untested else ""))
    for name, overrides in used:          # compiled as admission would (the stage's reused)
        key = (name, tuple(sorted(overrides.items())))
        if key not in session.kernels:
            session.kernels[key] = report.compiled.get(key) or await pipeline_set.compile(session.device, name,
                                                                                         overrides)
    report.compiled = {}
    session.tuning = report
    return new
