"""The decoder's steps as plain numpy functions, one per operation, in f32.

Shapes: T = tokens in this call, D = hidden, H = query heads, K = KV heads, E = head_dim.
"""
from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x [T, D] -> x / sqrt(mean(x^2) + eps) * weight, accumulated in f32."""
    # np.mean's own arithmetic (a float32 add.reduce, then / count) without its Python
    # wrapper, which costs ~4x the sum itself under Pyodide
    variance = np.add.reduce(np.square(x), axis=-1, keepdims=True, dtype=np.float32) / x.shape[-1]
    return (x / np.sqrt(variance + np.float32(eps))) * weight


def rope_tables(positions: np.ndarray, rotary_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, rotary_dim/2] for absolute positions (offset already added).

    Pair i turns at base^(-2i/rotary_dim) radians per position. Computed in f32 like the
    reference implementations, so that long positions round the same way."""
    inv_freq = (1.0 / (np.float32(base) ** (np.arange(0, rotary_dim, 2, dtype=np.float32) / np.float32(rotary_dim)))).astype(np.float32)
    angles = np.outer(positions.astype(np.float32), inv_freq).astype(np.float32)
    return np.cos(angles), np.sin(angles)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, convention: str) -> np.ndarray:
    """x [T, heads, E] rotated on its first rotary_dim = 2 * cos.shape[1] dims.

    rotate-half:   pair (i, i + r/2)   (Hugging Face layout)
    adjacent-pair: pair (2i, 2i + 1)   (GGML layout)"""
    half = cos.shape[1]
    rotary = 2 * half
    c, s = cos[:, None, :], sin[:, None, :]       # broadcast over heads
    out = x.copy()
    if convention == "rotate-half":
        a, b = x[..., :half], x[..., half:rotary]
        out[..., :half] = a * c - b * s
        out[..., half:rotary] = b * c + a * s
    else:
        a, b = x[..., 0:rotary:2], x[..., 1:rotary:2]
        out[..., 0:rotary:2] = a * c - b * s
        out[..., 1:rotary:2] = b * c + a * s
    return out


# Scores of one pass of attention() at most (f32): a prompt's query rows are taken in groups
# so that this temporary, and so the memory of attention, grows linearly with the positions.
ATTENTION_SCORES_BYTES = 8 << 20


def attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, start: int,
              scale: float | None = None, window: int | None = None) -> np.ndarray:
    """Causal grouped-query attention.

    q [T, H, E] for positions start..start+T-1; k_cache, v_cache [start+T, K, E] hold every
    position so far. Query head h reads KV head h // (H / K). Scores are q.k * scale
    (default 1/sqrt(E)); with a window, position i sees only positions i-window+1..i.
    Returns [T, H * E]. Query rows are taken ATTENTION_SCORES_BYTES at a time: the scores of
    a group [K, G, rows, n] are the only temporary that grows with n = start + T, and a row's
    result does not depend on the others (each row's softmax is its own)."""
    t, heads, e = q.shape
    n = k_cache.shape[0]
    rows = max(1, ATTENTION_SCORES_BYTES // (4 * heads * n))
    if t <= rows:
        return _attention_rows(q, k_cache, v_cache, start, scale, window)
    out = np.empty((t, heads * e), np.float32)
    for r in range(0, t, rows):
        # rows r.. see the cache up to their own last position only
        end = min(t, r + rows)
        out[r:end] = _attention_rows(q[r:end], k_cache[:start + end], v_cache[:start + end], start + r, scale, window)
    return out


def _attention_rows(q, k_cache, v_cache, start, scale, window) -> np.ndarray:
    t, heads, e = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    n = k_cache.shape[0]
    qg = q.reshape(t, kv_heads, group, e).transpose(1, 2, 0, 3)       # [K, G, T, E]
    k = k_cache.transpose(1, 2, 0)                                     # [K, E, n]
    v = v_cache.transpose(1, 0, 2)                                     # [K, n, E]
    scale = np.float32(1.0 / np.sqrt(e) if scale is None else scale)
    scores = (qg @ k[:, None]) * scale                                 # [K, G, T, n]
    # n = start + t. One query row (a decode step) at the last position sees every position
    # unless a window hides the oldest: then there is nothing to mask (the mask would leave
    # every score as it is), and the five numpy calls that build it are a fair part of a
    # decode step's attention.
    if t > 1 or (window is not None and n > window):
        query_positions = (start + np.arange(t))[:, None]
        hidden = np.arange(n)[None, :] > query_positions               # [T, n]: future positions
        if window is not None:
            hidden |= np.arange(n)[None, :] <= query_positions - window  # [T, n]: out of the window
        scores = np.where(hidden, np.float32(-np.inf), scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    out = weights @ v[:, None]                                         # [K, G, T, E]
    return out.transpose(2, 0, 1, 3).reshape(t, heads * e)


def swiglu(x: np.ndarray, gate_up, down) -> np.ndarray:
    """down(silu(gate x) * up x); x [T, D]; gate_up: x -> [gate x, up x] (gate, up [F, D]),
    down: h -> [down h] (down [D, F]), as qmatrix.Products."""
    g, u = gate_up(x)
    return down((g / (np.float32(1) + np.exp(-g))) * u)[0]


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (PyTorch's gelu(approximate="tanh")), in f32."""
    c = np.float32(np.sqrt(2.0 / np.pi))
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def geglu(x: np.ndarray, gate_up, down) -> np.ndarray:
    """down(gelu_tanh(gate x) * up x); arguments as swiglu's."""
    g, u = gate_up(x)
    return down(gelu_tanh(g) * u)[0]
