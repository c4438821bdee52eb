"""A Llama-architecture model stored in GGUF's K-quant mixes runs end to end on the GPU
executor (wgpu-native; lavapipe here): bench/synthetic_model.py --shape kquant (hidden 256,
rows of whole super-blocks) with --encoding q4k_m (llama.cpp's Q4_K_M: q4k, q6k attn_v and
ffn_down in its more-bits layers, q6k embedding, gate|up stacked) and --encoding kmix (q4k,
q5k, q6k, q5 "offset" and "min" with f32 scales, q8) and --encoding kmix_layers (encodings
mixed ACROSS layers as in Gemma 3's Q4_K_M GGUF: attn_v q5 / q8, ffn_down q4k / q6k, the
stacked gate|up q5 / q8; one params slot per form, program/ops.py weight_forms), each on the
fused and the reference step program: logits against the CPU path after prefill and every
decode step, and teacher-forced conformance (engine/conformance.py) with 100% top-1 agreement."""
from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.backends.gpu import GpuBackend
from webslm.backends.scores import Want
from webslm.cpu import CpuBackend
from webslm.engine.conformance import conformance
from webslm.program.fusion import ALL

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOGIT_TOLERANCE = 2e-3      # |GPU - CPU| / max |CPU logit|, as tests/test_gpu_engine_native.py

pytestmark = pytest.mark.usefixtures("self_test_once")


@pytest.fixture(scope="module", params=["q4k_m", "kmix", "kmix_layers"])
def model(request, tmp_path_factory):
    spec = importlib.util.spec_from_file_location("synthetic_model", ROOT / "bench" / "synthetic_model.py")
    synthetic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synthetic)
    path = tmp_path_factory.mktemp("kquant") / f"{request.param}.slm"
    synthetic.write_synthetic(path, "kquant", scheme=request.param)
    return request.param, webslm.open_model(path)


@pytest.mark.parametrize("fusions", [ALL, ()], ids=["fused", "reference"])
def test_gpu_logits_follow_the_cpu_path_and_conform(native_gpu, run, model, fusions):
    scheme, model = model
    ids = [5, 17, 99, 250, 3, 42, 7]

    async def go():
        session = await admit(native_gpu, model, AdmissionPolicy(fusions=fusions))
        slots = session.plan.data["schedules"]["decode"]["slots"]
        backend = await GpuBackend.build(session, model)
        cpu = CpuBackend(model)
        try:
            errors = []
            got, want = (await backend.prefill(ids, Want("full"))).logits, cpu.prefill(ids)
            for _ in range(8):
                errors.append(float(np.abs(got - want).max()) / float(np.abs(want).max()))
                token = int(np.argmax(want))
                got, want = (await backend.decode_one(token, Want("full"))).logits, cpu.decode_one(token)
            report = await conformance(model, backend, ids, tokens=24)
            return errors, report, slots
        finally:
            backend.release()
    errors, report, slots = run(go())
    forms = {slot for slot in slots if "@" in slot}          # a slot per weight form where layers differ
    if scheme == "kmix_layers":
        stacked = {"gate_up@q5-32-offset-f16", "gate_up@q8-32-f16"} if fusions else {
            f"{label}@{form}" for label in ("gate", "up") for form in ("q5-32-offset-f16", "q8-32-f16")}
        assert forms == {"v@q5-32-offset-f16", "v@q8-32-f16", "down@q4k-256-scaled-min-f16",
                         "down@q6k-256-offset-f16"} | stacked, slots
    elif scheme == "kmix":
        assert not forms, slots                              # one encoding a kind: the slots of old
    assert max(errors) <= LOGIT_TOLERANCE, errors
    assert report["top1_agreement"] == 1.0, report
