"""The CPU engine (webslm.cpu) on the fixture model against an independent float64 forward.

The oracle below is written from docs/slm-format.md alone (it imports nothing from
webslm.cpu): one position at a time, one head at a time, in float64, with the
architecture read from the manifest JSON as stored in the file (tests/slm_surgery.split),
not from webslm's parsed Architecture. Weights come from `model.dequantize(name)` (the
codecs have their own tests), so this file tests the forward pass: qkv biases, untied
output head, partial rotary (rotary_dim 8 < head_dim 12), both RoPE conventions, GQA 4/2,
position_offset, the KV cache across prefill/decode_one/rebuild, and the errors.

Tolerance: max |engine - oracle| over every position and logit, divided by max |oracle|
(the logit scale), for the engine's f32 arithmetic:

    check                                            measured (max rel.)   bound
    prefill, all positions, 5 sequences (1-64 t.)    1.5e-6                1e-5
    prefill n + decode_one, chunked prefill, rebuild 4.7e-7                1e-5
    rotate-half variant                              6.9e-7                1e-5
    position_offset 37 (logits; cached K and V)      5.9e-7; 4.1e-7        1e-5

A wrong convention, full instead of partial rotary, another RoPE base or a wrong GQA mapping
moves the logits by 0.38..0.89 of their scale (test_oracle_has_teeth asserts > 1e-3).
A uniform position_offset cancels in q.k (RoPE sees position differences only), so the
offset test also checks the rotated keys in the engine's KV cache (white box: `_k`).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import webslm
from webslm.cpu.backend import CpuBackend, CpuBackendError

import slm_surgery

REL_TOL = 1e-5
BUG_FLOOR = 1e-3     # a deliberately wrong oracle must differ from the engine by more than this


# -- the independent float64 oracle -------------------------------------------------------------

class Oracle:
    """Float64 forward of a `family: "llama"` model, straight from the spec, per position."""

    def __init__(self, model, arch: dict):
        self.a = arch
        self.w = {}
        names = ["token_embd", "output_norm"] + ([] if arch["tied_output"] else ["output"])
        for i in range(arch["n_layers"]):
            names += [f"blk.{i}.{n}" for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")]
            if arch["qkv_bias"]:
                names += [f"blk.{i}.attn_{n}.bias" for n in "qkv"]
        for name in names:
            self.w[name] = np.asarray(model.dequantize(name), dtype=np.float64)

    def _rms(self, x, weight):
        return x / math.sqrt(float(np.mean(x * x)) + self.a["norm_eps"]) * weight

    def _rope(self, vec, position, convention, offset, rotary_dim=None):
        """Rotate one head's vector [head_dim] at absolute position `position + offset`."""
        r = rotary_dim or self.a["rope"]["rotary_dim"]
        base = self.a["rope"]["base"]
        out = vec.copy()
        for i in range(r // 2):
            theta = (position + offset) * base ** (-2.0 * i / r)
            c, s = math.cos(theta), math.sin(theta)
            j, k = (i, i + r // 2) if convention == "rotate-half" else (2 * i, 2 * i + 1)
            out[j] = vec[j] * c - vec[k] * s
            out[k] = vec[k] * c + vec[j] * s
        return out

    def logits(self, ids, convention=None, offset=None, group_map=None, rotary_dim=None) -> np.ndarray:
        """Logits [T, V] at every position of `ids` (starting at position 0)."""
        return self.forward(ids, convention, offset, group_map, rotary_dim)[0]

    def forward(self, ids, convention=None, offset=None, group_map=None, rotary_dim=None):
        """(logits [T, V], keys [layers, T, n_kv_heads, head_dim] after RoPE, values likewise)."""
        a, w = self.a, self.w
        convention = a["rope"]["convention"] if convention is None else convention
        offset = a["rope"]["position_offset"] if offset is None else offset
        H, K, E = a["n_heads"], a["n_kv_heads"], a["head_dim"]
        group_map = group_map or (lambda h: h // (H // K))
        head = w["token_embd"] if a["tied_output"] else w["output"]
        caches = [([], []) for _ in range(a["n_layers"])]
        rows = []
        for p, token in enumerate(ids):
            x = w["token_embd"][token].copy()
            for i in range(a["n_layers"]):
                b = f"blk.{i}."
                h = self._rms(x, w[b + "attn_norm"])
                q, k, v = w[b + "attn_q"] @ h, w[b + "attn_k"] @ h, w[b + "attn_v"] @ h
                if a["qkv_bias"]:
                    q, k, v = q + w[b + "attn_q.bias"], k + w[b + "attn_k.bias"], v + w[b + "attn_v.bias"]
                q = [self._rope(q[n * E:(n + 1) * E], p, convention, offset, rotary_dim) for n in range(H)]
                ks, vs = caches[i]
                ks.append([self._rope(k[n * E:(n + 1) * E], p, convention, offset, rotary_dim) for n in range(K)])
                vs.append([v[n * E:(n + 1) * E] for n in range(K)])
                heads = []
                for n in range(H):
                    g = group_map(n)
                    scores = np.array([q[n] @ ks[j][g] for j in range(p + 1)]) / math.sqrt(E)
                    weights = np.exp(scores - scores.max())
                    weights /= weights.sum()
                    heads.append(sum(weights[j] * vs[j][g] for j in range(p + 1)))
                x = x + w[b + "attn_output"] @ np.concatenate(heads)
                h = self._rms(x, w[b + "ffn_norm"])
                gate, up = w[b + "ffn_gate"] @ h, w[b + "ffn_up"] @ h
                x = x + w[b + "ffn_down"] @ (gate / (1.0 + np.exp(-gate)) * up)
            rows.append(head @ self._rms(x, w["output_norm"]))
        return np.array(rows), np.array([c[0] for c in caches]), np.array([c[1] for c in caches])


def _with_base(oracle: Oracle, base: float) -> Oracle:
    other = Oracle.__new__(Oracle)
    other.w, other.a = oracle.w, {**oracle.a, "rope": {**oracle.a["rope"], "base": base}}
    return other


def rel_error(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(ours, np.float64) - ref)) / np.max(np.abs(ref)))


# -- models --------------------------------------------------------------------------------------

def variant(data: bytes, path, **rope) -> tuple[object, dict]:
    """The fixture with manifest architecture.rope fields replaced; (model, raw architecture)."""
    pieces = slm_surgery.split(data)
    pieces.manifest["architecture"]["rope"].update(rope)
    path.write_bytes(slm_surgery.join(pieces))
    return webslm.open_model(path), pieces.manifest["architecture"]


@pytest.fixture(scope="module")
def base(fixture_slm_path):
    data = fixture_slm_path.read_bytes()
    model = webslm.open_model(fixture_slm_path)
    arch = slm_surgery.split(data).manifest["architecture"]
    return model, arch, Oracle(model, arch)


def sequences(vocab: int, context: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [
        [5],                                                   # one token
        [296, 297, 298, 299],                                  # specials and the embedding's padding rows
        rng.integers(0, vocab, 9).tolist(),
        rng.integers(0, vocab, 23).tolist(),
        rng.integers(0, vocab, context).tolist(),              # the whole context
    ]


def engine_all_logits(backend: CpuBackend, ids: list[int], split_at: int | None = None) -> np.ndarray:
    """Every position's logits through prefill (in one or two calls) and then decode_one."""
    backend.reset()
    split_at = len(ids) if split_at is None else split_at
    rows = []
    if split_at:
        rows.append(backend.prefill(ids[:split_at], all_logits=True))
    rows += [backend.decode_one(t)[None] for t in ids[split_at:]]
    return np.concatenate(rows)


# -- the tests -------------------------------------------------------------------------------------

def test_prefill_all_positions_match_float64_oracle(base):
    model, arch, oracle = base
    backend = CpuBackend(model)
    worst = 0.0
    for ids in sequences(arch["vocab"], arch["context_length"]):
        ref = oracle.logits(ids)
        backend.reset()
        ours = backend.prefill(ids, all_logits=True)
        assert ours.shape == (len(ids), arch["vocab"]) and ours.dtype == np.float32
        err = rel_error(ours, ref)
        worst = max(worst, err)
        assert err < REL_TOL, f"len {len(ids)}: rel. error {err:.2e}"
        backend.reset()
        last = backend.prefill(ids)
        assert last.shape == (arch["vocab"],)
        assert rel_error(last, ref[-1]) < REL_TOL
    print(f"\nprefill vs float64 oracle: max rel. error {worst:.2e} (bound {REL_TOL:.0e})")


@pytest.mark.parametrize("split_at", [1, 10, 22])
def test_decode_one_and_chunked_prefill_match_oracle(base, split_at):
    """prefill(ids[:n]) then decode_one for the rest: the KV cache carries every position."""
    model, arch, oracle = base
    ids = sequences(arch["vocab"], arch["context_length"])[3]
    ref = oracle.logits(ids)
    backend = CpuBackend(model)
    ours = engine_all_logits(backend, ids, split_at)
    err = rel_error(ours, ref)
    print(f"\nprefill {split_at} + decode_one: max rel. error {err:.2e}")
    assert err < REL_TOL
    # two prefills in a row append to the same cache
    backend.reset()
    ours2 = np.concatenate([backend.prefill(ids[:7], all_logits=True), backend.prefill(ids[7:], all_logits=True)])
    assert rel_error(ours2, ref) < REL_TOL
    # rebuild forgets everything and replays
    backend.prefill([1, 2, 3])
    assert rel_error(backend.rebuild(ids[:12]), ref[11]) < REL_TOL
    assert rel_error(backend.decode_one(ids[12]), ref[12]) < REL_TOL
    assert backend.position == 13


def test_oracle_has_teeth(base):
    """The bound is far below what a wrong convention, rotary_dim, base or GQA mapping gives."""
    model, arch, oracle = base
    ids = sequences(arch["vocab"], arch["context_length"])[3]
    ours = CpuBackend(model).prefill(ids, all_logits=True)
    wrong = {
        "rotate-half": oracle.logits(ids, convention="rotate-half"),
        "full rotary (12 dims)": oracle.logits(ids, rotary_dim=arch["head_dim"]),
        "base 1e4 -> 1e5": Oracle.logits(_with_base(oracle, 1e5), ids),
        "GQA h % K": oracle.logits(ids, group_map=lambda h: h % arch["n_kv_heads"]),
    }
    for label, ref in wrong.items():
        err = rel_error(ours, ref)
        print(f"\nengine vs oracle with {label}: rel. difference {err:.2e}")
        assert err > BUG_FLOOR, label


def test_rotate_half_variant(base, fixture_slm_path, tmp_path):
    data = fixture_slm_path.read_bytes()
    model, arch = variant(data, tmp_path / "rotate_half.slm", convention="rotate-half")
    assert model.architecture.rope.convention == "rotate-half"
    oracle = Oracle(model, arch)
    backend = CpuBackend(model)
    worst = 0.0
    for ids in sequences(arch["vocab"], arch["context_length"])[:4]:
        ref = oracle.logits(ids)
        err = rel_error(engine_all_logits(backend, ids, split_at=max(1, len(ids) // 2)), ref)
        worst = max(worst, err)
        assert err < REL_TOL, f"len {len(ids)}: {err:.2e}"
        if len(ids) > 1:      # (position 0 turns by 0 rad: one token cannot tell the conventions apart)
            assert rel_error(engine_all_logits(backend, ids), base[2].logits(ids)) > BUG_FLOOR
    print(f"\nrotate-half vs oracle: max rel. error {worst:.2e}")


@pytest.mark.parametrize("convention", ["adjacent-pair", "rotate-half"])
def test_position_offset_variant(fixture_slm_path, tmp_path, convention):
    data = fixture_slm_path.read_bytes()
    model, arch = variant(data, tmp_path / "offset.slm", position_offset=37, convention=convention)
    assert model.architecture.rope.position_offset == 37
    oracle = Oracle(model, arch)
    backend = CpuBackend(model)
    ids = sequences(arch["vocab"], arch["context_length"])[3]
    ref, keys, values = oracle.forward(ids)
    err = rel_error(engine_all_logits(backend, ids, split_at=5), ref)
    # A uniform offset cancels in q.k (RoPE depends on position differences only), so the
    # logits cannot show whether it was applied: the cached keys do. White box: _k is
    # [layers, capacity, n_kv_heads, head_dim], rotated keys in the file's row order.
    cached_k, cached_v = backend._k[:, :len(ids)], backend._v[:, :len(ids)]
    k_err, v_err = rel_error(cached_k, keys), rel_error(cached_v, values)
    print(f"\nposition_offset 37, {convention}: logits rel. error {err:.2e}, cached keys {k_err:.2e}")
    assert err < REL_TOL and k_err < REL_TOL and v_err < REL_TOL
    _, keys_at_0, _ = oracle.forward(ids, offset=0)
    assert rel_error(cached_k, keys_at_0) > BUG_FLOOR


def test_token_out_of_range_raises(base):
    model, arch, _ = base
    backend = CpuBackend(model)
    backend.prefill([1, 2, 3])
    for bad in (arch["vocab"], arch["vocab"] + 1000, -1):
        with pytest.raises(CpuBackendError):
            backend.decode_one(bad)
        with pytest.raises(CpuBackendError):
            backend.prefill([4, bad])
    with pytest.raises(CpuBackendError):
        backend.rebuild([arch["vocab"]])
    with pytest.raises(CpuBackendError):
        backend.prefill([])
    assert issubclass(CpuBackendError, ValueError)
    # a rejected request changes nothing: the backend serves on
    backend.rebuild([1, 2, 3])
    before = backend.position
    with pytest.raises(CpuBackendError):
        backend.decode_one(arch["vocab"])
    assert backend.position == before == 3
    ids = [1, 2, 3, 4]
    np.testing.assert_allclose(backend.decode_one(4), CpuBackend(model).prefill(ids), rtol=0, atol=1e-5)


def test_context_overflow_raises(base):
    model, arch, oracle = base
    n = arch["context_length"]
    ids = sequences(arch["vocab"], n)[4]
    backend = CpuBackend(model)
    with pytest.raises(CpuBackendError):
        backend.prefill(ids + [1])                       # one prompt longer than the context
    assert backend.position == 0
    last = backend.prefill(ids[:-1])
    # position n - 1, the last one there is
    assert rel_error(backend.decode_one(ids[-1]), oracle.logits(ids)[-1]) < REL_TOL
    assert backend.position == n
    with pytest.raises(CpuBackendError):
        backend.decode_one(1)                            # position n does not exist
    with pytest.raises(CpuBackendError):
        backend.prefill([1, 2])
    assert backend.position == n
    backend.reset()
    backend.prefill(ids[:10])
    with pytest.raises(CpuBackendError):
        backend.prefill(ids[:n - 9])                     # 10 + 55 > 64
    assert backend.position == 10
    assert last.shape == (arch["vocab"],)
