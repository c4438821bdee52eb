"""Fusion as named rewrite rules over the step program (ops.py).

Each rule takes the op list and returns a shorter one computing the same step with fewer
dispatches, using a fused kernel variant (docs/kernels.md). A rule only rewrites what it can
prove safe from the list itself (who reads and writes which ref), and leaves the rest alone, so
applying every rule to any program is always valid. Order matters: a rule may create the shape
the next one matches (residual-into-accumulate turns the residual norms into plain ones, which
norm-into-matmul then folds away).

    rule                       schedule  what it does                                     dispatches a layer
    stack-projections          both      q|k|v and gate|up as one stacked mat-vec (GEMM)    13 -> 10
    residual-into-accumulate   decode    o and down add into x (ACCUMULATE); the residual
                                         norms become plain norms of x
    norm-into-matmul           decode    a plain RMSNorm read only by mat-vecs moves into     -> 8
                                         their input (also the final norm into the head)
    swiglu-into-down           decode    SwiGLU moves into down's input                       -> 7
    rope-kv-into-matmul        decode    RoPE and the KV append move into the q|k|v mat-vec   -> 6
    rope-kv-into-attention     decode    RoPE and the KV append move into attention           (-> 6, when
                                         the rule above did not take them)
    quantize-into-attention    decode    attention quantizes its output for an o projection    (int8: -1)
                                         on activations quantized once (lowering decides, by
                                         what the tuning stage measured)
    quantize-into-matmul       decode    o and down quantize x for the norm-input mat-vecs,      (int8: -3)
                                         gate|up silu(gate) * up for down (likewise decided
                                         in lowering)

(The counts are for a decode layer whose q|k|v and gate|up stack; tests/test_program.py
checks each rule against the reference numerically on the GPU.) Prefill multiplies with the
GEMM, which has no fused input modes: only the stacking applies there (12 -> 9 dispatches a
layer; the stacked q|k|v GEMM writes the planar qkv activation as three column sections).

`fuse(program, layout, rules)` applies the named rules in RULES order; `ALL` names them all.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from .ops import Layout, Op, Program, base


def _consumers(ops: list[Op], start: int, ref: str) -> list[int]:
    """Indices of ops after `start` that read activation `ref` before anything writes it again."""
    out = []
    for i in range(start + 1, len(ops)):
        if any(base(r) == ref for _, r in ops[i].reads):
            out.append(i)
        if any(base(r) == ref for _, r in ops[i].writes):
            break
    return out


def _with(op: Op, reads: dict | None = None, writes: dict | None = None, **mode) -> Op:
    new_reads = tuple((reads or {}).items()) if reads is not None else op.reads
    new_writes = tuple((writes or {}).items()) if writes is not None else op.writes
    return op.replace(reads=new_reads, writes=new_writes, mode=tuple(sorted({**dict(op.mode), **mode}.items())))


# -- the rules -----------------------------------------------------------------------------------

def stack_projections(ops: list[Op], layout: Layout) -> list[Op]:
    """A layer's q, k, v (and gate, up) matmuls read one input row; when the planner laid their
    weights out back to back (layout.stacks), one mat-vec (prefill: one GEMM) over the stacked
    rows writes the whole qkv (gate_up) activation. The planner stacks a group only when its
    members share one encoding in every layer (plan/layout.py row_groups); when that encoding
    differs across layers (ops.py weight_forms), the stacked op keeps the members' form, so each
    form has its own params slot ("gate_up@q8-32-f16")."""
    groups = {"qkv": (("q", "k", "v"), "attn_", "qkv"), "gate_up": (("gate", "up"), "ffn_", "gate_up")}
    out = list(ops)
    for stack, (labels, prefix, target) in groups.items():
        if stack not in layout.stacks:
            continue
        members = {(op.layer, op.label): op for op in out if op.layer is not None and op.kind == "matmul"}
        rewritten = []
        for op in out:
            if op.layer is None or op.kind != "matmul" or op.label not in labels:
                rewritten.append(op)
                continue
            if op.label != labels[0]:
                continue                                   # folded into the first of the group
            tensors = "+".join(f"blk.{op.layer}.{prefix}{label}" for label in labels)
            forms = {members[(op.layer, label)].option("form") for label in labels}
            if len(forms) > 1:
                raise ValueError(f"layer {op.layer}: {stack} was laid out stacked but its parts have "
                                 f"different forms {sorted(map(str, forms))}")
            form = forms.pop()
            mode = (("form", form), ("piece", 0)) if form else (("piece", 0),)
            rewritten.append(Op(f"L{op.layer}.{stack}", "matmul", (("x", op.read("x")), ("w", f"w:{tensors}")),
                                (("y", target),), mode, op.layer))
        out = rewritten
    return out


def residual_into_accumulate(ops: list[Op], layout: Layout) -> list[Op]:
    """matmul -> delta, then a residual norm x += delta: the matmul adds into x itself
    (ACCUMULATE: y += W x), and the norm becomes a plain RMSNorm of x. No delta at all."""
    out, writers = list(ops), []          # writers: ops that wrote delta since the last residual norm
    for i, op in enumerate(out):
        if any(base(r) == "delta" for _, r in op.writes):     # a norm writing delta (gemma3) blocks it
            writers.append(i)
        if op.kind != "norm" or not op.option("residual"):
            continue
        if writers and all(out[j].kind == "matmul" and not out[j].option("accumulate") for j in writers):
            for j in writers:
                out[j] = _with(out[j], writes={"y": "x"}, accumulate=True)
            out[i] = _with(op, reads={"x": "x", "weight": op.read("weight")}, writes={"out": op.write("out")},
                           residual=False)
        writers = []
    return out


def norm_into_matmul(ops: list[Op], layout: Layout) -> list[Op]:
    """A plain RMSNorm whose output only mat-vecs read (without another input mode): each of
    them normalizes its own input row instead (the row is small; the norm costs a dispatch).
    A layer's norm folds only when it folds in every layer: the layers keep one shape."""
    def foldable(i: int) -> list[int] | None:
        op = ops[i]
        if op.kind != "norm" or op.option("residual"):
            return None
        readers = _consumers(ops, i, op.write("out"))
        ok = readers and all(ops[j].kind == "matmul" and ops[j].option("input", "plain") == "plain"
                             and ops[j].read("x") == op.write("out") for j in readers)
        return readers if ok else None

    found = {i: foldable(i) for i, op in enumerate(ops) if op.kind == "norm"}
    by_label: dict[str, list[int]] = {}
    for i in found:
        by_label.setdefault(ops[i].label if ops[i].layer is not None else ops[i].name, []).append(i)
    fold = {i for members in by_label.values() if all(found[i] is not None for i in members) for i in members}
    out = list(ops)
    for i in fold:
        norm = ops[i]
        for j in found[i]:
            out[j] = _with(out[j], reads={**dict(out[j].reads), "x": norm.read("x"), "weight": norm.read("weight")},
                           input="norm")
    return [op for i, op in enumerate(out) if i not in fold]


def swiglu_into_down(ops: list[Op], layout: Layout) -> list[Op]:
    """SwiGLU read only by the down projection: down computes silu(gate) * up on its input."""
    out = list(ops)
    i = 0
    while i < len(out):
        op = out[i]
        if op.kind == "swiglu":
            readers = _consumers(out, i, op.write("out"))
            if readers and all(out[j].kind == "matmul" and out[j].option("input", "plain") == "plain"
                               for j in readers):
                for j in readers:
                    out[j] = _with(out[j], reads={**dict(out[j].reads), "x": op.read("h")}, input="swiglu")
                del out[i]
                continue
        i += 1
    return out


def rope_kv_into_matmul(ops: list[Op], layout: Layout) -> list[Op]:
    """RoPE + KV append right after the stacked q|k|v mat-vec of its layer (norm input): the
    mat-vec rotates q in its output and writes k and v into the caches itself
    (kernels/matvec_rope_kv.py, one dispatch a layer fewer). That kernel rotates whole heads,
    adds no biases and reads one RoPE table: a program with partial rotary, q/k/v biases,
    per-head norms between the two (Gemma 3) or a second table is left alone, in every layer;
    so is one whose fused kernel binds more storage buffers than the device gives (the planner
    says: layout.rope_matmul)."""
    if not layout.rope_matmul or any(op.kind == "rope_kv" and (op.mode or op.read("table") != "rope_table")
                                     for op in ops):
        return list(ops)
    out = []
    for op in ops:
        before = out[-1] if out else None
        if (op.kind == "rope_kv" and before is not None and before.kind == "matmul" and before.layer == op.layer
                and before.write("y") == "qkv" and before.option("input") == "norm" and before.option("piece") == 0
                and sum(1 for o in ops if o.layer == op.layer and o.kind == "matmul" and o.write("y") == "qkv") == 1):
            out[-1] = _with(before, reads={**dict(before.reads), "table": op.read("table")},
                            writes={**dict(before.writes), "k_cache": op.write("k_cache"),
                                    "v_cache": op.write("v_cache")}, rope=True)
            continue
        out.append(op)
    return out


def rope_kv_into_attention(ops: list[Op], layout: Layout) -> list[Op]:
    """RoPE + KV append, then attention of the same layer: attention rotates q and the new k
    itself and writes the new cache row (kernels/attention_rope.py). That kernel adds no
    biases, reads one RoPE table and has no window or scale of its own: a program with any of
    them (Qwen2, Gemma 3) is left alone, in every layer (the layers keep one shape)."""
    if any(op.kind == "rope_kv" and (op.option("bias") or op.read("table") != "rope_table") for op in ops) \
            or any(op.kind == "attention" and op.mode for op in ops):
        return list(ops)
    out = []
    for op in ops:
        if op.kind == "attention" and out and out[-1].kind == "rope_kv" and out[-1].layer == op.layer:
            rope = out.pop()
            caches = {role: rope.write(role) for role in ("k_cache", "v_cache")}
            writes = {**caches, **{role: ref for role, ref in op.writes}}
            out.append(op.replace(kind="attention_rope", reads=(("qkv", "qkv"), ("table", rope.read("table"))),
                                  writes=tuple(writes.items())))
            continue
        out.append(op)
    return out


def quantize_into_attention(ops: list[Op], layout: Layout) -> list[Op]:
    """Decode attention whose output only plain-input mat-vecs read (the o projection) may
    quantize it for them (kernels/attention_xq.py): marked here, decided in lowering, which
    knows what tuning chose. Where the o projection runs on activations quantized once, its
    quantize_x launch goes (one dispatch a layer fewer), unless the tuning stage timed the
    whole step faster with it (attention_xq.CHOICE); where o is not on that path, or in a step
    past the single-pass length, nothing changes."""
    out = list(ops)
    for i, op in enumerate(out):
        if op.kind != "attention":
            continue
        readers = _consumers(out, i, op.write("out"))
        if readers and all(out[j].kind == "matmul" and out[j].option("input", "plain") == "plain"
                           for j in readers):
            out[i] = _with(op, quantize_out=True)
    return out


def quantize_into_matmul(ops: list[Op], layout: Layout) -> list[Op]:
    """A decode matmul whose output only mat-vecs that quantize it again read next may quantize
    it for them (kernels/matvec_quantize_out.py): a residual projection (a matmul adding into x:
    o, down) read through a norm (gate|up, the next layer's q|k|v, the head), and the stacked
    gate|up read by down's SwiGLU input. Marked here, decided in lowering, which knows what
    tuning chose: where the readers run on activations quantized once (norm readers with the
    norm from the units' squares, "xq2s"), their quantize_x launches go (three a layer), unless
    the tuning stage timed the whole step faster without fused quantizers (attention_xq.CHOICE)."""
    out = list(ops)
    for i, op in enumerate(out):
        if op.kind != "matmul":
            continue
        readers = _consumers(out, i, op.write("y"))
        mode = "norm" if op.option("accumulate") else "swiglu"
        if readers and all(out[j].kind == "matmul" and out[j].option("input") == mode
                           and out[j].read("x") == op.write("y") for j in readers):
            out[i] = _with(op, quantize_out=True)
    return out


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    rewrite: Callable[[list[Op], Layout], list[Op]]
    schedules: tuple[str, ...]


RULES = (
    Rule("stack-projections", stack_projections, ("decode", "prefill")),
    Rule("residual-into-accumulate", residual_into_accumulate, ("decode",)),
    Rule("norm-into-matmul", norm_into_matmul, ("decode",)),
    Rule("swiglu-into-down", swiglu_into_down, ("decode",)),
    Rule("rope-kv-into-matmul", rope_kv_into_matmul, ("decode",)),
    Rule("rope-kv-into-attention", rope_kv_into_attention, ("decode",)),
    Rule("quantize-into-attention", quantize_into_attention, ("decode",)),
    Rule("quantize-into-matmul", quantize_into_matmul, ("decode",)),
)
ALL = tuple(rule.name for rule in RULES)
# What admission uses unless told otherwise. rope-kv-into-attention is left out: measured on the
# H200 (docs/RESULTS.md) its fused kernel took 12.9 us a layer against 10.5 us for RoPE + KV
# append and attention apart, so the step with it was slower on SmolLM2's shape.
# quantize-into-attention is in: it only marks attention, and whether a session's attention
# quantizes for o is measured at admission (the tuning stage times the whole step both ways,
# backends/gpu/tuning.py _step_check); unmeasured, lowering lets it (one launch fewer).
# quantize-into-matmul likewise (the same step timing covers both; on an H100 it measured twice
# as slow and the step timing turned it off, docs/RESULTS.md). rope-kv-into-matmul is left out
# until a GPU has timed it: it is built and checked (tests/test_program.py, the golden family
# matvec_rope_kv), and `bench/engine.py --fusions default,rope-kv-into-matmul` times it.
DEFAULT = tuple(name for name in ALL if name not in ("rope-kv-into-attention", "rope-kv-into-matmul"))


def fuse(program: Program, layout: Layout, rules: tuple[str, ...] = ALL) -> Program:
    """The program with the named rules applied (in RULES order; unknown names are refused)."""
    unknown = set(rules) - set(ALL)
    if unknown:
        raise ValueError(f"unknown fusion rules {sorted(unknown)}; known: {list(ALL)}")
    ops, applied = list(program.ops), []
    for rule in RULES:
        if rule.name in rules and program.schedule in rule.schedules:
            ops = rule.rewrite(ops, layout)
            applied.append(rule.name)
            shapes = {tuple(op.label for op in ops if op.layer == i) for i in range(program.n_layers)}
            if len(shapes) > 1:      # the planner and executor run one layer template for every layer
                raise ValueError(f"fusion rule {rule.name} left the layers in different shapes")
    return dataclasses.replace(program, ops=tuple(ops), fusions=tuple(applied))
