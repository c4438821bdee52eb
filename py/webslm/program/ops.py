"""The reference step program: what one forward step computes, op by op, over named regions.

One step of T tokens at positions start .. start + T - 1 (x is the residual stream [T, D]),
the CPU oracle's steps (cpu/backend.py `_forward`) one for one:

    embed        token_ids [T]               -> x [T, D]   (host_embed when the plan split the
                                                             table: the host writes x's rows)
    per layer i (ops named "L{i}.<label>"):
      attn_norm  x (+= delta from layer 1)   -> attn_in [T, D]              RMSNorm
      q, k, v    attn_in                     -> qkv: q [T, H E] | k [T, K E] | v [T, K E]
      rope_kv    q rotated in place; k rotated and v written to the layer's cache rows
      attention  q, cache[0 .. start + T)    -> attn_out [T, H E]
      o          attn_out                    -> delta [T, D]
      ffn_norm   x += delta                  -> ffn_in [T, D]
      gate, up   ffn_in                      -> gate_up [T, 2 F'] (gate | up, F' = F padded)
      swiglu     gate_up                     -> ffn_act [T, F']
      down       ffn_act                     -> delta [T, D]
    final_norm   x += delta                  -> final_in [T, D]
    (prefill)    last_row = final_in[T - 1]  (a copy: the head sees one row)
    head         final_in (decode) / last_row -> logits [V]
    reduce       logits -> argmax / top-k words (or the full row is read back)

Architectures add ops where their block differs, and only there (the llama program above is
unchanged by them):
    qkv_bias (Qwen2)   rope_kv reads the layer's q/k/v biases and adds them as it reads q, k, v
                       (mode bias): no extra dispatch (kernels/rope_kv.py)
    family "gemma3"    embed_scale  x *= embedding_scale                    after embed
                       head_norm    q and k RMS-normed per head in qkv      after q, k, v
                       rope_kv      reads "rope_table_local" on sliding layers (their RoPE base)
                       attention    mode scale (attention_scale) and, on sliding layers, window
                                    (a slot of its own: "attention@window")
                       o, down      write "proj"; post_attention_norm / post_ffw_norm: proj -> delta
                       geglu        instead of swiglu (gelu_tanh gate)
                     RMSNorm's (1 + w) is not an op: admission uploads the norm vectors with the
                     offset added (admission/pipelines.py uploaded_part), the CPU path's f32 sum.

fusion.py rewrites this list; the planner, admission and the executor all read the rewritten
list, so a fusion is one rule there and nothing else.

An op names what it reads and writes by role -> ref. Refs:
    activations      "x", "delta", "qkv", "qkv.q" (a section of qkv), "gate_up.up", ...; the
                     planner gives each a region per schedule ("decode.qkv")
    weights          "w:blk.3.attn_q" (a matrix), "w:blk.3.attn_q+blk.3.attn_k+blk.3.attn_v"
                     (rows stacked: the planner laid the parts out back to back)
    norm vectors     "v:blk.3.attn_norm"
    caches           "kv:L3.k", "kv:L3.v";  the RoPE table: "rope_table"
A weight split into row pieces (binding limits) is one matmul op per piece ("L3.o#1").
Ops of the same label share one params slot across layers (the layers have one shape), with two
exceptions whose params differ by layer: a sliding-window attention ("attention@window"), and a
projection whose layers store its weight in different forms (llama.cpp's Q4_K_M gives attn_v
and ffn_down more bits in some layers): its matmuls carry mode "form" (`weight_forms`) and each
form has a slot of its own ("v@q8-32-f16", "v@q5-32-offset-f16"). A mat-vec's params hold its
row geometry (kernels/matvec.py), which the form decides. A model whose every projection has
one form gets no form option: its slots are those of the one-slot-per-label program.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

SCHEDULES = ("decode", "prefill")
# Ops whose params depend on the position: their slots come first, a decode step rewrites them.
POSITIONAL_KINDS = ("rope_kv", "attention", "attention_rope")
# Ops that are not dispatches: a buffer copy inside the step, the host's write of x before it.
NO_DISPATCH = ("copy", "host_embed")
# What a step may read back: the reduce op has one params slot per reduction ("full" has none).
READBACKS = ("argmax", "top-k", "full")
# Decode attention scratch (kernels/attention.py plan_decode): up to SINGLE_PASS_MAX keys take one
# pass; past it no chunk is shorter than MIN_CHUNK, so C keys need at most ceil(C / MIN_CHUNK) chunks.
SINGLE_PASS_MAX, MIN_CHUNK = 256, 64
# Logits reductions (kernels/logits.py default_chunk / plan): top-k pass 1 takes chunks of
# round_up(isqrt(V k) + 1, LOAD) logits; argmax aims for ARGMAX_GROUPS workgroups.
LOGITS_LOAD, ARGMAX_GROUPS = 512, 256


def align(n: int, a: int) -> int:
    return -(-n // a) * a


@dataclasses.dataclass(frozen=True)
class Op:
    name: str                                  # unique in its program: "embed", "L3.qkv", "head#1"
    kind: str                                  # embed, norm, matmul, rope_kv, attention, attention_rope,
                                               # swiglu, copy, reduce; gemma3: scale, head_norm, geglu
    reads: tuple[tuple[str, str], ...]         # (role, ref), in no particular order
    writes: tuple[tuple[str, str], ...]
    mode: tuple[tuple[str, Any], ...] = ()     # the kind's options: input, accumulate, residual, piece
    layer: int | None = None

    @property
    def label(self) -> str:
        """The name without its layer: "qkv", "o#1", "head#0"."""
        return self.name.split(".", 1)[1] if self.layer is not None else self.name

    @property
    def slot(self) -> str:
        """The params slot: one per label, but a sliding-window attention (Gemma 3) has params
        of its own (the window moves its first key), so its layers share a second slot; and a
        projection stored in several forms across layers has one slot per form."""
        if self.option("window"):
            return f"{self.label}@window"
        form = self.option("form")
        return f"{self.label}@{form}" if form else self.label

    @property
    def positional(self) -> bool:
        """Whether the op's params depend on the position (a decode step rewrites its slot): RoPE +
        KV append, attention, and a q|k|v mat-vec that does RoPE + KV append itself."""
        return self.kind in POSITIONAL_KINDS or bool(self.option("rope"))

    @property
    def step(self) -> str:
        """The planner's step: layer ops share one step per label ("layer.qkv")."""
        return f"layer.{self.label}" if self.layer is not None else self.name

    def read(self, role: str) -> str:
        return dict(self.reads)[role]

    def write(self, role: str) -> str:
        return dict(self.writes)[role]

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.mode).get(key, default)

    def refs(self) -> list[str]:
        return [ref for _, ref in self.reads + self.writes]

    def replace(self, **changes) -> "Op":
        return dataclasses.replace(self, **changes)


def base(ref: str) -> str:
    """The activation a ref names ("qkv.q" -> "qkv"); other refs as they are."""
    return ref if ":" in ref else ref.split(".", 1)[0]


def is_activation(ref: str) -> bool:
    return ":" not in ref and not ref.startswith("rope_table")


@dataclasses.dataclass(frozen=True)
class Layout:
    """What the memory planner decided about the weights that changes the program: tensors cut
    into row pieces (binding limits), the row groups laid out back to back in every layer, and
    whether the stacked q|k|v's mat-vec with RoPE binds no more storage buffers than the device gives;
    and what the manifest says: the form of each layer weight whose kind is stored in more than
    one form across the layers (`weight_forms`)."""
    pieces: Mapping[str, int] = dataclasses.field(default_factory=dict)   # tensor -> pieces, when > 1
    stacks: frozenset[str] = frozenset()                                  # "qkv", "gate_up"
    forms: Mapping[str, str] = dataclasses.field(default_factory=dict)    # tensor -> form, mixed kinds only
    rope_matmul: bool = False          # the stacked q|k|v's fused RoPE kernel fits the device (rope-kv-into-matmul)


@dataclasses.dataclass(frozen=True)
class Program:
    schedule: str                  # "decode" or "prefill"
    tokens: int                    # T of the step (decode 1, prefill the chunk)
    n_layers: int
    ops: tuple[Op, ...]
    fusions: tuple[str, ...] = ()  # the rules applied, in order

    # -- the list's parts -------------------------------------------------------------------
    def layer(self, i: int) -> list[Op]:
        return [op for op in self.ops if op.layer == i]

    @property
    def before(self) -> list[Op]:
        first = next(i for i, op in enumerate(self.ops) if op.layer is not None)
        return list(self.ops[:first])

    @property
    def after(self) -> list[Op]:
        last = max(i for i, op in enumerate(self.ops) if op.layer is not None)
        return list(self.ops[last + 1:])

    def dispatch_ops(self) -> list[Op]:
        """Ops that run as dispatches (a copy is a buffer copy, host_embed a buffer write)."""
        return [op for op in self.ops if op.kind not in NO_DISPATCH]

    def dispatches_per_layer(self) -> int:
        return sum(1 for op in self.layer(0) if op.kind not in NO_DISPATCH)

    # -- what the planner derives -------------------------------------------------------------
    def steps(self) -> list[str]:
        """The schedule's steps in order: upload, the ops before the layers, one layer (the
        loop body, run once per layer on the same regions), the ops after, readback."""
        return (["upload"] + [op.step for op in self.before] + [op.step for op in self.layer(0)]
                + [op.step for op in self.after] + ["readback"])

    def layer_loop(self) -> tuple[int, int]:
        steps = self.steps()
        body = [op.step for op in self.layer(0)]
        return steps.index(body[0]), steps.index(body[-1])

    def slots(self) -> list[str]:
        """Params slots, one per label; the position-dependent ones first (a decode step
        rewrites one contiguous range)."""
        labels = list(dict.fromkeys(op.slot for op in self.ops if op.kind not in NO_DISPATCH + ("reduce",)))
        positional = {op.slot: op.positional for op in self.ops}
        reductions = [f"reduce:{r}" for r in READBACKS[:2]] if any(op.kind == "reduce" for op in self.ops) else []
        return [s for s in labels if positional[s]] + [s for s in labels if not positional[s]] + reductions

    def activations(self) -> list[str]:
        """Every activation the program reads or writes, in first-use order."""
        return list(dict.fromkeys(base(ref) for op in self.ops for ref in op.refs() if is_activation(ref)))

    def intervals(self) -> dict[str, tuple[str, str]]:
        """activation -> (first producer step, last consumer step). One used outside the layer
        loop and inside it, or read in a layer before that layer writes it (carried from the
        previous layer), surrounds the loop; the readback reads the logits and the result."""
        steps = self.steps()
        lo, hi = self.layer_loop()
        out = {}
        for name in self.activations():
            touched = [steps.index(op.step) for op in self.ops
                       if name in {base(r) for r in op.refs() if is_activation(r)}]
            written = [steps.index(op.step) for op in self.ops if name in {base(r) for _, r in op.writes}]
            first, last = min(touched), max(touched)
            if name == "token_ids" or any(op.kind == "host_embed" and op.write("x") == name for op in self.ops):
                first = 0                                   # uploaded before the step
            if name in ("logits", "logits_result"):
                last = len(steps) - 1                       # read back after it
            inside_first_write = min((w for w in written if lo <= w <= hi), default=None)
            carried = inside_first_write is not None and any(
                lo <= t < inside_first_write for t in touched)
            straddles = (first < lo <= last) or (first <= hi < last)
            if carried or straddles:
                first, last = min(first, lo - 1), max(last, hi + 1)
            out[name] = (steps[first], steps[last])
        return out


# -- weight forms ---------------------------------------------------------------------------------

def weight_form(info) -> str:
    """What fixes a matrix's launch besides its shape, as a slot suffix: the encoding, and for
    a quantized one its block, zero kind and scale type ("q8-32-f16", "q5-32-offset-f16",
    "q4k-256-scaled-min-f16"; "f16")."""
    q = info.quant
    if q is None:
        return info.encoding
    zero = [q.zero] if q.zero != "none" else []
    return "-".join([info.encoding, str(q.block_elements), *zero, q.scale_type])


def weight_forms(manifest) -> dict[str, str]:
    """tensor -> form (`weight_form`) of every layer matrix whose kind ("attn_v", "ffn_down")
    has more than one form across the layers; kinds with one form are left out, so a uniform
    model's program is unchanged."""
    by_kind: dict[str, dict[str, str]] = {}
    for name, info in manifest.tensors.items():
        if name.startswith("blk.") and len(info.shape) == 2:
            by_kind.setdefault(name.split(".", 2)[2], {})[name] = weight_form(info)
    return {name: form for forms in by_kind.values() if len(set(forms.values())) > 1
            for name, form in forms.items()}


# -- activation sizes ----------------------------------------------------------------------------

def qkv_offsets(arch, tokens: int, s_align: int) -> tuple[int, int, int]:
    """Byte offsets of the q, k and v sections of the planar qkv activation: each at an aligned
    offset so it can be bound alone."""
    k_at = align(4 * tokens * arch.n_heads * arch.head_dim, s_align)
    return 0, k_at, k_at + align(4 * tokens * arch.n_kv_heads * arch.head_dim, s_align)


def ffn_padded(arch, s_align: int) -> int:
    """F' = F rounded up to a whole alignment unit of floats: up's columns start aligned."""
    return align(arch.ffn, s_align // 4)


def logits_partials_words(vocab: int, k: int) -> int:
    """Words of the pass-1 partials [2 G k + G] (kernels/logits.py LogitsPlan.partials_words),
    the most any k' <= k needs with the host's default chunk, or argmax's (G <= ARGMAX_GROUPS)."""
    import math
    most = 3 * min(ARGMAX_GROUPS, vocab)
    for kk in range(1, k + 1):
        chunk = min(align(math.isqrt(vocab * kk) + 1, LOGITS_LOAD), align(vocab, LOGITS_LOAD))
        most = max(most, (2 * kk + 1) * -(-vocab // chunk))
    return most


def activation_bytes(arch, schedule: str, tokens: int, capacity: int, k: int, s_align: int) -> dict[str, tuple]:
    """activation -> (part, bytes): f32 rows of T tokens laid out as the executor binds them.
    Parts: "arena" (activations), "scratch" (partial sums), "logits" (what is read back)."""
    t, d, h, kv, e, v = tokens, arch.hidden, arch.n_heads, arch.n_kv_heads, arch.head_dim, arch.vocab
    f_pad = ffn_padded(arch, s_align)
    _, _, v_at = qkv_offsets(arch, t, s_align)
    chunks = -(-capacity // MIN_CHUNK) if capacity > SINGLE_PASS_MAX else 0
    return {
        "token_ids": ("arena", 4 * t), "x": ("arena", 4 * t * d), "delta": ("arena", 4 * t * d),
        "attn_in": ("arena", 4 * t * d), "qkv": ("arena", v_at + 4 * t * kv * e),
        "attn_out": ("arena", 4 * t * h * e), "ffn_in": ("arena", 4 * t * d),
        "gate_up": ("arena", 4 * t * 2 * f_pad), "ffn_act": ("arena", 4 * t * f_pad),
        "final_in": ("arena", 4 * t * d), "last_row": ("arena", 4 * d), "proj": ("arena", 4 * t * d),
        "attn_acc": ("scratch", 4 * max(4, h * chunks * e)), "attn_ml": ("scratch", 4 * max(2, h * chunks * 2)),
        "logits_partials": ("scratch", 4 * logits_partials_words(v, k)),
        "logits": ("logits", 4 * v), "logits_result": ("logits", 4 * (2 * k + 1)),
    }


# The prefill GEMM's split-K partial sums (kernels/gemm_split.py): up to 4 parts of a chunk's
# widest projection output that is not an FFN one (q|k|v, o, down: the ones with few output
# tiles), and never more than 8 MiB; the lowering splits only as far as this holds.
PARTIALS_MAX_FLOATS = 1 << 21


def gemm_partials_floats(arch, tokens: int) -> int:
    """Floats of the plan's `prefill.gemm_partials` region for chunks of `tokens` rows."""
    widest = max(arch.hidden, (arch.n_heads + 2 * arch.n_kv_heads) * arch.head_dim)
    return min(PARTIALS_MAX_FLOATS, 4 * tokens * (-(-widest // 4) * 4))


def int8_x_bytes(arch) -> int:
    """Bytes of the plan's `decode.int8_x` region: one decode row of activations quantized for
    the pre-quantized mat-vec (kernels/matvec_prequant.py xq_bytes), for the widest K of
    any decode matmul (q4 rows hold whole blocks of up to 256: 8 units of 32 each), with two
    bytes an activation (5 vec4 a unit)."""
    widest = max(arch.hidden, arch.n_heads * arch.head_dim, arch.ffn)
    return 16 * (1 + 5 * (-(-widest // 256) * 8))


# -- the reference program ------------------------------------------------------------------------

def _matmul(label: str, layer: int | None, tensor: str, x: str, y: str, layout: Layout, **mode) -> list[Op]:
    """A projection: one op per row piece of the weight (plan splits), each its own slot, and
    the weight's form when its kind's layers differ (layout.forms)."""
    n = layout.pieces.get(tensor, 1)
    prefix = f"L{layer}." if layer is not None else ""
    if tensor in layout.forms:
        mode = {**mode, "form": layout.forms[tensor]}
    names = [label] if n == 1 else [f"{label}#{p}" for p in range(n)]
    return [Op(prefix + name, "matmul", (("x", x), ("w", f"w:{tensor}")), (("y", y),),
               tuple(sorted({**mode, "piece": p}.items())), layer) for p, name in enumerate(names)]


def _norm(name: str, layer: int | None, weight: str, out: str, residual: bool) -> Op:
    reads = (("x", "x"), ("delta", "delta"), ("weight", weight)) if residual else (("x", "x"), ("weight", weight))
    writes = (("out", out), ("x", "x")) if residual else (("out", out),)
    return Op(name, "norm", reads, writes, (("residual", residual),), layer)


def _post_norm(name: str, layer: int, weight: str) -> Op:
    """Gemma 3's norm of a sub-layer's output before the residual add: proj -> delta."""
    return Op(name, "norm", (("x", "proj"), ("weight", weight)), (("out", "delta"),), (("residual", False),), layer)


def reference(arch, schedule: str, tokens: int, layout: Layout = Layout(), tied_output: bool | None = None) -> Program:
    """The unfused program of one step: the readable reference every fusion rewrites."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, not {schedule!r}")
    gemma = getattr(arch, "gemma3", None)
    head = "token_embd" if (arch.tied_output if tied_output is None else tied_output) else "output"
    # A table split into row pieces cannot be bound whole by the gather kernel: the host
    # gathers its rows (backends/gpu/host_embedding.py) and writes them into x before the step.
    embed_kind = "host_embed" if layout.pieces.get("token_embd", 1) > 1 else "embed"
    ops = [Op("embed", embed_kind, (("ids", "token_ids"), ("table", "w:token_embd")), (("x", "x"),))]
    if gemma:
        ops.append(Op("embed_scale", "scale", (), (("x", "x"),), (("scale", float(gemma.embedding_scale)),)))
    sublayer_out = "proj" if gemma else "delta"          # gemma3 norms it into delta
    for i in range(arch.n_layers):
        b, p = f"blk.{i}.", f"L{i}."
        ops.append(_norm(p + "attn_norm", i, f"v:{b}attn_norm", "attn_in", residual=i > 0))
        for label, section in (("q", "qkv.q"), ("k", "qkv.k"), ("v", "qkv.v")):
            ops += _matmul(label, i, f"{b}attn_{label}", "attn_in", section, layout)
        if gemma:
            ops.append(Op(p + "head_norm", "head_norm", (("q_weight", f"v:{b}attn_q_norm"),
                                                          ("k_weight", f"v:{b}attn_k_norm")), (("qkv", "qkv"),), (), i))
        sliding = bool(gemma) and gemma.layer_types[i] == "sliding"
        caches = (("k_cache", f"kv:L{i}.k"), ("v_cache", f"kv:L{i}.v"))
        rope_reads = (("table", "rope_table_local" if sliding else "rope_table"),)
        rope_mode = (("rotary", arch.rope.rotary_dim),) if arch.rope.rotary_dim != arch.head_dim else ()
        if arch.qkv_bias:
            rope_reads += tuple((f"bias_{x}", f"v:{b}attn_{x}.bias") for x in "qkv")
            rope_mode += (("bias", True),)
        ops.append(Op(p + "rope_kv", "rope_kv", rope_reads, (("qkv", "qkv"),) + caches, rope_mode, i))
        scratch = (("acc", "attn_acc"), ("ml", "attn_ml")) if schedule == "decode" else ()
        attention_mode = ()
        if gemma:
            attention_mode = (("scale", float(gemma.attention_scale)),) + ((("window", gemma.sliding_window),)
                                                                          if sliding else ())
        ops.append(Op(p + "attention", "attention", (("q", "qkv.q"),) + caches, (("out", "attn_out"),) + scratch,
                      attention_mode, i))
        ops += _matmul("o", i, f"{b}attn_output", "attn_out", sublayer_out, layout)
        if gemma:
            ops.append(_post_norm(p + "post_attention_norm", i, f"v:{b}post_attention_norm"))
        ops.append(_norm(p + "ffn_norm", i, f"v:{b}ffn_norm", "ffn_in", residual=True))
        ops += _matmul("gate", i, f"{b}ffn_gate", "ffn_in", "gate_up.gate", layout)
        ops += _matmul("up", i, f"{b}ffn_up", "ffn_in", "gate_up.up", layout)
        activation = "geglu" if gemma else "swiglu"
        ops.append(Op(p + activation, activation, (("h", "gate_up"),), (("out", "ffn_act"),), (), i))
        ops += _matmul("down", i, f"{b}ffn_down", "ffn_act", sublayer_out, layout)
        if gemma:
            ops.append(_post_norm(p + "post_ffw_norm", i, f"v:{b}post_ffw_norm"))
    ops.append(_norm("final_norm", None, "v:output_norm", "final_in", residual=True))
    row = "final_in"
    if schedule == "prefill":        # the head multiplies one row: the chunk's last
        ops.append(Op("last_row", "copy", (("src", "final_in"),), (("dst", "last_row"),)))
        row = "last_row"
    ops += _matmul("head", None, head, row, "logits", layout, head=True)
    ops.append(Op("reduce", "reduce", (("logits", "logits"),),
                  (("partials", "logits_partials"), ("result", "logits_result"))))
    return Program(schedule, tokens, arch.n_layers, tuple(ops))
