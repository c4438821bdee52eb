"""The engine: one model answered on the GPU executor or the CPU path, with cancellation,
device-loss recovery and the state machine of the design report (states.py)."""
from .engine import TOP_K_CANDIDATES, Engine, EngineError, want_for
from .states import State, StateError, StateMachine, TRANSITIONS

__all__ = ["Engine", "EngineError", "State", "StateError", "StateMachine", "TRANSITIONS",
           "TOP_K_CANDIDATES", "want_for"]
