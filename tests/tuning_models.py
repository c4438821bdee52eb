"""What the tuning tests share (tests/test_tuning.py, tests/test_tune_later.py): their bounds
against the CPU oracle, the forced admission policy, one forced tuning run, and cache entries
that put every form the pre-quantized path serves on it."""
from __future__ import annotations

import asyncio

import numpy as np

from webslm.admission.admit import AdmissionPolicy, admit
from webslm.cpu import CpuBackend
from webslm.backends.gpu import GpuBackend
from webslm.backends.scores import Want
from webslm.kernels import attention_xq, matvec, matvec_prequant
from webslm.program.fusion import ALL

LOGIT_TOLERANCE = 2e-3            # tests/test_gpu_engine_native.py's bound, the same model
INT8_LOGIT_TOLERANCE = 6e-2       # int8 activations in every q4 mat-vec (matvec_prequant): measured 1.8-3.3e-2 here
                                  # with one byte; the engine's two bytes: INT8_TWO_BYTE_LOGIT_TOLERANCE
INT8_TWO_BYTE_LOGIT_TOLERANCE = 2e-3
# Forced tuning with time for every form (lavapipe compiles each launch shape in ~0.1-1 s).
FORCED = AdmissionPolicy(fusions=ALL, tuning="force", tuning_budget_s=600.0)


def forced_tuning(gpu, model) -> tuple:
    """One forced tuning run: (report, the session's compiled kernel keys)."""
    async def go():
        session = await admit(gpu, model, FORCED)
        try:
            return session.tuning, set(session.kernels)
        finally:
            session.destroy()
    return asyncio.run(go())


def prequantized_entries(report, variant: str = matvec_prequant.VARIANT,
                         norm_variant: str | None = None) -> dict[str, dict]:
    """The measured cache entries with every form the pre-quantized path serves (q4, q8, q4k,
    q6k: matvec.PREQUANT_VARIANTS) on it (int8 activations, `variant`: two bytes or one; the
    norm-input forms `norm_variant` where given: "xq2s", the 1/rms from the units' squares)."""
    def served(key: str) -> bool:
        return key.split("|")[2].split("[")[0] in matvec.PREQUANT_VARIANTS

    def choice(key: str) -> dict:
        norm = " norm" in key.split("|")[2]
        return {"variant": norm_variant if norm and norm_variant else variant, "WG": 32, "ROWS": 4}
    # Without the step check's fused-quantizer verdict (attention_xq.CHOICE): that was timed on
    # this machine and may say "unfused" in one run and not the next; the tests that want it
    # add their own entry.
    return {key: {**entry, "choice": choice(key) if served(key) else entry["choice"]}
            for key, entry in report.cache_entries.items() if not key.split("|")[2].startswith(attention_xq.CHOICE)}


async def errors_against_the_oracle(session, model, ids) -> list[float]:
    """max |logits - oracle| / max |oracle| of the prefill and 6 greedy decode steps (the
    oracle's tokens fed to both), then the session released."""
    backend = await GpuBackend.build(session, model)
    try:
        return await oracle_errors(backend, model, ids)
    finally:
        backend.release()


async def oracle_errors(backend, model, ids) -> list[float]:
    """errors_against_the_oracle's errors on a backend built already (left running)."""
    cpu = CpuBackend(model)
    errors = []
    got, want = (await backend.prefill(ids, Want("full"))).logits, cpu.prefill(ids)
    for _ in range(6):
        errors.append(float(np.abs(got - want).max()) / float(np.abs(want).max()))
        token = int(np.argmax(want))
        got, want = (await backend.decode_one(token, Want("full"))).logits, cpu.decode_one(token)
    return errors
