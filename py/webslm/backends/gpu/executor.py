"""GpuBackend: the admitted session driven as the engine's backend (backends/scores.Backend).

Everything per model is done once in `build`: the kernels the forward pass needs (admission
compiled most of them), the RoPE table upload, and the decode step's dispatch lists recorded
(forward.py). Then

    decode_one(token)  one write of the position slots and the token id, one submit of the
                       recorded list, one readback of a few words (argmax, top-k) or of the
                       logits row when the sampler needs it: device.run(), one call
    greedy chaining    for an argmax readback, the steps for the next CHAIN_DEPTH positions
                       are submitted before this one's result is read, each taking its token
                       on the GPU from the argmax of the step before it (embed reads
                       decode.logits_result instead of token_ids), and the next chained step
                       is encoded while the GPU works (device.prepare). The GPU then never
                       waits for the host's round trip. A chained result is used only when
                       the engine's next token is that argmax at that position (a greedy
                       sampler's always is); otherwise it and the steps behind it are
                       forgotten: their KV rows are rewritten by the real step, queued after
                       them. Exact either way.
    prefill(ids)       chunks of at most the plan's prefill_chunk tokens, each one submit
                       with no readback; the last chunk is followed by the LM head and the
                       readback. The KV cache stays on the GPU throughout, and between
                       answers: a new turn truncate()s it to the prefix it shares and
                       prefills from there. Chunks are paced by a one-word read behind each
                       (one queued ahead of the one running), for progress and a prompt
                       cancel.

Cancellation and loss. Work is tagged with the generation epoch the engine passes in; the
backend asks `current_epoch()` (set by the engine) before encoding, before each submit and
after completion, and raises BackendCancelled instead of returning stale scores. A lost
device, an uncaptured GPU error, NaN logits or a failed readback raise BackendLost: the
engine then moves to the CPU path. Nothing here retries or restarts.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Callable

import numpy as np

from ...kernels.rope import rope_table
from ...plan.memory import uses_local_rope
from ...webgpu.interface import BufferUsage, Copy
from ..scores import BackendCancelled, BackendLost, Scores, Want
from .forward import Forward

# Greedy chaining pays when the host's round trip (submit, map, the engine's loop: ~0.3 ms
# on the H200's host) is a real part of a step; on a software adapter a step is tens of ms
# to seconds, and a chained step left behind by a stop or a cancel would make the next
# request wait that long, for nothing gained. So a step chains only while decode steps
# have averaged under this (results are identical either way).
CHAIN_MAX_STEP_S = 0.025

# How many steps are in flight behind the one being read. With one, the GPU idles whenever
# the host's turn (the map's completion reaching Python, the engine's loop, the next submit)
# outlasts a step; with two it has a whole step more to finish. Each step ahead is a KV row
# and a step of GPU time spent for nothing when a stop or a sampled token forgets it.
CHAIN_DEPTH = 2


@dataclasses.dataclass
class _Ahead:
    """A decode step submitted before the engine asked for it (greedy chaining)."""
    position: int            # the position it appends (its scores are for position + 1)
    read: tuple              # (buffer, offset, size) its result is copied to
    sequence: int            # its submission: what its scores are tagged with
    token: int | None = None # the token it was fed: the argmax of the step before, once read


class GpuBackendError(ValueError):
    """A request the model cannot serve (a token out of range, the context full)."""


class GpuBackend:
    kind = "gpu"
    RECORD_SLICE = 16       # ops recorded between two turns of the event loop (a new prefill chunk size)

    def __init__(self, session, model, forward: Forward):
        self.session, self.model, self.forward = session, model, forward
        self.device = session.device
        self.vocab = model.architecture.vocab
        self.capacity = forward.capacity
        self.top_k = forward.top_k
        self.position = 0
        self.sequence = 0                        # submissions so far (tags every result)
        self.current_epoch: Callable[[], int] | None = None
        self._errors: list = []
        self._lost = None                        # the device's lost promise, watched (_watch_lost)
        self._on_lost: Callable[[BackendLost], None] | None = None
        self._recordings: dict = {}
        self._released = False
        self._ahead: list[_Ahead] = []          # steps submitted and not yet read, in order
        self._chain_reads: list[tuple] = []     # small readback buffers, one per chained step in flight
        self.chaining = True                     # bench/engine.py --no-chain turns it off
        self.chain_depth = CHAIN_DEPTH           # bench/engine.py compares depths
        self.prepare_chained = True              # encode the next chained step ahead (bench A/B)
        self.device.on_uncaptured_error(self._errors.append)
        # Per decode step, where the time goes on the host: preparing (params, checks, the
        # writes), waiting for run() (encode + submit + GPU + readback), finishing (scores).
        self.stats = {"decode_steps": 0, "prepare_s": 0.0, "run_s": 0.0, "finish_s": 0.0,
                      "chained_steps": 0, "chain_misses": 0}

    # -- building ------------------------------------------------------------------------------
    @classmethod
    async def build(cls, session, model) -> "GpuBackend":
        """Compile what admission did not, upload the RoPE table(s), record the decode steps.
        A GPU error on the way is BackendLost("build-failed"); the session is then destroyed."""
        device = session.device
        device.push_error_scope("validation")
        try:
            forward = Forward(session, model)
            backend = cls(session, model, forward)
            backend._watch_lost()
            a = model.architecture
            tables = {"rope_table": a.rope.base}
            if uses_local_rope(a):
                tables["rope_table_local"] = a.gemma3.local_rope_base
            for name, rope_base in tables.items():
                table = rope_table(forward.capacity, a.rope.rotary_dim, rope_base, a.rope.position_offset)
                device.write_buffer(forward.regions.buffer(name), forward.regions.offset(name), table.reshape(-1))
            await backend._record_decode()
            backend._prepare_chaining()
        except Exception:
            await device.pop_error_scope()
            session.destroy()
            raise
        error = await device.pop_error_scope()
        if error is not None:
            session.destroy()
            raise BackendLost("build-failed", "gpu", f"recording the forward pass failed: {error.kind} error")
        return backend

    async def _record_decode(self) -> None:
        """The decode params' static slots written (once: a step rewrites only the positional
        ones), and the decode step recorded for each readback and attention form."""
        forward = self.forward
        forward.set_params("decode", 1, 0)
        self.device.write_buffer(*forward.tables["decode"].write())
        for op, k in (("argmax", 1), ("top-k", forward.top_k), ("full", 0)):
            await self._decode_recording(False, op, k)
            if forward.decode_combine_grid is not None:
                await self._decode_recording(True, op, k)

    # -- tuning measured after admission (AdmissionPolicy.tune_later) -----------------------------
    @property
    def tuning_deferred(self) -> bool:
        """Whether admission left mat-vec forms for retune() to measure."""
        tuning = self.session.tuning
        return tuning is not None and tuning.later is not None

    async def retune(self, cache=None, checkpoint=None):
        """Measure what admission deferred and take the measured choices: the tuning stage on
        the live session (its weights, and the decode regions: activations and params hold
        nothing between steps), the kernels they add self-tested (admission/retune.py), then
        the step lowered and recorded again. The stage's whole-step timing runs decode steps
        at the position the conversation has reached, which write that row only: the row
        the next step writes anyway. So the conversation is kept (its rows, the position, the
        engine's prompt cache), except when the cache is full: then there is no free row, and
        the cache is reset to position 0 first. Between answers only. `checkpoint` (async) may
        raise to stop the stage; the session then keeps its choices and stays deferred.
        Returns the TuningReport (its cache_entries for the caller to keep); None when nothing
        was deferred."""
        from ...admission.retune import RetuneRejected, adopt
        from . import tuning
        session, model = self.session, self.model
        if not self.tuning_deferred:
            return None
        old = dict(session.choices)
        self._ahead = []                                 # chained steps left behind: their rows are not kept
        if self.position >= self.capacity:               # a full cache has no free row for the stage
            self.reset()
        try:
            report = await tuning.tune(self.device, model, session.plan, session.buffers, cache=cache,
                                       checkpoint=checkpoint, position=self.position, kernels=session.kernels,
                                       **session.tuning.later)
            self._check_alive()
            try:
                await adopt(session, model, report)
            except RetuneRejected as rejected:      # the rule stays, for good: not measured again
                session.tuning.later = None
                report.choices, report.cache_entries = {}, {}
                report.source, report.reason = "rejected", rejected.sentence
        finally:
            self.forward.set_params("decode", 1, self.position)   # the stage's launches rewrote the params
            self.device.write_buffer(*self.forward.tables["decode"].write())
        if session.choices != old:
            self.forward, self._recordings = Forward(session, model), {}
            await self._record_decode()
        self._check_alive()
        return report

    async def _decode_recording(self, long_attention: bool, op: str, k: int):
        """The whole decode program, recorded once per (attention form, readback)."""
        key = ("decode", long_attention, op, k)
        if key not in self._recordings:
            forward = self.forward
            dispatches, copies = await forward.record("decode", list(forward.programs["decode"].ops), 1, 0,
                                                      readback=op, long_attention=long_attention)
            self._recordings[key] = self.device.record(dispatches, copies + self._readback_copies("decode", op, k))
        return self._recordings[key]

    def _prepare_chaining(self) -> None:
        """CHAIN_DEPTH + 1 readback buffers of the argmax result's size for chained steps (each
        step in flight copies its result to its own while the oldest is mapped), and a check
        of the plan: the
        step's argmax words (decode.logits_result) must stay as the step left them until the
        next step's embed reads them, so no other decode region may share their bytes."""
        regions, size = self.forward.regions, self._result_layout("argmax", 1).result_bytes
        mine = regions["decode.logits_result"]
        shared = [r.name for r in regions.plan.regions if r.name != mine.name and r.buffer == mine.buffer
                  and r.offset < mine.offset + mine.size and mine.offset < r.offset + r.size
                  and not r.name.startswith("prefill.")]
        # No chaining for a plan that reuses those bytes (never seen), nor when the host
        # gathers the embedding rows (host_embed: the token must be known on the host).
        if shared or self.forward.host_embedding is not None:
            self.chaining = False
            return
        self._chain_reads = [
            (self.device.create_buffer(size, BufferUsage.MAP_READ | BufferUsage.COPY_DST, f"chained readback {i}"), 0, size)
            for i in range(CHAIN_DEPTH + 1)]

    async def _chained_recording(self, long_attention: bool, target: int):
        """The argmax decode step whose token is the argmax the step before it left in
        decode.logits_result (word 0), its result copied to chained readback `target`."""
        key = ("decode-chained", long_attention, target)
        if key not in self._recordings:
            forward = self.forward
            ops = [_fed_from_argmax(op) for op in forward.programs["decode"].ops]
            dispatches, copies = await forward.record("decode", ops, 1, 0, readback="argmax",
                                                      long_attention=long_attention)
            r = forward.regions
            buffer, offset, size = self._chain_reads[target]
            result = Copy(r.buffer("decode.logits_result"), r.offset("decode.logits_result"), buffer, offset, size)
            self._recordings[key] = self.device.record(dispatches, copies + [result])
        return self._recordings[key]

    async def _prefill_recordings(self, tokens: int, start: int, last: bool, op: str, k: int):
        """(body, head or None) for a chunk of `tokens`; lists cached per chunk size, params
        rewritten per chunk. The body's copy of the last row runs after its dispatches."""
        forward = self.forward
        body_ops, head_ops = forward.prefill_parts(last)
        key = ("prefill", tokens, last)
        if key not in self._recordings:
            # Recording a new chunk size lowers and binds every op (~0.3 s natively, about a
            # second under Pyodide for SmolLM2): done a slice of ops at a time, with a turn of
            # the event loop between, so that a Stop is read meanwhile.
            dispatches, copies = [], []
            for begin in range(0, len(body_ops), self.RECORD_SLICE):
                d, c = await forward.record("prefill", body_ops[begin:begin + self.RECORD_SLICE], tokens, start)
                dispatches += d
                copies += c
                await asyncio.sleep(0)
            self._recordings[key] = self.device.record(dispatches, copies)
        head = None
        if last:
            head_key = ("prefill-head", op, k)
            if head_key not in self._recordings:
                dispatches, copies = await forward.record("prefill", head_ops, 1, 0, readback=op)
                self._recordings[head_key] = self.device.record(dispatches, copies + self._readback_copies("prefill", op, k))
            head = self._recordings[head_key]
        return self._recordings[key], head

    def _readback_copies(self, schedule: str, op: str, k: int) -> list[Copy]:
        r = self.forward.regions
        if op == "full":
            source, size, target = f"{schedule}.logits", 4 * self.vocab, "readback.logits"
        else:
            source, size, target = f"{schedule}.logits_result", self._result_layout(op, k).result_bytes, "readback.result"
        return [Copy(r.buffer(source), r.offset(source), r.buffer(target), r.offset(target), size)]

    # -- the backend surface ---------------------------------------------------------------------
    async def prefill(self, ids: list[int], want: Want, epoch: int = 0, progress=None) -> Scores:
        """Append ids at self.position (0 after reset(), or the prefix a new turn keeps) in
        chunks, each one submit. Behind each chunk but the last a one-word read is queued
        (_chunk_mark): it resolves when the GPU has finished that chunk, which paces the
        loop to one chunk queued ahead of the one running (no bubble, and a cancel leaves
        at most two chunks to retire) and gives progress(done, len(ids)) as chunks finish.
        The epoch is checked before every submit."""
        ids = self._checked(ids)
        self._check_epoch(epoch)
        self._ahead = []                         # chained steps left behind run first, unread
        op, k = self._op(want)
        forward = self.forward
        marks: list[tuple[int, asyncio.Future]] = []       # (ids done when it resolves, the read)
        try:
            for begin in range(0, len(ids), forward.chunk):
                chunk = ids[begin:begin + forward.chunk]
                last = begin + forward.chunk >= len(ids)
                body, head = await self._prefill_recordings(len(chunk), self.position, last, op, k)
                forward.set_params("prefill", len(chunk), self.position)
                self._check_epoch(epoch)                   # before submit
                writes = [forward.tables["prefill"].write(), *forward.input_writes("prefill", chunk)]
                await self._run(body, writes)
                self.position += len(chunk)
                if not last:
                    marks.append((begin + len(chunk), self._chunk_mark()))
                    if len(marks) > 1:                     # wait for the chunk before this one
                        done, mark = marks.pop(0)
                        await self._mark_done(mark)
                        if progress is not None:
                            progress(done, len(ids))
        finally:
            for _, mark in marks:                          # nothing outlives the call
                await self._mark_done(mark, raising=False)
        raw = await self._run(head, [], self._read(op, k))
        return self._scores(raw, op, k, epoch)

    def _chunk_mark(self) -> asyncio.Future:
        """Copy one word (the chunk's first token id) into a staging buffer of its own, in a
        submit right behind the chunk's, and start mapping it: done when the chunk is."""
        r, device = self.forward.regions, self.device
        staging = device.create_buffer(4, BufferUsage.MAP_READ | BufferUsage.COPY_DST, "prefill chunk mark")
        device.submit([], [Copy(r.buffer("prefill.token_ids"), r.offset("prefill.token_ids"), staging, 0, 4)])

        async def read():
            try:
                return await device.read_mapped(staging, 0, 4)
            finally:
                device.destroy_buffer(staging)
        return asyncio.ensure_future(read())

    async def _mark_done(self, mark: asyncio.Future, raising: bool = True) -> None:
        try:
            await mark
        except Exception as exc:
            if raising:
                await asyncio.sleep(0)                     # let the lost notification land
                self._check_alive()
                raise BackendLost("readback-failed", "gpu", f"a prefill chunk did not finish: {exc}") from exc

    async def decode_one(self, token: int, want: Want, epoch: int = 0) -> Scores:
        began = time.perf_counter()
        (token,) = self._checked([token])
        self._check_epoch(epoch)
        op, k = self._op(want)
        forward, position = self.forward, self.position
        ahead, self._ahead = self._ahead, []
        if ahead and (op != "argmax" or ahead[0].position != position or ahead[0].token != token):
            self.stats["chain_misses"] += 1      # computed for another token or readback: forgotten
            ahead = []
        chain = self._chains(op, position)
        if not ahead:                            # the step, submitted now with its token id
            forward.set_params("decode", 1, position, positional=True)
            recording = await self._decode_recording(not forward.single_pass_at(position), op, k)
            writes = [forward.tables["decode"].write(0, forward.positional_slots("decode")),
                      *forward.input_writes("decode", [token])]
            self._check_epoch(epoch)                       # before submit
            read = self._read(op, k)
            if not chain:
                submitted = time.perf_counter()
                raw = await self._run(recording, writes, read)
                return self._decoded(raw, op, k, epoch, began, submitted, self.sequence)
            await self._run(recording, writes)
            ahead = [_Ahead(position, read, self.sequence, token)]
        else:
            self.stats["chained_steps"] += 1
        if chain:                                # the next steps, before this one is read
            depth = min(self.chain_depth, len(self._chain_reads) - 1)
            while len(ahead) <= depth and ahead[-1].position + 2 <= self.capacity:
                ahead.append(await self._submit_ahead(ahead[-1].position + 1, ahead))
            await self._prepare_next_chained(ahead)
        current, self._ahead = ahead[0], ahead[1:]
        submitted = time.perf_counter()
        raw = await self._read_result(current.read)
        scores = self._decoded(raw, op, k, epoch, began, submitted, current.sequence)
        if self._ahead:
            self._ahead[0].token = int(scores.ids[0])
        return scores

    def _chains(self, op: str, position: int) -> bool:
        """Whether steps after the one at `position` are submitted before its result is read."""
        stats = self.stats
        fast = stats["decode_steps"] > 0 and (stats["prepare_s"] + stats["run_s"]) < CHAIN_MAX_STEP_S * stats["decode_steps"]
        return (self.chaining and op == "argmax" and bool(self._chain_reads) and fast
                and position + 2 <= self.capacity)

    def _free_chain_read(self, busy: list[_Ahead]) -> int:
        """A chained readback buffer no step in `busy` copies its result to."""
        taken = {id(a.read[0]) for a in busy}
        return next(i for i, read in enumerate(self._chain_reads) if id(read[0]) not in taken)

    async def _submit_ahead(self, position: int, busy: list[_Ahead]) -> _Ahead:
        """Submit the chained step at `position` into a readback buffer no step in `busy` uses."""
        forward = self.forward
        target = self._free_chain_read(busy)
        recording = await self._chained_recording(not forward.single_pass_at(position), target)
        forward.set_params("decode", 1, position, positional=True)
        await self._run(recording, [forward.tables["decode"].write(0, forward.positional_slots("decode"))])
        return _Ahead(position, self._chain_reads[target], self.sequence)

    async def _prepare_next_chained(self, ahead: list[_Ahead]) -> None:
        """Let the device encode the chained step the next call will submit (the one after
        `ahead`, into the buffer ahead[0] frees), while the GPU runs what is queued: its
        encoding (~3 us a dispatch natively) then stays off the host's turn between steps."""
        position = ahead[-1].position + 1
        if not self.prepare_chained or position + 2 > self.capacity:
            return
        target = self._free_chain_read(ahead[1:])
        self.device.prepare(await self._chained_recording(not self.forward.single_pass_at(position), target))

    async def _read_result(self, read: tuple) -> bytes:
        """The result of a step submitted earlier (a chained one), mapped and read."""
        try:
            raw = await self.device.read_mapped(*read)
        except Exception as exc:
            raise await self._step_failed(exc) from exc
        await asyncio.sleep(0)
        self._check_alive()
        return raw

    def _decoded(self, raw: bytes, op: str, k: int, epoch: int, began: float, submitted: float,
                  sequence: int) -> Scores:
        """The scores of the decode step just read (submission `sequence`); its time in the stats."""
        finished = time.perf_counter()
        self.position += 1
        scores = self._scores(raw, op, k, epoch, sequence)
        stats = self.stats
        stats["decode_steps"] += 1
        stats["prepare_s"] += submitted - began
        stats["run_s"] += finished - submitted
        stats["finish_s"] += time.perf_counter() - finished
        return scores

    async def rebuild(self, ids: list[int], want: Want, epoch: int = 0) -> Scores:
        self._checked(ids)
        self.reset()
        return await self.prefill(ids, want, epoch)

    def reset(self) -> None:
        self.position = 0       # the cache rows past the position are never read
        self._ahead = []        # chained steps' rows too: they run first, then are overwritten

    def truncate(self, position: int) -> None:
        """Keep the first `position` positions of the cache (a new turn's shared prefix)."""
        if not 0 <= position <= self.position:
            raise GpuBackendError(f"cannot keep {position} positions of a cache that holds {self.position}")
        self.position = position
        self._ahead = []

    def release(self) -> None:
        """Destroy every buffer and the device (idempotent)."""
        if self._released:
            return
        self._released = True
        self._recordings.clear()
        self._ahead = []
        if self._lost is not None and not self._lost.done():
            self._lost.cancel()
        self.session.destroy()

    # -- helpers -----------------------------------------------------------------------------------
    def _result_layout(self, op: str, k: int):
        return self.forward.lowering.reduce_layout(op, k)[1]

    def _op(self, want: Want) -> tuple[str, int]:
        if want.kind == "argmax":
            return "argmax", 1
        if want.kind == "top-k":
            if want.k > self.top_k:
                return "full", 0
            return "top-k", self.top_k          # the canonical top-K contains any smaller one
        return "full", 0

    def _read(self, op: str, k: int) -> tuple:
        r = self.forward.regions
        name = "readback.logits" if op == "full" else "readback.result"
        size = 4 * self.vocab if op == "full" else self._result_layout(op, k).result_bytes
        return r.buffer(name), r.offset(name), size

    def _checked(self, ids) -> list[int]:
        if self._released:
            raise GpuBackendError("the GPU backend was released")
        ids = [int(t) for t in ids]
        if not ids:
            raise GpuBackendError("at least one token is needed")
        if any(not 0 <= t < self.vocab for t in ids):
            raise GpuBackendError(f"token id out of range [0, {self.vocab})")
        if self.position + len(ids) > self.capacity:
            # The plan's KV capacity (default min(context_length, 2048)) is smaller than the
            # model's context: the answer goes on, on the CPU path, which replays it whole.
            raise BackendLost("context-full", "kv", f"position {self.position + len(ids) - 1} is past the "
                                                    f"GPU's KV capacity {self.capacity}")
        return ids

    def _check_epoch(self, epoch: int) -> None:
        if self.current_epoch is not None and epoch != self.current_epoch():
            raise BackendCancelled("stale-epoch", "epoch", f"generation {epoch} was cancelled")
        self._check_alive()

    def _watch_lost(self) -> None:
        """A task resolved by the device's lost promise. A caller that runs each call in its
        own event loop (asyncio.run per call) cancels it when that loop closes: watch again."""
        if self._lost is None or self._lost.cancelled():
            self._lost = asyncio.ensure_future(self.device.lost())
            self._lost.add_done_callback(self._lost_resolved)

    def on_lost(self, callback: Callable[[BackendLost], None]) -> None:
        """callback(BackendLost) once the device is lost while this executor holds it, even
        with no call in progress (the engine then leaves a GPU it is not using). Not called
        for release(): the executor's own teardown is no loss."""
        self._on_lost = callback
        self._watch_lost()

    def _lost_resolved(self, task: asyncio.Future) -> None:
        if task.cancelled() or self._released:
            return
        if self._on_lost is not None:
            self._on_lost(BackendLost("device-lost", "gpu", "the GPU device was lost"))

    def lost_now(self) -> BackendLost | None:
        """The loss _check_alive would raise (the device lost, or an uncaptured GPU error),
        without raising and without needing an event loop; None while the device serves."""
        return None if self._released else self._loss()

    def _loss(self) -> BackendLost | None:
        if self._lost is not None and self._lost.done() and not self._lost.cancelled():
            return BackendLost("device-lost", "gpu", "the GPU device was lost")
        if self._errors:
            error = self._errors[0]
            return BackendLost("gpu-error", "gpu", f"the GPU reported a {error.kind} error: {error.message[:300]}")
        return None

    def _check_alive(self) -> None:
        self._watch_lost()
        lost = self._loss()
        if lost is not None:
            raise lost

    async def _run(self, recording, writes, read=None):
        self.sequence += 1
        try:
            raw = await self.device.run(recording, writes, read)
        except Exception as exc:
            raise await self._step_failed(exc) from exc
        if read is not None:
            await asyncio.sleep(0)
        self._check_alive()
        return raw

    async def _step_failed(self, exc: Exception) -> BackendLost:
        """A submit or readback raised: the device's loss if it is lost (raised here), else
        readback-failed (returned, for the caller to raise)."""
        await asyncio.sleep(0)                    # let the lost notification land
        self._check_alive()
        return BackendLost("readback-failed", "gpu", f"the GPU step failed: {exc}")

    def _scores(self, raw: bytes, op: str, k: int, epoch: int, sequence: int | None = None) -> Scores:
        """Scores of a step's readback; tagged with its submission (`sequence`, default the last)."""
        sequence = self.sequence if sequence is None else sequence
        if self.current_epoch is not None and epoch != self.current_epoch():
            raise BackendCancelled("stale-epoch", "epoch", f"generation {epoch} was cancelled")   # after completion
        if op == "full":
            logits = np.frombuffer(raw, np.float32, self.vocab).copy()
            if not np.isfinite(logits).all():
                raise BackendLost("gpu-error", "logits", "the GPU produced non-finite logits")
            return Scores(self.position, epoch, sequence, logits=logits)
        result = self._result_layout(op, k).decode(np.frombuffer(raw, np.uint32))
        if result.nan_count:
            raise BackendLost("gpu-error", "logits", f"the GPU produced {result.nan_count} NaN logits")
        return Scores(self.position, epoch, sequence, ids=result.indices, values=result.values.copy())


def _fed_from_argmax(op):
    """op reading its token id from the previous step's argmax (word 0 of logits_result)."""
    if not any(ref == "token_ids" for _, ref in op.reads):
        return op
    reads = tuple((role, "logits_result" if ref == "token_ids" else ref) for role, ref in op.reads)
    return dataclasses.replace(op, reads=reads)
