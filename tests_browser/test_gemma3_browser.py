"""Gemma 3 270M (Q4_K_M as stored) in a browser GPU row: conformance with the CPU oracle.

The model is the site's second model (tools/assets.py puts it there when
`python tools/test_data.py gemma3` has cached its GGUF; ./dev test runs that first); without
it the test skips. In the row's worker: load it from the site (not into Cache Storage: the
page's cache tests count what is cached), admit it on the GPU (forced: the software GPUs here
are slower than the CPU path), then the teacher-forced conformance request: the GPU executor's
top-1 token against the worker's CPU oracle at each position, 100% except where the oracle's
top-2 margin is under the tolerance. The default model is loaded back afterwards.

CI cost: this runs only in the fastest GPU row, chromium-compat (Dawn's GL ES backend over
lavapipe, 128 MiB bindings: the 262k-row tied embedding is split across bindings for real);
Firefox (lavapipe) would add the same again. The figures go to tests_browser/results/<row>.json
under "gemma3".
"""
from __future__ import annotations

import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GEMMA_ID = "gemma-3-270m-q4km"
ROWS = {"chromium-compat"}
TOKENS = 8
TIMEOUT_S = 1800


def _entry() -> dict:
    models = json.loads((ROOT / ".assets/site/manifest.json").read_text())["models"]
    entry = next((m for m in models if m["id"] == GEMMA_ID), None)
    if entry is None:
        pytest.skip(f"{GEMMA_ID} is not on the site (python tools/test_data.py gemma3, then tools/assets.py)")
    return entry


def test_gemma3_270m_passes_conformance_on_the_gpu(booted):
    if booted.row.name not in ROWS:
        pytest.skip(f"{booted.row.name}: Gemma 3 runs in {sorted(ROWS)} only (CI cost; module docstring)")
    entry = _entry()
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
    try:
        model = booted.request("load-model", {"source": {"url": f"assets/{entry['file']}"},
                                              "sha256": entry["artifact_sha256"], "name": entry["name"],
                                              "cache": False}, timeout_s=TIMEOUT_S)
        assert model["artifact_sha256"] == entry["artifact_sha256"], model
        admitted = booted.request("admit", {"featureLevel": "auto", "fault": None, "gpu": "force"}, timeout_s=TIMEOUT_S)
        assert admitted["engine"]["backend"] == "gpu", admitted["engine"]
        report = booted.request("conformance", {"tokens": TOKENS}, timeout_s=TIMEOUT_S)
    finally:
        booted.row.eval("window.webslm.loadModel('default').then(() => true)", timeout_s=TIMEOUT_S)
    summary = {"tier": report["tier"], "positions": report["positions"], "top1_agreement": report["top1_agreement"],
               "disagreements": report["disagreements"], "max_abs_logit_error": report["max_abs_logit_error"],
               "margin_tolerance": report["margin_tolerance"], "passed": report["passed"],
               "min_margin": min(p["margin"] for p in report["per_position"]), "seconds": report["seconds"]}
    booted.results["gemma3"] = summary
    booted.record()
    print(f"\n{booted.row.name}: Gemma 3 270M conformance {json.dumps(summary)}")
    assert report["positions"] == TOKENS
    assert all(d["margin"] < report["margin_tolerance"] for d in report["disagreements"]), report["disagreements"]
    assert report["passed"], report
