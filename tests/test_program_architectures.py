"""The step program for the architectures beyond the llama block (no GPU): Gemma 3 and Qwen2's
biases as ops of the one program (program/ops.py), what the fusion rules do and do not do to
them, the host-gathered embedding of a split table, admission's checks and the norm offset
folded into the upload. Their numerics on the GPU: tests/test_gpu_gemma3_native.py."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gemma3_model
import webslm
from webslm.admission.pipelines import unsupported, uploaded_part
from webslm.plan import SPEC_DEFAULT_LIMITS, PlanPolicy, plan_memory, verify
from webslm.plan.memory import plan_programs
from webslm.program.fusion import ALL, fuse
from webslm.program.ops import Layout, reference

GEMMA_LAYER = ["attn_norm", "q", "k", "v", "head_norm", "rope_kv", "attention", "o", "post_attention_norm",
               "ffn_norm", "gate", "up", "geglu", "down", "post_ffw_norm"]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3_program") / "g.slm"
    gemma3_model.write(path, matrices="q8")
    return webslm.open_model(path)


@pytest.fixture(scope="module")
def qwen2(qwen2_slm_path):
    return webslm.open_model(qwen2_slm_path)


def test_gemma3_reference_layer_and_its_ops(gemma):
    arch = gemma.architecture
    program = reference(arch, "decode", 1)
    assert [op.name for op in program.before] == ["embed", "embed_scale"]
    assert program.before[1].option("scale") == pytest.approx(64 ** 0.5)
    for i, kind in enumerate(arch.gemma3.layer_types):
        layer = {op.label: op for op in program.layer(i)}
        assert list(layer) == GEMMA_LAYER
        sliding = kind == "sliding"
        assert layer["rope_kv"].read("table") == ("rope_table_local" if sliding else "rope_table")
        assert layer["attention"].option("window") == (8 if sliding else None)
        assert layer["attention"].option("scale") == pytest.approx(24 ** -0.5)
        assert layer["attention"].slot == ("attention@window" if sliding else "attention")
        assert layer["head_norm"].read("q_weight") == f"v:blk.{i}.attn_q_norm"
        assert layer["o"].write("y") == "proj" and layer["post_attention_norm"].read("x") == "proj"
        assert layer["post_ffw_norm"].write("out") == "delta"
    slots = program.slots()
    assert slots[:3] == ["rope_kv", "attention@window", "attention"]      # the positional ones first


def test_fusion_leaves_gemma3_alone_but_stacks_and_keeps_one_layer_shape(gemma):
    arch = gemma.architecture
    layout = Layout({}, frozenset({"qkv", "gate_up"}))
    decode = fuse(reference(arch, "decode", 1, layout), layout, ALL)
    # Only stacking applies: the post norms write delta (no ACCUMULATE into x), so every norm
    # after the first is a residual one (nothing folds into the mat-vecs), the activation is
    # GeGLU (no swiglu input mode) and the attention has a window and a scale (no fused RoPE).
    assert [op.label for op in decode.layer(2)] == ["attn_norm", "qkv", "head_norm", "rope_kv", "attention", "o",
                                                    "post_attention_norm", "ffn_norm", "gate_up", "geglu", "down",
                                                    "post_ffw_norm"]
    assert decode.dispatches_per_layer() == 12
    assert not any(op.option("accumulate") or op.option("input") for op in decode.ops)


def test_the_llama_program_is_what_it_was(stacked_slm_path):
    """No Gemma or bias op in a llama model's program; the fused step is 5 dispatches a layer."""
    arch = webslm.open_model(stacked_slm_path).architecture
    layout = Layout({}, frozenset({"qkv", "gate_up"}))
    decode = fuse(reference(arch, "decode", 1, layout), layout, ALL)
    assert decode.dispatches_per_layer() == 5 and [op.name for op in decode.before] == ["embed"]
    assert {op.kind for op in decode.ops} == {"embed", "matmul", "attention_rope", "reduce"}


def test_qwen2_biases_ride_in_rope_kv_and_block_only_the_fused_attention(qwen2):
    arch = qwen2.architecture
    layout = Layout({}, frozenset({"qkv", "gate_up"}))
    rope = next(op for op in reference(arch, "decode", 1, layout).layer(1) if op.kind == "rope_kv")
    assert rope.option("bias") and rope.read("bias_k") == "v:blk.1.attn_k.bias"
    decode = fuse(reference(arch, "decode", 1, layout), layout, ALL)
    assert [op.label for op in decode.layer(0)] == ["qkv", "rope_kv", "attention", "o", "gate_up", "down"]


def test_a_split_embedding_is_gathered_by_the_host(gemma):
    """Binding limits small enough to split token_embd (as the real Gemma 3's 262k rows are in
    the 128 MiB tier): the embed op becomes host_embed (no dispatch, no params slot), the head
    runs a matmul a piece, and x is live from the upload on."""
    limits = {**SPEC_DEFAULT_LIMITS["core"], "maxStorageBufferBindingSize": 8192}
    plan = plan_memory(gemma, limits, PlanPolicy(context_capacity=32, prefill_chunk=4))
    verify(plan)
    assert [s["tensor"] for s in plan.splits] == ["token_embd"]
    for schedule, program in plan_programs(gemma, plan).items():
        assert program.before[0].kind == "host_embed" and program.before[0] not in program.dispatch_ops()
        assert "embed" not in program.slots()
        assert len([op for op in program.after if op.label.startswith("head#")]) == len(
            plan.splits[0]["pieces"]["codes"])
        assert program.intervals()["x"][0] == "upload"


def test_admission_checks_for_the_new_architectures(gemma, qwen2):
    assert unsupported(gemma.manifest) is None and unsupported(qwen2.manifest) is None
    arch = qwen2.manifest.architecture
    partial = dataclasses.replace(arch, rope=dataclasses.replace(arch.rope, rotary_dim=arch.head_dim // 2))
    manifest = dataclasses.replace(qwen2.manifest, architecture=partial)
    assert "rotary_dim == head_dim" in unsupported(manifest)


def test_gemma3_norms_are_uploaded_with_their_offset_as_the_cpu_path_adds_it(gemma):
    from webslm.cpu import CpuBackend
    cpu = CpuBackend(gemma)
    got = np.frombuffer(bytes(uploaded_part(gemma, "blk.1.attn_q_norm", "data")), "<f4")
    assert got.tobytes() == cpu.layers[1].q_norm.astype("<f4").tobytes()
    got = np.frombuffer(bytes(uploaded_part(gemma, "output_norm", "data")), "<f4")
    assert got.tobytes() == cpu.output_norm.astype("<f4").tobytes()
    stored = bytes(gemma.tensor_parts("blk.1.attn_q")["codes"])
    assert bytes(uploaded_part(gemma, "blk.1.attn_q", "codes")) == stored      # matrices as stored
