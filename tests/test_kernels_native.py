"""The same GPU smoke check the browser rows run, here on wgpu-native."""
import json

import numpy as np
import pytest

from webslm import gpu_smoke, shader_bundle
from webslm.kernels.probe import check_matvec
from webslm.kernels.runner import workgroup_grid


def test_smoke_probe_passes_on_native_adapter(native_gpu, run):
    report = run(gpu_smoke.probe(native_gpu, "core", seed=7))
    print(json.dumps(report["adapter"], indent=1))   # the adapter row of the matrix, in -s output
    assert report["outcome"] == "passed", json.dumps(report, indent=1)
    assert report["shader_bundle_hash"] == shader_bundle.bundle_hash()
    assert len(report["cases"]) == len(gpu_smoke.CASES)
    assert report["gpu_errors"] == []


def test_smoke_cases_cover_the_adversarial_shapes():
    shapes = {(rows, cols) for rows, cols, _, _ in gpu_smoke.CASES}
    assert (1, 1) in shapes                                     # single element
    assert any(cols % 4 and cols > 64 for _, cols in shapes)    # odd tail past a workgroup
    assert any(rows > 65535 for rows, _ in shapes)              # needs the 2-D grid
    assert {data for *_, data in gpu_smoke.CASES} >= {"normal", "huge", "tiny", "alternating"}


def test_check_catches_wrong_and_unwritten_results():
    rng = np.random.default_rng(1)
    w, x = gpu_smoke.make_case(rng, 9, 67, "normal")
    exact = (w.astype(np.float64) @ x.astype(np.float64)).astype(np.float32)
    assert check_matvec(w, x, exact, 64).passed
    off_by_one_row = np.roll(exact, 1)
    assert not check_matvec(w, x, off_by_one_row, 64).passed
    dropped_tail = (w[:, :-1].astype(np.float64) @ x[:-1]).astype(np.float32)  # a kernel that misses k = cols-1
    assert not check_matvec(w, x, dropped_tail, 64).passed
    unwritten = exact.copy()
    unwritten[3] = np.nan
    check = check_matvec(w, x, unwritten, 64)
    assert check.unwritten == 1 and not check.passed


def test_tiny_case_fails_an_all_zero_result():
    w, x = gpu_smoke.make_case(np.random.default_rng(2), 16, 257, "tiny")
    assert not check_matvec(w, x, np.zeros(16, np.float32), 64).passed


@pytest.mark.parametrize("groups, limit, grid", [
    (1, 65535, (1, 1, 1)),
    (65535, 65535, (65535, 1, 1)),
    (65536, 65535, (65535, 2, 1)),
    (70000, 65535, (65535, 2, 1)),
])
def test_workgroup_grid_covers_every_row(groups, limit, grid):
    assert workgroup_grid(groups, limit) == grid
    assert grid[0] * grid[1] >= groups


def test_workgroup_grid_rejects_what_cannot_fit():
    with pytest.raises(ValueError):
        workgroup_grid(10 * 10 + 1, 10)


def test_workgroup_steps_down_to_what_the_device_admits():
    compat = {"maxComputeInvocationsPerWorkgroup": 128, "maxComputeWorkgroupSizeX": 128}
    core = {"maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupSizeX": 256}
    assert gpu_smoke.fit_workgroup(256, compat) == 128
    assert gpu_smoke.fit_workgroup(256, core) == 256
    assert gpu_smoke.fit_workgroup(64, core) == 64
    with pytest.raises(ValueError):
        gpu_smoke.fit_workgroup(256, {"maxComputeInvocationsPerWorkgroup": 32, "maxComputeWorkgroupSizeX": 32})
