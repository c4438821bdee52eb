"""The deterministic memory planner (py/webslm/plan): property tests over random architectures,
limits and policies (no byte shared without a proof, every binding within limits, totals and
the KV formula, a stable hash), the checker's rejection of tampered plans, the default model
under core and compatibility limits, and a Llama-3-8B-shaped model that must be split."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, event, given, settings, strategies as st

import webslm
from webslm.plan import (SPEC_DEFAULT_LIMITS, PlanInvalid, PlanPolicy, PlanRejected, canonical_json,
                         plan_hash, plan_memory, synthetic_manifest, verify)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
REJECTION_CODES = {"no-split", "kv-too-large", "too-large"}
LLAMA3_8B = dict(n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, hidden=4096, ffn=14336,
                 vocab=128256, context_length=8192, tied_output=False, rope={"base": 500000.0})


def independent_checks(plan, arch, limits):
    """What the tests check themselves, without proof.verify: limits, totals, the KV formula,
    and that every two regions sharing a byte are both temporaries that are never live together."""
    d = plan.as_dict()
    binding, max_buffer = limits["maxStorageBufferBindingSize"], limits["maxBufferSize"]
    sizes = {b["name"]: b["size"] for b in d["buffers"]}
    assert all(size <= max_buffer for size in sizes.values())
    for r in d["regions"]:
        assert 0 <= r["offset"] and r["offset"] + r["size"] <= sizes[r["buffer"]]
        if r["binding"] in ("storage", "read-only-storage"):
            assert r["size"] <= binding and r["size"] % 4 == 0
            assert r["offset"] % limits["minStorageBufferOffsetAlignment"] == 0
    assert plan.total_gpu_bytes == sum(plan.gpu_bytes.values())
    assert plan.total_cpu_bytes == sum(plan.cpu_bytes.values())
    for part in ("weights", "metadata", "kv", "arena", "scratch", "logits", "staging", "readback"):
        assert plan.gpu_bytes[part] == sum(b["size"] for b in d["buffers"] if b["part"] == part)
    owned = plan.total_gpu_bytes - plan.gpu_bytes["reserve"]
    assert plan.gpu_bytes["reserve"] == max(64 << 20, -(-owned * 15 // 100))
    p = d["policy"]
    formula = (arch.n_layers * p["context_capacity"] * arch.n_kv_heads * arch.head_dim * 2
               * {"f32": 4, "f16": 2}[p["kv_dtype"]])
    assert plan.kv["formula_bytes"] == formula
    assert sum(r["size"] for r in d["regions"] if r["part"] == "kv") == formula
    by_buffer = {}
    for r in d["regions"]:
        by_buffer.setdefault(r["buffer"], []).append(r)
    proved = {(q["first"], q["then"]) for q in d["proofs"]}
    shared = 0
    for members in by_buffer.values():
        members.sort(key=lambda r: r["offset"])
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                if b["offset"] >= a["offset"] + a["size"]:
                    break
                shared += 1
                assert a["schedule"] and b["schedule"], (a["name"], b["name"])
                if a["schedule"] == b["schedule"]:
                    (_, ea), (sb, _) = sorted((a["interval"], b["interval"]))
                    assert ea < sb, (a["name"], b["name"])
                assert (a["name"], b["name"]) in proved or (b["name"], a["name"]) in proved
    assert shared == len(d["proofs"])


def reordered(manifest):
    """The same manifest with its tensor mapping in reverse order."""
    return type(manifest)(manifest.architecture, dict(reversed(list(manifest.tensors.items()))))


# -- property tests ------------------------------------------------------------------------------

@st.composite
def cases(draw):
    kv = draw(st.integers(1, 4))
    heads = kv * draw(st.integers(1, 4))
    head_dim = 4 * draw(st.integers(1, 16))
    context = draw(st.integers(1, 700))
    arch = dict(n_layers=draw(st.integers(1, 4)), n_heads=heads, n_kv_heads=kv, head_dim=head_dim,
                hidden=heads * head_dim, ffn=draw(st.integers(1, 300)), vocab=draw(st.integers(1, 3000)),
                context_length=context, tied_output=draw(st.booleans()), qkv_bias=draw(st.booleans()))
    encodings = dict(matrices=draw(st.sampled_from(["q4", "q8", "f16", "f32"])),
                     embedding=draw(st.sampled_from(["q4", "q8", "f16", "f32"])),
                     vectors=draw(st.sampled_from(["f32", "f16"])), block=draw(st.sampled_from([32, 64, 128, 256])),
                     scale_type=draw(st.sampled_from(["f16", "f32"])), zero=draw(st.sampled_from(["min", "offset"])))
    binding = 4 * draw(st.integers(4096, 1 << 18))
    limits = {"maxStorageBufferBindingSize": binding,
              "maxBufferSize": binding * draw(st.sampled_from([1, 2, 4])) + 4 * draw(st.integers(0, 1000)),
              "minStorageBufferOffsetAlignment": draw(st.sampled_from([32, 64, 128, 256])),
              "minUniformBufferOffsetAlignment": draw(st.sampled_from([64, 256])),
              "maxUniformBufferBindingSize": draw(st.sampled_from([16384, 65536]))}
    policy = PlanPolicy(context_capacity=draw(st.one_of(st.none(), st.integers(1, context))),
                        kv_dtype=draw(st.sampled_from(["f32", "f16"])), prefill_chunk=draw(st.integers(1, 128)),
                        top_k_capacity=draw(st.integers(1, 256)), upload_chunk=4 * draw(st.integers(1, 1 << 12)),
                        feature_level=draw(st.sampled_from(["core", "compatibility"])))
    return arch, encodings, limits, policy


@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_random_plans_are_proved_within_limits_and_stable(case):
    arch, encodings, limits, policy = case
    manifest = synthetic_manifest(arch, **encodings)
    try:
        plan = plan_memory(manifest, limits, policy)
    except PlanRejected as exc:
        assert exc.code in REJECTION_CODES, exc
        event(f"rejected: {exc.code}")
        limit = min(limits["maxStorageBufferBindingSize"], limits["maxBufferSize"])
        a = manifest.architecture
        if exc.code == "no-split":           # only when some part really is over the limit
            assert max(n for t in manifest.tensors.values() for _, _, n in t.parts) > limit
        if exc.code == "kv-too-large":       # only when one layer's K really is over it
            capacity = policy.context_capacity or min(a.context_length, 2048)
            assert a.n_kv_heads * capacity * a.head_dim * (4 if policy.kv_dtype == "f32" else 2) > limit
        assume(False)
    event(f"split tensors: {min(len(plan.splits), 3)}")
    verify(plan)
    independent_checks(plan, manifest.architecture, limits)
    # Same inputs in another order (tensors reversed, limit keys shuffled, an unused limit
    # added): the same bytes and hash.
    shuffled = dict(random.Random(0).sample(sorted(limits.items()), len(limits)))
    shuffled["maxComputeWorkgroupsPerDimension"] = 65535
    again = plan_memory(reordered(manifest), shuffled, policy)
    assert again.canonical_json() == plan.canonical_json() and again.hash == plan.hash
    assert plan.hash == plan_hash(json.loads(plan.canonical_json()))


@settings(max_examples=60, derandomize=True, deadline=None)
@given(cases())
def test_random_plans_reject_tampering(case):
    arch, encodings, limits, policy = case
    try:
        plan = plan_memory(synthetic_manifest(arch, **encodings), limits, policy)
    except PlanRejected:
        assume(False)
    d = plan.as_dict()
    # Two session regions moved onto the same bytes: no proof can justify that.
    weights = [r for r in d["regions"] if r["part"] == "weights"]
    assume(len(weights) >= 2)
    bad = plan.as_dict()
    a, b = [r for r in bad["regions"] if r["part"] == "weights"][:2]
    b["buffer"], b["offset"] = a["buffer"], a["offset"]
    expect(bad, "overlap-without-proof")
    # A binding past the recorded limit.
    bad = plan.as_dict()
    bad["limits"]["maxStorageBufferBindingSize"] = max(r["size"] for r in bad["regions"]
                                                       if r["binding"].endswith("storage")) - 4
    assume(bad["limits"]["maxStorageBufferBindingSize"] >= 4)
    with pytest.raises(PlanInvalid) as info:
        verify(bad)
    assert info.value.code in ("binding-too-large", "buffer-too-large")


def expect(plan_dict, code, words=""):
    with pytest.raises(PlanInvalid) as info:
        verify(plan_dict)
    assert info.value.code == code, info.value
    assert words in info.value.sentence
    return info.value


# -- the checker on tampered copies of one plan ----------------------------------------------------

@pytest.fixture(scope="module")
def fixture_plan(fixture_slm_path):
    model = webslm.open_model(fixture_slm_path)
    return model, plan_memory(model, SPEC_DEFAULT_LIMITS["core"], PlanPolicy())


def region(d, name):
    return next(r for r in d["regions"] if r["name"] == name)


def test_fixture_model_plans_and_verifies(fixture_plan):
    model, plan = fixture_plan
    verify(plan)
    verify(plan.as_dict())
    independent_checks(plan, model.architecture, SPEC_DEFAULT_LIMITS["core"])
    assert plan.splits == [] and plan.kv["capacity"] == 64          # min(context_length 64, 2048)
    assert plan.cpu_bytes["artifact"] == fixture_plan[0].artifact.nbytes
    names = {r.name for r in plan.regions}
    assert {"w.token_embd.codes", "w.output.mins", "kv.L1.v", "decode.qkv", "prefill.gate_up",
            "decode.attn_acc", "params.decode", "rope_table", "readback.result"} <= names
    # Each temporary has its own buffer (WebGPU usage scopes), shared by the two schedules.
    shared = [q for q in plan.proofs if q["reason"].startswith("schedules exclusive")]
    assert shared and all(q["first"].split(".", 1)[1] == q["then"].split(".", 1)[1] for q in shared)
    verify(same_schedule_sharing(plan.as_dict()))       # the verifier still proves interval sharing


def same_schedule_sharing(d: dict) -> dict:
    """The plan with prefill.attn_out moved onto prefill.attn_in's bytes and the interval proof a
    planner would write for it (attn_in is last read by the v projection, attn_out made by attention)."""
    a, o = region(d, "prefill.attn_in"), region(d, "prefill.attn_out")
    steps = d["schedules"]["prefill"]["steps"]
    o["buffer"], o["offset"] = a["buffer"], a["offset"]
    d["proofs"] = [q for q in d["proofs"] if "prefill.attn_out" not in (q["first"], q["then"])]   # moved away
    d["proofs"].append({"first": "prefill.attn_in", "then": "prefill.attn_out", "offset": a["offset"],
                        "size": min(a["size"], o["size"]), "last_consumer": steps[a["interval"][1]],
                        "producer": steps[o["interval"][0]], "buffer": a["buffer"],
                        "reason": f"intervals disjoint: {a['interval'][1]} < {o['interval'][0]}"})
    decode = next((r for r in d["regions"] if r["name"] == "decode.attn_in"), None)
    if decode is not None:       # in that buffer too (the unfused decode program): the schedules' own proof
        d["proofs"].append({"first": "decode.attn_in", "then": "prefill.attn_out", "offset": decode["offset"],
                            "size": min(decode["size"], o["size"]), "last_consumer": None, "producer": None,
                            "buffer": a["buffer"], "reason": "schedules exclusive: decode / prefill"})
    from webslm.plan.proof import plan_hash
    d["hash"] = plan_hash(d)
    return d


def test_removed_proof_is_overlap_without_proof(fixture_plan):
    d = fixture_plan[1].as_dict()
    d["proofs"].pop(0)
    expect(d, "overlap-without-proof")


def test_proof_with_overlapping_intervals_is_rejected(fixture_plan):
    d = same_schedule_sharing(fixture_plan[1].as_dict())
    proof = next(q for q in d["proofs"] if q["first"] == "prefill.attn_in" and q["then"] == "prefill.attn_out")
    # attn_out is now said to be written at the step that last reads attn_in; the proof is
    # updated to match, so only the overlap itself is left to catch.
    last_read = region(d, "prefill.attn_in")["interval"][1]
    region(d, "prefill.attn_out")["interval"] = [last_read, region(d, "prefill.attn_out")["interval"][1]]
    proof["producer"] = d["schedules"]["prefill"]["steps"][last_read]
    proof["reason"] = f"intervals disjoint: {last_read} < {last_read}"
    expect(d, "bad-proof", "live ranges overlap")


def test_proof_with_wrong_steps_or_bytes_is_rejected(fixture_plan):
    d = same_schedule_sharing(fixture_plan[1].as_dict())
    next(q for q in d["proofs"] if q["last_consumer"])["last_consumer"] = "lm_head"
    expect(d, "bad-proof", "last consumer")
    d = fixture_plan[1].as_dict()
    d["proofs"][0]["size"] += 4
    expect(d, "bad-proof", "claims bytes")
    d = fixture_plan[1].as_dict()
    d["proofs"].append({**d["proofs"][0], "first": "w.token_embd.codes", "then": "kv.L0.k"})
    expect(d, "bad-proof", "share no bytes")


def test_session_region_alias_is_rejected(fixture_plan):
    d = fixture_plan[1].as_dict()
    k, v = region(d, "kv.L0.k"), region(d, "kv.L0.v")
    v["offset"] = k["offset"]
    expect(d, "overlap-without-proof")
    # Even with a proof record, a region live for the whole session never shares bytes.
    d["proofs"].append({"first": "kv.L0.k", "then": "kv.L0.v", "offset": k["offset"],
                        "size": min(k["size"], v["size"]), "last_consumer": None, "producer": None,
                        "reason": "schedules exclusive: decode / prefill", "buffer": k["buffer"]})
    expect(d, "bad-proof", "whole session")


def test_binding_buffer_alignment_interval_total_hash(fixture_plan):
    d = fixture_plan[1].as_dict()
    d["limits"]["maxStorageBufferBindingSize"] = 1024
    expect(d, "binding-too-large")
    d = fixture_plan[1].as_dict()
    d["limits"]["maxBufferSize"] = 1024
    expect(d, "buffer-too-large")
    d = fixture_plan[1].as_dict()
    region(d, "kv.L0.v")["offset"] += 4
    expect(d, "misaligned")
    d = fixture_plan[1].as_dict()
    region(d, "decode.qkv")["interval"] = [0, 6]                      # produced before the loop, read in it
    expect(d, "bad-interval", "straddles")
    d = fixture_plan[1].as_dict()
    d["gpu_bytes"]["kv"] -= 256
    expect(d, "bad-total")
    d = fixture_plan[1].as_dict()
    d["policy"]["prefill_chunk"] = 63
    expect(d, "bad-hash")


# -- determinism ---------------------------------------------------------------------------------

def test_same_inputs_same_bytes_in_a_fresh_process(fixture_plan, fixture_slm_path):
    plan = fixture_plan[1]
    code = ("import webslm, sys; from webslm.plan import *; "
            "p = plan_memory(webslm.open_model(sys.argv[1]), SPEC_DEFAULT_LIMITS['core'], PlanPolicy()); "
            "print(p.hash)")
    out = subprocess.run([sys.executable, "-c", code, str(fixture_slm_path)], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert out.stdout.strip() == plan.hash
    assert plan_memory(fixture_plan[0].manifest, dict(reversed(list(SPEC_DEFAULT_LIMITS["core"].items()))),
                       PlanPolicy()).canonical_json() == plan.canonical_json()
    assert canonical_json(plan.as_dict()) == plan.canonical_json()
    other = plan_memory(fixture_plan[0], SPEC_DEFAULT_LIMITS["core"], PlanPolicy(kv_dtype="f16"))
    assert other.hash != plan.hash and other.gpu_bytes["kv"] == plan.gpu_bytes["kv"] // 2


# -- the default model, a model that must be split, and rejections --------------------------------

@pytest.mark.skipif(not DEFAULT_MODEL.exists(), reason="the default model is not assembled (tools/assets.py)")
@pytest.mark.parametrize("level", ["core", "compatibility"])
def test_default_model_plans_under_spec_limits(level):
    model = webslm.open_model(DEFAULT_MODEL)
    limits = SPEC_DEFAULT_LIMITS[level]
    plan = plan_memory(model, limits, PlanPolicy(feature_level=level))
    verify(plan)
    independent_checks(plan, model.architecture, limits)
    assert plan.splits == []                           # token_embd codes: 28 MiB < 128 MiB
    assert plan.kv["formula_bytes"] == 30 * 2048 * 3 * 64 * 2 * 4 == plan.gpu_bytes["kv"]
    assert plan.gpu_bytes["weights"] >= plan.as_dict()["weights_payload_bytes"]
    assert plan.gpu_bytes["reserve"] == 64 << 20
    assert plan.cpu_bytes["artifact"] == DEFAULT_MODEL.stat().st_size
    assert plan.total_gpu_bytes < 300 << 20


def test_llama3_8b_shape_is_split_by_rows():
    manifest = synthetic_manifest(LLAMA3_8B, matrices="q4", embedding="q8")
    limits = SPEC_DEFAULT_LIMITS["compatibility"]
    plan = plan_memory(manifest, limits, PlanPolicy(feature_level="compatibility"))
    verify(plan)
    independent_checks(plan, manifest.architecture, limits)
    splits = {s["tensor"]: s for s in plan.splits}
    assert set(splits) == {"token_embd", "output"}     # 128256 x 4096 q8 codes: 525 MB > 128 MiB
    embd = splits["token_embd"]
    assert embd["strategy"] == "split-rows" and embd["rows_per_piece"] == 32768
    assert [len(v) for v in embd["pieces"].values()] == [4, 4] and len(embd["buffers"]) > 1
    assert plan.required_limits["maxStorageBufferBindingSize"] <= 128 << 20
    assert sum(1 for d in plan.as_dict()["schedules"]["decode"]["ops"] if d.startswith("head#")) == 4
    # With large limits nothing is split, and the KV cache is the same formula.
    big = {**SPEC_DEFAULT_LIMITS["core"], "maxStorageBufferBindingSize": 1 << 31, "maxBufferSize": 1 << 34}
    whole = plan_memory(manifest, big, PlanPolicy())
    verify(whole)
    assert whole.splits == [] and whole.kv == plan.kv


def test_rejections_name_their_reason():
    long_context = synthetic_manifest({**LLAMA3_8B, "context_length": 131072})
    with pytest.raises(PlanRejected) as info:
        plan_memory(long_context, SPEC_DEFAULT_LIMITS["core"], PlanPolicy(context_capacity=131072))
    assert info.value.code == "kv-too-large" and "32768 tokens" in info.value.sentence
    tiny = {**SPEC_DEFAULT_LIMITS["core"], "maxStorageBufferBindingSize": 1024}
    with pytest.raises(PlanRejected) as info:
        plan_memory(synthetic_manifest(dict(LLAMA3_8B, n_layers=1)), tiny, PlanPolicy())
    assert info.value.code == "no-split" and "token_embd" in info.value.where
    with pytest.raises(PlanRejected) as info:
        plan_memory(synthetic_manifest(LLAMA3_8B), {"maxBufferSize": 1 << 30}, PlanPolicy())
    assert info.value.code == "missing-limit"
    with pytest.raises(PlanRejected) as info:
        plan_memory(synthetic_manifest(LLAMA3_8B), SPEC_DEFAULT_LIMITS["core"], PlanPolicy(kv_dtype="bf16"))
    assert info.value.code == "bad-policy"
    with pytest.raises(PlanRejected) as info:
        plan_memory(synthetic_manifest(dict(LLAMA3_8B, n_layers=1)), SPEC_DEFAULT_LIMITS["core"],
                    PlanPolicy(prefill_chunk=4096))
    assert info.value.code == "too-large" and "prefill chunk" in info.value.sentence
    assert isinstance(info.value, webslm.errors.CodedError)


# -- the copied kernel formulas still bound what the kernels plan ---------------------------------

def test_scratch_bounds_cover_the_kernels_plans():
    from webslm.kernels import attention, logits
    core = {"maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupSizeX": 256,
            "maxComputeWorkgroupStorageSize": 16384, "maxComputeWorkgroupsPerDimension": 65535,
            **SPEC_DEFAULT_LIMITS["core"]}
    for h, kv, e, capacity in [(9, 3, 64, 2048), (32, 8, 128, 8192), (4, 4, 64, 300), (8, 1, 128, 1000)]:
        arch = synthetic_manifest(dict(n_layers=1, n_heads=h, n_kv_heads=kv, head_dim=e, hidden=h * e, ffn=8,
                                       vocab=1000, context_length=capacity)).architecture
        plan = plan_memory(synthetic_manifest(arch), SPEC_DEFAULT_LIMITS["core"], PlanPolicy(context_capacity=capacity))
        acc, ml = (region(plan.as_dict(), f"decode.attn_{n}")["size"] for n in ("acc", "ml"))
        shape = attention.AttentionShape(h, kv, e, capacity)
        for position in range(0, capacity, 7):
            p = attention.plan_decode(core, shape, position)
            assert 4 * p.scratch_acc <= acc and 4 * p.scratch_ml <= ml, (h, kv, e, position)

    class Device:
        limits, features = core, frozenset()
    for vocab in (1, 300, 49152, 128256):
        for k in (1, 40, 64, 256):
            if k > vocab:
                continue
            arch = dict(n_layers=1, n_heads=1, n_kv_heads=1, head_dim=4, hidden=4, ffn=4, vocab=vocab, context_length=8)
            plan = plan_memory(synthetic_manifest(arch), SPEC_DEFAULT_LIMITS["core"], PlanPolicy(top_k_capacity=k))
            have = region(plan.as_dict(), "decode.logits_partials")["size"]
            for kk in {1, max(1, k // 2), k}:
                op = "argmax" if kk == 1 else "topk"
                p = logits.plan(Device(), logits.choose(Device(), op, kk), vocab, kk)
                assert 4 * p.partials_words <= have, (vocab, k, kk)
