"""Which adapter to use, and what kernel tier it offers.

Both questions are answered from the GPU interface alone (interface.py), before any kernel
is compiled: the probe (gpu_smoke.py), admission (admission/admit.py) and the worker's kernel
golden suite ask them the same way. Nothing here imports kernels or the engine.
"""
from __future__ import annotations

from .interface import Adapter, Gpu


async def choose_adapter(gpu: Gpu, feature_level: str) -> Adapter | None:
    """The adapter for a feature level ("core", "compatibility" or "auto"); None if there is
    none. "auto" prefers a real (non-fallback) adapter.

    A browser may answer a core request with a software fallback (Chromium's SwiftShader)
    while a compatibility-mode request reaches the actual GPU through OpenGL ES; then the
    compatibility adapter is the better choice. A fallback is used only when it is all
    there is."""
    if feature_level != "auto":
        return await gpu.request_adapter(feature_level)
    core = await gpu.request_adapter("core")
    if core is not None and not core.summary().is_fallback:
        return core
    compatibility = await gpu.request_adapter("compatibility")
    if compatibility is not None and not compatibility.summary().is_fallback:
        return compatibility
    return core or compatibility


def tier_for(features: frozenset[str] | set[str]) -> str:
    """The design report's kernel tiers, from what an adapter offers:
    C = subgroups available, B = shader-f16 available, A = f32 baseline."""
    if "subgroups" in features:
        return "C"
    if "shader-f16" in features:
        return "B"
    return "A"
