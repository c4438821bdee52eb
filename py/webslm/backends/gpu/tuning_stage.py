"""The tuning stage's instrument (tuning.py): one admitted model's decode program, lowered
with the choices being tried, on the plan's own regions, and the GPU time of its launches.

A Stage owns a Forward over the session's buffers (the weights, the decode regions and the
params table: nothing in them is live between steps) and times launches as the engine runs
them: dependent dispatches cycling through a form's layers' own weights, less the round trip of
an empty submit and its read. Its whole-step timing runs decode steps at `position`, which
write that row of every layer's KV cache (tune(position=): 0 at admission, the conversation's
first free row in a retune); so does a q|k|v mat-vec with RoPE (rope-kv-into-matmul) timed as
a form, which every launch here lowers at `position` too. `checkpoint` (async, may raise) is
where a retune is stopped.
"""
from __future__ import annotations

import statistics
import types

import numpy as np

from ...kernels import attention_xq, matvec
from ...kernels.registry import KERNELS
from ...program.lowering import Binding
from ...webgpu.interface import BufferBinding, BufferUsage, Dispatch
from . import timing
from .forward import Forward

ROUND_SECONDS = 1e-3           # GPU time per timed round (many dispatches)
ROUNDS = 3                     # timed rounds per launch shape; the median is kept
TRIP_SHARE_KEPT = 0.1          # a round less its round trip is never taken below this share of it (noise)
MAX_REPEAT = 64                # the most copies of a form's dispatches one timed round holds


SCRATCH_USAGE = BufferUsage.STORAGE | BufferUsage.COPY_SRC | BufferUsage.COPY_DST


class Stage:
    def __init__(self, device, model, plan, buffers, checkpoint, clock, position: int = 0, kernels=None):
        session = types.SimpleNamespace(device=device, plan=plan, buffers=buffers, kernels=dict(kernels or {}))
        self.device, self.clock, self.checkpoint = device, clock, checkpoint
        self.position = position                          # the cache row a whole step writes (tune())
        self.forward = Forward(session, model)
        self.lowering = self.forward.lowering
        self.rng = np.random.default_rng(16)
        self.scratch = None                               # (buffer, bytes): the check's output
        self.settles: list[tuple] = []                    # settle(): (seconds, first round, last round, trip)
        self.looks: list[float] = []                      # looks_slow's looks (seconds a dispatch)
        self.trip = 0.0                                   # the round trip timed rounds subtract (settle)
        self.forward.set_params("decode", 1, position)    # a q|k|v with RoPE writes that cache row
        device.write_buffer(*self.forward.tables["decode"].write())

    async def checkpoint_now(self) -> None:
        """Where tune()'s `checkpoint` may stop the stage (a retune an answer is waiting for):
        before each compile, after each shape is timed, before each round of the runoffs and
        of the step check. So an answer waits at most one timed round (~ROUND_SECONDS of GPU
        time a round on a fast GPU), not a whole burst of every form's shapes."""
        if self.checkpoint is not None:
            await self.checkpoint()

    def forms(self) -> dict[str, list]:
        """form key -> the decode program's matmul ops of that form, in program order."""
        out: dict[str, list] = {}
        for op in self.forward.programs["decode"].ops:
            if op.kind == "matmul":
                out.setdefault(self.lowering.matvec_form(op)[0], []).append(op)
        return out

    def _bind(self, role: str, ref: str):
        return self.forward.resolve("decode", Binding(role, ref))

    def fill_inputs(self, ops, seed: int | None = None) -> None:
        """Random activations where the form's ops read (never zeros: a broken launch that
        skipped work would otherwise agree with the rule); with a seed, the same values each
        time."""
        rng = self.rng if seed is None else np.random.default_rng([16, seed])
        for ref in sorted({op.read("x") for op in ops}):
            binding = self._bind("x", ref)
            self.device.write_buffer(binding.buffer, binding.offset,
                                     rng.standard_normal(binding.size // 4).astype(np.float32))

    async def launches(self, ops, choice: matvec.Choice | None) -> list:
        key = self.lowering.matvec_form(ops[0])[0]
        if choice is None:
            self.lowering.choices.pop(key, None)
        else:
            self.lowering.choices[key] = choice
        self._write_params(ops)
        dispatches, _ = await self.forward.record("decode", ops, 1, self.position)
        return dispatches

    def _write_params(self, ops) -> None:
        """The ops' params slots as the lowering now says: a choice may change them (a q8
        mat-vec on pre-quantized activations counts its units in 32s, not 16s)."""
        table = self.forward.tables["decode"]
        for op in ops:
            table.set(self.forward.slot(op, "argmax"), self.lowering.lower(op, "decode", 1, self.position)[0].params)
        self.device.write_buffer(*table.write())

    async def output(self, ops) -> np.ndarray:
        """y of the form's first op, launched as the lowering now says (a pre-quantized choice:
        its quantizer, then the mat-vec), the mat-vec's output redirected into a scratch buffer
        that starts as a fixed y0 (ACCUMULATE adds to it; rows a launch skips keep it): the
        plan's own output may not be writable from the host (the logits are not)."""
        launches = self.lowering.lower(ops[0], "decode", 1, self.position)
        self._write_params(ops[:1])
        y = self._bind("y", ops[0].write("y"))
        if self.scratch is None or self.scratch[1] < y.size:
            self.release()
            self.scratch = (self.device.create_buffer(y.size, SCRATCH_USAGE, "tuning.y"), y.size)
        scratch = self.scratch[0]
        self.device.write_buffer(scratch, 0, np.linspace(-1.0, 1.0, y.size // 4, dtype=np.float32))
        params = self.forward.tables["decode"].binding(self.forward.slot(ops[0], "argmax"))
        dispatches = []
        for i, launch in enumerate(launches):
            kernel = await self.forward.kernel(launch.kernel, launch.overrides)
            outputs = [self.forward.resolve("decode", b) for b in launch.outputs]
            if i == len(launches) - 1:       # y (a q|k|v with RoPE also writes the stage's cache row)
                outputs[0] = BufferBinding(scratch, 0, y.size)
            pending = {"read-only-storage": [self.forward.resolve("decode", b) for b in launch.inputs],
                       "storage": outputs}
            entries = [params if kind == "uniform" else pending[kind].pop(0) for kind in KERNELS[launch.kernel].bindings]
            group = self.device.create_bind_group(kernel.bind_group_layout, entries, "tuning check")
            dispatches.append(Dispatch(kernel.pipeline, [group], launch.grid))
        self.device.submit(dispatches)
        return np.frombuffer(await self.device.read_buffer(scratch, 0, y.size), np.float32).copy()

    def release(self) -> None:
        if self.scratch is not None:
            self.device.destroy_buffer(self.scratch[0])
            self.scratch = None

    async def seconds_per_step(self, choices: dict) -> float:
        """GPU seconds of one whole decode step at the stage's position (every op of the
        program; it writes that row of the KV cache) with `choices` as the mat-vecs' launches:
        one timed round."""
        await self.checkpoint_now()
        ops = self.forward.programs["decode"].ops
        matmuls = [op for op in ops if op.kind == "matmul"]
        self.lowering.choices.clear()
        self.lowering.choices.update(choices)
        self._write_params(matmuls)
        dispatches, _ = await self.forward.record("decode", ops, 1, self.position,
                                                  long_attention=not self.forward.single_pass_at(self.position))
        try:
            return await self.seconds_per_op(matmuls[:1], dispatches, rounds=1)   # one "op": the step
        finally:
            self.lowering.choices.clear()

    def output_form(self) -> str | None:
        """The cache's form for whether decode attention quantizes for o (attention_xq.CHOICE):
        a step's choice, so keyed by the model's shape; None where the program marks no attention."""
        if not any(op.option("quantize_out") for op in self.forward.programs["decode"].ops):
            return None
        a, shape = self.forward.arch, self.lowering.shape
        return (f"{attention_xq.CHOICE} {shape.n_heads}/{shape.n_kv_heads}x{shape.head_dim} {shape.dtype}, "
                f"{a.n_layers} layers of {a.hidden}")

    def quantizes_outputs(self, choices: dict) -> bool:
        """Whether the stage's decode step with `choices` has a launch quantize another op's
        input: decode attention for o (lowering.output_quantizer; never past the single-pass
        length) or a mat-vec for the mat-vecs reading its output
        (lowering.matmul_output_quantizer)."""
        saved = dict(self.lowering.choices)
        self.lowering.choices.clear()
        self.lowering.choices.update(choices)
        ops = self.forward.programs["decode"].ops
        try:
            return (any(self.lowering.matmul_output_quantizer(op) is not None for op in ops if op.kind == "matmul")
                    or (self.forward.single_pass_at(self.position)
                        and any(self.lowering.output_quantizer(op) is not None for op in ops if op.kind == "attention")))
        finally:
            self.lowering.choices.clear()
            self.lowering.choices.update(saved)

    async def settle(self, ops, choice: matvec.Choice | None = None) -> None:
        """Run `ops` (at `choice`) until the GPU's clocks settle (timing.settle): an idle GPU
        runs slow, and the stage leaves it idle while it compiles; then measure the round trip
        the timed rounds subtract (timing.round_trip). Records (seconds spent, first round,
        last round, round trip) in `settles`."""
        dispatches = await self.launches(ops, choice)
        settled = await timing.settle(lambda: self.seconds_per_op(ops, dispatches, rounds=1), self.clock)
        await self.measure_trip(ops)
        self.settles.append((*settled, self.trip))

    async def measure_trip(self, ops) -> None:
        """The round trip the timed rounds of `ops` subtract (timing.round_trip on their output)."""
        self.trip = await timing.round_trip(self.device, self._sync(ops), self.clock)

    def _sync(self, ops) -> tuple:
        y = self._bind("y", ops[0].write("y"))
        return y.buffer, y.offset, 4

    async def seconds_per_op(self, ops, dispatches, rounds: int = ROUNDS) -> float:
        """GPU seconds per op of the form (its dispatches: one, or a pre-quantized choice's two),
        dependent as in a step; the median of `rounds` rounds of >= ROUND_SECONDS, each less
        the round trip measured at the last settle (`trip`; 0 before the first)."""
        sync = self._sync(ops)
        per_op = max(1, len(dispatches) // len(ops))

        async def timed(batch) -> float:
            await self.device.read_buffer(*sync)          # the queue is idle before the clock starts
            self.device.submit(batch)
            started = self.clock()                        # encoding is done: the GPU has the work
            await self.device.read_buffer(*sync)
            elapsed = self.clock() - started
            return max(elapsed - self.trip, TRIP_SHARE_KEPT * elapsed) / (len(batch) // per_op)

        first = await timed(dispatches)                   # also the warm-up
        if rounds == 0:
            return first
        repeat = min(MAX_REPEAT, max(1, int(ROUND_SECONDS / (first * len(dispatches) / per_op))))
        batch = dispatches * repeat
        return statistics.median([await timed(batch) for _ in range(rounds)])
