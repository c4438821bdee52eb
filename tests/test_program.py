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

import types

import numpy as np
import pytest

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.admission.pipelines import KERNEL_LIMITS
from webslm.backends.gpu import GpuBackend
from webslm.backends.scores import Want
from webslm.plan import SPEC_DEFAULT_LIMITS, PlanPolicy, plan_memory, verify
from webslm.plan.memory import plan_programs
from webslm.kernels import matvec
from webslm.kernels.kv_cache import KvShapeError
from webslm.program.fusion import ALL, RULES, fuse
from webslm.program.lowering import Lowering
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


def test_every_rule_fused_gives_five_dispatches_a_layer_and_prefill_only_stacks(stacked_model):
    arch = stacked_model.architecture
    layout = Layout({}, frozenset({"qkv", "gate_up"}), rope_matmul=True)
    decode = fuse(reference(arch, "decode", 1, layout), layout)
    assert decode.fusions == ALL
    assert [(op.label, op.kind) for op in decode.layer(0)] == [
        ("qkv", "matmul"), ("attention", "attention"), ("o", "matmul"), ("gate_up", "matmul"), ("down", "matmul")]
    qkv, attention, o, gate_up, down = decode.layer(1)
    assert qkv.option("input") == "norm" and qkv.read("x") == "x" and qkv.read("weight") == "v:blk.1.attn_norm"
    assert qkv.option("rope") and qkv.read("table") == "rope_table" and qkv.write("k_cache") == "kv:L1.k"
    assert attention.option("quantize_out")             # quantize-into-attention marks it (lowering decides)
    no_matmul_rope = fuse(reference(arch, "decode", 1, layout), layout,
                          tuple(r for r in ALL if r != "rope-kv-into-matmul"))
    assert [op.kind for op in no_matmul_rope.layer(0)][:2] == ["matmul", "attention_rope"]
    assert o.option("accumulate") and o.write("y") == "x" and gate_up.option("input") == "norm"
    assert down.option("input") == "swiglu" and down.option("accumulate") and down.read("x") == "gate_up"
    head = decode.after[0]                              # the final norm folded into the head
    assert [op.kind for op in decode.after] == ["matmul", "reduce"] and head.option("input") == "norm"
    assert len(decode.dispatch_ops()) == 1 + 5 * arch.n_layers + 2
    prefill = fuse(reference(arch, "prefill", 64, layout), layout)
    assert prefill.fusions == ("stack-projections",)
    assert [op.label for op in prefill.layer(1)] == ["attn_norm", "qkv", "rope_kv", "attention", "o", "ffn_norm",
                                                     "gate_up", "swiglu", "down"]
    qkv = prefill.layer(1)[1]
    assert qkv.write("y") == "qkv" and qkv.read("w") == "w:blk.1.attn_q+blk.1.attn_k+blk.1.attn_v"


def test_each_rule_on_top_of_the_ones_before_removes_dispatches(stacked_model):
    arch = stacked_model.architecture
    layout = Layout({}, frozenset({"qkv", "gate_up"}), rope_matmul=True)
    base = reference(arch, "decode", 1, layout)
    before = base
    for k, rule in enumerate(RULES):
        fused = fuse(base, layout, ALL[:k + 1])
        if rule.name == "residual-into-accumulate":       # turns the residual norms into plain ones
            assert len(fused.ops) == len(before.ops) and fused.ops != before.ops
        elif rule.name == "rope-kv-into-attention":       # RoPE + KV append went into q|k|v already
            assert fused.ops == before.ops
        elif rule.name == "quantize-into-attention":      # marks attention; lowering removes a launch
            assert len(fused.ops) == len(before.ops)      # (test_quantize_into_attention.py)
            assert [op.label for op in fused.ops if op.option("quantize_out")] == ["attention"] * arch.n_layers
        elif rule.name == "quantize-into-matmul":         # marks o, gate|up, down; lowering removes launches
            assert len(fused.ops) == len(before.ops)      # (test_quantize_into_matmul.py)
            marked = [op.label for op in fused.ops if op.option("quantize_out") and op.kind == "matmul"]
            assert marked == ["o", "gate_up", "down"] * arch.n_layers
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


def test_the_planner_lets_qkv_take_rope_where_its_kernel_fits_the_storage_buffers(stacked_model):
    """The stacked q4 q|k|v's fused kernel binds 9 storage buffers: with WebGPU's default 8 a
    stage the rule leaves RoPE + KV append alone; with 9 or more it takes them (5 dispatches)."""
    core = SPEC_DEFAULT_LIMITS["core"]
    for buffers, rope in ((None, False), (8, False), (9, True), (16, True)):
        limits = core if buffers is None else {**core, "maxStorageBuffersPerShaderStage": buffers}
        plan = plan_memory(stacked_model, limits, PlanPolicy(fusions=ALL))
        decode = plan_programs(stacked_model, plan)["decode"]
        assert plan.data["program"]["rope_matmul"] is rope
        assert bool(decode.layer(0)[0].option("rope")) is rope and decode.dispatches_per_layer() == 5
        assert [op.kind for op in decode.layer(0)][1] == ("attention" if rope else "attention_rope")


def test_partial_rotary_keeps_rope_out_of_the_qkv_mat_vec_but_not_out_of_attention(stacked_model):
    """The fused q|k|v kernel rotates whole heads: with rotary_dim < head_dim the rule leaves
    RoPE + KV append alone, and rope-kv-into-attention (which rotates part of a head) still
    takes it."""
    import dataclasses
    arch = stacked_model.architecture
    partial = dataclasses.replace(arch, rope=dataclasses.replace(arch.rope, rotary_dim=arch.head_dim // 2))
    layout = Layout({}, frozenset({"qkv", "gate_up"}), rope_matmul=True)
    decode = fuse(reference(partial, "decode", 1, layout), layout)
    qkv, attention = decode.layer(0)[:2]
    assert not qkv.option("rope") and attention.kind == "attention_rope"
    whole = fuse(reference(arch, "decode", 1, layout), layout)
    assert whole.layer(0)[0].option("rope") and whole.layer(0)[1].kind == "attention"


def test_the_fused_qkv_params_follow_a_changed_choice(stacked_model):
    """The q|k|v with RoPE keeps its lowered block between tokens, but its launch shape is in
    it (the pair blocks a head): when the tuning stage changes that form's choice, the next
    token's params are the new shape's, as lower() plans them."""
    limits = {**SPEC_DEFAULT_LIMITS["core"], **KERNEL_LIMITS, "maxComputeWorkgroupsPerDimension": 65535}
    plan = plan_memory(stacked_model, limits, PlanPolicy(fusions=ALL, kv_dtype="f16"))
    lowering = Lowering(types.SimpleNamespace(limits=limits, features=frozenset()), stacked_model, plan)
    qkv = next(op for op in plan_programs(stacked_model, plan)["decode"].ops if op.option("rope"))
    form = lowering.matvec_form(qkv)[0]
    head_dim = stacked_model.architecture.head_dim
    for rows in (4, 8, 16, 4):
        lowering.choices[form] = matvec.Choice("", 64, rows)
        words = lowering.decode_params(qkv, 3)
        np.testing.assert_array_equal(words, lowering.lower(qkv, "decode", 1, 3)[0].params)
        assert int(words[8]) == 3 and int(words[14]) == head_dim // rows


@pytest.mark.parametrize("fusions", [(), ALL, tuple(r for r in ALL if r != "rope-kv-into-matmul")],
                         ids=["rope_kv and attention", "q|k|v with RoPE", "attention_rope"])
def test_a_decode_step_rewrites_the_params_lowering_plans_at_every_position(stacked_model, fusions):
    """The executor's per-token path (Lowering.decode_params: the family plan made once, its
    params re-derived per position) writes exactly what planning that position from scratch
    (lower) would, at every position of the cache, short and long attention alike."""
    limits = {**SPEC_DEFAULT_LIMITS["core"], **KERNEL_LIMITS, "maxComputeWorkgroupsPerDimension": 65535}
    plan = plan_memory(stacked_model, limits, PlanPolicy(fusions=fusions, kv_dtype="f16"))
    device = types.SimpleNamespace(limits=limits, features=frozenset())
    lowering = Lowering(device, stacked_model, plan)
    ops = {op.slot: op for op in plan_programs(stacked_model, plan)["decode"].ops if op.positional}
    kinds = {(): ["attention", "rope_kv"], ALL: ["attention", "matmul"]}.get(fusions, ["attention_rope"])
    assert sorted(op.kind for op in ops.values()) == kinds
    assert lowering.capacity > lowering.single_pass          # both attention forms are crossed
    for op in ops.values():
        for position in range(lowering.capacity):
            long_attention = not lowering.single_pass_at(position)
            planned = lowering.lower(op, "decode", 1, position, long_attention=long_attention)[0].params
            np.testing.assert_array_equal(lowering.decode_params(op, position), planned, err_msg=f"{op.slot} {position}")
        with pytest.raises(KvShapeError, match="capacity"):
            lowering.decode_params(op, lowering.capacity)


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


def test_long_attention_fused_computes_what_the_reference_does(native_gpu, stacked_model, run):
    """Past the single-pass length (256 keys) decode attention splits the context and adds the
    combine pass; the fused RoPE + KV + attention kernel (every rule) then runs with the
    combine of attention's own layout. Prefill 270 tokens, decode 4: the same logits as the
    reference program within FUSED_TOLERANCE, across the 256-key boundary."""
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, stacked_model.architecture.vocab, 254)]

    async def logits(fusions):
        session = await admit(native_gpu, stacked_model, AdmissionPolicy(fusions=fusions))
        backend = await GpuBackend.build(session, stacked_model)
        try:
            assert backend.capacity > 256 + 4 and backend.forward.decode_combine_grid is not None
            rows = [(await backend.prefill(prompt, Want("full"))).logits]
            for _ in range(DECODE_STEPS):
                rows.append((await backend.decode_one(int(np.argmax(rows[-1])), Want("full"))).logits)
            assert not backend.forward.single_pass_at(backend.position - 1)     # the last steps were long
            return rows
        finally:
            backend.release()

    for want, got in zip(run(logits(())), run(logits(ALL))):
        error = float(np.abs(got - want).max()) / float(np.abs(want).max())
        assert error <= FUSED_TOLERANCE, error


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


def test_the_stacked_prefill_qkv_writes_three_sections(stacked_model, monkeypatch):
    """The prefill q|k|v GEMM writes q, k and v where rope_kv and attention read them: the planar
    qkv activation's sections (ops.qkv_offsets for the planned chunk), each [T][width]."""
    from webslm.kernels import gemm
    from webslm.program.lowering import Lowering
    from webslm.program.ops import qkv_offsets

    class Device:
        limits = {**SPEC_DEFAULT_LIMITS["core"], "maxComputeWorkgroupStorageSize": 32768,
                  "maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupSizeX": 256,
                  "maxComputeWorkgroupsPerDimension": 65535}
        features = frozenset()
    plan = plan_memory(stacked_model, Device.limits, PlanPolicy())
    programs = plan_programs(stacked_model, plan)
    lowering = Lowering(Device(), stacked_model, plan)
    op = next(op for op in programs["prefill"].layer(0) if op.label == "qkv")
    (launch,) = lowering.lower(op, "prefill", 5, 0)
    a = stacked_model.architecture
    q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    _, k_at, v_at = qkv_offsets(a, lowering.chunk, lowering.s_align)
    assert launch.kernel.startswith("gemm_tiled_") and launch.outputs[0].ref == "qkv"
    # params: m, n, k, x_stride, y_stride, tiles_m, tiles, split1, split2, base1, base2, stride1, stride2
    words = list(launch.params[:13])
    assert words[:5] == [5, q + 2 * kv, a.hidden, a.hidden, q]
    assert words[7:] == [q, q + kv, k_at // 4, v_at // 4, kv, kv]
    assert any(t.sections and t.overrides().items() <= launch.overrides.items() for t in gemm.TILES.values())
    # The tile follows the chunk's length (rounded up to a bucket), and admission compiles each.
    # (This model's projections are narrow: with the shipped MIN_WORKGROUPS every one takes the
    # shortest tile, so the rule asks for none here and the tallest tile that fits wins.)
    from webslm.admission.pipelines import pipelines
    monkeypatch.setattr(gemm, "MIN_WORKGROUPS", 1)
    compiled = pipelines(stacked_model, Device(), plan)
    heights = set()
    for tokens in range(1, lowering.chunk + 1, 7):
        for op in programs["prefill"].layer(0):
            for launch in lowering.lower(op, "prefill", tokens, 0):
                assert (launch.kernel, launch.overrides) in compiled, (op.label, tokens)
                if op.kind == "matmul":
                    tile = next(t for t in gemm.TILES.values()
                                if t.kernel("q4") == launch.kernel and t.overrides().items() <= launch.overrides.items())
                    assert tile.tm <= max(32, 2 * tokens), (op.label, tokens, tile.name)
                    heights.add(tile.tm)
    assert len(heights) > 1
