"""Gemma 3 and Qwen2 biases on the GPU executor (wgpu-native; lavapipe here), against the CPU path.

Models:
- the tiny Gemma 3 of tests/gemma3_model.py (3 layers: sliding, full, sliding; window 8; GQA
  4/2, head_dim 32, hidden 64 != 4 x 32; attention scale 24^-0.5; (1 + w) norms with random
  w; tied embedding), its matrices stored as f32, f16 and q8;
- the Qwen2-style synthetic model (bench/synthetic_model.py --shape qwen2: the stacked shape
  with f32 q/k/v biases of std 0.5), on the fused path (every rule) and the reference one.

Each is checked as the llama models are in tests/test_gpu_engine_native.py: the GPU's logits
against the CPU oracle after prefills of lengths that straddle the window edge (with prefill
chunks smaller than the prompt, so a chunk starts inside a window) and after every decode step
to past the window several times over; then teacher-forced conformance, 100% top-1.
"""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

import gemma3_model
import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.admission.pipelines import unsupported
from webslm.admission.tracked import Faults
from webslm.backends.gpu import GpuBackend
from webslm.backends.scores import Want
from webslm.cpu import CpuBackend
from webslm.engine.conformance import conformance
from webslm.generate import prompt_ids
from webslm.program.fusion import ALL
from webslm.semantic.sampler import canonical_top_k

# |GPU - CPU| per logit relative to the row's largest |logit| (test_gpu_engine_native's bound):
# the GPU sums in other orders; f16 and q8 weights are dequantized the same way on both sides.
LOGIT_TOLERANCE = 2e-3
PREFILL_LENGTHS = (1, 7, 8, 9, 13, 21)            # around the window of 8, and past a chunk of 6
PREFILL_CHUNK = 6
DECODE_STEPS = 24                                  # positions 13 .. 36: three windows

# Admission's quick self-test does not run the small-shape gemm_q8 / gemm_f32 kernels these tiny
# models plan (kernels/gemm.py's quick cases are q4, q8 and f16 at other shapes), so admission
# would refuse them ("self-test-incomplete"): the full self-test of the planned kernels runs
# instead (once per session and device: conftest.py self_test_once).
POLICY = AdmissionPolicy(prefill_chunk=PREFILL_CHUNK, self_test_size="full")
pytestmark = pytest.mark.usefixtures("self_test_once")


@pytest.fixture(scope="module", params=gemma3_model.MATRIX_ENCODINGS)
def gemma_path(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3_gpu") / f"gemma3-{request.param}.slm"
    gemma3_model.write(path, matrices=request.param)
    return path


@pytest.fixture(scope="module")
def qwen2_path(qwen2_slm_path):
    return qwen2_slm_path


def prompt(model, n: int, seed: int = 5) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, model.architecture.vocab, n)]


async def _compare(gpu, model, policy, faults=Faults()) -> tuple[list[float], int, int, list[str]]:
    """Relative logit errors after each prefill length and each decode step; dispatches a
    decode layer, how many of them are projections (q|k|v and gate|up stacked or not), and the
    kinds of the ops before the layers."""
    session = await admit(gpu, model, policy, faults=faults)
    backend = await GpuBackend.build(session, model)
    cpu = CpuBackend(model)
    errors = []

    def error(got, want):
        return float(np.abs(got - want).max()) / float(np.abs(want).max())

    try:
        ids = prompt(model, max(PREFILL_LENGTHS))
        for n in PREFILL_LENGTHS:
            backend.reset()
            cpu.reset()
            errors.append(error((await backend.prefill(ids[:n], Want("full"))).logits, cpu.prefill(ids[:n])))
        want = None
        for step in range(DECODE_STEPS):       # greedy every third step, prompt tokens between
            token = int(np.argmax(want)) if want is not None and step % 3 == 0 else ids[step % len(ids)]
            got, want = (await backend.decode_one(token, Want("full"))).logits, cpu.decode_one(token)
            errors.append(error(got, want))
        decode = backend.forward.programs["decode"]
        projections = sum(1 for op in decode.layer(0) if op.kind == "matmul" and op.label not in ("o", "down"))
        return errors, decode.dispatches_per_layer(), projections, [op.kind for op in decode.before]
    finally:
        backend.release()


def test_gemma3_logits_follow_the_cpu_path_through_prefill_and_decode(native_gpu, gemma_path, run):
    model = webslm.open_model(gemma_path)
    assert unsupported(model.manifest) is None
    errors, per_layer, projections, before = run(_compare(native_gpu, model, POLICY))
    assert before == ["embed", "scale"]
    print(f"{gemma_path.name}: max relative logit error {max(errors):.2e}, {per_layer} dispatches a decode layer")
    assert max(errors) <= LOGIT_TOLERANCE, errors
    # a layer: attn_norm, the projections (q|k|v and gate|up stacked where the planner could lay
    # their parts out back to back: 2 for f32/f16, 3 for q8, whose gate and up scales are not
    # whole alignment units), head_norm, rope_kv, attention, o, post_attention_norm, ffn_norm,
    # geglu, down, post_ffw_norm
    assert per_layer == 10 + projections and projections in (2, 3)


def test_gemma3_with_a_split_embedding_gathers_it_on_the_host(native_gpu, tmp_path, run):
    """The real Gemma 3's 262k-row tied embedding does not fit one 128 MiB binding: the planner
    cuts it into row pieces, the head multiplies piece by piece and the host gathers the
    embedding rows (program/ops.py host_embed). The same here at a scale lavapipe runs: the
    adapter reports an 8 KiB binding limit, so the q8 table (300 x 64) splits in three."""
    path = tmp_path / "gemma3-q8.slm"
    gemma3_model.write(path, matrices="q8")
    model = webslm.open_model(path)
    small = Faults(limit_overrides={"maxStorageBufferBindingSize": 8192})
    errors, _, _, before = run(_compare(native_gpu, model, POLICY, small))
    assert before == ["host_embed", "scale"]
    print(f"split embedding: max relative logit error {max(errors):.2e}")
    assert max(errors) <= LOGIT_TOLERANCE, errors


def test_gemma3_conformance_is_100_percent_top1(native_gpu, gemma_path, run):
    model = webslm.open_model(gemma_path)

    async def go():
        session = await admit(native_gpu, model, POLICY)
        backend = await GpuBackend.build(session, model)
        try:
            return await conformance(model, backend, prompt(model, 10, seed=9), tokens=40)
        finally:
            backend.release()
    report = run(go())
    assert report["top1_agreement"] == 1.0, report["disagreements"]


@pytest.mark.parametrize("fusions", [ALL, ()], ids=["fused", "reference"])
def test_qwen2_biases_on_the_gpu_follow_the_cpu_path(native_gpu, qwen2_path, run, fusions):
    model = webslm.open_model(qwen2_path)
    assert model.architecture.qkv_bias and unsupported(model.manifest) is None
    errors, per_layer, _, _ = run(_compare(native_gpu, model, AdmissionPolicy(fusions=fusions, prefill_chunk=PREFILL_CHUNK,
                                                                           self_test_size="full")))
    print(f"qwen2 {fusions or 'reference'}: max relative logit error {max(errors):.2e}, {per_layer} a layer")
    assert max(errors) <= LOGIT_TOLERANCE, errors
    # the bias costs no dispatch: rope-kv-into-attention declines (its kernel adds no bias), so
    # the fused layer is qkv, rope_kv, attention, o, gate_up, down
    assert per_layer == (6 if fusions else 12)


def test_qwen2_conformance_is_100_percent_top1(native_gpu, qwen2_path, run):
    model = webslm.open_model(qwen2_path)

    async def go():
        session = await admit(native_gpu, model, AdmissionPolicy(self_test_size="full"))
        backend = await GpuBackend.build(session, model)
        try:
            return await conformance(model, backend, prompt(model, 12, seed=4), tokens=32)
        finally:
            backend.release()
    report = run(go())
    assert report["top1_agreement"] == 1.0, report["disagreements"]


# -- the real Gemma 3 270M, its K-quant tensors requantized to q8 --------------------------------

GEMMA_GGUF = pathlib.Path(__file__).resolve().parents[1] / ".assets/cache/gemma-3-270m-q4_k_m.gguf"


@pytest.mark.skipif(not GEMMA_GGUF.is_file(), reason="set-up did not fetch gemma-3-270m-q4_k_m.gguf")
def test_real_gemma3_270m_requantized_to_q8_on_the_gpu(native_gpu, tmp_path, run):
    """Weights nobody here wrote: the GGUF converted with --quant q8 (its Q4_K/Q5_0/Q6_K
    matrices requantized; the K-quant GPU kernels are another branch's). On lavapipe's 128 MiB
    bindings the 262,144-row tied embedding (168 MB in q8) is split: host-gathered rows, a head
    of two pieces. Teacher-forced conformance with the CPU path: 100% top-1."""
    from webslm.convert.gguf import convert_gguf
    path = tmp_path / "gemma3-270m-q8.slm"
    convert_gguf(GEMMA_GGUF, path, quant="q8")
    model = webslm.open_model(path)
    assert model.architecture.vocab == 262144 and unsupported(model.manifest) is None

    async def go():
        session = await admit(native_gpu, model, AdmissionPolicy(context=64, self_test_size="full"))
        backend = await GpuBackend.build(session, model)
        try:
            assert [op.kind for op in backend.forward.programs["decode"].before] == ["host_embed", "scale"]
            ids = prompt_ids(model, "The capital of France is", chat=False)     # BOS first
            report = await conformance(model, backend, ids, tokens=16)
            # The 262,144-logit reductions on the GPU against the full row of the same step.
            full = (await backend.decode_one(ids[-1], Want("full"))).logits
            for asked in (Want("top-k", 8), Want("argmax")):
                backend.position -= 1                                  # the same step again
                top = await backend.decode_one(ids[-1], asked)
                assert list(top.ids) == list(canonical_top_k(full, top.ids.size))
                assert top.values.tobytes() == full[top.ids].tobytes()
            return report
        finally:
            backend.release()
    report = run(go())
    print(f"real Gemma 3 270M (q8): top-1 {report['top1_agreement']}, max |logit error| "
          f"{report['max_abs_logit_error']:.3g}")
    assert report["top1_agreement"] == 1.0, report["disagreements"]


@pytest.mark.skipif(not GEMMA_GGUF.is_file(), reason="set-up did not fetch gemma-3-270m-q4_k_m.gguf")
def test_real_gemma3_270m_q4_k_m_as_stored_on_the_gpu(native_gpu, gemma3_270m_slm_path, run):
    """The same GGUF converted losslessly (Q5_0 x81, Q4_K x27, Q8_0 x10, Q6_K x9 kept as q5,
    q4k, q8, q6k; conftest.py converts it once a session, test_gemma3_gguf.py checks that
    conversion tensor by tensor): its attn_v is q8 in some layers and q5 in the others, its
    ffn_down q6k or q4k, so those projections run with a params slot per form (program/ops.py
    weight_forms). Teacher-forced conformance with the CPU path: 100% top-1 over 16 positions.
    About 40 s on lavapipe here (admission, then the CPU oracle and the GPU step)."""
    model = webslm.open_model(gemma3_270m_slm_path)
    encodings = {model.manifest.tensors[f"blk.{i}.{kind}"].encoding for i in range(18) for kind in ("attn_v", "ffn_down")}
    assert encodings == {"q5", "q8", "q4k", "q6k"} and unsupported(model.manifest) is None

    async def go():
        session = await admit(native_gpu, model, AdmissionPolicy(context=64))
        backend = await GpuBackend.build(session, model)
        try:
            slots = backend.forward.programs["decode"].slots()
            kernels = {op.layer: backend.forward.lowering.lower(op, "decode", 1, 0)[0].kernel
                       for op in backend.forward.programs["decode"].ops if op.label == "v"}
            ids = prompt_ids(model, "The capital of France is", chat=False)     # BOS first
            return slots, kernels, await conformance(model, backend, ids, tokens=16)
        finally:
            backend.release()
    slots, kernels, report = run(go())
    assert {"v@q8-32-f16", "v@q5-32-offset-f16", "down@q6k-256-offset-f16", "down@q4k-256-scaled-min-f16"} \
        <= set(slots), slots
    assert "q8" in kernels[0] and "q5" in kernels[2], kernels          # attn_v: Q8_0 in layer 0, Q5_0 in 2
    print(f"real Gemma 3 270M (Q4_K_M as stored): top-1 {report['top1_agreement']}, max |logit error| "
          f"{report['max_abs_logit_error']:.3g}")
    assert report["top1_agreement"] == 1.0, report["disagreements"]
