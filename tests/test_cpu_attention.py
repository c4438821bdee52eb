"""The CPU path's attention takes a prompt's query rows in groups (layers.attention): the
same results as one pass, and memory that grows linearly with the positions."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from webslm.cpu import layers


def inputs(t: int, start: int, heads=9, kv_heads=3, e=64, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((t, heads, e), dtype=np.float32)
    k = rng.standard_normal((start + t, kv_heads, e), dtype=np.float32)
    v = rng.standard_normal((start + t, kv_heads, e), dtype=np.float32)
    return q, k, v


def reference(q, k, v, start, window=None) -> np.ndarray:
    """float64, one query row at a time, straight from the definition."""
    t, heads, e = q.shape
    group = heads // k.shape[1]
    out = np.zeros((t, heads, e))
    for i in range(t):
        pos = start + i
        lo = 0 if window is None else max(0, pos - window + 1)
        for h in range(heads):
            s = k[lo:pos + 1, h // group].astype(np.float64) @ q[i, h] / np.sqrt(e)
            w = np.exp(s - s.max())
            out[i, h] = (w / w.sum()) @ v[lo:pos + 1, h // group]
    return out.reshape(t, heads * e)


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("budget", [1, 9 * 4 * 50, 9 * 4 * 50 * 13])     # 1 row, a few rows, one pass
def test_groups_of_rows_give_one_pass_results(monkeypatch, window, budget):
    q, k, v = inputs(t=37, start=13)
    whole = layers.attention(q, k, v, 13, window=window)
    monkeypatch.setattr(layers, "ATTENTION_SCORES_BYTES", budget)
    grouped = layers.attention(q, k, v, 13, window=window)
    np.testing.assert_allclose(grouped, whole, rtol=0, atol=2e-6)
    np.testing.assert_allclose(grouped, reference(q, k, v, 13, window), rtol=0, atol=2e-5)


def test_memory_is_linear_in_the_positions():
    """2048 query rows over 2048 positions: one pass would hold 9 x 2048 x 2048 f32 scores
    (144 MiB) several times over; in groups the temporaries stay near the 8 MiB budget."""
    q, k, v = inputs(t=2048, start=0)
    tracemalloc.start()
    out = layers.attention(q, k, v, 0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"attention 2048 x 2048: peak {peak / 2 ** 20:.1f} MiB")
    assert np.isfinite(out).all()
    assert peak < 8 * layers.ATTENTION_SCORES_BYTES
