"""CpuBackend: prefill, decode_one and rebuild on a validated model, with a KV cache.

The forward pass, step by step, for one layer (x is the residual stream [T, D]):

    h = rms_norm(x, attn_norm)
    q, k, v = h @ Wq.T (+bq), h @ Wk.T (+bk), h @ Wv.T (+bv)     [T, H*E], [T, K*E], [T, K*E]
    q, k = rope(q), rope(k)                                       at positions start..start+T-1
    append k, v to the cache; o = attention(q, cache)             [T, H*E]
    x = x + o @ Wo.T
    x = x + swiglu(rms_norm(x, ffn_norm), Wgate, Wup, Wdown)

then logits = rms_norm(x[-1], output_norm) @ Whead.T, Whead = the embedding when tied.

Family "gemma3" (docs/slm-format.md) changes the block in these places: x starts as the
embedding rows times embedding_scale; every RMSNorm multiplies by (norm_weight_offset + w);
q and k are RMS-normed per head (attn_q_norm, attn_k_norm) before RoPE; the attention output
and the FFN output are RMS-normed (post_attention_norm, post_ffw_norm) before their residual
adds; scores are scaled by attention_scale; the FFN is GeGLU (tanh GELU); "sliding" layers see
only the last sliding_window positions and rotate with local_rope_base, "full" layers with
rope.base.

Weights are dequantized once, tensor by tensor, into f32 (docs/slm-format.md decoding, the
same as the GPU kernels must match) and stored transposed, [in, out] contiguous, so that
every projection is `x @ Wt`: numpy's BLAS takes a fast path for that layout at any T,
while `x @ W.T` with one row fell onto a path 50-100x slower (measured). Every product
accumulates in f32.
"""
from __future__ import annotations

import numpy as np

from .layers import apply_rope, attention, geglu, rms_norm, rope_tables, swiglu


class CpuBackendError(ValueError):
    """A request the model cannot serve (a token out of range, the context full)."""


class _Layer:
    """One block's weights: vectors as stored (norms with the format's offset added),
    matrices transposed to [in, out]."""

    def __init__(self, model, i: int, arch):
        gemma3 = arch.gemma3
        offset = np.float32(gemma3.norm_weight_offset if gemma3 else 0.0)
        vector = lambda name: model.dequantize(f"blk.{i}.{name}")                      # noqa: E731
        norm = lambda name: vector(name) + offset if offset else vector(name)          # noqa: E731
        matrix = lambda name: np.ascontiguousarray(model.dequantize(f"blk.{i}.{name}").T)  # noqa: E731
        self.attn_norm, self.ffn_norm = norm("attn_norm"), norm("ffn_norm")
        self.q, self.k, self.v, self.o = matrix("attn_q"), matrix("attn_k"), matrix("attn_v"), matrix("attn_output")
        self.gate, self.up, self.down = matrix("ffn_gate"), matrix("ffn_up"), matrix("ffn_down")
        self.bq = vector("attn_q.bias") if arch.qkv_bias else None
        self.bk = vector("attn_k.bias") if arch.qkv_bias else None
        self.bv = vector("attn_v.bias") if arch.qkv_bias else None
        # gemma3 only
        self.q_norm = norm("attn_q_norm") if gemma3 else None
        self.k_norm = norm("attn_k_norm") if gemma3 else None
        self.post_attention_norm = norm("post_attention_norm") if gemma3 else None
        self.post_ffw_norm = norm("post_ffw_norm") if gemma3 else None
        self.window = gemma3.sliding_window if gemma3 and gemma3.layer_types[i] == "sliding" else None

    def arrays(self):
        return [a for a in vars(self).values() if isinstance(a, np.ndarray)]


class CpuBackend:
    KV_GROWTH = 256      # KV cache capacity grows in steps of this many positions

    def __init__(self, model):
        a = model.architecture
        self.arch = a
        self.embedding = model.dequantize("token_embd")                        # [V, D]
        self.head = self.embedding if a.tied_output else model.dequantize("output")
        offset = np.float32(a.gemma3.norm_weight_offset) if a.gemma3 else np.float32(0)
        self.output_norm = model.dequantize("output_norm") + offset if offset else model.dequantize("output_norm")
        self.layers = [_Layer(model, i, a) for i in range(a.n_layers)]
        # gemma3: the embedding's scale, the attention scale (None: 1/sqrt(head_dim)), the FFN
        self.embedding_scale = np.float32(a.gemma3.embedding_scale) if a.gemma3 else None
        self.attention_scale = a.gemma3.attention_scale if a.gemma3 else None
        self.ffn = geglu if a.gemma3 else swiglu
        self.reset()

    # -- cache -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every position (a new conversation)."""
        self.position = 0
        self._k = np.zeros((self.arch.n_layers, 0, self.arch.n_kv_heads, self.arch.head_dim), np.float32)
        self._v = self._k.copy()

    def _reserve(self, end: int) -> None:
        if end > self.arch.context_length:
            raise CpuBackendError(f"position {end - 1} is past the context length {self.arch.context_length}")
        if end > self._k.shape[1]:
            capacity = min(self.arch.context_length, -(-end // self.KV_GROWTH) * self.KV_GROWTH)
            grow = ((0, 0), (0, capacity - self._k.shape[1]), (0, 0), (0, 0))
            self._k, self._v = np.pad(self._k, grow), np.pad(self._v, grow)

    def memory_bytes(self) -> int:
        """Bytes held in weights and the KV cache."""
        weights = {id(x): x.nbytes for x in [self.embedding, self.head, self.output_norm]}
        weights.update({id(x): x.nbytes for layer in self.layers for x in layer.arrays()})
        return sum(weights.values()) + self._k.nbytes + self._v.nbytes

    # -- the forward pass ----------------------------------------------------------------------
    def _forward(self, ids: list[int]) -> np.ndarray:
        """Run ids at positions position.., append them to the cache; hidden states [T, D]."""
        a = self.arch
        self._check(ids, self.position)
        start, t = self.position, len(ids)
        self._reserve(start + t)
        x = self.embedding[np.asarray(ids)]                                    # [T, D]
        if self.embedding_scale is not None:
            x = x * self.embedding_scale
        positions = np.arange(start, start + t) + a.rope.position_offset
        global_rope = rope_tables(positions, a.rope.rotary_dim, a.rope.base)
        local_rope = rope_tables(positions, a.rope.rotary_dim, a.gemma3.local_rope_base) if a.gemma3 else None
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, a.norm_eps)
            q, k, v = h @ layer.q, h @ layer.k, h @ layer.v
            if layer.bq is not None:
                q, k, v = q + layer.bq, k + layer.bk, v + layer.bv
            q, k = q.reshape(t, a.n_heads, a.head_dim), k.reshape(t, a.n_kv_heads, a.head_dim)
            if layer.q_norm is not None:                                       # per head, over head_dim
                q, k = rms_norm(q, layer.q_norm, a.norm_eps), rms_norm(k, layer.k_norm, a.norm_eps)
            cos, sin = global_rope if layer.window is None else local_rope      # sliding layers: local
            q = apply_rope(q, cos, sin, a.rope.convention)
            k = apply_rope(k, cos, sin, a.rope.convention)
            self._k[i, start:start + t] = k
            self._v[i, start:start + t] = v.reshape(t, a.n_kv_heads, a.head_dim)
            o = attention(q, self._k[i, :start + t], self._v[i, :start + t], start,
                          self.attention_scale, layer.window) @ layer.o
            if layer.post_attention_norm is not None:
                o = rms_norm(o, layer.post_attention_norm, a.norm_eps)
            x = x + o
            f = self.ffn(rms_norm(x, layer.ffn_norm, a.norm_eps), layer.gate, layer.up, layer.down)
            if layer.post_ffw_norm is not None:
                f = rms_norm(f, layer.post_ffw_norm, a.norm_eps)
            x = x + f
        self.position = start + t
        return x

    def _logits(self, x: np.ndarray) -> np.ndarray:
        """[T, D] -> [T, V]. The head stays [V, D] (it doubles as the embedding when tied);
        one row goes through a matrix-vector product, its fast path."""
        h = rms_norm(x, self.output_norm, self.arch.norm_eps)
        return (self.head @ h[0])[None] if len(h) == 1 else h @ self.head.T

    # -- the backend surface ---------------------------------------------------------------------
    def prefill(self, ids: list[int], all_logits: bool = False) -> np.ndarray:
        """Append a prompt; logits [V] at its last position ([T, V] with all_logits)."""
        x = self._forward(list(ids))
        return self._logits(x) if all_logits else self._logits(x[-1:])[0]

    def decode_one(self, token: int) -> np.ndarray:
        """Append one token; logits [V] for the next position."""
        return self._logits(self._forward([int(token)]))[0]

    def rebuild(self, ids: list[int]) -> np.ndarray:
        """Reset and replay committed ids (continuing after a GPU loss); last logits [V].
        The ids are checked first: a rejected rebuild leaves the cache as it was."""
        ids = list(ids)
        self._check(ids, start=0)
        self.reset()
        return self.prefill(ids)

    def _check(self, ids: list[int], start: int) -> None:
        if not ids:
            raise CpuBackendError("at least one token is needed")
        if any(not 0 <= t < self.arch.vocab for t in ids):
            raise CpuBackendError(f"token id out of range [0, {self.arch.vocab})")
        if start + len(ids) > self.arch.context_length:
            raise CpuBackendError(f"position {start + len(ids) - 1} is past the context length {self.arch.context_length}")
