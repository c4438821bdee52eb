"""The forward pass as GPU dispatches: what runs, in which order, on which regions.

One step of T tokens at positions start .. start + T - 1 (x is the residual stream [T, D]):

    embed        token_ids [T]            -> x [T, D]
    per layer i:
      attn_norm  x (+= delta, i > 0)      -> attn_in [T, D]          rms_norm / rms_norm_residual
      q, k, v    attn_in                  -> qkv: q [T, H E] | k [T, K E] | v [T, K E]
      rope_kv    q rotated in place; k rotated and v written to the layer's cache rows
      attention  q, cache[0 .. start + T) -> attn_out [T, H E]       (decode: split-K + combine)
      o_proj     attn_out                 -> delta [T, D]
      ffn_norm   x += delta               -> ffn_in [T, D]
      gate, up   ffn_in                   -> gate_up [T, 2 F'] (gate | up, F' = F padded)
      swiglu     gate_up                  -> ffn_act [T, F']
      down       ffn_act                  -> delta [T, D]
    final_norm   x += delta               -> final_in [T, D]
    lm_head      the last row             -> logits [V]
    reduce       logits                   -> argmax / top-k words (or the full row is copied)

Prefill chunks multiply with the GEMM. Decode multiplies with the mat-vec kernels and, when
the planner stacked q|k|v and gate|up (`stacks`), uses the fused variants (docs/kernels.md),
6 dispatches a layer instead of 10:

      qkv        rms_norm(x) fused on the input of the stacked q|k|v mat-vec
      rope_kv    as above
      attention  as above
      o          x += W_o attn_out          (ACCUMULATE: no delta, no residual pass)
      gate_up    rms_norm(x) fused on the input of the stacked gate|up mat-vec
      down       x += W_down swiglu(gate_up) (SwiGLU fused on the input, ACCUMULATE)

and the final norm is a plain RMSNorm of x. Every launch's params live in a slot of the
schedule's params uniform; launches of the same kind share one slot across layers (the
layers have one shape), so a decode step rewrites only the position-dependent slots
(rope_kv, attention).

A `Launch` is a kernel with its params and grid but no buffers; `Forward.launches` computes
every launch of a step from (schedule, T, start) alone, validating each shape on the host
before any GPU work (the kernels' plan_* functions raise on a bad size). The executor turns
them into recorded dispatch lists once and afterwards only refreshes params.
"""
from __future__ import annotations

import numpy as np

from ...kernels import attention, embed, gemm, logits, matvec, norm, rope_kv, swiglu
from ...kernels.kv_cache import DispatchPlan
from ...kernels.registry import KERNELS, compile_kernel
from ...webgpu.interface import BufferBinding, Dispatch
from .regions import ParamsTable, Regions, matrix, stacked, vector

POSITION_SLOTS = ("rope_kv", "attention")    # rewritten every decode step
MATRICES = ("q", "k", "v", "o", "gate", "up", "down")
TENSOR = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
          "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}


# A launch without buffers (kernel, overrides, params, grid): the kernel families' own record.
Launch = DispatchPlan


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


class Forward:
    """The step builder for one admitted session. Knows shapes, regions and kernels."""

    def __init__(self, session, model, fused: bool = True):
        self.device = session.device
        self.limits = session.device.limits
        self.plan = session.plan
        a = self.arch = model.architecture
        self.manifest = model.manifest
        self.regions = Regions(session.plan, session.buffers)
        policy = session.plan.as_dict()["policy"]
        self.capacity, self.chunk, self.top_k = (policy["context_capacity"], policy["prefill_chunk"],
                                                 policy["top_k_capacity"])
        s_align = session.plan.required_limits["minStorageBufferOffsetAlignment"]
        self.s_align = s_align
        self.f_pad = _align(a.ffn, s_align // 4)
        self.shape = attention.AttentionShape(a.n_heads, a.n_kv_heads, a.head_dim, self.capacity,
                                              session.plan.kv["dtype"])
        self.head_tensor = "token_embd" if a.tied_output else "output"
        self.embedding = embed.model_embedding(model)
        self._compiled = dict(session.kernels)      # admission's pipelines, reused
        self.labels: dict[int, str] = {}            # id(Dispatch) -> what it computes (benchmarks)
        self._layouts: dict[tuple, logits.LogitsPlan] = {}
        self.matrices = {kind: [matrix(self.regions, self.manifest, f"blk.{i}.{TENSOR[kind]}")
                                for i in range(a.n_layers)] for kind in MATRICES}
        self.head_pieces = matrix(self.regions, self.manifest, self.head_tensor)
        self.stacks = self._stacks()
        self.fused = fused and set(self.stacks) == {"qkv", "gate_up"}
        # Decode attention: one head grouping and grid for every position (those chosen for a
        # full cache), so the pipeline and the grid stay fixed and workgroups past the
        # position's chunks exit at once. Up to single_pass keys take one pass with the whole
        # context as one chunk (kernels/attention.py: the combine dispatch costs more than it
        # saves there); longer contexts take the full cache's chunk and the combine pass (the
        # "long" recording).
        widest = attention.plan_decode(self.limits, self.shape, self.capacity - 1)
        self.decode_chunk = widest.chunk
        self.single_pass = min(attention.SINGLE_PASS_MAX, attention.SCORE_WORDS // widest.chunk_pass.overrides["GW"])
        self.decode_heads = widest.chunk_pass.overrides["GW"]
        self.decode_grid = widest.chunk_pass.grid
        self.decode_combine_grid = widest.combine.grid if widest.combine else None
        self.tables = {s: ParamsTable(self.regions, s, self._slot_names(s)) for s in ("decode", "prefill")}

    def _stacks(self) -> dict[str, list]:
        """Decode multiplies a layer's q, k, v (and gate, up) as one stacked matrix when the
        planner laid their weights out back to back in every layer and their outputs are
        back to back too (q | k | v with no alignment gap; F a multiple of the alignment
        unit): 2 dispatches a layer instead of 5."""
        a = self.arch
        _, k_at, v_at = self.qkv_offsets("decode")
        outputs = {"qkv": k_at == 4 * a.n_heads * a.head_dim and v_at == k_at + 4 * a.n_kv_heads * a.head_dim,
                   "gate_up": self.f_pad == a.ffn}
        members = {"qkv": ("attn_q", "attn_k", "attn_v"), "gate_up": ("ffn_gate", "ffn_up")}
        out = {}
        for name, tensors in members.items():
            layers = [stacked(self.regions, self.manifest, [f"blk.{i}.{t}" for t in tensors]) if outputs[name] else None
                      for i in range(a.n_layers)]
            if all(layers):
                out[name] = layers
        return out

    # -- kernels ------------------------------------------------------------------------------
    async def kernel(self, name: str, overrides: dict):
        key = (name, tuple(sorted(overrides.items())))
        if key not in self._compiled:
            self._compiled[key] = await compile_kernel(self.device, name, **overrides)
        return self._compiled[key]

    # -- params ---------------------------------------------------------------------------------
    def _slot_names(self, schedule: str) -> list[str]:
        pieces = lambda kind, n: [f"{kind}#{p}" for p in range(n)]   # noqa: E731
        names = list(POSITION_SLOTS) + ["embed", "attn_norm", "attn_norm_res", "ffn_norm_res", "final_norm",
                                        "final_norm_plain", "swiglu", "argmax", "top-k", "qkv#0", "gate_up#0",
                                        "qkv_norm#0", "gate_up_norm#0"]
        for kind in MATRICES:
            names += pieces(kind, len(self.matrices[kind][0]))
        names += pieces("o_acc", len(self.matrices["o"][0])) + pieces("down_swiglu", len(self.matrices["down"][0]))
        return names + pieces("head", len(self.head_pieces))

    def position_launches(self, schedule: str, tokens: int, start: int) -> dict[str, Launch]:
        """The launches whose params depend on the position: rope_kv and attention."""
        a, limits = self.arch, self.limits
        q_at, k_at, v_at = self.qkv_offsets(schedule)
        p = rope_kv.plan_rope_kv_append(limits, self.shape.layout, tokens, a.n_heads, a.rope.rotary_dim, start,
                                        self.capacity, a.rope.convention, q_at // 4, k_at // 4, v_at // 4,
                                        self.regions[f"{schedule}.qkv"].size // 4)
        out = {"rope_kv": Launch(p.kernel, p.overrides, p.params, p.grid)}
        if schedule == "decode":
            n_keys = start + 1
            d = attention.plan_decode(limits, self.shape, start, heads_per_workgroup=self.decode_heads,
                                      chunk=n_keys if self.single_pass_at(start) else self.decode_chunk)
            out["attention"] = Launch(d.chunk_pass.kernel, d.chunk_pass.overrides, d.chunk_pass.params,
                                      self.decode_grid)
        else:
            p = attention.plan_prefill(limits, self.shape, start, tokens).dispatch
            out["attention"] = Launch(p.kernel, p.overrides, p.params, p.grid)
        return out

    def launches(self, schedule: str, tokens: int, start: int) -> dict[str, Launch]:
        """Every launch of one step of `tokens` tokens at `start` (decode: tokens == 1)."""
        a, limits = self.arch, self.limits
        out = self.position_launches(schedule, tokens, start)
        p = embed.plan_embed(limits, np.zeros(tokens, np.uint32), self.embedding)
        out["embed"] = Launch(p.kernel, p.overrides, p.params, p.grid)
        for slot, residual in (("attn_norm", False), ("attn_norm_res", True), ("ffn_norm_res", True),
                               ("final_norm", True)):
            p = norm.plan_norm(limits, tokens, a.hidden, a.norm_eps, residual=residual)
            out[slot] = Launch(p.kernel, p.overrides, p.params, p.grid)
        p = swiglu.plan_swiglu(limits, tokens, self.f_pad)
        out["swiglu"] = Launch(p.kernel, p.overrides, p.params, p.grid)
        strides = self.matrix_strides()
        for kind in MATRICES:
            x_stride, y_stride = strides[kind]
            for i, piece in enumerate(self.matrices[kind][0]):
                out[f"{kind}#{i}"] = self._matmul(schedule, piece.weights, tokens, x_stride, y_stride)
        for name, layers in self.stacks.items():
            if schedule == "decode":
                out[f"{name}#0"] = self._matmul(schedule, layers[0].weights, tokens, a.hidden, layers[0].weights.rows)
                p = matvec.plan(self.device, layers[0].weights, tokens, a.hidden, layers[0].weights.rows,
                                input="norm", eps=float(a.norm_eps), norm_elements=a.hidden)
                out[f"{name}_norm#0"] = Launch(p.kernel, p.overrides, p.params, p.grid)
        if schedule == "decode" and self.fused:
            for i, piece in enumerate(self.matrices["o"][0]):
                p = matvec.plan(self.device, piece.weights, tokens, a.n_heads * a.head_dim, a.hidden, accumulate=True)
                out[f"o_acc#{i}"] = Launch(p.kernel, p.overrides, p.params, p.grid)
            for i, piece in enumerate(self.matrices["down"][0]):
                p = matvec.plan(self.device, piece.weights, tokens, 2 * self.f_pad, a.hidden, input="swiglu",
                                accumulate=True, up_offset=self.f_pad)
                out[f"down_swiglu#{i}"] = Launch(p.kernel, p.overrides, p.params, p.grid)
            p = norm.plan_norm(limits, tokens, a.hidden, a.norm_eps, residual=False)
            out["final_norm_plain"] = Launch(p.kernel, p.overrides, p.params, p.grid)
        for i, piece in enumerate(self.head_pieces):                 # the head always sees one row
            out[f"head#{i}"] = self._matmul("decode", piece.weights, 1, a.hidden, a.vocab)
        for op, k in (("argmax", 1), ("top-k", self.top_k)):
            choice, lp = self.reduce_choice(op, k), self.result_layout(op, k)
            out[op] = Launch(choice.partial, choice.overrides, lp.params, lp.partial_grid)
        return out

    def _matmul(self, schedule: str, weights, tokens: int, x_stride: int, y_stride: int) -> Launch:
        if schedule == "decode":
            name, overrides = matvec.choose_kernel(self.device, weights)
            return Launch(name, overrides, matvec.params(weights, x_stride, y_stride),
                          matvec.grid(self.device, weights, overrides["ROWS"], tokens))
        tile = gemm.choose_tile(self.limits, self.chunk, weights.rows)   # one tile for every chunk size
        p = gemm.plan(self.limits, weights, tokens, x_stride, y_stride, tile=tile)
        return Launch(p.kernel, p.overrides, p.params, p.grid)

    def matrix_strides(self) -> dict[str, tuple[int, int]]:
        """(x_stride, y_stride) in floats of each projection's input and output rows."""
        a = self.arch
        q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        return {"q": (a.hidden, q), "k": (a.hidden, kv), "v": (a.hidden, kv), "o": (q, a.hidden),
                "gate": (a.hidden, 2 * self.f_pad), "up": (a.hidden, 2 * self.f_pad), "down": (self.f_pad, a.hidden)}

    def reduce_choice(self, op: str, k: int) -> logits.LogitsChoice:
        return logits.choose(self.device, "argmax" if op == "argmax" else "topk", k)

    def set_params(self, schedule: str, launches: dict[str, Launch]) -> None:
        table = self.tables[schedule]
        for slot, launch in launches.items():
            table.set(slot, launch.params)

    def single_pass_at(self, position: int) -> bool:
        """Whether decode attention at this position is one pass (the "short" recording)."""
        return position + 1 <= self.single_pass or self.decode_combine_grid is None

    # -- regions of a step ------------------------------------------------------------------------
    def qkv_offsets(self, schedule: str) -> tuple[int, int, int]:
        """Byte offsets of q, k and v in the qkv region (sections sized for the schedule's T)."""
        a, t = self.arch, (1 if schedule == "decode" else self.chunk)
        k_at = _align(4 * t * a.n_heads * a.head_dim, self.s_align)
        return 0, k_at, k_at + _align(4 * t * a.n_kv_heads * a.head_dim, self.s_align)

    # -- dispatch lists ---------------------------------------------------------------------------
    async def dispatch(self, launch: Launch, params: BufferBinding, inputs: list, outputs: list,
                       grid: tuple | None = None, label: str | None = None) -> Dispatch:
        """Bind in the kernel's declared order: the uniform, each read-only input, each output."""
        kernel = await self.kernel(launch.kernel, launch.overrides)
        pending = {"read-only-storage": list(inputs), "storage": list(outputs)}
        entries = [params if kind == "uniform" else pending[kind].pop(0) for kind in KERNELS[launch.kernel].bindings]
        if any(pending.values()):
            raise ValueError(f"{launch.kernel}: bindings left over {pending}")
        group = self.device.create_bind_group(kernel.bind_group_layout, entries, launch.kernel)
        dispatch = Dispatch(kernel.pipeline, [group], grid or launch.grid)
        self.labels[id(dispatch)] = label or launch.kernel
        return dispatch

    async def body(self, schedule: str, tokens: int, start: int, long_attention: bool = False,
                   final: bool = True) -> list[Dispatch]:
        """The dispatches from embed to the final norm, for a step of `tokens` tokens."""
        a, r, table = self.arch, self.regions, self.tables[schedule]
        launches = self.launches(schedule, tokens, start)
        s = lambda name: f"{schedule}.{name}"                         # noqa: E731
        q_at, k_at, v_at = self.qkv_offsets(schedule)
        qkv_out = {"q": r.bind(s("qkv"), q_at, k_at - q_at), "k": r.bind(s("qkv"), k_at, v_at - k_at),
                   "v": r.bind(s("qkv"), v_at)}
        ids = r.bind(s("token_ids"))
        x, delta = r.bind(s("x")), r.bind(s("delta"))
        out = []

        async def add(slot, inputs, outputs, grid=None):
            out.append(await self.dispatch(launches[slot], table.binding(slot), inputs, outputs, grid,
                                           label=slot.split("#")[0]))

        async def matmul(kind, layer, x_in, y_region, y_offset=0):
            for i, piece in enumerate(self.matrices[kind][layer]):
                y = r.bind(y_region, y_offset + 4 * piece.row_start) if isinstance(y_region, str) else y_region
                # mat-vec binds the weight parts first, the GEMM the activations first
                await add(f"{kind}#{i}", [*piece.parts, x_in] if schedule == "decode" else [x_in, *piece.parts], [y])

        async def attention_of(layer, caches):
            attn_out = r.bind(s("attn_out"))
            if schedule == "decode":
                scratch = [r.bind(s("attn_acc")), r.bind(s("attn_ml"))]
                await add("attention", [qkv_out["q"], *caches], [attn_out, *scratch])
                if long_attention:
                    combine = Launch(launches["attention"].kernel.replace("decode", "combine"),
                                     {k: v for k, v in launches["attention"].overrides.items() if k != "GW"},
                                     launches["attention"].params, self.decode_combine_grid)
                    out.append(await self.dispatch(combine, table.binding("attention"),
                                                   [qkv_out["q"], *caches], [attn_out, *scratch], label="combine"))
            else:
                await add("attention", [qkv_out["q"], *caches], [attn_out])
            return attn_out

        await add("embed", [ids, *(r.bind(f"w.token_embd.{p}") for p in self.embedding.part_order)], [x])
        for i in range(a.n_layers):
            b = f"blk.{i}."
            caches = [r.bind(f"kv.L{i}.k"), r.bind(f"kv.L{i}.v")]
            if schedule == "decode" and self.fused:       # 6 dispatches (module docstring)
                qkv, gate_up = self.stacks["qkv"][i], self.stacks["gate_up"][i]
                await add("qkv_norm#0", [*qkv.parts, x, vector(r, b + "attn_norm")], [r.bind(s("qkv"))])
                await add("rope_kv", [r.bind("rope_table")], [r.bind(s("qkv")), *caches])
                attn_out = await attention_of(i, caches)
                for j, piece in enumerate(self.matrices["o"][i]):
                    await add(f"o_acc#{j}", [*piece.parts, attn_out], [r.bind(s("x"), 4 * piece.row_start)])
                await add("gate_up_norm#0", [*gate_up.parts, x, vector(r, b + "ffn_norm")], [r.bind(s("gate_up"))])
                for j, piece in enumerate(self.matrices["down"][i]):
                    await add(f"down_swiglu#{j}", [*piece.parts, r.bind(s("gate_up"))],
                              [r.bind(s("x"), 4 * piece.row_start)])
                continue
            if i == 0:
                await add("attn_norm", [vector(r, b + "attn_norm"), x], [r.bind(s("attn_in"))])
            else:
                await add("attn_norm_res", [vector(r, b + "attn_norm"), delta], [r.bind(s("attn_in")), x])
            if schedule == "decode" and "qkv" in self.stacks:
                piece = self.stacks["qkv"][i]
                await add("qkv#0", [*piece.parts, r.bind(s("attn_in"))], [r.bind(s("qkv"))])
            else:
                for kind, at in (("q", q_at), ("k", k_at), ("v", v_at)):
                    await matmul(kind, i, r.bind(s("attn_in")), s("qkv"), at)
            await add("rope_kv", [r.bind("rope_table")], [r.bind(s("qkv")), *caches])
            attn_out = await attention_of(i, caches)
            await matmul("o", i, attn_out, s("delta"))
            await add("ffn_norm_res", [vector(r, b + "ffn_norm"), delta], [r.bind(s("ffn_in")), x])
            if schedule == "decode" and "gate_up" in self.stacks:
                piece = self.stacks["gate_up"][i]
                await add("gate_up#0", [*piece.parts, r.bind(s("ffn_in"))], [r.bind(s("gate_up"))])
            else:
                await matmul("gate", i, r.bind(s("ffn_in")), s("gate_up"))
                await matmul("up", i, r.bind(s("ffn_in")), s("gate_up"), 4 * self.f_pad)
            await add("swiglu", [r.bind(s("gate_up"))], [r.bind(s("ffn_act"))])
            await matmul("down", i, r.bind(s("ffn_act")), s("delta"))
        if final and schedule == "decode" and self.fused:
            await add("final_norm_plain", [vector(r, "output_norm"), x], [r.bind(s("final_in"))])
        elif final:
            await add("final_norm", [vector(r, "output_norm"), delta], [r.bind(s("final_in")), x])
        self.set_params(schedule, launches)
        return out

    async def head(self, schedule: str, row: BufferBinding, op: str, k: int) -> list[Dispatch]:
        """LM head on one row, then the reduction op ("argmax", "top-k" or "full": none)."""
        r, table = self.regions, self.tables[schedule]
        launches = self.launches(schedule, 1, 0)
        out = []
        for i, piece in enumerate(self.head_pieces):
            y = r.bind(f"{schedule}.logits", 4 * piece.row_start)
            out.append(await self.dispatch(launches[f"head#{i}"], table.binding(f"head#{i}"), [*piece.parts, row], [y],
                                           label="lm_head"))
        if op != "full":
            if k != (1 if op == "argmax" else self.top_k):
                raise ValueError(f"{op} with k={k}: the params slot holds k={self.top_k} (top-k) or 1 (argmax)")
            choice, lp = self.reduce_choice(op, k), self.result_layout(op, k)
            lg = r.bind(f"{schedule}.logits", 0, 4 * self.arch.vocab)
            partials, result = r.bind(f"{schedule}.logits_partials"), r.bind(f"{schedule}.logits_result")
            out.append(await self.dispatch(Launch(choice.partial, choice.overrides, lp.params, lp.partial_grid),
                                           table.binding(op), [lg], [partials], label=f"{op} pass 1"))
            out.append(await self.dispatch(Launch(choice.merge, choice.overrides, lp.params, lp.merge_grid),
                                           table.binding(op), [lg, partials], [result], label=f"{op} pass 2"))
        return out

    def result_layout(self, op: str, k: int) -> logits.LogitsPlan:
        """The reduction's layout, planned once per (op, k): decode reads it every token."""
        key = (op, k)
        if key not in self._layouts:
            self._layouts[key] = logits.plan(self.device, self.reduce_choice(op, k), self.arch.vocab, k)
        return self._layouts[key]
