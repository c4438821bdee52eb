"""Admission's plans: what a model will own on a GPU, decided and proved before allocation.

    memory.py   plan_memory(manifest, limits, policy) -> MemoryPlan (the deterministic planner)
    proof.py    verify(plan), the independent checker; canonical_json and plan_hash

`synthetic_manifest` below makes the manifest a converter would write for an architecture,
without weights, so a model can be planned (will it fit? how is it split?) before it exists.
"""
from __future__ import annotations

import dataclasses

from ..artifact.model import Architecture, QuantDescriptor, Rope, TensorInfo
from .memory import (SPEC_DEFAULT_LIMITS, MemoryPlan, PlanPolicy, PlanRejected, plan_memory)
from .proof import PlanInvalid, canonical_json, plan_hash, verify

__all__ = ["SPEC_DEFAULT_LIMITS", "MemoryPlan", "PlanPolicy", "PlanRejected", "plan_memory",
           "PlanInvalid", "canonical_json", "plan_hash", "verify", "synthetic_manifest"]


@dataclasses.dataclass(frozen=True)
class SyntheticManifest:
    """Duck-typed like ValidatedModelManifest for the planner: architecture and tensors."""
    architecture: Architecture
    tensors: dict


def _tensor(name: str, shape: tuple, encoding: str, offset: int, block: int, scale_type: str,
            zero: str) -> TensorInfo:
    """One tensor's descriptor with the part lengths of docs/slm-format.md (row strides table)."""
    rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
    quant, lengths = None, []
    if encoding in ("f32", "f16"):
        stride = 4 * cols if encoding == "f32" else -(-2 * cols // 4) * 4
        lengths = [("data", rows * stride)]
    else:
        bpr, sb = -(-cols // block), 2 if scale_type == "f16" else 4
        stride = bpr * block if encoding == "q8" else bpr * block // 2
        q4 = encoding == "q4"
        zero = zero if q4 else "none"
        quant = QuantDescriptor(block, bpr, cols - (bpr - 1) * block, scale_type, "rows-by-blocks", zero,
                                8 if zero == "offset" else None, scale_type if zero == "min" else None,
                                "unsigned" if q4 else "signed", "low-first" if q4 else None)
        lengths = [("codes", rows * stride), ("scales", rows * bpr * sb)]
        if zero == "min":
            lengths.append(("mins", rows * bpr * sb))
    parts = []
    for part, length in lengths:
        parts.append((part, offset, length))
        offset = -(-(offset + length) // 256) * 256
    return TensorInfo(name, tuple(shape), encoding, quant, stride, tuple(parts), "0" * 64)


def synthetic_manifest(arch: Architecture | dict, matrices: str = "q4", embedding: str = "q8",
                       output: str | None = None, vectors: str = "f32", block: int = 32,
                       scale_type: str = "f16", zero: str = "min", payload_offset: int = 4096) -> SyntheticManifest:
    """The llama-family tensor set of `arch` (an Architecture, or its fields with `rope` a dict
    or omitted) with the given encodings, laid out as a converter would: file order, every part
    at the next 256-byte boundary. Hashes are placeholders: this manifest describes, it holds
    no weights."""
    if isinstance(arch, dict):
        fields = dict(arch)
        rope = fields.pop("rope", None) or {}
        rope = Rope(**{"base": 10000.0, "rotary_dim": fields["head_dim"], "convention": "rotate-half",
                       "position_offset": 0, "scaling": None, **rope})
        fields = {"family": "llama", "norm_eps": 1e-5, "tied_output": True, "qkv_bias": False, **fields}
        arch = Architecture(rope=rope, **fields)
    d, e = arch.hidden, arch.head_dim
    shapes = [("token_embd", (arch.vocab, d), embedding), ("output_norm", (d,), vectors)]
    if not arch.tied_output:
        shapes.append(("output", (arch.vocab, d), output or embedding))
    for i in range(arch.n_layers):
        b = f"blk.{i}."
        shapes += [(b + "attn_norm", (d,), vectors), (b + "attn_q", (arch.n_heads * e, d), matrices),
                   (b + "attn_k", (arch.n_kv_heads * e, d), matrices), (b + "attn_v", (arch.n_kv_heads * e, d), matrices),
                   (b + "attn_output", (d, arch.n_heads * e), matrices), (b + "ffn_norm", (d,), vectors),
                   (b + "ffn_gate", (arch.ffn, d), matrices), (b + "ffn_up", (arch.ffn, d), matrices),
                   (b + "ffn_down", (d, arch.ffn), matrices)]
        if arch.qkv_bias:
            shapes += [(b + "attn_q.bias", (arch.n_heads * e,), vectors),
                       (b + "attn_k.bias", (arch.n_kv_heads * e,), vectors),
                       (b + "attn_v.bias", (arch.n_kv_heads * e,), vectors)]
    tensors, offset = {}, payload_offset
    for name, shape, encoding in shapes:
        info = _tensor(name, shape, encoding, offset, block, scale_type, zero)
        tensors[name] = info
        _, last_offset, last_length = info.parts[-1]
        offset = -(-(last_offset + last_length) // 256) * 256
    return SyntheticManifest(arch, tensors)
