"""The fusion rule quantize-into-attention (program/fusion.py) and its lowering: decode
attention writes the o projection's int8 input itself (kernels/attention_xq.py) where the o
projection runs on activations quantized once, so the step has no quantize_x launch between
them; past the single-pass length the combine pass and quantize_x run as before. The logits
are those of the same session without the rule, bit for bit (the same bytes reach o)."""
from __future__ import annotations

import numpy as np
import pytest

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.backends.gpu import GpuBackend
from webslm.backends.scores import Want
from webslm.program.fusion import ALL, DEFAULT, fuse
from webslm.program.ops import Layout, reference

from tuning_models import prequantized_entries

RULE = "quantize-into-attention"
WITHOUT = tuple(rule for rule in DEFAULT if rule != RULE)
DECODE_STEPS = 4


@pytest.fixture(scope="module")
def model(stacked_slm_path):
    return webslm.open_model(stacked_slm_path)       # head_dim 32: whole units of 32; context 320


def test_the_rule_marks_decode_attention_read_only_by_plain_matmuls(model):
    arch = model.architecture
    layout = Layout({}, frozenset({"qkv", "gate_up"}))
    assert RULE in DEFAULT
    decode = fuse(reference(arch, "decode", 1, layout), layout, DEFAULT)
    attention = [op for op in decode.ops if op.kind == "attention"]
    assert len(attention) == arch.n_layers and all(op.option("quantize_out") for op in attention)
    assert RULE in decode.fusions
    assert len(decode.ops) == len(fuse(reference(arch, "decode", 1, layout), layout, WITHOUT).ops)
    prefill = fuse(reference(arch, "prefill", 64, layout), layout, DEFAULT)
    assert not any(op.option("quantize_out") for op in prefill.ops)     # prefill runs the GEMM
    every = fuse(reference(arch, "decode", 1, layout), layout, ALL)      # RoPE in attention: left alone
    assert not any(op.option("quantize_out") for op in every.ops if op.kind.startswith("attention"))


async def _session_logits(gpu, model, fusions, cache, prompt):
    """(logits of a prefill and DECODE_STEPS greedy steps across the single-pass length, the
    labels and kernels of the short and the long decode recordings, the self-test report)."""
    session = await admit(gpu, model, AdmissionPolicy(fusions=fusions, tuning="force", tuning_budget_s=600.0),
                          tuning_cache=cache)
    assert session.tuning.source == "cached"
    self_test = session.self_test
    backend = await GpuBackend.build(session, model)
    try:
        forward = backend.forward
        ops = forward.programs["decode"].ops
        recordings = {}
        for long in (False, True):
            dispatches, _ = await forward.record("decode", ops, 1, 0, long_attention=long)
            recordings[long] = [forward.labels[id(d)] for d in dispatches]
        rows = [(await backend.prefill(prompt, Want("full"))).logits]
        for _ in range(DECODE_STEPS):
            rows.append((await backend.decode_one(int(np.argmax(rows[-1])), Want("full"))).logits)
        assert not forward.single_pass_at(backend.position - 1)            # the last steps were long
        return rows, recordings, {name for name, _ in session.kernels}, self_test
    finally:
        backend.release()


def test_attention_quantizes_for_o_and_the_logits_do_not_move(native_gpu, model, measured, run):
    cache = prequantized_entries(measured[0])         # every q4/q8 form on two-byte int8 activations
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, model.architecture.vocab, 254)]
    fused, fused_rec, fused_kernels, self_test = run(_session_logits(native_gpu, model, DEFAULT, cache, prompt))
    plain, plain_rec, plain_kernels, _ = run(_session_logits(native_gpu, model, WITHOUT, cache, prompt))
    layers = model.architecture.n_layers
    # the short recording: no quantize_x before o; the long one keeps it after the combine
    assert plain_rec[False].count("o quantize") == layers and "o quantize" not in fused_rec[False]
    assert len(fused_rec[False]) == len(plain_rec[False]) - layers
    assert fused_rec[True] == plain_rec[True] and fused_rec[True].count("o quantize") == layers
    assert any(name.startswith("attention_decode_xq_") for name in fused_kernels), fused_kernels
    assert not any(name.startswith("attention_decode_xq_") for name in plain_kernels)
    # admission's self-test ran the plan's own quantizing pipeline (else admission refuses:
    # "self-test-incomplete")
    assert "attention_xq" in self_test["families"]
    assert any(name.startswith("attention_decode_xq_") for name in self_test["kernels"])
    for want, got in zip(plain, fused):
        assert np.array_equal(want, got)


# -- measured at admission: the whole step with and without it (tuning._step_check) --------------

def _int8_report():
    from webslm.backends.gpu import tuning
    from webslm.kernels import matvec
    form = "q4[] 64x64 plain +y"
    report = tuning.TuningReport({form: matvec.Choice("xq2", 32, 4)}, {form: {"rule_us": 9.0}}, "measured")
    return report, {form: matvec.Choice("", 32, 8)}


@pytest.mark.parametrize("fused_us, unfused_us, exact_us, expect", [
    (90.0, 95.0, 100.0, "fused"), (95.0, 90.0, 100.0, "unfused"), (99.0, 99.5, 100.0, "exact"),
    (99.5, 96.0, 100.0, "unfused")])
def test_the_step_check_keeps_the_faster_of_attention_quantizing_or_not(run, fused_us, unfused_us, exact_us,
                                                                         expect):
    """Three steps timed in turn where attention would quantize for o: with it, with the
    separate quantize_x, and without int8 forms. The faster int8 step is the int8 step; where
    that is the unfused one the choices say so (attention_xq.CHOICE); the int8 forms still need
    STEP_GAIN (3%) over the exact step."""
    from webslm.backends.gpu import timing, tuning
    from webslm.kernels import attention_xq
    report, exact = _int8_report()
    timed = []

    async def seconds_per_step(choices):
        int8 = any(getattr(c, "variant", "") == "xq2" for c in choices.values())
        unfused = attention_xq.CHOICE in choices and not choices[attention_xq.CHOICE].quantize
        timed.append("exact" if not int8 else "unfused" if unfused else "fused")
        return {"exact": exact_us, "unfused": unfused_us, "fused": fused_us}[timed[-1]] * 1e-6
    run(tuning._step_check(report, exact, seconds_per_step, lambda choices: True))
    assert timed == ["fused", "exact", "unfused", "unfused", "exact", "fused"] * timing.PAIRS
    assert report.step_us == {"int8": fused_us, "exact": exact_us, "int8 unfused": unfused_us}
    form = next(iter(exact))
    if expect == "exact":
        assert report.choices == exact and "int8 forms dropped" in report.reason
        return
    assert report.choices[form].variant == "xq2"
    if expect == "unfused":
        assert report.choices[attention_xq.CHOICE] == attention_xq.OutputChoice(False)
    else:
        assert attention_xq.CHOICE not in report.choices


def test_an_unfused_choice_from_the_cache_keeps_quantize_x(native_gpu, model, measured, run):
    """A cached attention_xq.CHOICE that says the step was faster without it: the session
    takes it unmeasured and the short recording keeps its "o quantize" launches; an entry that
    is not a choice is ignored (lowering's default: attention quantizes)."""
    from webslm.backends.gpu import tuning_cache
    from webslm.kernels import attention_xq
    cache = prequantized_entries(measured[0])
    identity = next(iter(cache)).split("|")[0]
    bundle = next(iter(cache)).split("|")[1]
    a = model.architecture
    form = (f"{attention_xq.CHOICE} {a.n_heads}/{a.n_kv_heads}x{a.head_dim} f16, "
            f"{a.n_layers} layers of {a.hidden}")
    key = tuning_cache.cache_key(identity, bundle + "0" * 16, form)

    async def short_labels(entry):
        session = await admit(native_gpu, model, AdmissionPolicy(fusions=DEFAULT, tuning="force",
                                                                 tuning_budget_s=600.0),
                              tuning_cache={**cache, key: entry})
        backend = await GpuBackend.build(session, model)
        try:
            assert session.tuning.source == "cached"
            dispatches, _ = await backend.forward.record("decode", backend.forward.programs["decode"].ops, 1, 0)
            return [backend.forward.labels[id(d)] for d in dispatches], session.choices
        finally:
            backend.release()
    labels, choices = run(short_labels({"choice": {"quantize": False}}))
    assert labels.count("o quantize") == a.n_layers and choices[attention_xq.CHOICE].quantize is False
    labels, choices = run(short_labels({"choice": {"quantize": "no"}}))
    assert "o quantize" not in labels and attention_xq.CHOICE not in choices


def test_a_context_within_one_pass_compiles_no_quantizer_for_o(native_gpu, model, measured, run):
    """Admission compiles what the recordings run (Lowering.lower_ops): with a KV capacity of
    one pass there is no long recording, so where attention quantizes for o, quantize_x_plain
    (o's only quantizer) is not compiled, nor self-tested; without the rule it is."""
    cache = prequantized_entries(measured[0])

    async def kernels(fusions):
        session = await admit(native_gpu, model, AdmissionPolicy(fusions=fusions, tuning="force", context=128,
                                                                 tuning_budget_s=600.0), tuning_cache=cache)
        try:
            return {name for name, _ in session.kernels}
        finally:
            session.destroy()
    fused, plain = run(kernels(DEFAULT)), run(kernels(WITHOUT))
    assert any(name.startswith("attention_decode_xq_") for name in fused)
    assert "quantize_x_plain" not in fused and "quantize_x_plain" in plain
    assert "quantize_x_norm" in fused          # (down's input: gate|up quantizes it, quantize-into-matmul)
