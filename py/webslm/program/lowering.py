"""Lowering: an op of the step program -> the kernel launch(es) that compute it on this device.

A `Launch` is a registry kernel with its overrides, params words and grid, and its bindings by
name in the kernel's order: `inputs` are its read-only storage bindings, `outputs` its writable
ones (the params uniform always comes first). A binding names the op's ref, and for a weight
the part ("codes", "scales", "mins", "data") and the row piece; the executor resolves each to a
range of the plan's buffers. Every size is validated here, on the host, by the kernel families'
own plan functions, before any GPU work.

    op kind          kernel family                        inputs                         outputs
    embed            embed_<enc>                          ids, table parts               x
    norm             rms_norm[_residual]                  weight, x (or delta)           out (and x)
    matmul decode    matvec[_norm|_swiglu]_<enc>          weight parts, x (+ norm weight)  y
                     or, measured faster ("xq"):
                     quantize_x_<input>, then             x (+ norm weight)              int8_x
                     matvec_int8_q4_dot4                  weight parts, int8_x           y
                     or qout_matvec_int8_* (its readers' int8 too: below)   (+ int8_x_out or int8_x)
                     or rkv_<either mat-vec> (q|k|v marked rope:  + rope_table    + k_cache, v_cache
                     RoPE + KV append in it, kernels/matvec_rope_kv.py)
    matmul prefill   gemm[_tiled[_half]]_<enc>            x, weight parts                y (q|k|v: 3 sections)
    rope_kv          rope_kv_append[_bias]_<kv dtype>     rope_table (+ q, k, v biases)  qkv, k_cache, v_cache
    attention        attention_decode / _prefill          q, k_cache, v_cache            out (+ acc, ml)
                     or attention_decode_xq (one pass, the o projection on int8_x: below)   (+ int8_x)
    attention_rope   attention_decode_rope                qkv, rope_table                k_cache, v_cache, out, acc, ml
    swiglu, geglu    swiglu / geglu                       h (gate | up)                  out
    scale            scale_rows (gemma3 embedding scale)  -                              x (in place)
    head_norm        head_norm (gemma3 q/k norms)         q_weight, k_weight             qkv (in place)
    reduce           logits argmax / top-k (two passes)   logits (+ partials)            partials / result

An attention op marked `quantize_out` (fusion rule quantize-into-attention) quantizes its own
output for the o projection when every mat-vec reading it is on the pre-quantized path with one
byte form, and the step is one pass (`output_quantizer`); `lower_ops`, which lowers the ops of
one recording in order, then lowers those mat-vecs with `x_quantized`, without their
quantize_x launch (the recorder, backends/gpu/forward.py, and admission's pipeline list).
Likewise a decode matmul marked `quantize_out` (fusion rule quantize-into-matmul: o, gate|up,
down) writes its readers' int8 input itself (`matmul_output_quantizer`,
kernels/matvec_quantize_out.py), into the int8 scratch its own input is not in.

The head always multiplies one row (the mat-vec, in both schedules). Decode attention has one
head grouping and grid for every position (the full cache's), so a decode recording never
changes; past the single-pass length it adds the combine pass (`long_attention`).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from ..kernels import (attention, attention_rope, attention_xq, embed, gemm, gemm_split, head_norm, logits, matvec,
                       matvec_prequant, matvec_quantize_out, matvec_rope_kv, norm, rope_kv, scale, swiglu)
from ..kernels.weights import Weights
from .ops import Op, ffn_padded, qkv_offsets


# Prefill chunk lengths the GEMM tile choice distinguishes (Lowering.prefill_buckets).
GEMM_BUCKETS = (32, 64, 128, 256)


@dataclasses.dataclass(frozen=True)
class Binding:
    role: str
    ref: str                       # the op's ref
    part: str | None = None        # a weight's part
    piece: int | None = None       # a weight's row piece (plan splits)
    offset: int = 0                # bytes into the ref (a piece's output rows start here)
    size: int | None = None        # bytes, when only part of the ref is bound


@dataclasses.dataclass(frozen=True)
class Launch:
    kernel: str
    overrides: dict
    params: np.ndarray
    grid: tuple[int, int, int]
    inputs: tuple[Binding, ...]
    outputs: tuple[Binding, ...]
    label: str


def weight_pieces(manifest, splits: list[dict], tensor: str) -> list[tuple[Weights, int]]:
    """(shape-only Weights, first row) of each row piece of a 2-D tensor (one without a split)."""
    info = manifest.tensors[tensor]
    rows = info.shape[0]
    split = next((s for s in splits if s["tensor"] == tensor), None)
    step = rows if split is None else split["rows_per_piece"]
    return [(Weights.of_tensor(info, min(a + step, rows) - a), a) for a in range(0, rows, step)]


def weight_of(manifest, splits: list[dict], ref: str, piece: int = 0) -> tuple[Weights, int]:
    """The Weights of a "w:" ref (stacked refs: the members' rows summed) and its first row."""
    tensors = ref[2:].split("+")
    pieces = [weight_pieces(manifest, splits, t) for t in tensors]
    if len(tensors) == 1:
        return pieces[0][piece]
    first = pieces[0][0][0]
    return dataclasses.replace(first, rows=sum(p[0][0].rows for p in pieces)), 0


def part_names(weights: Weights) -> tuple[str, ...]:
    """The kernels' weight bindings in order: q4/q5 "offset" bind their scales in the mins slot."""
    return weights.binding_names()


def _is_quantizer(launch: Launch) -> bool:
    return launch.kernel.startswith(matvec_prequant.QUANTIZER_PREFIX)


def _same_quantizer(a: Launch | None, b: Launch) -> bool:
    """Whether two quantize_x launches write the same bytes: one kernel and overrides, grid and
    inputs, and the params words the quantizer reads (cols, units, x_stride, aux: the two
    launches read two mat-vecs' params slots, whose rows differ)."""
    return (a is not None and (a.kernel, a.overrides, a.grid, a.inputs, a.outputs) ==
            (b.kernel, b.overrides, b.grid, b.inputs, b.outputs)
            and all(int(a.params[w]) == int(b.params[w]) for w in matvec_prequant.QUANTIZER_PARAMS))


class OutputQuantizer(NamedTuple):
    """How a matmul quantizes its output for its readers (Lowering.matmul_output_quantizer)."""
    natural: bool                  # the readers' byte order: natural (q8), else nibble order
    next_norm: str | None          # the norm-input readers' norm weight ref; None for swiglu
    swiglu: bool                   # the stacked gate|up for swiglu-input readers (down)


class Lowering:
    """Launches for one admitted session: device limits and features, shapes, plan facts."""

    def __init__(self, device, model, plan, choices: dict | None = None):
        self.device, self.limits = device, device.limits
        # Measured mat-vec launch shapes by form (matvec.form_key -> matvec.Choice), and the
        # prefill attention variant (attention.PREFILL_CHOICE -> attention.PrefillChoice), from
        # admission's tuning stage (backends/gpu/tuning.py); what has none takes the rule.
        self.choices = dict(choices or {})
        # Room for split-K partial sums (kernels/gemm_split.py), in floats: 0 in a plan without it.
        self.partials_floats = next((r.size // 4 for r in plan.regions if r.name == "prefill.gemm_partials"), 0)
        # Room for decode activations quantized once (kernels/matvec_prequant.py), in bytes.
        self.int8_x_bytes = next((r.size for r in plan.regions if r.name == "decode.int8_x"), 0)
        self.arch = a = model.architecture
        self.model, self.manifest = model, model.manifest
        self._decode_ops: list[Op] | None = None     # the decode program (output_quantizer's readers)
        self.plan = plan
        policy = plan.as_dict()["policy"]
        self.capacity, self.chunk, self.top_k = (policy["context_capacity"], policy["prefill_chunk"],
                                                 policy["top_k_capacity"])
        self.splits = plan.splits
        self.s_align = plan.required_limits["minStorageBufferOffsetAlignment"]
        self.f_pad = ffn_padded(a, self.s_align)
        self.shape = attention.AttentionShape(a.n_heads, a.n_kv_heads, a.head_dim, self.capacity, plan.kv["dtype"])
        self.embedding = embed.model_embedding(model)     # (unused by a host_embed program)
        # Decode attention: one head grouping and grid for every position (those of a full
        # cache), so the pipeline and grid stay fixed; workgroups past a position's chunks exit.
        # Up to single_pass keys take one pass with the whole context as one chunk.
        widest = attention.plan_decode(self.limits, self.shape, self.capacity - 1)
        self.decode_chunk = widest.chunk
        self.decode_heads = widest.chunk_pass.overrides["GW"]
        self.decode_grid = widest.chunk_pass.grid
        self.decode_combine_grid = widest.combine.grid if widest.combine else None
        self.decode_combine_overrides = dict(widest.combine.overrides) if widest.combine else None
        self.single_pass = min(attention.SINGLE_PASS_MAX, attention.SCORE_WORDS // self.decode_heads)
        self._reduce_layouts: dict[tuple, logits.LogitsPlan] = {}
        self._decode_plans: dict[str, object] = {}      # params slot -> its family's plan (decode_params)

    # -- facts the executor shares ---------------------------------------------------------------
    def planned_tokens(self, schedule: str) -> int:
        """T the schedule's activations were laid out for (sections sit at these offsets)."""
        return 1 if schedule == "decode" else self.chunk

    def prefill_buckets(self) -> list[int]:
        """The chunk lengths prefill GEMM tiles are chosen for: a chunk of T tokens takes the
        tile of the smallest bucket >= T, so a short prompt does not run the full chunk's tall
        tiles. Admission compiles the tiles of every bucket (admission/pipelines.py)."""
        return sorted({min(b, self.chunk) for b in GEMM_BUCKETS} | {self.chunk})

    def single_pass_at(self, position: int) -> bool:
        """Whether decode attention at this position is one pass (the "short" recording)."""
        return position + 1 <= self.single_pass or self.decode_combine_grid is None

    def section(self, schedule: str, ref: str) -> tuple[int, int | None]:
        """(byte offset, byte size or None: to the end) of a section ref inside its activation."""
        q_at, k_at, v_at = qkv_offsets(self.arch, self.planned_tokens(schedule), self.s_align)
        return {"qkv.q": (q_at, k_at - q_at), "qkv.k": (k_at, v_at - k_at), "qkv.v": (v_at, None),
                "gate_up.gate": (0, None), "gate_up.up": (4 * self.f_pad, None)}.get(ref, (0, None))

    def reduce_layout(self, op: str, k: int) -> tuple[logits.LogitsChoice, logits.LogitsPlan]:
        """The reduction's kernels and layout, planned once per (op, k): decode reads it every token."""
        key = (op, k)
        if key not in self._reduce_layouts:
            choice = logits.choose(self.device, "argmax" if op == "argmax" else "topk", k)
            self._reduce_layouts[key] = (choice, logits.plan(self.device, choice, self.arch.vocab, k))
        return self._reduce_layouts[key]

    # -- ops -> launches ------------------------------------------------------------------------
    def lower(self, op: Op, schedule: str, tokens: int, start: int, readback: str = "argmax",
              long_attention: bool = False, x_quantized: str | None = None,
              quantize_out: OutputQuantizer | None = None) -> list[Launch]:
        """The launches of `op` in a step of `tokens` tokens at `start` ([] for a copy, or a
        reduce when the whole logits row is read back). For a matmul, from `lower_ops`:
        `x_quantized`, the scratch ("int8_x", "int8_x_out") where an earlier launch of the same
        recording left its input quantized already (output_quantizer,
        matmul_output_quantizer); `quantize_out`, the latter's answer for this op, to quantize
        its own output for its readers."""
        if op.kind == "matmul":
            return self._matmul(op, schedule, tokens, start, readback, long_attention, x_quantized, quantize_out)
        return getattr(self, f"_{op.kind}")(op, schedule, tokens, start, readback, long_attention)

    def lower_ops(self, ops: list[Op], schedule: str, tokens: int, start: int, readback: str = "argmax",
                  long_attention: bool = False) -> list[tuple[Op, Launch]]:
        """(op, launch) of every launch of `ops` recorded together, in order: a matmul whose input
        a launch before it among `ops` quantized already takes no quantize_x launch: an attention
        for o, a mat-vec for the mat-vecs reading its output (matmul_output_quantizer), or an
        earlier reader's own identical quantize_x (q, k and v unstacked, as a Q4_K_M model's
        are, read one x: one quantizer serves them). A mat-vec quantizes its output only where a
        reader of it follows among `ops` (tuning's launches of one form alone, with no reader
        among them, keep the plain kernel; a layer's own attention decides for its readers)."""
        out = []
        quantized = {}      # activation ref -> the scratch a launch here also wrote it to as int8
        prepared = {}       # activation ref -> (scratch, quantize_x launch) that left it there
        for i, op in enumerate(ops):
            quantize_out = None
            if op.kind == "matmul" and schedule == "decode" and any(
                    r.kind == "matmul" and r.read("x") == op.write("y") for r in ops[i + 1:]):
                quantize_out = self.matmul_output_quantizer(op)
            launches = self.lower(op, schedule, tokens, start, readback, long_attention,
                                  x_quantized=quantized.get(op.read("x")) if op.kind == "matmul" else None,
                                  quantize_out=quantize_out)
            if (op.kind == "matmul" and launches and _is_quantizer(launches[0])
                    and _same_quantizer(prepared.get(op.read("x"), (None, None))[1], launches[0])):
                launches = launches[1:]       # its bytes are in int8_x already, from the same launch
            for _, ref in op.writes:
                quantized.pop(ref, None)
                prepared.pop(ref, None)
            for launch in launches:
                written = {b.ref for b in launch.outputs}
                prepared = {ref: entry for ref, entry in prepared.items() if entry[0] not in written}
                if op.kind == "matmul" and _is_quantizer(launch):
                    prepared[op.read("x")] = (launch.outputs[0].ref, launch)
                if launch.kernel.startswith(attention_xq.KERNEL_PREFIX):
                    quantized[op.write("out")] = "int8_x"
                if launch.kernel.startswith(matvec_quantize_out.PREFIX):
                    quantized[op.write("y")] = launch.outputs[-1].ref       # xq_out's scratch
            out += [(op, launch) for launch in launches]
        return out

    def _copy(self, op, schedule, tokens, start, readback, long_attention):
        return []

    def _host_embed(self, op, schedule, tokens, start, readback, long_attention):
        return []            # the host writes x (backends/gpu/host_embedding.py)

    def _launch(self, op: Op, planned, inputs, outputs) -> Launch:
        return Launch(planned.kernel, dict(planned.overrides), planned.params, tuple(planned.grid),
                      tuple(inputs), tuple(outputs), op.label.split("#")[0])

    def _embed(self, op, schedule, tokens, start, readback, long_attention):
        p = embed.plan_embed(self.limits, np.zeros(tokens, np.uint32), self.embedding)
        parts = [Binding(part, op.read("table"), part=part) for part in self.embedding.binding_parts]
        return [self._launch(op, p, [Binding("ids", op.read("ids")), *parts], [Binding("x", op.write("x"))])]

    def _norm(self, op, schedule, tokens, start, readback, long_attention):
        residual = bool(op.option("residual"))
        p = norm.plan_norm(self.limits, tokens, self.arch.hidden, self.arch.norm_eps, residual=residual)
        source = "delta" if residual else "x"
        outputs = [Binding("out", op.write("out"))] + ([Binding("x", op.write("x"))] if residual else [])
        return [self._launch(op, p, [Binding("weight", op.read("weight")), Binding(source, op.read(source))], outputs)]

    def _swiglu(self, op, schedule, tokens, start, readback, long_attention, activation="silu"):
        p = swiglu.plan_swiglu(self.limits, tokens, self.f_pad, activation=activation)
        return [self._launch(op, p, [Binding("h", op.read("h"))], [Binding("out", op.write("out"))])]

    def _geglu(self, op, schedule, tokens, start, readback, long_attention):
        return self._swiglu(op, schedule, tokens, start, readback, long_attention, activation="gelu-tanh")

    def _scale(self, op, schedule, tokens, start, readback, long_attention):
        p = scale.plan_scale(self.limits, tokens * self.arch.hidden, op.option("scale"))
        return [self._launch(op, p, [], [Binding("x", op.write("x"))])]

    def _head_norm(self, op, schedule, tokens, start, readback, long_attention):
        a = self.arch
        t = self.planned_tokens(schedule)
        q_at, k_at, v_at = qkv_offsets(a, t, self.s_align)
        p = head_norm.plan_head_norm(self.limits, tokens, a.n_heads, a.n_kv_heads, a.head_dim, a.norm_eps,
                                     q_at // 4, k_at // 4, (v_at + 4 * t * a.n_kv_heads * a.head_dim) // 4)
        inputs = [Binding("q_weight", op.read("q_weight")), Binding("k_weight", op.read("k_weight"))]
        return [self._launch(op, p, inputs, [Binding("qkv", op.write("qkv"))])]

    def _strides(self, op: Op, weights: Weights) -> tuple[int, int]:
        """(x_stride, y_stride) in floats: the input row and the whole output row."""
        a = self.arch
        q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        x_ref, y_ref = op.read("x"), op.write("y")
        x_stride = {"attn_out": q, "ffn_act": self.f_pad, "gate_up": 2 * self.f_pad}.get(x_ref, a.hidden)
        y_stride = {"qkv.q": q, "qkv.k": kv, "qkv.v": kv, "gate_up.gate": 2 * self.f_pad,
                    "gate_up.up": 2 * self.f_pad, "logits": a.vocab}.get(y_ref, a.hidden)
        if y_ref in ("qkv", "gate_up"):
            y_stride = weights.rows                  # a stacked decode row: its members back to back
        return x_stride, y_stride

    def _matmul(self, op, schedule, tokens, start, readback, long_attention, x_quantized=None, quantize_out=None):
        piece = op.option("piece", 0)
        weights, row_start = weight_of(self.manifest, self.splits, op.read("w"), piece)
        parts = [Binding(part, op.read("w"), part=part, piece=piece) for part in part_names(weights)]
        y = Binding("y", op.write("y"), offset=4 * row_start)
        x_stride, y_stride = self._strides(op, weights)
        if schedule == "decode" or op.option("head"):
            mode, accumulate = op.option("input", "plain"), bool(op.option("accumulate"))
            extra = {}
            if mode == "norm":
                extra = {"eps": float(self.arch.norm_eps), "norm_elements": self.arch.hidden}
            elif mode == "swiglu":
                extra = {"up_offset": self.f_pad}
            choice = self.choices.get(matvec.form_key(weights, mode, accumulate))
            if choice is not None and choice.variant in matvec_prequant.VARIANTS and schedule != "decode":
                choice = None     # the prefill head (once a prompt, of a decode form): exact, no int8_x there
            if choice is not None:
                extra |= {"workgroup": choice.workgroup, "rows_per_group": choice.rows}
            m = 1 if op.option("head") else tokens
            inputs = {"x": Binding("x", op.read("x")), "h": Binding("h", op.read("x"))}
            if mode == "norm":
                inputs["norm_weight"] = Binding("norm_weight", op.read("weight"))
            if choice is not None and choice.variant in matvec_prequant.VARIANTS:
                # Activations quantized once, then the packed-dot mat-vec on them: two launches
                # on one params block, through the plan's int8_x scratch (kernels/matvec_prequant.py).
                residual = bool(matvec_prequant.VARIANTS[choice.variant])
                q = matvec_prequant.plan(self.device, weights, m, x_stride, y_stride, mode, accumulate, **extra,
                                         residual=residual, squares=choice.variant in matvec_prequant.SQUARES)
                need = matvec_prequant.xq_bytes(matvec_prequant.x_units(weights), m, residual)
                if need > self.int8_x_bytes:
                    raise matvec.MatvecShapeError("binding-size", f"{op.name}: its quantized activations need "
                                                  f"{need} bytes; the plan's decode.int8_x holds {self.int8_x_bytes}")
                xq = Binding("xq", x_quantized or "int8_x")
                label = op.label.split("#")[0]
                if quantize_out is not None:      # y's int8 for its readers too (matmul_output_quantizer)
                    out = matvec_quantize_out.plan(self.device, q.matvec, weights, m, quantize_out.natural,
                                                   quantize_out.swiglu)
                    if matvec_quantize_out.out_bytes(weights.rows, m, residual, quantize_out.swiglu) > self.int8_x_bytes:
                        raise matvec.MatvecShapeError("binding-size", f"{op.name}: its output quantized needs more "
                                                      f"than the plan's int8 scratch holds")
                    # into the int8 scratch its own input is not in (the two are the same size);
                    # with swiglu no norm weight is read: the weight codes are bound in its place
                    target = "int8_x" if x_quantized == "int8_x_out" else "int8_x_out"
                    norm = (Binding("next_norm", quantize_out.next_norm) if quantize_out.next_norm is not None
                            else dataclasses.replace(parts[0], role="next_norm"))
                    matvec_launch = self._launch(op, out, parts + [xq, norm], [y, Binding("xq_out", target)])
                elif op.option("rope"):
                    fused = self._with_rope(q.matvec, weights, start)
                    matvec_launch = self._launch(op, fused, parts + [xq, Binding("table", op.read("table"))],
                                                 [y, *self._rope_caches(op)])
                else:
                    matvec_launch = self._launch(op, q.matvec, parts + [xq], [y])
                if x_quantized:
                    return [matvec_launch]
                # the two launches read one params block (the fused mat-vec's: its first words)
                return [Launch(q.quantize.kernel, dict(q.quantize.overrides), matvec_launch.params, q.quantize.grid,
                               tuple(inputs[name] for name in q.quantize.inputs), (xq,), f"{label} quantize"),
                        matvec_launch]
            if choice is not None:
                extra["variant"] = choice.variant
            p = matvec.plan(self.device, weights, m, x_stride, y_stride, input=mode, accumulate=accumulate, **extra)
            if op.option("rope"):
                return [self._launch(op, self._with_rope(p, weights, start),
                                     parts + [inputs[name] for name in p.inputs] + [Binding("table", op.read("table"))],
                                     [y, *self._rope_caches(op)])]
            return [self._launch(op, p, parts + [inputs[name] for name in p.inputs], [y])]
        if op.option("input", "plain") != "plain":
            raise ValueError(f"{op.name}: the prefill GEMM has no fused input")
        sections = None
        if op.write("y") == "qkv":        # stacked q|k|v: three column sections of the planar qkv activation
            a = self.arch
            _, k_at, v_at = qkv_offsets(a, self.chunk, self.s_align)
            q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
            sections, y_stride = [(0, 0, q), (q, k_at // 4, kv), (q + kv, v_at // 4, kv)], q
        features = self.device.features
        rows = next(b for b in self.prefill_buckets() if b >= tokens)
        # The tile for the chunk's bucket; with few tiles for a long K, KPARTS workgroups a tile
        # and then a reduce into y (kernels/gemm_split.py; both launches read one params block).
        tile, kparts = gemm_split.choose_tile(self.limits, rows, weights.rows, weights.cols, features,
                                              weights.encoding, self.partials_floats, sections is not None)
        accumulate = bool(op.option("accumulate"))
        p = gemm.plan(self.limits, weights, tokens, x_stride, y_stride, accumulate, tile, sections, features)
        x = Binding("x", op.read("x"))
        if kparts == 1:
            return [self._launch(op, p, [x, *parts], [y])]
        s = gemm_split.split(self.limits, p, tokens, weights.rows, kparts, accumulate)
        partials = Binding("partials", "gemm_partials")
        label = op.label.split("#")[0]
        return [self._launch(op, s.gemm, [x, *parts], [partials]),
                Launch(s.reduce_kernel, dict(s.reduce_overrides), p.params, tuple(s.reduce_grid), (partials,), (y,),
                       f"{label} reduce")]

    def _with_rope(self, p: matvec.MatvecPlan, weights: Weights, start: int) -> matvec.MatvecPlan:
        """The q|k|v mat-vec `p` as its RoPE + KV append form at `start` (rope-kv-into-matmul)."""
        a = self.arch
        return matvec_rope_kv.plan(self.device, p, weights, a.n_heads, self.shape.layout, a.rope.rotary_dim, start,
                                   self.capacity, a.rope.convention)

    @staticmethod
    def _rope_caches(op: Op) -> list[Binding]:
        return [Binding("k_cache", op.write("k_cache")), Binding("v_cache", op.write("v_cache"))]

    def matvec_form(self, op: Op) -> tuple[str, Weights]:
        """(matvec.form_key, the piece's shape-only Weights) of a decode matmul op: what
        admission's tuning measures and `choices` is keyed by."""
        weights, _ = weight_of(self.manifest, self.splits, op.read("w"), op.option("piece", 0))
        return matvec.form_key(weights, op.option("input", "plain"), bool(op.option("accumulate"))), weights

    def _rope_kv(self, op, schedule, tokens, start, readback, long_attention):
        bias = bool(op.option("bias"))
        p = self._plan_rope_kv(schedule, tokens, start, bias)
        outputs = [Binding("qkv", op.write("qkv")), Binding("k_cache", op.write("k_cache")),
                   Binding("v_cache", op.write("v_cache"))]
        inputs = [Binding("table", op.read("table"))]
        if bias:
            inputs += [Binding(role, op.read(role)) for role in ("bias_q", "bias_k", "bias_v")]
        return [self._launch(op, p, inputs, outputs)]

    def _attention(self, op, schedule, tokens, start, readback, long_attention):
        inputs = [Binding("q", op.read("q")), Binding("k_cache", op.read("k_cache")),
                  Binding("v_cache", op.read("v_cache"))]
        if schedule == "prefill":
            measured = self.choices.get(attention.PREFILL_CHOICE)    # else the first variant that fits
            p = attention.plan_prefill(self.limits, self.shape, start, tokens, op.option("scale"),
                                       variant=measured.variant if measured else None,
                                       window=op.option("window")).dispatch
            return [self._launch(op, p, inputs, [Binding("out", op.write("out"))])]
        d = self._plan_attention(start, window=op.option("window"), scale=op.option("scale"))
        outputs = [Binding("out", op.write("out")), Binding("acc", op.write("acc")), Binding("ml", op.write("ml"))]
        quantizer = None if long_attention else self.output_quantizer(op)
        if quantizer is not None:       # the o projection's int8 input as well (one pass only)
            chunk = attention_xq.quantized_chunk_pass(d.chunk_pass, self.shape, *quantizer)
            return [dataclasses.replace(self._launch(op, chunk, inputs, outputs + [Binding("xq", "int8_x")]),
                                        grid=tuple(self.decode_grid))]
        chunk_pass = dataclasses.replace(self._launch(op, d.chunk_pass, inputs, outputs), grid=tuple(self.decode_grid))
        if not long_attention:
            return [chunk_pass]
        combine = dataclasses.replace(chunk_pass, kernel=chunk_pass.kernel.replace("decode", "combine"),
                                      overrides={k: v for k, v in chunk_pass.overrides.items() if k != "GW"},
                                      grid=tuple(self.decode_combine_grid), label="combine")
        return [chunk_pass, combine]

    def _attention_rope(self, op, schedule, tokens, start, readback, long_attention):
        """Decode attention that rotates q and the new k itself and writes the new cache row
        (kernels/attention_rope.py); past the single-pass length the combine pass follows,
        binding the same ranges with attention's own layout."""
        d = self._plan_attention_rope(start)
        caches = [Binding("k_cache", op.write("k_cache")), Binding("v_cache", op.write("v_cache"))]
        partials = [Binding("out", op.write("out")), Binding("acc", op.write("acc")), Binding("ml", op.write("ml"))]
        qkv, table = Binding("qkv", op.read("qkv")), Binding("table", op.read("table"))
        chunk_pass = dataclasses.replace(self._launch(op, d.chunk_pass, [qkv, table], caches + partials),
                                         grid=tuple(self.decode_grid), label="attention")
        if not long_attention:
            return [chunk_pass]
        # Recorded once (at position 0) for every long position: the full cache's combine.
        combine = Launch(attention_rope.COMBINE_KERNEL, dict(self.decode_combine_overrides), d.chunk_pass.params,
                         tuple(self.decode_combine_grid), (qkv, *caches), tuple(partials), "combine")
        return [chunk_pass, combine]

    def output_quantizer(self, op: Op) -> tuple[bool, bool] | None:
        """(RESIDUAL, NATURAL) of the bytes a decode attention op writes for the mat-vecs that
        read its output, or None where it does not: the op is marked `quantize_out`, a head is
        whole units of 32, the tuning stage did not find the step faster without it
        (attention_xq.CHOICE), and every reader's current choice is the pre-quantized path on a
        plain input of exactly the attention output's units, all wanting one byte form."""
        if not op.option("quantize_out") or op.kind != "attention" or not attention_xq.fits(self.shape):
            return None
        measured = self.choices.get(attention_xq.CHOICE)          # the tuning stage's step timing
        if measured is not None and not measured.quantize:
            return None
        if self._decode_ops is None:
            from ..plan.memory import plan_programs        # (the planner imports this module)
            self._decode_ops = list(plan_programs(self.model, self.plan)["decode"].ops)
        readers = [r for r in self._decode_ops if r.kind == "matmul" and r.layer == op.layer
                   and r.read("x") == op.write("out")]
        forms = set()
        for reader in readers:
            key, weights = self.matvec_form(reader)
            choice = self.choices.get(key)
            if (choice is None or choice.variant not in matvec_prequant.VARIANTS
                    or reader.option("input", "plain") != "plain" or not matvec_prequant.serves(self.device, weights)
                    or matvec_prequant.x_units(weights) * matvec_prequant.UNIT != self.arch.n_heads * self.arch.head_dim):
                return None
            forms.add((bool(matvec_prequant.VARIANTS[choice.variant]), weights.encoding == "q8"))
        return forms.pop() if len(forms) == 1 else None

    def matmul_output_quantizer(self, op: Op) -> "OutputQuantizer | None":
        """How a decode matmul quantizes its own output for the mat-vecs reading it next
        (kernels/matvec_quantize_out.py), or None where it does not: the op is marked
        `quantize_out` (fusion rule quantize-into-matmul), is on the pre-quantized path itself
        with no row pieces, the tuning stage did not find the step faster without fused
        quantizers (attention_xq.CHOICE), and the readers of its output before it is written
        again are all on the pre-quantized path with this op's RESIDUAL, one byte order and one
        input of exactly its rows in units of 32: either norm-input mat-vecs on "xq2s" (the
        1/rms from the units' squares, no header) with one norm weight, or, for the stacked
        gate|up, swiglu-input mat-vecs (down) on half its rows."""
        if not op.option("quantize_out") or op.kind != "matmul" or op.option("piece", 0):
            return None
        measured = self.choices.get(attention_xq.CHOICE)
        if measured is not None and not measured.quantize:
            return None
        key, weights = self.matvec_form(op)
        own = self.choices.get(key)
        tensors = op.read("w")[2:].split("+")
        if (own is None or own.variant not in matvec_prequant.VARIANTS or len(tensors) > 2
                or any(len(weight_pieces(self.manifest, self.splits, t)) > 1 for t in tensors)):
            return None
        readers = self._readers(op)
        forms = set()
        for reader in readers:
            mode = reader.option("input", "plain")
            if reader.kind != "matmul" or reader.read("x") != op.write("y") or mode not in ("norm", "swiglu"):
                return None
            key, reader_weights = self.matvec_form(reader)
            choice = self.choices.get(key)
            swiglu = mode == "swiglu"
            rows = weights.rows // 2 if swiglu else weights.rows
            if (choice is None or choice.variant not in matvec_prequant.VARIANTS
                    or (not swiglu and choice.variant not in matvec_prequant.SQUARES)
                    or (swiglu and (len(tensors) != 2 or weights.rows % 2))
                    or matvec_prequant.VARIANTS[choice.variant] != matvec_prequant.VARIANTS[own.variant]
                    or not matvec_prequant.serves(self.device, reader_weights)
                    or matvec_prequant.x_units(reader_weights) * matvec_prequant.UNIT != rows
                    or rows % matvec_quantize_out.UNIT_ROWS):
                return None
            forms.add(OutputQuantizer(reader_weights.encoding == "q8", None if swiglu else reader.read("weight"),
                                      swiglu))
        return forms.pop() if len(forms) == 1 else None

    def _readers(self, op: Op) -> list[Op]:
        """The decode program's ops after `op` that read its output before it is written again."""
        if self._decode_ops is None:
            from ..plan.memory import plan_programs        # (the planner imports this module)
            self._decode_ops = list(plan_programs(self.model, self.plan)["decode"].ops)
        ops = self._decode_ops
        at = next((i for i, o in enumerate(ops) if o.name == op.name), None)
        readers = []
        for later in ops[at + 1:] if at is not None else []:
            if any(ref == op.write("y") for _, ref in later.reads):
                readers.append(later)
            if any(ref == op.write("y") for _, ref in later.writes):
                break
        return readers

    # -- the family plans behind the position-dependent ops ----------------------------------------
    def _chunk_at(self, start: int) -> int:
        return start + 1 if self.single_pass_at(start) else self.decode_chunk

    def _plan_rope_kv(self, schedule: str, tokens: int, start: int, bias: bool = False) -> rope_kv.RopeKvPlan:
        a = self.arch
        t = self.planned_tokens(schedule)
        q_at, k_at, v_at = qkv_offsets(a, t, self.s_align)
        qkv_bytes = v_at + 4 * t * a.n_kv_heads * a.head_dim
        return rope_kv.plan_rope_kv_append(self.limits, self.shape.layout, tokens, a.n_heads, a.rope.rotary_dim,
                                           start, self.capacity, a.rope.convention, q_at // 4, k_at // 4, v_at // 4,
                                           qkv_bytes // 4, bias=bias)

    def _plan_attention(self, start: int, chunk: int | None = None, window: int | None = None,
                        scale: float | None = None) -> attention.DecodePlan:
        return attention.plan_decode(self.limits, self.shape, start, scale, heads_per_workgroup=self.decode_heads,
                                     chunk=chunk or self._chunk_at(start), window=window)

    def _plan_attention_rope(self, start: int, chunk: int | None = None) -> attention_rope.DecodeRopePlan:
        a = self.arch
        q_at, k_at, v_at = qkv_offsets(a, 1, self.s_align)
        return attention_rope.plan_decode_rope(
            self.limits, self.shape, start, a.rope.rotary_dim, self.capacity, a.rope.convention, q_at // 4,
            k_at // 4, v_at // 4, (v_at + 4 * a.n_kv_heads * a.head_dim) // 4,
            heads_per_workgroup=self.decode_heads, chunk=chunk or self._chunk_at(start))

    def decode_params(self, op: Op, start: int) -> np.ndarray:
        """The params of a position-dependent decode op (rope_kv, attention, attention_rope, a
        q|k|v mat-vec with RoPE) at `start`: all a decode step rewrites. Derived from the
        family's plan made once for the cache's last position with the long chunk (the widest
        case, so it vouches for every position; `params_at` re-checks the position), not
        planned again per token: a token's host work stays a few array writes. Equal to
        lower()'s params at every position (tests/test_program.py)."""
        if op.kind == "matmul":         # rope-kv-into-matmul: the fused q|k|v mat-vec's block
            return self._rope_matvec_params(op, start)
        plan = self._decode_plans.get(op.slot)
        if plan is None:
            last = self.capacity - 1
            plan = {"rope_kv": lambda: self._plan_rope_kv("decode", 1, last, bool(op.option("bias"))),
                    "attention": lambda: self._plan_attention(last, self.decode_chunk, op.option("window"),
                                                              op.option("scale")),
                    "attention_rope": lambda: self._plan_attention_rope(last, self.decode_chunk)}[op.kind]()
            self._decode_plans[op.slot] = plan
        if op.kind == "rope_kv":
            return plan.params_at(start)
        return plan.params_at(start, self._chunk_at(start))

    def _rope_matvec_params(self, op: Op, start: int) -> np.ndarray:
        """The fused q|k|v mat-vec's params at `start`: lowered once for the cache's last position
        (again after the tuning stage changed a choice: its launch shape is in the block), then
        only the position word rewritten."""
        cached = self._decode_plans.get(op.slot)
        if cached is None or cached[0] != self.choices:
            cached = (dict(self.choices), self.lower(op, "decode", 1, self.capacity - 1)[-1].params)
            self._decode_plans[op.slot] = cached
        return matvec_rope_kv.params_at(cached[1], start, self.capacity)

    def _reduce(self, op, schedule, tokens, start, readback, long_attention):
        if readback == "full":
            return []
        k = 1 if readback == "argmax" else self.top_k
        choice, lp = self.reduce_layout(readback, k)
        lg = Binding("logits", op.read("logits"), size=4 * self.arch.vocab)
        partials, result = Binding("partials", op.write("partials")), Binding("result", op.write("result"))
        return [Launch(choice.partial, dict(choice.overrides), lp.params, tuple(lp.partial_grid), (lg,), (partials,),
                       f"{readback} pass 1"),
                Launch(choice.merge, dict(choice.overrides), lp.params, tuple(lp.merge_grid), (lg, partials),
                       (result,), f"{readback} pass 2")]
