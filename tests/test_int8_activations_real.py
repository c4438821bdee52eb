"""The pre-quantized mat-vec's numerics on real weights (kernels/matvec_prequant.py), by
teacher-forced conformance with the CPU oracle (engine/conformance.py), on lavapipe.

Admission's tuning mode "int8" ("int8-1") puts every mat-vec form the pre-quantized path
serves on activations of two bytes (one byte) each, unmeasured, as `webslm conformance --matvec`
does. Random weights cannot judge this: their top-2 margins are tiny and their activations
have no outliers. Real ones have both:
- SmolLM2-135M (the default model: q4 layers, q8 tied head): one byte an activation, as
  llama.cpp's mat-vec takes them, changes greedy tokens at margins far above the tolerance
  (its activations have outliers: one large value per unit of 32 coarsens the other 31);
  two bytes (the engine's variant) keep 100% top-1, within a small fraction of the error.
- Gemma 3 270M Q4_K_M as stored (q4k, q6k and q8 forms on the path, q5 exact): two bytes,
  100% top-1; its tied 262k-row q8 head is a "plain" form in decode and in prefill, so the
  prefill head must stay exact (prefill has no int8_x region).
"""
from __future__ import annotations

import asyncio
import pathlib

import pytest

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.backends.gpu import GpuBackend
from webslm.engine.conformance import conformance
from webslm.generate import prompt_ids
from webslm.kernels import matvec_prequant

DEFAULT_MODEL = pathlib.Path(__file__).resolve().parents[1] / ".assets/site/models/smollm2-135m-instruct-q4.slm"
PROMPT = "The quick brown fox jumps over the lazy dog."


async def _conformance(gpu, model, tuning: str, tokens: int, context: int | None = None):
    """(conformance report, the variants of the session's choices)."""
    session = await admit(gpu, model, AdmissionPolicy(tuning=tuning, context=context))
    backend = await GpuBackend.build(session, model)
    try:
        variants = {choice.variant for choice in session.choices.values()}
        return await conformance(model, backend, prompt_ids(model, PROMPT, chat=False), tokens=tokens), variants
    finally:
        backend.release()


@pytest.fixture(scope="module")
def smollm2():
    if not DEFAULT_MODEL.is_file():
        pytest.skip("the default model is not set up (tools/assets.py)")
    return webslm.open_model(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def two_bytes(native_gpu, smollm2):
    """SmolLM2's conformance on two bytes an activation (the engine's "xq2"), once for the module."""
    return asyncio.run(_conformance(native_gpu, smollm2, "int8", tokens=16))


def test_two_byte_activations_keep_the_default_models_greedy_tokens_where_one_byte_does_not(native_gpu, smollm2,
                                                                                           two_bytes, run):
    two, variants_two = two_bytes
    one, variants_one = run(_conformance(native_gpu, smollm2, "int8-1", tokens=16))
    assert variants_two == {"xq2"} and variants_one == {"xq"}
    print(f"SmolLM2-135M: two bytes top-1 {two['top1_agreement']}, max |logit error| {two['max_abs_logit_error']:.3g};"
          f" one byte top-1 {one['top1_agreement']}, {one['max_abs_logit_error']:.3g}")
    # top-1 equal to the oracle outside near-ties (conformance's rule): a position where the
    # oracle's top two are 0.0037 apart flipped once the quantizer's sum of squares became a tree
    # (its 1/rms rounds differently); the two bytes' logit error is ~0.04
    assert two["passed"], two["disagreements"]
    assert all(d["margin"] < two["margin_tolerance"] for d in two["disagreements"]), two["disagreements"]
    assert len(two["disagreements"]) <= 1, two["disagreements"]
    assert not one["passed"], one["disagreements"]                     # why the engine never takes one byte
    assert two["max_abs_logit_error"] * 10 <= one["max_abs_logit_error"]


def test_two_byte_activations_on_gemma3_270m_q4_k_m_as_stored(native_gpu, gemma3_270m_slm_path, run):
    model = webslm.open_model(gemma3_270m_slm_path)
    report, variants = run(_conformance(native_gpu, model, "int8", tokens=16, context=64))
    assert variants == {matvec_prequant.VARIANT}
    print(f"Gemma 3 270M Q4_K_M, two bytes: top-1 {report['top1_agreement']}, max |logit error| "
          f"{report['max_abs_logit_error']:.3g}")
    assert report["passed"] and all(d["margin"] < report["margin_tolerance"] for d in report["disagreements"]), \
        report["disagreements"]


def test_the_norm_from_the_units_squares_keeps_the_default_models_greedy_tokens(native_gpu, smollm2, two_bytes,
                                                                               run):
    """"xq2s" (matvec_prequant.SQUARES): the norm forms' 1/rms from the squares each unit
    carries, not the quantizer's header; the same bytes, the squares summed in another order.
    On SmolLM2's real weights: top-1 as the two bytes' (conformance's rule), and a logit error
    of the same size."""
    squares, variants = run(_conformance(native_gpu, smollm2, "int8-s", tokens=16))
    two, _ = two_bytes
    assert variants == {"xq2", "xq2s"}                  # xq2s on the norm forms, xq2 on the others
    print(f"SmolLM2-135M: units' squares top-1 {squares['top1_agreement']}, max |logit error| "
          f"{squares['max_abs_logit_error']:.3g} (header: {two['max_abs_logit_error']:.3g})")
    assert squares["passed"], squares["disagreements"]
    assert all(d["margin"] < squares["margin_tolerance"] for d in squares["disagreements"]), squares["disagreements"]
    assert len(squares["disagreements"]) <= 1, squares["disagreements"]
    assert squares["max_abs_logit_error"] <= 1.5 * two["max_abs_logit_error"] + 1e-2
