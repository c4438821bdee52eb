"""Logits reductions (py/webslm/kernels/logits.py, shaders/logits.wgsl): the golden family
"logits" at full size on wgpu-native, the host's validation before any dispatch, the oracle's
agreement with the sampler's contract, and that the comparison catches wrong answers."""
import re
from pathlib import Path

import numpy as np
import pytest

from webslm.kernels import golden, logits
from webslm.semantic.sampler import canonical_top_k

ROOT = Path(__file__).resolve().parents[1]

CORE = {"maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupSizeX": 256,
        "maxComputeWorkgroupStorageSize": 16384, "maxComputeWorkgroupsPerDimension": 65535,
        "maxStorageBufferBindingSize": 128 << 20, "maxBufferSize": 256 << 20}
COMPAT = {**CORE, "maxComputeInvocationsPerWorkgroup": 128, "maxComputeWorkgroupSizeX": 128}


class FakeDevice:
    """Limits and features only: everything plan() and choose() look at."""
    def __init__(self, limits=CORE, features=()):
        self.limits, self.features = dict(limits), frozenset(features)


# -- the golden family on the native adapter ---------------------------------------------------

def test_golden_logits_full_passes(native_device, run):
    report = run(golden.run_all(native_device, "full", families=["logits"]))
    results = report["families"]["logits"]["results"]
    print(f"logits: {len(results)} results in {report['families']['logits']['seconds']} s")
    assert report["failed"] == [], report["failed"][:5]
    assert len(results) > 300 and report["passed"]
    kernels = {r["kernel"].split(" k=")[0] for r in results}
    assert any("topk" in name and "KMAX=256" in name for name in kernels)
    if "subgroups" in native_device.features:
        assert any("argmax_partial_subgroups" in name for name in kernels)


def test_golden_logits_quick_passes(native_device, run):
    report = run(golden.run_all(native_device, "quick", families=["logits"]))
    assert report["passed"], report["failed"][:5]


def test_one_shot_helpers(native_device, run):
    x = np.array([1.0, 3.0, -0.0, 3.0, np.nan, 0.0, -np.inf], np.float32)
    index, value = run(logits.argmax(native_device, None, x))
    assert (index, value) == (1, np.float32(3.0))
    ids, values = run(logits.topk(native_device, None, x, 7))
    assert ids.tolist() == [1, 3, 0, 2, 5, 6, 4]           # ties and -0.0 == 0.0 by index; NaN last
    assert values.view(np.uint32)[3] == 0x80000000         # the stored -0.0, bit for bit
    result = run(logits.reduce(native_device, None, x, 3))
    assert result.nan_count == 1 and result.indices.tolist() == [1, 3, 0]


# -- the host validates before any dispatch ----------------------------------------------------

@pytest.mark.parametrize("vocab, k, message", [
    (0, 1, "nothing to reduce"),
    (-5, 1, "nothing to reduce"),
    (2 ** 32, 1, "past u32"),
    (2 ** 32 - 1, 1, "past u32"),
    ((128 << 20) // 4 + 1, 1, "binding size"),
    (True, 1, "must be an int"),
    (10.0, 1, "must be an int"),
    (100, 0, "outside"),
    (100, 65, "outside"),                  # above the KMAX=64 kernel's capacity
    (10, 40, "exceeds the vocabulary"),
    (100, 2.0, "must be an int"),
])
def test_plan_rejects_bad_sizes(vocab, k, message):
    device = FakeDevice()
    choice = logits.choose(device, "topk", 40)
    with pytest.raises(logits.LogitsShapeError, match=message):
        logits.plan(device, choice, vocab, k)


def test_choose_rejects_bad_requests():
    device = FakeDevice()
    with pytest.raises(logits.LogitsShapeError, match="outside"):
        logits.choose(device, "topk", logits.MAX_K + 1)
    with pytest.raises(logits.LogitsShapeError, match="outside"):
        logits.choose(device, "topk", 0)
    with pytest.raises(logits.LogitsShapeError, match="'argmax' or 'topk'"):
        logits.choose(device, "median")
    with pytest.raises(logits.LogitsShapeError, match="without subgroups"):
        logits.choose(device, "argmax", subgroups=True)
    with pytest.raises(logits.LogitsShapeError, match="not one of"):
        logits.choose(device, "argmax", workgroup=96)
    with pytest.raises(logits.LogitsShapeError, match="not one of"):
        logits.choose(FakeDevice(COMPAT), "argmax", workgroup=256)
    assert isinstance(logits.LogitsShapeError("x"), ValueError)


def test_argmax_plan_takes_only_k_1():
    device = FakeDevice()
    with pytest.raises(logits.LogitsShapeError, match="outside"):
        logits.plan(device, logits.choose(device, "argmax"), 100, 2)


@pytest.mark.parametrize("chunk", [0, 100, 513, -512, 512.0, True])
def test_plan_rejects_chunks_the_kernels_cannot_split(chunk):
    device = FakeDevice()
    with pytest.raises(logits.LogitsShapeError, match="chunk"):
        logits.plan(device, logits.choose(device, "topk", 8), 10 ** 6, 8, chunk)


def test_plan_rejects_too_many_partials():
    device = FakeDevice({**CORE, "maxComputeWorkgroupsPerDimension": 4})
    with pytest.raises(logits.LogitsShapeError, match="grid"):
        logits.plan(device, logits.choose(device, "argmax"), 10 ** 6, 1, 256)


def test_variant_choice_follows_device_limits():
    compat = logits.choose(FakeDevice(COMPAT), "topk", 40)
    assert compat.overrides == {"WG": 128, "KMAX": 64}
    assert logits.choose(FakeDevice(), "topk", 65).overrides == {"WG": 256, "KMAX": 128}
    assert logits.choose(FakeDevice(), "topk", 256).overrides == {"WG": 256, "KMAX": 256}
    assert logits.choose(FakeDevice(features={"subgroups"}), "argmax").partial.endswith("_subgroups")
    assert not logits.choose(FakeDevice(), "argmax").partial.endswith("_subgroups")
    tiny = {**CORE, "maxComputeWorkgroupStorageSize": 4096}
    with pytest.raises(logits.LogitsShapeError):
        logits.choose(FakeDevice(tiny), "topk", 8)            # the 8 KiB working set does not fit
    # compat devices: 128 invocations, 16 KiB of workgroup memory
    assert logits.workgroup_storage("topk", 128) <= 16384
    assert logits.workgroup_storage("argmax", 256) <= 16384


def test_plan_layout():
    device = FakeDevice()
    p = logits.plan(device, logits.choose(device, "topk", 40), 128256, 40)
    assert p.groups == -(-128256 // p.chunk) and p.chunk % logits.LOAD == 0
    assert p.partial_grid == (p.groups, 1, 1) and p.merge_grid == (1, 1, 1)
    assert (p.index_offset, p.value_offset, p.nan_count_offset, p.result_bytes) == (0, 160, 320, 324)
    assert p.partials_words == 2 * p.groups * 40 + p.groups
    assert p.params.tolist() == [128256, 40, p.chunk, p.groups]
    a = logits.plan(device, logits.choose(device, "argmax"), 49152)
    assert a.result_bytes == 12 and a.chunk % 256 == 0 and a.groups <= logits.ARGMAX_GROUPS
    one = logits.plan(device, logits.choose(device, "topk", 64), 1000, 64, 2 ** 20)
    assert (one.chunk, one.groups) == (1024, 1)                  # a huge chunk is capped at V


def test_checked_logits_wants_1d_float32():
    for bad in (np.zeros(4, np.float64), np.zeros((2, 2), np.float32), [1.0, 2.0]):
        with pytest.raises(logits.LogitsShapeError, match="float32"):
            logits.checked_logits(bad)


def test_host_constants_match_the_shader():
    source = (ROOT / "shaders" / "logits.wgsl").read_text()
    for name, value in (("TILE", logits.TILE), ("LOAD", logits.LOAD)):
        assert re.search(rf"const {name}: u32 = {value}u;", source), name
    assert logits.LOAD // min(logits.WORKGROUP_SIZES) <= int(re.search(r"const MAX_HELD = (\d+)u;", source)[1])
    assert logits.TILE - max(logits.CAPACITIES) >= logits.LOAD   # the append area holds a step


# -- the oracle is the sampler's contract, and the comparison catches wrong answers ------------

def test_oracle_order_is_the_samplers():
    x = np.array([0.5, np.nan, -np.inf, 0.5, -0.0, np.inf, 0.0, np.nan, -1.0], np.float32)
    words = logits.oracle(x, 9)
    assert words[:9].tolist() == [5, 0, 3, 4, 6, 8, 2, 1, 7]   # +inf, ties by index, zeros equal, NaN last
    assert words[:9].tolist() == canonical_top_k(x, 9).tolist()
    assert words[9:18].tolist() == x.view(np.uint32)[words[:9]].tolist()
    assert words[18] == 2
    # without NaN the top-1 is numpy's argmax (the sampler's greedy rule)
    y = np.random.default_rng(3).integers(-2, 3, 1000).astype(np.float32)
    assert logits.oracle(y, 1)[0] == np.argmax(y)


def _compare(got, want):
    return golden.compare_exact("logits", "test", "case", got, want, logits.POISON)


def test_comparison_fails_wrong_answers():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(1000).astype(np.float32)
    ties = np.flatnonzero(x > 1.5)[:6]
    x[ties] = 9.0                                              # 6 tied maxima
    want = logits.oracle(x, 1)
    assert want[0] == ties[0] and _compare(want, want).passed
    bits = x.view(np.uint32)
    highest_tie = np.array([ties[-1], bits[ties[-1]], 0], np.uint32)
    assert not _compare(highest_tie, want).passed              # same value, wrong index
    second = canonical_top_k(np.where(x == 9.0, -np.inf, x).astype(np.float32), 1)[0]
    assert not _compare(np.array([second, bits[second], 0], np.uint32), want).passed
    wrong_nans = want.copy()
    wrong_nans[2] = 1
    assert not _compare(wrong_nans, want).passed               # a NaN count that is off
    top = logits.oracle(x, 40)
    swapped = top.copy()
    swapped[[38, 39]] = swapped[[39, 38]]                      # two ranks out of order
    assert not _compare(swapped, top).passed
    unwritten = top.copy()
    unwritten[-1] = logits.POISON
    result = _compare(unwritten, top)
    assert result.unwritten == 1 and not result.passed


def test_bench_hook_shapes():
    assert {s["vocab"] for s in logits.BENCH_SHAPES.values()} == {49152, 128256}


def test_prepare_bench_runs_both_passes(native_device, run):
    prepared = run(logits.prepare_bench(native_device, "topk40", {"vocab": 4099}, np.random.default_rng(0)))
    try:
        assert len(prepared.dispatches) == 2 and prepared.bytes_moved == 4 * 4099 + 4 * 81
        native_device.submit(list(prepared.dispatches))
        (words,) = run(prepared.read_outputs(native_device))
        assert words.size == 81 and words[80] == 0 and (words[:40] < 4099).all()
    finally:
        prepared.release(native_device)
