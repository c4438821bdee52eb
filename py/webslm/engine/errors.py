"""The engine's own errors (the backends raise BackendLost and BackendCancelled, admission
AdmissionFailure)."""
from __future__ import annotations

from ..errors import CodedError


class EngineError(CodedError):
    """Codes: "bad-prompt", "replay-mismatch" (a CPU continuation cannot be proven exact),
    "misplaced-result" (a backend answered for another position or epoch),
    "gpu-backend-unavailable" (webslm.backends.gpu cannot be imported)."""
