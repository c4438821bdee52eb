"""An adapter that stops long shader loops early, found and refused at admission.

llvmpipe (lavapipe's Vulkan driver: this machine's native adapter, and the Firefox and
Chromium "compat" rows) ends every loop of a shader invocation once 65535 iterations have run
in all its loops together, and writes whatever the cut loops left. Prefill attention walks
every key tile of the context in one invocation, so at head_dim 256 (Gemma 3's) its answers
go wrong from key 2404 on (docs/RESULTS.md). Admission now self-tests attention at the plan's
KV capacity (attention_cases.at_capacity), and words such a failure with the loop probe
(kernels/probe.py loop_limit) as "loop-limit".
"""
from __future__ import annotations

import asyncio

import pytest

import webslm
from webslm.admission.admit import AdmissionFailure, AdmissionPolicy, admit
from webslm.kernels import probe


def test_the_probe_generator_composes_the_steps_it_skips():
    """_generator_after(n) is n steps of x -> 1664525 x + 1013904223 mod 2^32, done one by one."""
    state = probe.LOOP_PROBE_SEED
    for steps in range(1, 300):
        state = (state * 1664525 + 1013904223) % 2**32
        assert probe._generator_after(steps) == state
    assert probe._generator_after(0) == probe.LOOP_PROBE_SEED


async def _probe(gpu):
    adapter = await gpu.request_adapter("core")
    device = await adapter.request_device([], {})
    try:
        return adapter.summary().description, await probe.loop_limit(device)
    finally:
        device.destroy()


def test_the_loop_probe_finds_llvmpipes_limit_and_nothing_elsewhere(native_gpu):
    """On llvmpipe the probe's 131072 iterations stop short of 65536; an adapter that runs
    them all (every hardware GPU measured) reports None."""
    description, limit = asyncio.run(_probe(native_gpu))
    if "llvmpipe" in description.lower():
        assert limit is not None and 60000 < limit < 65536, limit
    else:
        assert limit is None, (description, limit)


@pytest.fixture(scope="module")
def wide_model(wide_heads_slm_path):
    return webslm.open_model(wide_heads_slm_path)


def test_admission_refuses_a_kv_capacity_whose_attention_the_adapter_cuts_short(native_gpu, wide_model):
    """head_dim 256 at a KV capacity of 4096: llvmpipe cuts the prefill attention's loops
    past key ~2404, the self-test at the capacity disagrees with the oracle, and admission
    refuses with "loop-limit", leaking nothing. (Before, this plan was admitted and a
    2600-token prompt's logits were off by 110% of the largest.) At 2048 it is admitted."""
    description, limit = asyncio.run(_probe(native_gpu))
    if limit is None:
        pytest.skip(f"{description} runs every loop: no capacity to refuse")
    with pytest.raises(AdmissionFailure) as caught:
        asyncio.run(admit(native_gpu, wide_model, AdmissionPolicy(context=4096)))
    failure = caught.value
    assert (failure.stage, failure.code) == ("self-test", "loop-limit"), failure
    assert "at the KV capacity" in failure.sentence and "below 4096 positions" in failure.sentence
    assert failure.leaked_buffers == 0 and failure.receipt.as_dict()["outcome_code"] == "loop-limit"
    session = asyncio.run(admit(native_gpu, wide_model, AdmissionPolicy(context=2048)))
    try:
        assert session.receipt.as_dict()["outcome_code"] == "admitted"
    finally:
        session.destroy()
