"""The step program (webslm.program): the reference op list, fusion rules, and what the planner
derives from it; each fusion rule against the reference on the GPU (wgpu-native, lavapipe).

Fused == reference bound: per logit, |fused - reference| <= FUSED_TOLERANCE x the row's largest
|logit|, after a prefill and after each of DECODE_STEPS greedy decode steps. A fusion changes
the order of f32 sums (a norm computed per workgroup, the residual added inside the mat-vec,
SwiGLU on the mat-vec's input), never the math, so the two agree to a few ULP of each partial
sum; measured on lavapipe up to ~1e-6 relative. The bound is 1e-4: tight enough that a wrong
offset, a missing residual or a stale row (errors of order 1) cannot pass.
"""
from __future__ import annotations

import numpy as np
import pytest

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.backends.gpu import GpuBackend
from webslm.backends.scores import Want
from webslm.plan import SPEC_DEFAULT_LIMITS, PlanPolicy, plan_memory, verify
from webslm.plan.memory import plan_programs
from webslm.program.fusion import ALL, RULES, fuse
from webslm.program.ops import Layout, reference

FUSED_TOLERANCE = 1e-4
DECODE_STEPS = 4
REFERENCE_LAYER = ["attn_norm", "q", "k", "v", "rope_kv", "attention", "o", "ffn_norm", "gate", "up", "swiglu",
                   "down"]


@pytest.fixture(scope="module")
def stacked_model(stacked_slm_path):
    return webslm.open_model(stacked_slm_path)


# -- the program itself (no GPU) ----------------------------------------------------------------

def test_the_reference_layer_is_the_cpu_oracles_steps(stacked_model):
    arch = stacked_model.architecture
    for schedule, tokens in (("decode", 1), ("prefill", 64)):
        program = reference(arch, schedule, tokens)
        assert [op.label for op in program.layer(1)] == REFERENCE_LAYER
        assert len({op.name for op in program.ops}) == len(program.ops)          # names are unique
        assert program.before[0].kind == "embed" and program.after[-1].kind == "reduce"
    assert [op.label for op in reference(arch, "prefill", 64).after] == ["final_norm", "last_row", "head", "reduce"]


def test_every_rule_fused_gives_five_dispatches_a_layer_and_leaves_prefill_alone(stacked_model):
    arch = stacked_model.architecture
    layout = Layout({}, frozenset({"qkv", "gate_up"}))
    decode = fuse(reference(arch, "decode", 1, layout), layout)
    assert decode.fusions == ALL
    assert [(op.label, op.kind) for op in decode.layer(0)] == [
        ("qkv", "matmul"), ("attention", "attention_rope"), ("o", "matmul"), ("gate_up", "matmul"), ("down", "matmul")]
    qkv, _, o, gate_up, down = decode.layer(1)
    assert qkv.option("input") == "norm" and qkv.read("x") == "x" and qkv.read("weight") == "v:blk.1.attn_norm"
    assert o.option("accumulate") and o.write("y") == "x" and gate_up.option("input") == "norm"
    assert down.option("input") == "swiglu" and down.option("accumulate") and down.read("x") == "gate_up"
    head = decode.after[0]                              # the final norm folded into the head
    assert [op.kind for op in decode.after] == ["matmul", "reduce"] and head.option("input") == "norm"
    assert len(decode.dispatch_ops()) == 1 + 5 * arch.n_layers + 2
    prefill = reference(arch, "prefill", 64, layout)
    assert fuse(prefill, layout).ops == prefill.ops


def test_each_rule_on_top_of_the_ones_before_removes_dispatches(stacked_model):
    arch = stacked_model.architecture
    layout = Layout({}, frozenset({"qkv", "gate_up"}))
    base = reference(arch, "decode", 1, layout)
    before = base
    for k, rule in enumerate(RULES):
        fused = fuse(base, layout, ALL[:k + 1])
        if rule.name == "residual-into-accumulate":       # turns the residual norms into plain ones
            assert len(fused.ops) == len(before.ops) and fused.ops != before.ops
        else:
            assert len(fused.ops) < len(before.ops), rule.name
        before = fused
    # norm-into-matmul alone folds nothing: every layer's norm but the first adds the residual,
    # and a layer's norm folds only when it folds in every layer.
    assert fuse(base, layout, ("norm-into-matmul",)).ops == base.ops
    with pytest.raises(ValueError, match="unknown fusion"):
        fuse(base, layout, ("norm-into-everything",))


def test_split_weights_run_one_matmul_a_piece():
    from test_plan_memory import LLAMA3_8B, synthetic_manifest
    manifest = synthetic_manifest(LLAMA3_8B, matrices="q4", embedding="q8")
    plan = plan_memory(manifest, SPEC_DEFAULT_LIMITS["compatibility"], PlanPolicy(feature_level="compatibility"))
    programs = plan_programs(manifest, plan)
    heads = [op for op in programs["decode"].ops if op.label.startswith("head#")]
    assert [op.option("piece") for op in heads] == [0, 1, 2, 3] and all(op.option("input") == "norm" for op in heads)
    assert [op.name for op in programs["prefill"].ops if op.name.startswith("embed")] == ["embed"]


def test_the_plan_derives_slots_and_temporaries_from_the_program(stacked_model):
    for fusions in (None, ALL, ()):
        plan = plan_memory(stacked_model, SPEC_DEFAULT_LIMITS["core"], PlanPolicy(fusions=fusions))
        verify(plan)
        programs = plan_programs(stacked_model, plan)
        d = plan.as_dict()
        for schedule, program in programs.items():
            record = d["schedules"][schedule]
            assert record["ops"] == [op.name for op in program.ops] and record["slots"] == program.slots()
            params = next(r for r in d["regions"] if r["name"] == f"params.{schedule}")
            assert params["slots"] == len(program.slots())
            temporaries = {r["name"].split(".", 1)[1] for r in d["regions"] if r["schedule"] == schedule}
            assert temporaries == set(program.activations())
        decode = {r["name"] for r in d["regions"] if r["schedule"] == "decode"}
        if fusions is None or fusions:       # what the fused step no longer needs is not planned
            assert not decode & {"decode.attn_in", "decode.ffn_in", "decode.ffn_act", "decode.delta", "decode.final_in"}
        else:
            assert {"decode.attn_in", "decode.delta", "decode.final_in"} <= decode
    with pytest.raises(Exception, match="fusions"):
        plan_memory(stacked_model, SPEC_DEFAULT_LIMITS["core"], PlanPolicy(fusions=("no-such-rule",)))


# -- each rule against the reference on the GPU ----------------------------------------------------

async def _logits(gpu, model, fusions) -> tuple[list[np.ndarray], int]:
    session = await admit(gpu, model, AdmissionPolicy(fusions=fusions, context=64))
    backend = await GpuBackend.build(session, model)
    try:
        rows = [(await backend.prefill([1, 5, 9, 200, 7, 3], Want("full"))).logits]
        for _ in range(DECODE_STEPS):
            rows.append((await backend.decode_one(int(np.argmax(rows[-1])), Want("full"))).logits)
        return rows, backend.forward.programs["decode"].dispatches_per_layer()
    finally:
        backend.release()


_REFERENCE: dict = {}      # the reference program's logits, computed once for every rule


@pytest.mark.parametrize("rules", [ALL[:k + 1] for k in range(len(ALL))] + [("swiglu-into-down",)],
                         ids=[f"+{r}" for r in ALL] + ["swiglu-into-down alone"])
def test_a_fusion_computes_what_the_reference_does(native_gpu, stacked_model, run, rules, self_test_once):
    """Each rule on top of the rules before it (the order fuse applies them), against the
    reference program: the same logits within FUSED_TOLERANCE. (Admission's self-test runs
    once for all of them: conftest.py self_test_once.)"""
    if "reference" not in _REFERENCE:
        _REFERENCE["reference"] = run(_logits(native_gpu, stacked_model, ()))
    reference_rows, per_layer = _REFERENCE["reference"]
    assert per_layer == len(REFERENCE_LAYER)
    fused_rows, fused_per_layer = run(_logits(native_gpu, stacked_model, rules))
    assert fused_per_layer < per_layer or rules == ALL[:2]
    if rules == ALL:
        assert fused_per_layer == 5
    for want, got in zip(reference_rows, fused_rows):
        error = float(np.abs(got - want).max()) / float(np.abs(want).max())
        assert error <= FUSED_TOLERANCE, (rules, error)
