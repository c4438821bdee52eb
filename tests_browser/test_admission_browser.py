"""GPU admission in every browser row: the page admits the default model and shows its tier
and receipt (or, in WebKitGTK, fails at the entry point and says so); in Chromium every
fault case fails at its stage and leaves nothing allocated."""
from __future__ import annotations

import pytest

from webslm.admission.tracked import FAULT_OUTCOMES

EXPECTED_TIER = {"chromium": "C", "chromium-compat": "A", "firefox": "B"}
FAULTS = FAULT_OUTCOMES
FORBIDDEN = ("description", "vendor", "architecture", "driver", "prompt", "token")


def _admission(booted) -> dict:
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
    return booted.row.eval("window.webslm.admission")


def test_the_page_admits_the_default_model_or_says_why_not(booted):
    result = _admission(booted)
    badge = booted.row.eval("document.getElementById('engine-badge').textContent")
    state = booted.row.eval("document.getElementById('admission-state').textContent")
    receipt_text = booted.row.eval("document.getElementById('receipt').textContent")
    booted.record(admission={k: result.get(k) for k in ("admitted", "tier", "stage", "code", "seconds", "features")})
    print(f"\n{booted.row.name}: {badge} | {state}")
    assert "error" not in result, result
    assert "Capability receipt" in receipt_text
    receipt = result["receipt"]
    assert not any(word in key for key in receipt for word in FORBIDDEN)
    if booted.row.name == "webkit":
        assert (result["stage"], result["code"]) == ("entry-point", "no-webgpu")
        assert badge == "CPU" and "no-webgpu" in state
        return
    assert receipt["browser_engine_major_bucket"].split("-")[0] in ("chromium", "firefox")
    if not booted.row.engine_on_gpu:
        # SwiftShader, timed against the CPU path (not forced): admission's step-floor stage
        # bounds its step above the CPU path's and stops before compiling; the CPU answers
        assert (result["stage"], result["code"]) == ("step-floor", "gpu-slower") and not result["admitted"], result
        assert result["stages"][-1] == "step-floor" and result["leaked_buffers"] == 0, result
        assert badge == "CPU" and receipt["outcome_code"] == "gpu-slower", (badge, receipt)
        assert receipt["failure_stage"] == "step-floor", receipt
        return
    assert result["admitted"], result
    assert result["tier"] == EXPECTED_TIER[booted.row.name]
    assert result["stages"][-1] == "publish"
    assert badge.startswith("GPU"), badge
    assert receipt["outcome_code"] == "admitted"


@pytest.mark.last_in_row(1)       # a failed admission leaves the engine on the CPU path; after
                                  # the device loss (rank 0), which needs the GPU engine
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_cases_in_chromium(booted, fault):
    if booted.row.name != "chromium":
        pytest.skip("fault injection runs in the Chromium row (natively too: tests/test_admission.py)")
    _admission(booted)                    # the page's own admission first: one at a time
    result = booted.request("admit", {"featureLevel": "core", "fault": fault, "gpu": "force"}, timeout_s=900)
    assert not result["admitted"], result
    assert (result["stage"], result["code"]) == FAULTS[fault], result
    assert result["leaked_buffers"] == 0
    assert result["receipt"]["failure_stage"] == result["stage"]
