"""The kernel golden suite (webslm.kernels.golden) in every browser row's worker.

The same coroutines the native tests run, at size "quick", on the row's own adapter: a
device with every optional feature the adapter offers (so tier B's f16 variants run in
Firefox and tier C's subgroup variants in Chromium's SwiftShader), plus cases on the loaded
default model's real weights. WebKitGTK has no WebGPU here and must say so cleanly.
"""
from __future__ import annotations

import json


def test_every_kernel_family_passes_its_golden_cases(booted):
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
    feature_level = booted.row.adapter_options.get("featureLevel", "core")
    report = booted.request("kernel-golden", {"featureLevel": feature_level, "size": "quick", "withModel": True},
                            timeout_s=900)
    if report.get("outcome") == "no-webgpu-adapter":
        assert booted.row.expects_webgpu is not True, "this row should have a WebGPU adapter"
        assert report == {"outcome": "no-webgpu-adapter"}
        return
    summary = {name: {"cases": len(f["results"]), "failed": sum(not r["passed"] for r in f["results"]),
                      "worst": max((r["error_over_tolerance"] for r in f["results"]), default=0.0),
                      "seconds": f["seconds"]}
               for name, f in report["families"].items()}
    booted.record(kernel_golden={"features": report["features"], "seconds": report["seconds"], "families": summary})
    print(f"\n{booted.row.name}: features {report['features']}, {report['cases']} cases in {report['seconds']} s")
    for name, s in summary.items():
        print(f"  {name:12s} {s['cases']:4d} cases {s['failed']:3d} failed  worst {s['worst']:.3g}  {s['seconds']} s")
    assert report["gpu_errors"] == [], report["gpu_errors"]
    assert report["outcome"] == "passed", json.dumps(report["failed"][:5], indent=1)
    # every family ran, and the real-weight cases were among them
    assert set(report["families"]) >= {"matvec"}
    assert any(r["case"].startswith("real") for f in report["families"].values() for r in f["results"])
