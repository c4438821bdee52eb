"""Admission's choice of the prefill attention variant (backends/gpu/tuning_attention.py), on
wgpu-native (lavapipe here): both variants are checked against the float64 oracle before any
timing; one that fails is never chosen however fast; the other variant replaces the rule only
when it is faster by NOISE; a choice from a cache is typed or refused. Which variant lavapipe
times faster is not asserted (timings here mean nothing for a GPU): the decision is tested
with the timings replaced."""
from __future__ import annotations

import time

import pytest

from webslm.backends.gpu import timing, tuning_attention
from webslm.kernels import attention
from webslm.kernels.attention import AttentionShape, KvShapeError, PrefillChoice

pytestmark = pytest.mark.usefixtures("self_test_once")
SHAPE = AttentionShape(9, 3, 64, 4096, "f32")         # SmolLM2's heads; capacity as a session's


def _measure(native_gpu, run, shape=SHAPE, chunk=64, force=True):
    async def go():
        adapter = await native_gpu.request_adapter("core")
        device = await adapter.request_device()
        try:
            return await tuning_attention.measure(device, shape, chunk, time.perf_counter, 0.10, force)
        finally:
            device.destroy()
    return run(go())


def test_both_variants_are_checked_then_timed(native_gpu, run):
    choice, entry = _measure(native_gpu, run)
    assert entry["rule"] == {"variant": "rows"} and entry["tried"] == 2 and entry["rejected"] == 0
    assert set(entry["us"]) == set(attention.PREFILL_VARIANTS) and all(us > 0 for us in entry["us"].values())
    assert entry["tokens"] == 64                         # the chunk, under TOKENS
    assert choice is None or choice.variant == "tiles"


def test_the_other_variant_replaces_the_rule_only_when_faster_by_noise(native_gpu, run, monkeypatch):
    async def figures(contenders, pairs=timing.PAIRS):
        for contender in contenders:
            await contender()                            # the rounds still run
        return [rows_seconds[0], 1e-4]                   # rows (the rule), tiles
    monkeypatch.setattr(timing, "alternating", figures)
    rows_seconds = [5e-4]
    choice, entry = _measure(native_gpu, run)
    assert choice == PrefillChoice("tiles") and entry["chosen_us"] == 100.0
    rows_seconds[0] = 1.05e-4                            # 5% slower: noise, the rule stays
    choice, entry = _measure(native_gpu, run)
    assert choice is None and entry["chosen_us"] == entry["rule_us"]


def test_a_variant_that_fails_its_check_is_never_chosen(native_gpu, run, monkeypatch):
    real = tuning_attention.compare_bound

    def broken_tiles(family, kernel, case, got, exact, bound, rule):
        result = real(family, kernel, case, got, exact, bound, rule)
        if "rows" not in kernel:                          # as if "tiles" computed wrong rows
            result = real(family, kernel, case, got + 1.0, exact, bound, rule)
        return result
    monkeypatch.setattr(tuning_attention, "compare_bound", broken_tiles)
    monkeypatch.setattr(timing, "alternating", pytest.fail)    # nothing is timed
    choice, entry = _measure(native_gpu, run)
    assert choice is None and entry["rejected"] == 1 and entry["searched"] is False


def test_a_head_dim_only_one_variant_fits_is_not_measured(native_gpu, run):
    choice, entry = _measure(native_gpu, run, AttentionShape(8, 2, 128, 512, "f32"))
    assert choice is None and entry == {"rule": {"variant": "tiles"}, "refused": 1, "rejected": 0,
                                        "searched": False, "why": "one variant fits"}


def test_a_software_adapter_keeps_the_rule_unmeasured(native_gpu, run, monkeypatch):
    monkeypatch.setattr(tuning_attention, "SLOW_SECONDS", 1e-9)     # every adapter looks slow
    choice, entry = _measure(native_gpu, run, force=False)
    assert choice is None and entry["searched"] is False and "software" in entry["why"]


@pytest.mark.parametrize("bad", [None, "tiles", {"variant": "fast"}, {"variant": 3}, {"variant": "tiles", "x": 1}])
def test_a_cached_prefill_choice_is_typed_or_refused(bad):
    with pytest.raises(KvShapeError):
        PrefillChoice.from_dict(bad)
    assert PrefillChoice.from_dict({"variant": "tiles"}) == PrefillChoice("tiles")
