"""The engine's states and the only transitions between them.

This is the device-loss and fallback state machine of the design report
(../shared/seeds/webgpu-backend-design-report.txt, "Device-loss and fallback state machine"),
written as a table so that a transition the report does not allow is a typed error instead
of a silent inconsistency. Every transition is also an event the page can show.

The report's diagram starts in CPUReady and only covers the GPU's life. An engine also has
a life before the model is loaded and a CPU-only life, so the table adds (marked "added"):

    Empty            no model loaded yet, or unloaded (the initial and the final state)
    Empty -> CPUReady, Empty -> Probing              load() without / with a GPU
    CPUReady -> CPUGenerating                        generating on the CPU path
    CPUGenerating -> CancelPending -> CPUReady       cancelling on the CPU path
    CancelPending -> Lost, GPUReady -> Lost          the device died while nothing has to continue
    CPURebuild -> CancelPending                      the answer was cancelled while the CPU replayed it
    Lost -> CPUReady                                 ... so there is nothing to rebuild
    Generating -> GPUReady, CPUGenerating -> CPUReady   also when a generation ends in an error
    CPUReady / VisibleFailure -> Destroying, Destroying -> Empty    unload()
"""
from __future__ import annotations

import enum
from typing import Callable

from ..errors import CodedError


class State(str, enum.Enum):
    EMPTY = "Empty"
    CPU_READY = "CPUReady"
    PROBING = "Probing"
    PREPARING = "Preparing"
    GPU_READY = "GPUReady"
    GENERATING = "Generating"
    CANCEL_PENDING = "CancelPending"
    LOST = "Lost"
    CPU_REBUILD = "CPURebuild"
    CPU_GENERATING = "CPUGenerating"
    VISIBLE_FAILURE = "VisibleFailure"
    DESTROYING = "Destroying"

    def __str__(self) -> str:
        return self.value


S = State

# (from, to) -> when it happens. The report's transitions first, then the added ones.
TRANSITIONS: dict[tuple[State, State], str] = {
    (S.CPU_READY, S.PROBING): "user enables GPU or model requests it",
    (S.PROBING, S.PREPARING): "adapter/device admitted",
    (S.PROBING, S.CPU_READY): "admission failure",
    (S.PREPARING, S.GPU_READY): "all allocations, pipelines, tests pass",
    (S.PREPARING, S.CPU_READY): "validation/OOM/compile/loss, or the GPU timed slower than the CPU path",
    (S.GPU_READY, S.GENERATING): "begin generation",
    (S.GENERATING, S.GPU_READY): "generation completes (or ends in an error)",
    (S.GENERATING, S.CANCEL_PENDING): "user/model/page cancellation",
    (S.CANCEL_PENDING, S.GPU_READY): "submitted work retires, result discarded",
    (S.GENERATING, S.LOST): "device.lost or fatal GPU error",
    (S.LOST, S.CPU_REBUILD): "committed tokens and sampler state are intact",
    (S.CPU_REBUILD, S.CPU_GENERATING): "deterministic replay succeeds",
    (S.CPU_REBUILD, S.VISIBLE_FAILURE): "exact continuation cannot be established",
    (S.CPU_GENERATING, S.CPU_READY): "generation completes (or ends in an error)",
    (S.GPU_READY, S.DESTROYING): "model switch or explicit free",
    (S.DESTROYING, S.CPU_READY): "resources retired and destroyed",
    (S.VISIBLE_FAILURE, S.CPU_READY): "user acknowledges or retries",
    # added: the engine's life before and after a model, and its CPU-only life
    (S.EMPTY, S.CPU_READY): "model loaded on the CPU path (no GPU, or GPU not requested)",
    (S.EMPTY, S.PROBING): "model loaded with a GPU offered: admission starts",
    (S.CPU_READY, S.CPU_GENERATING): "begin generation on the CPU path",
    (S.CPU_GENERATING, S.CANCEL_PENDING): "cancellation on the CPU path",
    (S.CANCEL_PENDING, S.CPU_READY): "cancelled on the CPU path (or after a loss)",
    (S.CANCEL_PENDING, S.LOST): "the device died while cancelled work was retiring",
    (S.CPU_REBUILD, S.CANCEL_PENDING): "cancelled while the CPU path replayed the answer",
    (S.GPU_READY, S.LOST): "the device died between generations",
    (S.LOST, S.CPU_READY): "lost with no generation to continue",
    (S.CPU_READY, S.DESTROYING): "unload",
    (S.VISIBLE_FAILURE, S.DESTROYING): "unload after a failure",
    (S.DESTROYING, S.EMPTY): "model unloaded: every buffer destroyed",
}

READY = frozenset({S.CPU_READY, S.GPU_READY})
GENERATING = frozenset({S.GENERATING, S.CPU_GENERATING})


class StateError(CodedError):
    """A transition the table does not allow (code "illegal-transition"), or an operation
    the current state does not allow (code "wrong-state"): both are engine bugs or misuse,
    never a race the engine is expected to absorb."""


class StateMachine:
    """The current state; go() moves along the table and reports every move to on_event."""

    def __init__(self, on_event: Callable[[dict], None] | None = None, initial: State = S.EMPTY):
        self._state = State(initial)
        self._on_event = on_event

    @property
    def state(self) -> State:
        return self._state

    def can(self, to: State) -> bool:
        return (self._state, State(to)) in TRANSITIONS

    def go(self, to: State, reason: str, **details) -> None:
        """Move to `to`, or raise StateError and stay. details (stage, code, sentence, ...)
        travel in the event next to the reason."""
        to = State(to)
        if (self._state, to) not in TRANSITIONS:
            raise StateError("illegal-transition", f"{self._state}->{to}",
                             f"the engine cannot go from {self._state} to {to} ({reason})")
        before, self._state = self._state, to
        if self._on_event is not None:
            self._on_event({"event": "state", "from": before.value, "to": to.value,
                            "reason": reason, **details})

    def require(self, allowed, operation: str) -> None:
        """Raise StateError("wrong-state") unless the current state is one of `allowed`."""
        if self._state not in allowed:
            names = ", ".join(sorted(s.value for s in allowed))
            raise StateError("wrong-state", operation,
                             f"{operation} needs the engine in {names}, it is in {self._state}")
