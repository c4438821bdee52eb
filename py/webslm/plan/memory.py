"""The deterministic memory planner: every byte a model will own, decided before any is asked for.

Design report, "KV Cache, Deterministic Memory Planning, and Binding Strategy" and admission
step 3: admission derives one immutable allocation graph from the validated manifest, a plain
dict of WebGPU limits (camelCase, as webgpu/interface.py spells them) and a PlanPolicy, and
nothing else. The planner knows no GPU object; the same inputs give byte-identical canonical
JSON and the same `plan.hash` in CPython and in Pyodide.

What a plan holds (MemoryPlan; `as_dict()` is its JSON):

    buffers    each GPU buffer to create: stable name, part, size, usage flags
    regions    each range of a buffer the engine binds or copies: name, buffer, offset, size,
               alignment (minStorageBufferOffsetAlignment, or the uniform one), binding kind,
               and when it is live: the whole session, or an interval [first producer step,
               last consumer step] of one schedule
    schedules  the step program of one decode step (T = 1) and of one prefill chunk (T = the
               policy's chunk; program/ops.py, fused by program/fusion.py): its op names, its
               steps with the layer loop's bounds, and its params slots
    proofs     one record per pair of regions that share bytes: which is read last when
               (last consumer), which is written first when (producer), the shared bytes and
               the reason ("intervals disjoint: e_i < b_j", or two schedules that never run
               in one submit); proof.verify() re-checks each from the regions' own data
    splits     tensors too large for one binding, and how they are split (strategy
               "split-rows": row ranges, aligned to whole rows and to the offset alignment)
    gpu_bytes  owned GPU bytes by part: weights, metadata, kv, arena, scratch, logits,
               staging, readback, reserve (each part is the sum of its buffers' sizes)
    cpu_bytes  artifact, repack, upload, readback, shadow, runtime
    required_limits   the limits this plan needs (admission requests exactly these)

The parts. weights: every tensor part as the artifact stores it (q4/q8 codes, scales and mins,
f16/f32 data), each at a 256-aligned offset, bound as its own range, packed in file order into
buffers of at most maxBufferSize. metadata: the params uniforms (one slot per dispatch of each
schedule) and the RoPE (cos, sin) table (two for Gemma 3: its sliding layers' own base). kv: per layer a K and a V region
[n_kv_heads][capacity][head_dim] (docs/kernels.md, kv_cache.py), so the KV bytes are exactly
L x C x H_kv x D_h x 2 x B (design report formula, batch 1); alignment gaps between regions are
counted in the part's buffer bytes, not hidden in the formula. arena: the activations of one
step. scratch: attention split-K partials and logits-reduction partials. logits: the [V] f32
row and the [2k + 1] u32 top-k result. staging: one upload chunk. readback: the result words
and one full logits row (the sampler may need all logits, sampler.needs_full_logits).
reserve ("reserve-v1"): max(64 MiB, 15% of the owned bytes), headroom for what the plan cannot
measure: pipelines, bind groups, command buffers and the driver's own allocations.

Liveness and aliasing. Temporaries of the arena, scratch and logits buffers get intervals over
a schedule's steps; placement is first fit, largest first, where a region may not touch the
bytes of any region whose interval overlaps its own in the same schedule. Whenever two regions
end up sharing bytes the planner writes the proof record; a region live for the whole session
(weights, KV, params, staging, readback) never shares a byte.

Binding limits. A weight part larger than min(maxStorageBufferBindingSize, maxBufferSize) is
split by rows: every part of that tensor (codes, scales, mins) into the same row ranges, each
piece its own binding; the row count of a piece is a multiple of the smallest row count whose
bytes in every part, and in the output row (4 bytes per row), are multiples of the offset
alignment, so pieces lie back to back and each piece's output range is bindable too. Pieces
that do not fit in one buffer continue in the next. Anything no strategy covers (one aligned
row group over the limit, a layer's KV cache over the binding limit, an activation over it)
is rejected with PlanRejected(code, where, sentence) before anything is allocated.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..kernels import matvec_rope_kv
from ..program.fusion import ALL as ALL_FUSIONS, DEFAULT as DEFAULT_FUSIONS, fuse
from ..program.ops import (SCHEDULES, Layout, Program, activation_bytes, ffn_padded, gemm_partials_floats,
                           int8_x_bytes, qkv_offsets, reference, weight_forms)
from .layout import (WEIGHT_ALIGNMENT, Buffer, Packer, PlanRejected, Region, align, fail, row_groups,
                     weight_layout)
from .proof import plan_hash

MiB = 1 << 20
RESERVE_POLICIES = ("reserve-v1",)
KV_DTYPES = {"f32": 4, "f16": 2}
FEATURE_LEVELS = ("core", "compatibility")          # webgpu/interface.py FEATURE_LEVELS
# The largest params block a kernel declares: attention's 11 u32 words (kernels/attention.py
# plan_decode), padded to 16 bytes by runner.params_words -> 48; 64 leaves room for 16 words.
PARAMS_BYTES = 64
MAX_TOP_K = 256                                      # kernels/logits.py MAX_K

# WebGPU's default limits (the specification's tables; compatibility mode per its proposal).
# For memory the two feature levels are the same: 128 MiB bindings, 256 MiB buffers.
SPEC_DEFAULT_LIMITS = {
    "core": {"maxStorageBufferBindingSize": 128 * MiB, "maxBufferSize": 256 * MiB,
             "minStorageBufferOffsetAlignment": 256, "minUniformBufferOffsetAlignment": 256,
             "maxUniformBufferBindingSize": 65536},
    "compatibility": {"maxStorageBufferBindingSize": 128 * MiB, "maxBufferSize": 256 * MiB,
                      "minStorageBufferOffsetAlignment": 256, "minUniformBufferOffsetAlignment": 256,
                      "maxUniformBufferBindingSize": 16384},
}
REQUIRED_LIMITS = tuple(SPEC_DEFAULT_LIMITS["core"])


# -- the inputs ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PlanPolicy:
    context_capacity: int | None = None      # tokens; None: min(context_length, 2048)
    kv_dtype: str = "f32"                    # "f32" (tier A) or "f16" (tier B)
    prefill_chunk: int = 512                 # tokens per prefill submit (the activations hold this many rows)
    top_k_capacity: int = 64                 # largest k the logits reduction returns
    upload_chunk: int = 4 * MiB              # bytes per bounded upload
    reserve: str = "reserve-v1"
    feature_level: str = "core"
    fusions: tuple[str, ...] | None = None   # program/fusion.py rules; None: its DEFAULT


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_limits(limits: Mapping[str, int]) -> dict[str, int]:
    """The five limits a plan depends on, checked; other keys are ignored (and not hashed)."""
    used = {}
    for key in REQUIRED_LIMITS:
        if key not in limits:
            fail("missing-limit", key, f"the limits do not state {key}, which the plan depends on")
        value = limits[key]
        if not _is_int(value) or value < 4:
            fail("bad-limit", key, f"{key} must be an integer >= 4, not {value!r}")
        used[key] = int(value)
    for key in ("minStorageBufferOffsetAlignment", "minUniformBufferOffsetAlignment"):
        if used[key] & (used[key] - 1):
            fail("bad-limit", key, f"{key} {used[key]} is not a power of two")
    return used


def _resolve_policy(policy: PlanPolicy, arch) -> dict[str, Any]:
    capacity = min(arch.context_length, 2048) if policy.context_capacity is None else policy.context_capacity
    checks = [
        (_is_int(capacity) and 1 <= capacity <= arch.context_length, "context_capacity",
         f"must be in 1..context_length ({arch.context_length}), not {capacity!r}"),
        (policy.kv_dtype in KV_DTYPES, "kv_dtype", f"must be one of {sorted(KV_DTYPES)}, not {policy.kv_dtype!r}"),
        (_is_int(policy.prefill_chunk) and 1 <= policy.prefill_chunk, "prefill_chunk",
         f"must be a positive integer, not {policy.prefill_chunk!r}"),
        (_is_int(policy.top_k_capacity) and 1 <= policy.top_k_capacity <= MAX_TOP_K, "top_k_capacity",
         f"must be in 1..{MAX_TOP_K} (kernels/logits.py MAX_K), not {policy.top_k_capacity!r}"),
        (_is_int(policy.upload_chunk) and policy.upload_chunk >= 4 and policy.upload_chunk % 4 == 0,
         "upload_chunk", f"must be a positive multiple of 4 bytes, not {policy.upload_chunk!r}"),
        (policy.reserve in RESERVE_POLICIES, "reserve", f"must be one of {RESERVE_POLICIES}, not {policy.reserve!r}"),
        (policy.feature_level in FEATURE_LEVELS, "feature_level",
         f"must be one of {FEATURE_LEVELS}, not {policy.feature_level!r}"),
        (policy.fusions is None or (isinstance(policy.fusions, tuple) and set(policy.fusions) <= set(ALL_FUSIONS)),
         "fusions", f"must be None or a tuple of rules from {list(ALL_FUSIONS)}, not {policy.fusions!r}"),
    ]
    for ok, field, sentence in checks:
        if not ok:
            fail("bad-policy", field, f"{field} {sentence}")
    return {"context_capacity": capacity, "kv_dtype": policy.kv_dtype,
            # a chunk never exceeds the cache; k never exceeds the vocabulary (logits.plan refuses k > V)
            "prefill_chunk": min(policy.prefill_chunk, capacity),
            "top_k_capacity": min(policy.top_k_capacity, arch.vocab),
            "upload_chunk": policy.upload_chunk, "reserve": policy.reserve,
            "feature_level": policy.feature_level,
            "fusions": [r for r in ALL_FUSIONS if r in (DEFAULT_FUSIONS if policy.fusions is None else policy.fusions)]}


# -- the plan (its buffers and regions: plan/layout.py) ------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class MemoryPlan:
    """The immutable plan; `as_dict()` is its content (JSON data) and `hash` the sha256 of its
    canonical JSON (proof.canonical_json). Two plans are the same plan when their hashes are."""
    data: Mapping[str, Any]

    def as_dict(self) -> dict:
        import copy
        return copy.deepcopy(dict(self.data))

    hash = property(lambda self: self.data["hash"])
    gpu_bytes = property(lambda self: dict(self.data["gpu_bytes"]))
    cpu_bytes = property(lambda self: dict(self.data["cpu_bytes"]))
    total_gpu_bytes = property(lambda self: self.data["total_gpu_bytes"])
    total_cpu_bytes = property(lambda self: self.data["total_cpu_bytes"])
    required_limits = property(lambda self: dict(self.data["required_limits"]))
    splits = property(lambda self: list(self.data["splits"]))
    proofs = property(lambda self: list(self.data["proofs"]))
    kv = property(lambda self: dict(self.data["kv"]))
    upload_chunk = property(lambda self: self.data["policy"]["upload_chunk"])
    unmeasured = property(lambda self: self.data["unmeasured"])

    @property
    def buffers(self) -> list[Buffer]:
        return [Buffer(**{**b, "usage": tuple(b["usage"])}) for b in self.data["buffers"]]

    @property
    def regions(self) -> list[Region]:
        return [Region(**{**r, "interval": tuple(r["interval"]) if r["interval"] else None})
                for r in self.data["regions"]]

    def canonical_json(self) -> str:
        from .proof import canonical_json
        return canonical_json(self.as_dict())


# -- the schedules: the step program of one decode step and one prefill chunk --------------------

def _programs(manifest, resolved, splits: list[dict], groups: dict, s_align: int,
              adapter_limits: Mapping[str, int]) -> tuple[dict[str, Program], Layout]:
    """The fused step program of each schedule (program/ops.py, program/fusion.py). What the
    planner decided about the weights changes it: split tensors run one matmul per piece, and
    q|k|v (gate|up) multiply as one stacked matrix when every layer's group was laid out back
    to back and their outputs are back to back too (no alignment gap between the q, k, v
    sections of a decode row; F a whole number of alignment units). A projection stored in
    several forms across the layers gets a params slot per form (ops.py weight_forms); its
    layers must still split into the same number of row pieces (one layer template)."""
    arch = manifest.architecture
    pieces = {s["tensor"]: len(next(iter(s["pieces"].values()))) for s in splits}
    for name in pieces:
        if name.startswith("blk."):
            kind = name.split(".", 2)[2]
            counts = {pieces.get(f"blk.{i}.{kind}", 1) for i in range(arch.n_layers)}
            if len(counts) > 1:
                fail("no-split", name, f"the layers' {kind} tensors split into different numbers of row "
                                         f"pieces ({sorted(counts)}); the step runs one layer template")
    _, k_at, v_at = qkv_offsets(arch, 1, s_align)
    contiguous = {"qkv": k_at == 4 * arch.n_heads * arch.head_dim
                  and v_at == k_at + 4 * arch.n_kv_heads * arch.head_dim,
                  "gate_up": ffn_padded(arch, s_align) == arch.ffn}
    first = {"qkv": "attn_q", "gate_up": "ffn_gate"}
    stacks = frozenset(name for name, ok in contiguous.items()
                       if ok and all(f"blk.{i}.{first[name]}" in groups for i in range(arch.n_layers)))
    # The q|k|v mat-vec may take RoPE + KV append (rope-kv-into-matmul) where its fused kernel's
    # storage buffers fit the device (q4 with mins: 9; the k-quants need more).
    rope_matmul = "qkv" in stacks and all(matvec_rope_kv.fits(manifest.tensors[f"blk.{i}.attn_q"].encoding,
                                                              adapter_limits) for i in range(arch.n_layers))
    layout = Layout(pieces, stacks, weight_forms(manifest), rope_matmul)
    return _build_programs(arch, resolved, layout), layout


def _build_programs(arch, resolved, layout: Layout) -> dict[str, Program]:
    tokens = {"decode": 1, "prefill": resolved["prefill_chunk"]}
    return {s: fuse(reference(arch, s, tokens[s], layout), layout, tuple(resolved["fusions"])) for s in SCHEDULES}


def plan_programs(manifest, plan: "MemoryPlan") -> dict[str, Program]:
    """The step programs a plan was made for, rebuilt from its own record (the executor and
    admission run exactly these); checked op by op against the names the plan recorded."""
    manifest = getattr(manifest, "manifest", manifest)
    data = plan.data
    layout = Layout(dict(data["program"]["pieces"]), frozenset(data["program"]["stacks"]), weight_forms(manifest),
                    bool(data["program"].get("rope_matmul", False)))
    programs = _build_programs(manifest.architecture, data["policy"], layout)
    for schedule, program in programs.items():
        if [op.name for op in program.ops] != list(data["schedules"][schedule]["ops"]):
            raise PlanRejected("bad-manifest", schedule, "the model does not give the step program this plan "
                                                         "recorded (a plan of another model?)")
    return programs


def _temporaries(program: Program, arch, capacity: int, k: int, s_align: int) -> list[tuple]:
    """(name, part, producer step, last consumer step, bytes) of every temporary of a schedule:
    the activations its program names (program/ops.py activation_bytes has their layouts),
    live from the step that first writes them to the one that last reads them."""
    sizes = activation_bytes(arch, program.schedule, program.tokens, capacity, k, s_align)
    return [(name, sizes[name][0], first, last, sizes[name][1]) for name, (first, last) in program.intervals().items()]


def _place(temps: list[tuple], alignment: int, steps: dict[str, list[str]]) -> tuple[list[tuple[str, int]], list[dict]]:
    """First fit, largest first: each temporary goes to the lowest aligned offset where it
    touches no temporary of its schedule whose interval overlaps its own. Then every pair that
    shares bytes anyway gets its proof record. temps: (name, schedule, (b, e), size)."""
    placed: list[tuple[str, str, tuple[int, int], int, int]] = []
    for name, schedule, (b, e), size in sorted(temps, key=lambda t: (-t[3], t[1], t[0])):
        live = sorted((o, o + s) for _, sc, (pb, pe), s, o in placed
                      if sc == schedule and not (pe < b or e < pb))
        offset = 0
        for start, end in live:
            if start >= offset + size:
                break
            if end > offset:
                offset = align(end, alignment)
        placed.append((name, schedule, (b, e), size, offset))
    proofs = []
    for i, (n1, s1, iv1, z1, o1) in enumerate(placed):
        for n2, s2, iv2, z2, o2 in placed[i + 1:]:
            start, end = max(o1, o2), min(o1 + z1, o2 + z2)
            if end <= start:
                continue
            if s1 != s2:
                (a, sa), (c, sc) = sorted(((n1, s1), (n2, s2)))
                proofs.append({"first": a, "then": c, "offset": start, "size": end - start,
                               "last_consumer": None, "producer": None,
                               "reason": f"schedules exclusive: {sa} / {sc}"})
                continue
            (fa, ivf), (th, ivt) = sorted(((n1, iv1), (n2, iv2)), key=lambda x: x[1])
            proofs.append({"first": fa, "then": th, "offset": start, "size": end - start,
                           "last_consumer": steps[s1][ivf[1]], "producer": steps[s1][ivt[0]],
                           "reason": f"intervals disjoint: {ivf[1]} < {ivt[0]}"})
    return [(name, offset) for name, _, _, _, offset in placed], proofs


# -- the KV cache ---------------------------------------------------------------------------------

def _kv(arch, limits, resolved, s_align: int) -> tuple[Packer, dict]:
    """Per layer a K and a V region [n_kv_heads][capacity][head_dim] (kernels/kv_cache.py KvLayout).
    The attention kernels bind a layer's cache whole, so there is no split strategy for it."""
    c, kvh, e = resolved["context_capacity"], arch.n_kv_heads, arch.head_dim
    b = KV_DTYPES[resolved["kv_dtype"]]
    if e % 4 or e > 256:
        fail("kv-layout", "head_dim", f"head_dim {e} must be a multiple of 4 and at most 256: the attention "
                                       f"kernels read cache rows as vec4 (docs/kernels.md)")
    region = kvh * c * e * b
    limit = min(limits["maxStorageBufferBindingSize"], limits["maxBufferSize"])
    if region > limit or kvh * c * e >= 2 ** 32:
        fits = min(limit // (kvh * e * b), (2 ** 32 - 1) // (kvh * e))
        fail("kv-too-large", "kv", f"one layer's K cache ({kvh} x {c} x {e} x {b} = {region} bytes) exceeds the "
                                    f"binding limit {limit} (or u32 offsets), and attention binds a layer's cache "
                                    f"whole; a context capacity of at most {fits} tokens fits"
                                    + (", or an f16 cache" if b == 4 else ""))
    packer = Packer("kv", "kv", ("STORAGE",), limits["maxBufferSize"])
    for layer in range(arch.n_layers):
        for which in ("k", "v"):
            packer.add(f"kv.L{layer}.{which}", region, s_align, "storage")
    facts = {"layers": arch.n_layers, "capacity": c, "n_kv_heads": kvh, "head_dim": e, "element_bytes": b,
             "dtype": resolved["kv_dtype"], "layout": "[n_kv_heads][capacity][head_dim] per layer, K and V",
             "formula_bytes": arch.n_layers * c * kvh * e * 2 * b}
    return packer, facts


# -- the planner ---------------------------------------------------------------------------------

UNMEASURED = ("Not counted: shader modules, compiled pipelines, bind groups, command encoders and "
              "buffers, the browser's staging copies of writeBuffer, and the driver's own allocations. "
              "WebGPU reports none of them; the reserve is the headroom for them, and admission's "
              "out-of-memory scopes catch what it does not cover.")


def plan_memory(manifest, limits: Mapping[str, int], policy: PlanPolicy = PlanPolicy()) -> MemoryPlan:
    """The MemoryPlan of `manifest` (a ValidatedModelManifest, or anything with .architecture
    and .tensors; a Model or ValidatedModel is accepted too) under `limits` and `policy`.
    Raises PlanRejected when no plan fits."""
    manifest = getattr(manifest, "manifest", manifest)
    arch = manifest.architecture
    used = _check_limits(limits)
    resolved = _resolve_policy(policy, arch)
    s_align, u_align = used["minStorageBufferOffsetAlignment"], used["minUniformBufferOffsetAlignment"]
    w_align = max(WEIGHT_ALIGNMENT, s_align)
    binding = min(used["maxStorageBufferBindingSize"], used["maxBufferSize"])

    weights, splits = weight_layout(manifest, used, w_align, s_align)
    kv, kv_facts = _kv(arch, used, resolved, s_align)

    # The step program of each schedule: what runs, over which temporaries, with which params.
    groups = row_groups(manifest, binding, w_align)
    programs, layout = _programs(manifest, resolved, splits, groups, s_align, limits)
    steps = {s: programs[s].steps() for s in SCHEDULES}

    # metadata: one params slot per op label (and form) of each schedule's program (the host writes a
    # submit's slots before it), and the RoPE (cos, sin) table [capacity][rotary_dim / 2][2] f32.
    stride = align(PARAMS_BYTES, u_align)
    if PARAMS_BYTES > used["maxUniformBufferBindingSize"]:
        fail("too-large", "params", f"a {PARAMS_BYTES}-byte params block exceeds maxUniformBufferBindingSize")
    params = Packer("params", "metadata", ("UNIFORM", "COPY_DST"), used["maxBufferSize"])
    for schedule in SCHEDULES:
        slots = len(programs[schedule].slots())
        params.add(f"params.{schedule}", slots * stride, u_align, "uniform",
                   slots=slots, slot_stride=stride, binding_size=PARAMS_BYTES)
    rope = Packer("rope", "metadata", ("STORAGE", "COPY_DST"), used["maxBufferSize"])
    table = resolved["context_capacity"] * (arch.rope.rotary_dim // 2) * 8
    _check_bound("rope_table", max(4, table), binding, "a smaller context capacity")
    rope.add("rope_table", max(4, table), s_align, "read-only-storage")
    if uses_local_rope(arch):          # gemma3's sliding layers rotate with their own base
        rope.add("rope_table_local", max(4, table), s_align, "read-only-storage")

    # arena, scratch, logits: the temporaries of both schedules, placed with liveness.
    tokens = {"decode": 1, "prefill": resolved["prefill_chunk"]}
    by_part: dict[str, list[tuple]] = {"arena": [], "scratch": [], "logits": []}
    for schedule in SCHEDULES:
        for name, part, producer, consumer, size in _temporaries(
                programs[schedule], arch, resolved["context_capacity"], resolved["top_k_capacity"], s_align):
            _check_bound(f"{schedule}.{name}", size, binding,
                         "a smaller prefill chunk" if part == "arena" else "a smaller context capacity or k")
            by_part[part].append((f"{schedule}.{name}", schedule,
                                  (steps[schedule].index(producer), steps[schedule].index(consumer)),
                                  align(size, 4)))
    usage = {"arena": ("STORAGE", "COPY_DST", "COPY_SRC"), "scratch": ("STORAGE",), "logits": ("STORAGE", "COPY_SRC")}
    # One buffer per temporary name: WebGPU's usage-scope rule makes a dispatch that binds one
    # buffer both read-only and writable invalid, whatever the ranges, and almost every kernel
    # reads one activation and writes another. Within a buffer the decode and prefill regions
    # of that name share bytes (the schedules never run in one submit), proved as such.
    planned, proofs = [], []
    for part, temps in by_part.items():
        packer = Packer(part, part, usage[part], used["maxBufferSize"])
        for base in sorted({n.split(".", 1)[1] for n, _, _, _ in temps}):
            group = [t for t in temps if t[0].split(".", 1)[1] == base]
            offsets, group_proofs = _place(group, s_align, steps)
            where, buffer = dict(offsets), f"{part}.{base}"
            size = max(where[n] + z for n, _, _, z in group)
            if size > used["maxBufferSize"]:
                fail("too-large", buffer, f"{buffer} needs {size} bytes, more than maxBufferSize "
                                           f"{used['maxBufferSize']}; a smaller prefill chunk needs less")
            packer.names.append(buffer)
            packer.sizes.append(size)
            packer.regions += [Region(n, part, buffer, where[n], z, s_align, "storage", schedule=sc, interval=iv)
                               for n, sc, iv, z in group]
            proofs += [{**p, "buffer": buffer} for p in group_proofs]
        planned.append(packer)

    # The prefill GEMM's split-K partial sums (kernels/gemm_split.py): not an activation of the
    # program but the lowering's scratch, in a buffer of its own (so no schedule or interval:
    # each split GEMM and its reduce use it in turn, and nothing else does).
    partials = Packer("partials", "scratch", ("STORAGE",), used["maxBufferSize"])
    # Optional room: under a small binding limit it shrinks, and the lowering splits less or not at all.
    size = max(4, min(4 * gemm_partials_floats(arch, tokens["prefill"]), binding // 4 * 4))
    partials.add("prefill.gemm_partials", size, s_align, "storage")
    planned.append(partials)
    # The decode activations quantized once for a pre-quantized q4 mat-vec
    # (kernels/matvec_prequant.py): the lowering's scratch like the partials, written by the
    # quantizer and read by the mat-vec right after it. A second one of the same size, in a
    # buffer of its own (a dispatch may not bind one buffer both read-only and writable), for
    # a residual projection that quantizes its output for the next mat-vec while its own input
    # is in the first (kernels/matvec_quantize_out.py).
    for name in ("int8_x", "int8_x_out"):
        int8_x = Packer(name, "scratch", ("STORAGE",), used["maxBufferSize"])
        int8_x.add(f"decode.{name}", int8_x_bytes(arch), s_align, "storage")
        planned.append(int8_x)

    # staging (one bounded upload chunk) and readback (the result words and one logits row).
    staging = Packer("staging", "staging", ("MAP_WRITE", "COPY_SRC"), used["maxBufferSize"])
    if resolved["upload_chunk"] > used["maxBufferSize"]:
        fail("too-large", "upload_chunk", f"an upload chunk of {resolved['upload_chunk']} bytes exceeds maxBufferSize")
    staging.add("staging.upload", resolved["upload_chunk"], 4, "copy")
    readback = Packer("readback", "readback", ("MAP_READ", "COPY_DST"), used["maxBufferSize"])
    readback.add("readback.result", 4 * (2 * resolved["top_k_capacity"] + 1), 8, "copy")
    readback.add("readback.logits", 4 * arch.vocab, 8, "copy")

    packers = [weights, params, rope, kv, *planned, staging, readback]
    buffers = [b for p in packers for b in p.buffers()]
    regions = [r for p in packers for r in p.regions]
    gpu = {part: 0 for part in ("weights", "metadata", "kv", "arena", "scratch", "logits", "staging", "readback")}
    for b in buffers:
        gpu[b.part] += b.size
    owned = sum(gpu.values())
    gpu["reserve"] = max(64 * MiB, -(-owned * 15 // 100))      # reserve-v1: max(64 MiB, 15% of owned)

    last_end = max(o + n for t in manifest.tensors.values() for _, o, n in t.parts)
    cpu = {"artifact": last_end + 32,          # the validated file stays in memory (its trailer ends it)
           "repack": 0,                        # parts are bound exactly as stored
           "upload": resolved["upload_chunk"],
           "readback": 4 * (2 * resolved["top_k_capacity"] + 1) + 4 * arch.vocab,
           "shadow": 0,                        # KV is rebuilt by replaying tokens, never mirrored
           "runtime": 4 * resolved["context_capacity"] + 4 * arch.vocab}   # token history + one logits row
    storage_bindings = [r.size for r in regions if r.binding in ("storage", "read-only-storage")]
    identity = getattr(manifest, "identity", None)
    data = {
        "planner": "webslm-memory-plan-v1",
        "model": {"artifact_sha256": getattr(identity, "artifact_sha256", None),
                  "layout_hash": getattr(identity, "layout_hash", None)},
        "limits": used,
        "policy": resolved,
        "required_limits": {"maxBufferSize": max(b.size for b in buffers),
                            "maxStorageBufferBindingSize": max(storage_bindings),
                            "maxUniformBufferBindingSize": PARAMS_BYTES,
                            "minStorageBufferOffsetAlignment": s_align,
                            "minUniformBufferOffsetAlignment": u_align},
        "schedules": {s: {"tokens": tokens[s], "steps": steps[s], "layer_loop": list(programs[s].layer_loop()),
                          "layers": arch.n_layers, "fusions": list(programs[s].fusions),
                          "ops": [op.name for op in programs[s].ops], "slots": programs[s].slots()}
                      for s in SCHEDULES},
        "program": {"stacks": sorted(layout.stacks), "pieces": dict(sorted(layout.pieces.items())),
                    "rope_matmul": layout.rope_matmul},
        "exclusive_schedules": [list(SCHEDULES)],
        "buffers": [_as_json(b) for b in buffers],
        "regions": [_as_json(r) for r in regions],
        "proofs": sorted(proofs, key=lambda p: (p["buffer"], p["first"], p["then"])),
        "splits": splits,
        "kv": kv_facts,
        "weights_payload_bytes": sum(n for t in manifest.tensors.values() for _, _, n in t.parts),
        "gpu_bytes": gpu,
        "total_gpu_bytes": sum(gpu.values()),
        "cpu_bytes": cpu,
        "total_cpu_bytes": sum(cpu.values()),
        "unmeasured": UNMEASURED,
    }
    data["hash"] = plan_hash(data)
    return MemoryPlan(data)


def uses_local_rope(arch) -> bool:
    """Whether some layer reads the second RoPE table (program/ops.py: "rope_table_local")."""
    gemma = getattr(arch, "gemma3", None)
    return gemma is not None and "sliding" in gemma.layer_types


def _check_bound(name: str, size: int, limit: int, remedy: str) -> None:
    if size > limit:
        fail("too-large", name, f"{name} needs one binding of {size} bytes, more than the binding limit "
                                 f"{limit}, and no split strategy applies to it; {remedy} would fit")


def _as_json(record) -> dict:
    """A record as plain JSON data: tuples become lists, mappings dicts."""
    out = {}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Mapping):
            value = {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}
        out[field.name] = value
    return out
