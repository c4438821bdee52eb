"""A projection stored in different forms across layers (no GPU): params slots per weight form.

llama.cpp's Q4_K_M gives attn_v and ffn_down more bits in some layers (Gemma 3 270M: attn_v
q8 or q5, ffn_down q6k or q4k). A mat-vec's params hold its row geometry, so those layers
cannot share one params slot: such a projection's ops carry mode "form" and each form has a
slot of its own (program/ops.py weight_forms, Op.slot). A model with one form per kind keeps
exactly the slots it had (its decode step's speed depends on them), pinned here.

Models: bench/synthetic_model.py --shape stacked (q4 everywhere) and --shape kquant
--encoding kmix_layers (attn_v q5 / q8, ffn_down q4k / q6k, the stacked gate|up q5 / q8).
Their numerics on the GPU: tests/test_gpu_kquant_native.py.
"""
from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import webslm
from webslm.admission.pipelines import KERNEL_LIMITS, unsupported
from webslm.plan import SPEC_DEFAULT_LIMITS, PlanPolicy, PlanRejected, plan_memory, verify
from webslm.plan.memory import plan_programs
from webslm.program.fusion import ALL, DEFAULT, fuse, stack_projections
from webslm.program.lowering import Lowering
from webslm.program.ops import NO_DISPATCH, Layout, reference, weight_forms

ROOT = pathlib.Path(__file__).resolve().parents[1]
Q5, Q8 = "q5-32-offset-f16", "q8-32-f16"
Q4K, Q6K = "q4k-256-scaled-min-f16", "q6k-256-offset-f16"


class Device:
    """What lowering reads of a device: limits (admission's requests) and features."""
    limits = {**SPEC_DEFAULT_LIMITS["core"], **KERNEL_LIMITS, "maxComputeWorkgroupsPerDimension": 65535}
    features = frozenset()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("synthetic_model", ROOT / "bench" / "synthetic_model.py")
    synthetic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synthetic)
    path = tmp_path_factory.mktemp("forms") / "kmix_layers.slm"
    synthetic.write_synthetic(path, "kquant", scheme="kmix_layers")
    return webslm.open_model(path)


def test_a_uniform_model_keeps_one_slot_per_label(stacked_slm_path):
    """The slots of every llama/SmolLM2-style artifact, as they were before forms existed."""
    model = webslm.open_model(stacked_slm_path)
    assert weight_forms(model.manifest) == {}
    want = {
        (DEFAULT, "decode"): ["rope_kv", "attention", "embed", "qkv", "o", "gate_up", "down", "head",
                              "reduce:argmax", "reduce:top-k"],
        (DEFAULT, "prefill"): ["rope_kv", "attention", "embed", "attn_norm", "qkv", "o", "ffn_norm", "gate_up",
                               "swiglu", "down", "final_norm", "head", "reduce:argmax", "reduce:top-k"],
        (ALL, "decode"): ["attention", "embed", "qkv", "o", "gate_up", "down", "head", "reduce:argmax",
                          "reduce:top-k"],
        ((), "decode"): ["rope_kv", "attention", "embed", "attn_norm", "q", "k", "v", "o", "ffn_norm", "gate", "up",
                         "swiglu", "down", "final_norm", "head", "reduce:argmax", "reduce:top-k"],
    }
    for (fusions, schedule), slots in want.items():
        plan = plan_memory(model, SPEC_DEFAULT_LIMITS["core"], PlanPolicy(fusions=fusions))
        program = plan_programs(model, plan)[schedule]
        assert program.slots() == slots, (fusions, schedule)
        assert not any(op.option("form") for op in program.ops)


def test_the_forms_of_a_model_mixed_across_layers(mixed):
    forms = weight_forms(mixed.manifest)
    assert forms == {"blk.0.attn_v": Q5, "blk.1.attn_v": Q8, "blk.0.ffn_down": Q4K, "blk.1.ffn_down": Q6K,
                     "blk.0.ffn_gate": Q5, "blk.1.ffn_gate": Q8, "blk.0.ffn_up": Q5, "blk.1.ffn_up": Q8}
    assert unsupported(mixed.manifest) is None           # admitted: no one-geometry-per-projection rule
    program = reference(mixed.architecture, "decode", 1, Layout(forms=forms))
    assert [op.slot for op in program.layer(0) if op.kind == "matmul"] == [
        "q", "k", f"v@{Q5}", "o", f"gate@{Q5}", f"up@{Q5}", f"down@{Q4K}"]
    assert [op.slot for op in program.layer(1) if op.kind == "matmul"] == [
        "q", "k", f"v@{Q8}", "o", f"gate@{Q8}", f"up@{Q8}", f"down@{Q6K}"]
    # The layers keep one template (the planner's steps, the regions): only the slots differ.
    assert [op.label for op in program.layer(0)] == [op.label for op in program.layer(1)]
    assert [op.step for op in program.layer(0)] == [op.step for op in program.layer(1)]


@pytest.mark.parametrize("fusions", [DEFAULT, ALL, ()], ids=["default", "all", "reference"])
def test_every_op_of_a_slot_lowers_to_that_slots_params(mixed, fusions):
    """What a shared slot promises: every op bound to it (every layer) lowers to the same params
    words, in both schedules, so the one write per slot is right for every layer. A mixed model
    planned without forms would break this (q5 and q8 rows differ in geometry)."""
    plan = plan_memory(mixed, Device.limits, PlanPolicy(fusions=fusions, prefill_chunk=32))
    verify(plan)
    assert plan.data["program"]["stacks"] == ["gate_up"]    # q|k|v differ inside layer 1: not stacked
    lowering = Lowering(Device(), mixed, plan)
    programs = plan_programs(mixed, plan)
    for schedule, program in programs.items():
        tokens = lowering.planned_tokens(schedule)
        by_slot: dict[str, list] = {}
        for op in program.ops:
            if op.kind not in NO_DISPATCH + ("reduce",):
                by_slot.setdefault(op.slot, []).append(lowering.lower(op, schedule, tokens, 0)[0])
        assert sorted(by_slot) == sorted(s for s in program.slots() if not s.startswith("reduce:"))
        for slot, launches in by_slot.items():
            for launch in launches[1:]:
                np.testing.assert_array_equal(launch.params, launches[0].params, err_msg=f"{schedule} {slot}")
        if schedule == "decode" and "stack-projections" in program.fusions:
            assert {f"gate_up@{Q5}", f"gate_up@{Q8}"} <= set(by_slot)
            assert by_slot[f"gate_up@{Q5}"][0].kernel != by_slot[f"gate_up@{Q8}"][0].kernel
        if schedule == "decode":   # the mat-vec's params differ by form: one slot would be wrong for one
            assert not np.array_equal(by_slot[f"v@{Q5}"][0].params, by_slot[f"v@{Q8}"][0].params)
        assert plan.data["schedules"][schedule]["slots"] == program.slots()


def test_stacking_refuses_parts_of_different_forms(mixed):
    """The planner stacks a group only when its parts share an encoding in every layer; a
    layout that claims otherwise is refused rather than given one slot for two forms."""
    forms = {"blk.1.attn_v": Q8, "blk.0.attn_v": Q5}
    layout = Layout({}, frozenset({"qkv"}), forms)
    with pytest.raises(ValueError, match="different forms"):
        stack_projections(list(reference(mixed.architecture, "decode", 1, layout).ops), layout)
    fused = fuse(reference(mixed.architecture, "decode", 1, Layout(forms=forms)), Layout(forms=forms), ALL)
    assert {op.slot for op in fused.ops if op.label == "v"} == {f"v@{Q5}", f"v@{Q8}"}


def test_layers_split_into_different_piece_counts_are_refused(mixed):
    """A binding limit that splits the q8 layers' matrices but not the q5 ones (or into other
    counts) would give the layers different op lists: the planner says so before any GPU work."""
    limits = {**SPEC_DEFAULT_LIMITS["core"], "maxStorageBufferBindingSize": 24576}
    with pytest.raises(PlanRejected) as caught:
        plan_memory(mixed, limits, PlanPolicy(context_capacity=32, prefill_chunk=4))
    assert caught.value.code == "no-split" and "different numbers of row pieces" in str(caught.value)
