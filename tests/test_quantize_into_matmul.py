"""The fusion rule quantize-into-matmul (program/fusion.py) and its lowering: a residual
projection (o, down) writes the int8 input of the norm-input mat-vecs that read x next (gate|up,
the next layer's q|k|v, the head) itself (kernels/matvec_quantize_out.py), where those run on
activations quantized once with the norm from the units' squares ("xq2s"), and the stacked
gate|up writes down's (silu(gate) * up), so the step has no quantize_x launch between them. The bytes are quantize_x's; the two f32 sums a unit carries may differ
in their last bits (a compiler may contract their products differently in the two kernels:
matvec_quantize_out.SUMS_BOUND), and int8 rounding downstream can amplify that into a few 1e-4
of the logits on random weights: so the logits are checked against the CPU oracle with the
two-byte int8 bound, as the unfused path's are (tests/test_tuning.py)."""
from __future__ import annotations

import numpy as np
import pytest

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.backends.gpu import GpuBackend
from webslm.program.fusion import DEFAULT, fuse
from webslm.program.ops import Layout, reference

from tuning_models import INT8_TWO_BYTE_LOGIT_TOLERANCE, oracle_errors, prequantized_entries

RULE = "quantize-into-matmul"
WITHOUT = tuple(rule for rule in DEFAULT if rule != RULE)
DECODE_STEPS = 4


@pytest.fixture(scope="module")
def model(stacked_slm_path):
    return webslm.open_model(stacked_slm_path)       # hidden 128: whole units of 32


def test_the_rule_marks_the_projections_read_by_quantizing_matmuls(model):
    arch = model.architecture
    layout = Layout({}, frozenset({"qkv", "gate_up"}))
    assert RULE in DEFAULT
    decode = fuse(reference(arch, "decode", 1, layout), layout, DEFAULT)
    marked = [op.label for op in decode.ops if op.kind == "matmul" and op.option("quantize_out")]
    assert marked == ["o", "gate_up", "down"] * arch.n_layers
    assert len(decode.ops) == len(fuse(reference(arch, "decode", 1, layout), layout, WITHOUT).ops)
    prefill = fuse(reference(arch, "prefill", 64, layout), layout, DEFAULT)
    assert not any(op.option("quantize_out") for op in prefill.ops)     # prefill runs the GEMM
    # without the norms folded into the mat-vecs x is read by a norm op, without SwiGLU in
    # down gate|up by the swiglu op: those are not marked
    unfolded = tuple(rule for rule in DEFAULT if rule not in ("norm-into-matmul", "swiglu-into-down"))
    assert not any(op.option("quantize_out") for op in fuse(reference(arch, "decode", 1, layout), layout,
                                                            unfolded).ops if op.kind == "matmul")


async def _session(gpu, model, fusions, cache, ids):
    """(the short decode recording's labels, the session's kernels, the self-test report,
    the logits' errors against the CPU oracle: tuning_models.oracle_errors)."""
    session = await admit(gpu, model, AdmissionPolicy(fusions=fusions, tuning="force", tuning_budget_s=600.0),
                          tuning_cache=cache)
    assert session.tuning.source == "cached"
    kernels, self_test = set(session.kernels), session.self_test
    backend = await GpuBackend.build(session, model)
    try:
        forward = backend.forward
        dispatches, _ = await forward.record("decode", forward.programs["decode"].ops, 1, 0)
        labels = [forward.labels[id(d)] for d in dispatches]
        return labels, kernels, self_test, await oracle_errors(backend, model, ids)
    finally:
        backend.release()


def test_o_and_down_quantize_for_their_readers_within_the_int8_bound(native_gpu, model, measured, run):
    cache = prequantized_entries(measured[0], norm_variant="xq2s")
    ids = [int(t) for t in np.random.default_rng(7).integers(0, model.architecture.vocab, 40)]
    fused_labels, fused_kernels, self_test, errors = run(_session(native_gpu, model, DEFAULT, cache, ids))
    plain_labels, plain_kernels, _, plain_errors = run(_session(native_gpu, model, WITHOUT, cache, ids))
    layers = model.architecture.n_layers
    # gate|up's, down's, the later layers' q|k|v's and the head's quantize_x launches are
    # gone; the first layer's q|k|v reads the embedding and keeps its own
    assert plain_labels.count("gate_up quantize") == layers and "gate_up quantize" not in fused_labels
    assert plain_labels.count("down quantize") == layers and "down quantize" not in fused_labels
    assert plain_labels.count("qkv quantize") == layers and fused_labels.count("qkv quantize") == 1
    assert plain_labels.count("head quantize") == 1 and "head quantize" not in fused_labels
    assert len(fused_labels) == len(plain_labels) - 3 * layers
    assert {dict(o)["SWIGLU_OUT"] for name, o in fused_kernels if name.startswith("qout_")} == {0, 1}
    assert not any(name.startswith("qout_") for name, _ in plain_kernels)
    # admission's self-test ran the plan's quantizing pipelines (else "self-test-incomplete")
    assert "matvec_quantize_out" in self_test["families"]
    assert any(name.startswith("qout_") for name in self_test["kernels"])
    assert max(errors[1:]) <= INT8_TWO_BYTE_LOGIT_TOLERANCE, errors       # decode steps
    assert max(plain_errors[1:]) <= INT8_TWO_BYTE_LOGIT_TOLERANCE, plain_errors
    assert errors[0] == plain_errors[0]                 # the prefill (the exact GEMM) is the same


def test_readers_not_on_squares_keep_their_quantizers(native_gpu, model, measured, run):
    """Norm readers on "xq2" (the 1/rms in a header only a whole-row quantizer writes): lowering
    leaves o and down plain (gate|up still quantizes for down); and a cached choice that the step was faster without fused
    quantizers (attention_xq.CHOICE, which covers both kinds) keeps every quantize_x launch."""
    from webslm.backends.gpu import tuning_cache
    from webslm.kernels import attention_xq
    prompt = [1, 2, 3]
    labels, kernels, _, _ = run(_session(native_gpu, model, DEFAULT, prequantized_entries(measured[0]), prompt))
    assert labels.count("gate_up quantize") == model.architecture.n_layers and "down quantize" not in labels
    assert {dict(o).get("SWIGLU_OUT") for name, o in kernels if name.startswith("qout_")} == {1}
    cache = prequantized_entries(measured[0], norm_variant="xq2s")
    identity, bundle = next(iter(cache)).split("|")[:2]
    a = model.architecture
    form = (f"{attention_xq.CHOICE} {a.n_heads}/{a.n_kv_heads}x{a.head_dim} f16, "
            f"{a.n_layers} layers of {a.hidden}")
    cache[tuning_cache.cache_key(identity, bundle + "0" * 16, form)] = {"choice": {"quantize": False}}
    labels, kernels, _, _ = run(_session(native_gpu, model, DEFAULT, cache, prompt))
    assert labels.count("gate_up quantize") == a.n_layers and labels.count("o quantize") == a.n_layers
    assert labels.count("down quantize") == a.n_layers
    assert not any(name.startswith("qout_") for name, _ in kernels)


# -- measured at admission: the step with the norm forms on "xq2s" (tuning._step_check) ----------

@pytest.mark.parametrize("int8_us, squares_us, expect", [(95.0, 90.0, "xq2s"), (90.0, 95.0, "xq2")])
def test_the_step_check_tries_the_norm_forms_on_squares(run, int8_us, squares_us, expect):
    """A norm form that took "xq2" alone: the step is also timed with it on "xq2s", where its
    producer could then quantize for it, and the faster int8 step is kept."""
    from webslm.backends.gpu import timing, tuning
    from webslm.kernels import attention_xq, matvec
    norm, plain = "q4[] 256x64 norm", "q4[] 64x64 plain +y"
    report = tuning.TuningReport({norm: matvec.Choice("xq2", 32, 4), plain: matvec.Choice("xq2", 32, 4)},
                                 {norm: {"rule_us": 9.0}, plain: {"rule_us": 9.0}}, "measured")
    exact = {norm: matvec.Choice("", 32, 8), plain: matvec.Choice("", 32, 8)}
    timed = []

    def fused(choices):          # lowering's producers quantize only for readers on "xq2s"
        return choices[norm].variant == "xq2s"

    async def seconds_per_step(choices):
        if choices[norm].variant == "":
            timed.append("exact")
        elif attention_xq.CHOICE in choices:
            timed.append("unfused")
        else:
            timed.append(choices[norm].variant)
        return {"exact": 100.0, "unfused": 99.0, "xq2": int8_us, "xq2s": squares_us}[timed[-1]] * 1e-6
    run(tuning._step_check(report, exact, seconds_per_step, fused))
    assert set(timed) == {"xq2", "exact", "xq2s"} and len(timed) == 3 * 2 * timing.PAIRS
    assert report.step_us == {"int8": int8_us, "exact": 100.0, "int8 squares": squares_us}
    assert report.choices[norm].variant == expect and report.choices[plain].variant == "xq2"
    assert attention_xq.CHOICE not in report.choices


# -- unstacked q, k, v (a Q4_K_M mix): one quantizer serves the three -----------------------------

def test_unstacked_readers_of_one_x_share_one_quantizer(native_gpu, run, q4k_m_slm_path):
    """llama.cpp's Q4_K_M mix keeps q, k and v apart (v is q6k in some layers). On the header
    form ("xq2", nothing quantizes for them) q's quantize_x launch leaves the bytes k's and v's
    would write, so Lowering.lower_ops records it once a layer; the logits stay within the
    two-byte int8 bound of the CPU oracle."""
    model = webslm.open_model(q4k_m_slm_path)

    async def go():
        session = await admit(native_gpu, model, AdmissionPolicy(tuning="int8", context=64))
        backend = await GpuBackend.build(session, model)
        try:
            forward = backend.forward
            dispatches, _ = await forward.record("decode", forward.programs["decode"].ops, 1, 0)
            labels = [forward.labels[id(d)] for d in dispatches]
            return labels, await oracle_errors(backend, model, [5, 17, 99, 250, 3, 42, 7])
        finally:
            backend.release()
    labels, errors = run(go())
    layers = model.architecture.n_layers
    assert labels.count("q quantize") == layers and "k quantize" not in labels and "v quantize" not in labels
    assert labels.count("k") == labels.count("v") == layers
    assert max(errors[1:]) <= INT8_TWO_BYTE_LOGIT_TOLERANCE, errors
