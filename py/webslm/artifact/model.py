"""What validation produces: an immutable manifest, the model identity, and read-only views
of the payload. The planner, the kernels and the CPU path all read the model from here."""
from __future__ import annotations

import dataclasses
import types
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class Rope:
    base: float
    rotary_dim: int
    convention: str            # "rotate-half" | "adjacent-pair"
    position_offset: int
    scaling: None              # v1: always None


@dataclasses.dataclass(frozen=True)
class Gemma3:
    """What family "gemma3" adds to the llama block (docs/slm-format.md)."""
    embedding_scale: float     # embedding rows are multiplied by this (sqrt(hidden))
    norm_weight_offset: float  # every RMSNorm multiplies by (offset + weight): 0.0 or 1.0
    activation: str            # "gelu-tanh": the FFN is down(gelu_tanh(gate x) * up x)
    attention_scale: float     # scores = (q . k) * attention_scale
    sliding_window: int        # a "sliding" layer's query sees the last sliding_window positions
    layer_types: tuple[str, ...]   # per layer: "sliding" | "full"
    local_rope_base: float     # RoPE base of "sliding" layers ("full" layers: rope.base)


@dataclasses.dataclass(frozen=True)
class Architecture:
    family: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int
    ffn: int
    vocab: int
    context_length: int
    norm_eps: float
    tied_output: bool
    qkv_bias: bool
    rope: Rope
    gemma3: Gemma3 | None = None   # family "gemma3" only

    @property
    def group_size(self) -> int:
        """Query heads per KV head: query head h reads KV head h // group_size."""
        return self.n_heads // self.n_kv_heads


@dataclasses.dataclass(frozen=True)
class QuantDescriptor:
    block_elements: int
    blocks_per_row: int
    tail_elements: int
    scale_type: str
    scale_layout: str
    zero: str                  # "none" | "offset" | "min" | "scaled-min"
    zero_offset: int | None
    min_type: str | None
    code_signedness: str
    nibble_order: str | None
    # super-block encodings (q4k, q5k, q6k) only; None for the others
    sub_block_elements: int | None = None
    sub_scale_type: str | None = None   # "u6" (0..63 in a u8) | "i8"
    sub_min_type: str | None = None


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    encoding: str
    quant: QuantDescriptor | None
    row_stride: int
    parts: tuple[tuple[str, int, int], ...]   # (part, absolute file offset, length), file order
    sha256: str

    @property
    def rows(self) -> int:
        return self.shape[0] if len(self.shape) == 2 else 1

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def nbytes(self) -> int:
        return sum(length for _, _, length in self.parts)


@dataclasses.dataclass(frozen=True)
class ModelIdentity:
    artifact_sha256: str       # the trailer: names the exact file
    layout_hash: str           # names the numerical model, independent of file placement


@dataclasses.dataclass(frozen=True)
class ValidatedModelManifest:
    architecture: Architecture
    tokenizer: Mapping[str, Any]       # deeply read-only (tuples and mapping proxies)
    chat_template: Mapping[str, Any]
    generation: Mapping[str, Any]
    source: Mapping[str, Any]
    tensors: Mapping[str, TensorInfo]  # in file order
    identity: ModelIdentity


def freeze(value: Any) -> Any:
    """JSON data -> the same data, read-only all the way down."""
    if isinstance(value, dict):
        return types.MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


class ValidatedModel:
    """A validated .slm: the manifest, the identity, and read-only views of tensor bytes."""

    def __init__(self, manifest: ValidatedModelManifest, data: bytearray):
        self.manifest = manifest
        self.identity = manifest.identity
        self._view = memoryview(data).toreadonly()

    @property
    def architecture(self) -> Architecture:
        return self.manifest.architecture

    @property
    def nbytes(self) -> int:
        return len(self._view)

    def tensor_parts(self, name: str) -> dict[str, memoryview]:
        """{part: read-only view of its bytes} for one tensor (no copy)."""
        info = self.manifest.tensors[name]
        return {part: self._view[offset:offset + length] for part, offset, length in info.parts}

    def tensor_arrays(self, name: str) -> dict:
        """{part: read-only numpy view} shaped as the format lays it out (no copy):
        data [rows, row_stride / itemsize] f32|f16; codes [rows, row_stride] int8 (q8) or
        uint8 (the others: two codes' low 4 bits per byte); high_bits [rows, -1] uint8;
        scales, mins [rows, blocks_per_row] f16|f32; sub_scales, sub_mins
        [rows, blocks_per_row * sub-blocks] uint8 (u6) or int8 (i8)."""
        import numpy as np
        info = self.manifest.tensors[name]
        rows, arrays = info.rows, {}
        for part, view in self.tensor_parts(name).items():
            if part == "data":
                dtype = np.dtype("<f4" if info.encoding == "f32" else "<f2")
            elif part == "codes":
                dtype = np.dtype(np.int8 if info.encoding == "q8" else np.uint8)
            elif part == "high_bits":
                dtype = np.dtype(np.uint8)
            elif part in ("sub_scales", "sub_mins"):
                kind = info.quant.sub_scale_type if part == "sub_scales" else info.quant.sub_min_type
                dtype = np.dtype(np.int8 if kind == "i8" else np.uint8)
            else:
                dtype = np.dtype("<f2" if info.quant.scale_type == "f16" else "<f4")
            arrays[part] = np.frombuffer(view, dtype).reshape(rows, -1)
        return arrays

    def dequantize(self, name: str):
        """The tensor as f32 numpy (decoded exactly as docs/slm-format.md defines)."""
        from . import quant
        info = self.manifest.tensors[name]
        descriptor = dataclasses.asdict(info.quant) if info.quant else None
        return quant.dequantize(info.encoding, info.shape, descriptor, self.tensor_parts(name))

    def __repr__(self) -> str:
        a = self.architecture
        return (f"<ValidatedModel {a.family} {a.n_layers}L h{a.hidden} v{a.vocab} "
                f"sha256 {self.identity.artifact_sha256[:12]}…>")
