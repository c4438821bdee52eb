"""WGSL kernel families: each module registers its kernels (registry.py) and golden tests (golden.py).

Importing this package imports every family listed in FAMILY_MODULES, so the registry and
the golden suite are complete once `webslm.kernels` is imported.
"""
import importlib

from . import registry  # noqa: F401  (first: the families register into it)

FAMILY_MODULES = ("probe", "matvec", "matvec_cases", "matvec_variants", "matvec_prequant", "gemm", "gemm_cases", "gemm_split",
                  "logits", "kv_cache", "attention", "attention_cases", "norm", "rope", "swiglu", "embed", "rope_kv",
                  "attention_rope", "attention_xq", "matvec_quantize_out", "matvec_rope_kv", "head_norm", "scale")

for _module in FAMILY_MODULES:
    importlib.import_module(f"{__name__}.{_module}")
