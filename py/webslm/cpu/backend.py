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

A prompt runs in chunks of PREFILL_CHUNK tokens, and the pass is a generator that pauses
after each half layer (forward_steps): the synchronous calls run it to its end, the engine's
CPU path (backends/cpu_path.py) gives the event loop a turn at the pauses, so that a cancel
is seen and progress is reported while a long prompt is read. Chunking bounds the work
between two pauses; it changes the float rounding only (BLAS sums a T-row product in
another order than a 1-row one), as decoding token by token always did.

Weights stay as the artifact stores them (qmatrix.py): a projection is W.matmul(x) = x . W^T,
computed block by block from the codes by qmatmul.c's kernel (q8, q4) when a build of it is
loaded (kernels.py), else strip by strip with numpy. Either way no whole matrix is ever
decoded to f32, every product accumulates in f32, and the embedding lookup decodes only
the rows it reads. The kernel's arithmetic (its header) gives each output element the same
value whatever the number of rows in the call, so chunking a prompt changes only the
attention's rounding (numpy's matmul), not the projections'. Memory: the codes (views of the
model's bytes), f32 scales, the norms, and the KV cache (f32, grown in KV_GROWTH steps).
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Iterator

import numpy as np

from .layers import apply_rope, attention, geglu, rms_norm, rope_tables, swiglu
from .qmatrix import Products, weight_matrix


class CpuBackendError(ValueError):
    """A request the model cannot serve (a token out of range, the context full)."""


class _Layer:
    """One block's weights: vectors decoded to f32 (norms with the format's offset added),
    matrices [out, in] as stored (qmatrix.py)."""

    def __init__(self, model, i: int, arch, use_kernel: bool = True):
        gemma3 = arch.gemma3
        offset = np.float32(gemma3.norm_weight_offset if gemma3 else 0.0)
        vector = lambda name: model.dequantize(f"blk.{i}.{name}")                      # noqa: E731
        norm = lambda name: vector(name) + offset if offset else vector(name)          # noqa: E731
        matrix = lambda name: weight_matrix(model, f"blk.{i}.{name}", use_kernel)      # noqa: E731
        self.attn_norm, self.ffn_norm = norm("attn_norm"), norm("ffn_norm")
        self.q, self.k, self.v, self.o = matrix("attn_q"), matrix("attn_k"), matrix("attn_v"), matrix("attn_output")
        self.gate, self.up, self.down = matrix("ffn_gate"), matrix("ffn_up"), matrix("ffn_down")
        # the products as the forward pass calls them (their results live until the next
        # call of the same role: qmatrix.Products)
        self.qkv, self.o_proj = Products("qkv", self.q, self.k, self.v), Products("o", self.o)
        self.gate_up, self.down_proj = Products("gate_up", self.gate, self.up), Products("down", self.down)
        self.bq = vector("attn_q.bias") if arch.qkv_bias else None
        self.bk = vector("attn_k.bias") if arch.qkv_bias else None
        self.bv = vector("attn_v.bias") if arch.qkv_bias else None
        # gemma3 only
        self.q_norm = norm("attn_q_norm") if gemma3 else None
        self.k_norm = norm("attn_k_norm") if gemma3 else None
        self.post_attention_norm = norm("post_attention_norm") if gemma3 else None
        self.post_ffw_norm = norm("post_ffw_norm") if gemma3 else None
        self.window = gemma3.sliding_window if gemma3 and gemma3.layer_types[i] == "sliding" else None

    def nbytes(self) -> int:
        return sum(a.nbytes for a in vars(self).values() if hasattr(a, "nbytes"))


def _output_norm(model) -> np.ndarray:
    """The final norm's weight [D], with the format's offset added (gemma3: 1 + w)."""
    a = model.architecture
    weight = model.dequantize("output_norm")
    return weight + np.float32(a.gemma3.norm_weight_offset) if a.gemma3 and a.gemma3.norm_weight_offset else weight


class CpuBackend:
    KV_GROWTH = 256      # KV cache capacity grows in steps of this many positions
    # Tokens of a prompt per forward pass; half a layer of a chunk is the longest stretch the
    # CPU path cannot be interrupted. The kernel reads each weight once per two rows of x,
    # so chunks cost little throughput; under Pyodide (SmolLM2, ~30 prompt tokens a CPU
    # second: bench/cpu_pyodide.py) half a layer of 16 tokens is ~10-20 ms, natively 64
    # tokens about the same. (These sizes were chosen for the f32 engine, whose BLAS made
    # small chunks costly natively; they still bound a pause well.)
    PREFILL_CHUNK = 16 if sys.platform == "emscripten" else 64

    def __init__(self, model, prefill_chunk: int | None = None, use_kernel: bool = True):
        """use_kernel=False: every product strip by strip in numpy (qmatrix.StripMatrix),
        even where the qmatmul kernel is loaded."""
        a = model.architecture
        embedding = weight_matrix(model, "token_embd", use_kernel)                         # [V, D]
        head = embedding if a.tied_output else weight_matrix(model, "output", use_kernel)  # [V, D]
        self._set_up(a, embedding, head, _output_norm(model),
                     [_Layer(model, i, a, use_kernel) for i in range(a.n_layers)], prefill_chunk)

    @classmethod
    def for_timing(cls, model, head_rows: int = 4096) -> "CpuBackend":
        """A CpuBackend that times what a decode step of `model` costs (engine/choice.py):
        layer 0 with its real weights, run by this class's own code, and the first head_rows
        rows of the embedding as the LM head (views: nothing is decoded). Its architecture
        says one layer and a vocabulary of head_rows: time one layer and the head, then
        scale by n_layers and vocab / head_rows."""
        a = model.architecture
        rows = min(int(head_rows), a.vocab)
        table = weight_matrix(model, "token_embd").row_slice(rows)            # [rows, D]
        probe = cls.__new__(cls)
        probe._set_up(dataclasses.replace(a, n_layers=1, vocab=rows), table, table, _output_norm(model),
                      [_Layer(model, 0, a)], None)
        return probe

    def _set_up(self, a, embedding, head, output_norm, layers, prefill_chunk) -> None:
        self.prefill_chunk = int(prefill_chunk or self.PREFILL_CHUNK)
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1, not {prefill_chunk!r}")
        self.arch = a
        self.embedding, self.head, self.output_norm = embedding, head, output_norm
        self.layers = layers
        # gemma3: the embedding's scale, the attention scale (None: 1/sqrt(head_dim)), the FFN
        self.embedding_scale = np.float32(a.gemma3.embedding_scale) if a.gemma3 else None
        self.attention_scale = a.gemma3.attention_scale if a.gemma3 else None
        self.ffn = geglu if a.gemma3 else swiglu
        self.reset()

    # -- cache -------------------------------------------------------------------------------
    def truncate(self, position: int) -> None:
        """Keep the first `position` positions of the cache and forget the rest (a new prompt
        that shares only a prefix with what the cache holds)."""
        if not 0 <= position <= self.position:
            raise CpuBackendError(f"cannot keep {position} positions of a cache that holds {self.position}")
        self.position = position     # the rows past it are never read, and overwritten next

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
        held = {id(x): x.nbytes for x in [self.embedding, self.head, self.output_norm]}
        return sum(held.values()) + sum(layer.nbytes() for layer in self.layers) + self._k.nbytes + self._v.nbytes

    # -- the forward pass ----------------------------------------------------------------------
    def forward_steps(self, ids: list[int], all_rows: bool = False) -> Iterator[int]:
        """Run ids at positions position.. and append them to the cache, chunk by chunk
        (PREFILL_CHUNK tokens), as a generator: it yields after each half of each layer
        (attention, then the feed-forward) the number of ids whose work is done so far,
        counted in layers (an estimate inside a chunk, exact at its end). Its return value
        (StopIteration.value) is the hidden state [rows, D]: the last row, or every row
        with all_rows.

        The cache only ever holds whole chunks: `position` moves at the end of each one, so
        a caller that stops the generator early (closes it) keeps every chunk finished
        before; the rows written for the chunk in progress lie past `position`, where they
        are never read and the next call overwrites them. The ids are all checked first:
        a rejected call changes nothing."""
        a = self.arch
        self.check(ids, self.position)
        total, layers = len(ids), len(self.layers)
        rows = []
        for begin in range(0, total, self.prefill_chunk):
            chunk = ids[begin:begin + self.prefill_chunk]
            start, t = self.position, len(chunk)
            self._reserve(start + t)
            x = self.embedding.rows(chunk)                                     # [t, D]
            if self.embedding_scale is not None:
                x = x * self.embedding_scale
            positions = np.arange(start, start + t) + a.rope.position_offset
            global_rope = rope_tables(positions, a.rope.rotary_dim, a.rope.base)
            local_rope = rope_tables(positions, a.rope.rotary_dim, a.gemma3.local_rope_base) if a.gemma3 else None
            for i, layer in enumerate(self.layers):
                h = rms_norm(x, layer.attn_norm, a.norm_eps)
                q, k, v = layer.qkv(h)
                if layer.bq is not None:
                    q, k, v = q + layer.bq, k + layer.bk, v + layer.bv
                q, k = q.reshape(t, a.n_heads, a.head_dim), k.reshape(t, a.n_kv_heads, a.head_dim)
                if layer.q_norm is not None:                                   # per head, over head_dim
                    q, k = rms_norm(q, layer.q_norm, a.norm_eps), rms_norm(k, layer.k_norm, a.norm_eps)
                cos, sin = global_rope if layer.window is None else local_rope  # sliding layers: local
                q = apply_rope(q, cos, sin, a.rope.convention)
                k = apply_rope(k, cos, sin, a.rope.convention)
                self._k[i, start:start + t] = k
                self._v[i, start:start + t] = v.reshape(t, a.n_kv_heads, a.head_dim)
                o = layer.o_proj(attention(q, self._k[i, :start + t], self._v[i, :start + t], start,
                                           self.attention_scale, layer.window))[0]
                if layer.post_attention_norm is not None:
                    o = rms_norm(o, layer.post_attention_norm, a.norm_eps)
                x = x + o
                yield begin + (2 * i + 1) * t // (2 * layers)
                f = self.ffn(rms_norm(x, layer.ffn_norm, a.norm_eps), layer.gate_up, layer.down_proj)
                if layer.post_ffw_norm is not None:
                    f = rms_norm(f, layer.post_ffw_norm, a.norm_eps)
                x = x + f
                yield begin + (i + 1) * t // layers
            self.position = start + t
            rows.append(x if all_rows else x[-1:])
        return np.concatenate(rows) if all_rows else rows[-1]

    def logits(self, x: np.ndarray) -> np.ndarray:
        """[T, D] -> [T, V]. The head is [V, D] (the embedding when tied)."""
        return self.head.matmul(rms_norm(x, self.output_norm, self.arch.norm_eps))

    # -- the backend surface, as step generators (forward_steps' pauses) and run to the end --------
    def prefill_steps(self, ids: list[int], all_logits: bool = False) -> Iterator[int]:
        """Append a prompt; returns logits [V] at its last position ([T, V] with all_logits)."""
        x = yield from self.forward_steps(list(ids), all_logits)
        return self.logits(x) if all_logits else self.logits(x)[0]

    def decode_steps(self, token: int) -> Iterator[int]:
        """Append one token; returns logits [V] for the next position."""
        x = yield from self.forward_steps([int(token)])
        return self.logits(x)[0]

    def rebuild_steps(self, ids: list[int]) -> Iterator[int]:
        """Reset and replay committed ids (continuing after a GPU loss); returns the last
        logits [V]. The ids are checked first: a rejected rebuild leaves the cache as it was."""
        ids = list(ids)
        self.check(ids, start=0)
        self.reset()
        return (yield from self.prefill_steps(ids))

    def prefill(self, ids: list[int], all_logits: bool = False) -> np.ndarray:
        return run_to_end(self.prefill_steps(ids, all_logits))

    def decode_one(self, token: int) -> np.ndarray:
        return run_to_end(self.decode_steps(token))

    def rebuild(self, ids: list[int]) -> np.ndarray:
        return run_to_end(self.rebuild_steps(ids))

    def check(self, ids: list[int], start: int) -> None:
        if not ids:
            raise CpuBackendError("at least one token is needed")
        if any(not 0 <= t < self.arch.vocab for t in ids):
            raise CpuBackendError(f"token id out of range [0, {self.arch.vocab})")
        if start + len(ids) > self.arch.context_length:
            raise CpuBackendError(f"position {start + len(ids) - 1} is past the context length {self.arch.context_length}")


def run_to_end(steps: Iterator[int]):
    """Run a step generator (CpuBackend.forward_steps and the calls built on it) without
    pausing; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
