"""The step program recorded as GPU dispatches over the plan's regions.

The program (program/ops.py, fused by program/fusion.py) says what a step computes, op by op,
over named refs; lowering (program/lowering.py) turns each op into kernel launches with their
bindings by name; this module resolves those names to ranges of the session's buffers
(`resolve`) and makes the bind groups and dispatches. Nothing here decides what runs.

Params: ops of one slot (program/ops.py Op.slot: the label, or the label and the weight's form
or attention's window where layers differ) share one slot of the schedule's params uniform
across layers; the position-dependent slots (RoPE + KV append, attention) come first,
so a decode step rewrites only them (`set_params(..., positional=True)`).
"""
from __future__ import annotations

import numpy as np

from ...kernels.registry import KERNELS, compile_kernel
from ...plan.memory import plan_programs
from ...program.lowering import Binding, Launch, Lowering, part_names, weight_of
from ...program.ops import NO_DISPATCH, Op, base, is_activation
from ...webgpu.interface import BufferBinding, Copy, Dispatch
from .host_embedding import HostEmbedding
from .regions import ParamsTable, Regions, stacked


class Forward:
    """The recorder for one admitted session: its programs, lowering, regions and pipelines."""

    def __init__(self, session, model):
        self.device = session.device
        self.plan = session.plan
        self.arch = model.architecture
        self.manifest = model.manifest
        self.regions = Regions(session.plan, session.buffers)
        self.lowering = lowering = Lowering(self.device, model, session.plan, getattr(session, "choices", None))
        self.programs = plan_programs(model, session.plan)
        self.capacity, self.chunk, self.top_k = lowering.capacity, lowering.chunk, lowering.top_k
        self.tables = {s: ParamsTable(self.regions, s, p.slots()) for s, p in self.programs.items()}
        # The first op of each slot, positional ones first: all a params refresh needs to lower.
        self._slot_ops = {s: sorted({op.slot: op for op in reversed(p.ops) if op.kind not in NO_DISPATCH}.values(),
                                    key=lambda op: not op.positional) for s, p in self.programs.items()}
        self._positional = {s: sum(1 for op in ops if op.positional) for s, ops in self._slot_ops.items()}
        self._compiled = dict(session.kernels)      # admission's pipelines, reused
        # A split table's rows come from the host (program/ops.py "host_embed").
        self.host_embedding = (HostEmbedding(model) if any(op.kind == "host_embed" for op in self.programs["decode"].ops)
                               else None)
        self.labels: dict[int, str] = {}            # id(Dispatch) -> what it computes (benchmarks)

    def positional_slots(self, schedule: str) -> int:
        """How many slots, from the first, a step rewrites when only the position changed."""
        return self._positional[schedule]

    def single_pass_at(self, position: int) -> bool:
        return self.lowering.single_pass_at(position)

    @property
    def decode_combine_grid(self):
        return self.lowering.decode_combine_grid

    # -- kernels and params ---------------------------------------------------------------------
    async def kernel(self, name: str, overrides: dict):
        key = (name, tuple(sorted(overrides.items())))
        if key not in self._compiled:
            self._compiled[key] = await compile_kernel(self.device, name, **overrides)
        return self._compiled[key]

    @staticmethod
    def slot(op: Op, readback: str) -> str:
        return f"reduce:{readback}" if op.kind == "reduce" else op.slot

    def set_params(self, schedule: str, tokens: int, start: int, positional: bool = False) -> None:
        """Write every slot of the schedule's params (or only the position-dependent ones) for a
        step of `tokens` tokens at `start`, into the host copy (ParamsTable.write uploads it)."""
        table, done = self.tables[schedule], set()
        if positional and schedule == "decode":       # every token: a few words, no planning
            for op in self._slot_ops[schedule][:self._positional[schedule]]:
                table.set(op.slot, self.lowering.decode_params(op, start))
            return
        for op in self._slot_ops[schedule]:
            if positional and not op.positional:
                continue
            for readback in (("argmax", "top-k") if op.kind == "reduce" else ("argmax",)):
                slot = self.slot(op, readback)
                if slot not in done:
                    done.add(slot)
                    table.set(slot, self.lowering.lower(op, schedule, tokens, start, readback)[0].params)

    # -- refs -> buffer ranges ------------------------------------------------------------------
    def resolve(self, schedule: str, binding: Binding) -> BufferBinding:
        """The buffer range a binding names: a weight part (of a row piece, or of a stacked
        group), a norm vector, a layer's cache, the RoPE table, or (a section of) an activation."""
        r, ref = self.regions, binding.ref
        if ref.startswith("w:"):
            tensors = ref[2:].split("+")
            if len(tensors) > 1:
                weights, _ = weight_of(self.manifest, self.plan.splits, ref)
                group = stacked(r, self.manifest, tensors)
                if group is None:
                    raise ValueError(f"{ref}: the plan did not lay these tensors out back to back")
                return group.parts[part_names(weights).index(binding.part)]
            return r.bind(f"w.{tensors[0]}.{binding.part}{self._piece_suffix(tensors[0], binding.piece)}")
        if ref.startswith("v:"):
            return r.bind(f"w.{ref[2:]}.data")
        if ref.startswith("kv:"):
            return r.bind(f"kv.{ref[3:]}")
        if not is_activation(ref):
            return r.bind(ref)
        offset, size = self.lowering.section(schedule, ref)
        offset += binding.offset
        if binding.size is not None:
            size = binding.size
        elif size is not None:
            size -= binding.offset
        return r.bind(f"{schedule}.{base(ref)}", offset, size)

    def _piece_suffix(self, tensor: str, piece: int | None) -> str:
        split = next((s for s in self.plan.splits if s["tensor"] == tensor), None)
        if split is None:
            return ""
        a = (piece or 0) * split["rows_per_piece"]
        return f"[{a}:{min(a + split['rows_per_piece'], split['rows'])}]"

    # -- recording --------------------------------------------------------------------------------
    async def dispatch(self, schedule: str, launch: Launch, params: BufferBinding) -> Dispatch:
        """Bind in the kernel's declared order: the uniform, each read-only input, each output."""
        kernel = await self.kernel(launch.kernel, launch.overrides)
        pending = {"read-only-storage": [self.resolve(schedule, b) for b in launch.inputs],
                   "storage": [self.resolve(schedule, b) for b in launch.outputs]}
        entries = [params if kind == "uniform" else pending[kind].pop(0) for kind in KERNELS[launch.kernel].bindings]
        if any(pending.values()):
            raise ValueError(f"{launch.kernel}: bindings left over {pending}")
        group = self.device.create_bind_group(kernel.bind_group_layout, entries, launch.kernel)
        dispatch = Dispatch(kernel.pipeline, [group], launch.grid)
        self.labels[id(dispatch)] = launch.label
        return dispatch

    async def record(self, schedule: str, ops: list[Op], tokens: int, start: int, readback: str = "argmax",
                     long_attention: bool = False) -> tuple[list[Dispatch], list[Copy]]:
        """The dispatches of `ops` (and the copies, which run after them in the same submit)."""
        table = self.tables[schedule]
        copies = [self._copy(schedule, op, tokens) for op in ops if op.kind == "copy"]
        dispatches = [await self.dispatch(schedule, launch, table.binding(self.slot(op, readback)))
                      for op, launch in self.lowering.lower_ops(ops, schedule, tokens, start, readback,
                                                                long_attention)]
        return dispatches, copies

    def _copy(self, schedule: str, op: Op, tokens: int) -> Copy:
        """last_row = final_in[tokens - 1]: the head multiplies the chunk's last row."""
        row_bytes = 4 * self.arch.hidden
        src = self.resolve(schedule, Binding("src", op.read("src"), offset=(tokens - 1) * row_bytes, size=row_bytes))
        dst = self.resolve(schedule, Binding("dst", op.write("dst"), size=row_bytes))
        return Copy(src.buffer, src.offset, dst.buffer, dst.offset, row_bytes)

    def input_writes(self, schedule: str, ids) -> list[tuple]:
        """The writes that give a step its input: the token ids, and for a host_embed program
        the embedding rows into x (device.run's (buffer, offset, data) writes)."""
        r = self.regions
        writes = [(r.buffer(f"{schedule}.token_ids"), r.offset(f"{schedule}.token_ids"), np.asarray(ids, np.uint32))]
        if self.host_embedding is not None:
            rows = self.host_embedding.rows_of(ids)
            writes.append((r.buffer(f"{schedule}.x"), r.offset(f"{schedule}.x"), rows.reshape(-1)))
        return writes

    def prefill_parts(self, last: bool) -> tuple[list[Op], list[Op]]:
        """(body, head) ops of a prefill chunk: the layers (and, for the last chunk, the final
        norm and the copy of its last row), then the head and the reduction."""
        program = self.programs["prefill"]
        layers = program.before + [op for i in range(program.n_layers) for op in program.layer(i)]
        if not last:
            return layers, []
        after = program.after
        cut = next(i for i, op in enumerate(after) if op.kind == "copy") + 1
        return layers + after[:cut], after[cut:]
