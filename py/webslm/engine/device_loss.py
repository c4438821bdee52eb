"""Engine's side of a lost GPU: where the loss is seen, and how an answer goes on without it.

A loss is seen three ways: a step raises BackendLost (_fail_over: the answer goes on on the
CPU path), the device's lost promise resolves while the engine is idle (_gpu_died), or an
answer ends while the device is already gone (_dead_gpu, asked by _settle_after: never
GPUReady on a dead device). Going on means rebuilding the CPU path from the ledger (the
prompt and the committed ids) and proving the rebuilt sampler is the one the loop holds
(_restored_sampler), so the answer continues exactly where it was. A mixin of Engine: it
uses the engine's state machine, its ledger, its backends and _submit.
"""
from __future__ import annotations

from ..answer import Answer
from ..backends.scores import BackendCancelled, BackendLost, Scores, Want
from ..errors import CodedError
from ..semantic.sampler import Sampler
from .errors import EngineError
from .states import State as S


class DeviceLoss:
    def _dead_gpu(self) -> BackendLost | None:
        """The loss of the GPU the engine still holds, if it is known: seen by a step that
        retired unseen (abandoned by a cancel), or reported by the device now."""
        if self._gpu is None:
            return None
        if self._gpu_loss is not None:
            return self._gpu_loss
        return self._gpu.lost_now() if hasattr(self._gpu, "lost_now") else None

    def _gpu_died(self, gpu, lost: BackendLost) -> None:
        """The executor's device was lost (its lost promise resolved). While an answer runs
        on it, its next step raises and the answer goes on on the CPU path, or the answer's
        end settles it (_settle_after); while idle the engine leaves it now."""
        if self._gpu is gpu and self.state is S.GPU_READY:
            self._leave_dead_gpu(lost, "the device died between generations")

    def _leave_dead_gpu(self, lost: BackendLost, reason: str) -> None:
        """Lost -> CPUReady with no answer to continue: the GPU released, the CPU path built."""
        self._go(S.LOST, reason, code=lost.code, sentence=lost.sentence)
        self._release_gpu(lost.code)
        self._cpu()
        self._go(S.CPU_READY, "lost with no generation to continue")

    async def _fail_over(self, run: Answer, lost: BackendLost, want: Want) -> Scores | None:
        """The GPU is gone: release it, and unless the answer was cancelled meanwhile, rebuild
        the CPU path from the ledger and return the scores for the next position."""
        self._go(S.LOST, "device.lost or fatal GPU error", code=lost.code, sentence=lost.sentence)
        self._release_gpu(lost.code)
        if not run.current:
            self._go(S.CPU_READY, "lost with no generation to continue")
            return None
        self._go(S.CPU_REBUILD, "committed tokens and sampler state are intact")
        try:
            run.sampler = self._restored_sampler(run)
            replay = self.ledger.replay()
            self._backend = self._cpu()
            scores = await self._submit("rebuild", list(replay.prompt_ids + replay.committed_ids),
                                        want, run.epoch)
        except BackendCancelled:
            if run.current:
                raise
            self._go(S.CANCEL_PENDING, "cancelled while replaying")
            self._settle_after("abort")
            return None
        except Exception as exc:
            code = exc.code if isinstance(exc, CodedError) else "internal-error"
            self._go(S.VISIBLE_FAILURE, "exact continuation cannot be established", code=code,
                     sentence=getattr(exc, "sentence", str(exc)))
            raise
        self._go(S.CPU_GENERATING, "deterministic replay succeeds", position=replay.next_position)
        if run.finish_reason is not None:    # cancelled while rebuilding (by an event handler)
            self._settle_after(run.finish_reason)
        return scores

    def _restored_sampler(self, run: Answer) -> Sampler:
        """A sampler rebuilt from the settings and the ledger alone, proven to be the one the
        loop holds: its state hash equals the one the ledger recorded with the last commit."""
        replay = self.ledger.replay()
        restored = Sampler(run.settings, run.sampler.vocab_size,
                           history=replay.prompt_ids + replay.committed_ids,
                           position=replay.next_position)
        recorded = replay.sampler_state_hash or restored.state_hash()   # None: nothing committed
        same_answer = replay.generation_epoch == run.epoch and replay.prompt_ids == tuple(run.prompt_ids)
        same_state = restored.state_hash() == recorded and run.sampler.state_hash() == recorded
        if not (same_answer and same_state):
            raise EngineError("replay-mismatch", "ledger.replay()",
                              "the sampler state after the committed tokens does not match the "
                              "ledger's record; the answer cannot be continued exactly")
        return restored
