"""Cross-platform reference vectors for the sampler: reference_run() in CPython and in the
Pyodide worker must return equal dicts (compare them, or just their "digest").

The logits come from a SplitMix64-style integer hash of (case, step, previous token), scaled
to exact float32 values, so they are identical everywhere and each chosen token feeds the
next step's logits, as in a real decode loop: one divergent choice changes everything after
it. The cases cover every step of the decision (docs/sampler.md) and both ways of choosing
(full logits, canonical top-K candidates). The exp and RNG samples localize a mismatch.
"""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from . import rng
from .sampler import Sampler, SamplerSettings, canonical_top_k, exp_array, exp_scalar

FORMAT = "webslm-sampler-vectors/1"
_M64 = 0xFFFF_FFFF_FFFF_FFFF


def _mix64(x: int) -> int:
    """The SplitMix64 finalizer (Steele, Lea, Flood 2014): a bijective integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def case_logits(case: int, step: int, previous: int, vocab: int, levels_bits: int = 24,
                neg_inf_every: int = 0) -> np.ndarray:
    """float32 logits in [-16, 16): a levels_bits-bit integer per token times a power of two
    (exact). Few bits give many ties; neg_inf_every > 0 masks every n-th token to -inf."""
    out = np.empty(vocab, dtype=np.float32)
    base = (case << 48) ^ (step << 24) ^ previous
    for i in range(vocab):
        level = _mix64(base * 0x1_0000_0001 + i) >> (64 - levels_bits)
        out[i] = (level - (1 << (levels_bits - 1))) * 2.0 ** (4 - levels_bits + 1)
    if neg_inf_every:
        out[::neg_inf_every] = -np.inf
    return out


# (name, settings, vocab, steps, logits options, candidate K or 0)
CASES = [
    ("greedy", SamplerSettings(temperature=0.0, seed=1), 97, 12, {}, 8),
    ("greedy-ties-penalized", SamplerSettings(temperature=0.0, repetition_penalty=1.5,
                                              penalty_window=4, seed=2), 64, 16, {"levels_bits": 3}, 8),
    ("plain", SamplerSettings(temperature=1.0, seed=3), 257, 16, {}, 0),
    ("hot", SamplerSettings(temperature=4.0, seed=4), 128, 12, {}, 0),
    ("cold", SamplerSettings(temperature=0.05, seed=5), 128, 12, {}, 0),
    ("top-k", SamplerSettings(temperature=0.9, top_k=5, seed=6), 300, 16, {}, 16),
    ("top-k-ties", SamplerSettings(temperature=1.0, top_k=4, seed=7), 64, 16, {"levels_bits": 2}, 8),
    ("top-p", SamplerSettings(temperature=0.7, top_p=0.8, seed=8), 200, 16, {}, 0),
    ("min-p", SamplerSettings(temperature=1.2, min_p=0.2, seed=9), 200, 16, {}, 0),
    ("everything", SamplerSettings(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05,
                                   repetition_penalty=1.3, frequency_penalty=0.2,
                                   presence_penalty=0.1, penalty_window=8,
                                   seed=0xFFFF_FFFF_FFFF_FFFF), 512, 20, {}, 40),
    ("raising-penalties", SamplerSettings(temperature=1.0, repetition_penalty=0.8,
                                          frequency_penalty=-0.5, penalty_window=0, seed=11),
     96, 16, {}, 0),
    ("masked", SamplerSettings(temperature=1.0, top_p=0.95, seed=12), 100, 12,
     {"neg_inf_every": 3}, 0),
    # The OpenAI/WebLLM request fields: logit_bias (a raise, a ban, a -inf ban, a nudge) and the
    # additive penalties over the whole history; then lowering biases only, where the canonical
    # candidates still decide, and greedy with a bias that can overturn the argmax.
    ("logit-bias", SamplerSettings(temperature=0.9, top_k=8, seed=13,
                                   logit_bias={3: 14.0, 10: -100.0, 17: -math.inf, 40: 0.5}), 64, 16, {}, 16),
    ("logit-bias-lowering", SamplerSettings(temperature=0.8, top_k=4, presence_penalty=0.4, seed=14,
                                            logit_bias={0: -3.0, 1: -math.inf, 5: -0.25}),
     80, 16, {"levels_bits": 3}, 16),
    ("greedy-biased", SamplerSettings(temperature=0.0, logit_bias={7: 2.5, 8: -2.5}, seed=15), 48, 12, {}, 8),
    ("openai-penalties", SamplerSettings(temperature=0.7, top_k=12, frequency_penalty=0.6,
                                         presence_penalty=0.3, penalty_window=0, seed=16), 128, 20, {}, 32),
]

EXP_SAMPLES = [-746.0, -745.2, -745.13, -708.5, -100.25, -20.0, -1.0, -0.34657359027997264,
               -1e-9, 0.0, 1e-300, 0.5, 1.0, 2.302585092994046, 88.7, 700.0, 709.78, 709.79]


def _run_case(name, settings, vocab, steps, options, k) -> dict:
    sampler = Sampler(settings, vocab, position=7, history=[0, 1, 1])  # a short "prompt"
    tokens, hashes, via_candidates = [], [], 0
    previous = 0
    for step in range(steps):
        logits = case_logits(len(name), step, previous, vocab, **options)
        position = sampler.position
        token = sampler.choose(logits, position)
        if k and not sampler.needs_full_logits(k):
            ids = canonical_top_k(logits, k)
            if sampler.choose_from_candidates(ids, logits[ids], position) != token:
                raise AssertionError(f"{name}: candidates disagree at step {step}")
            via_candidates += 1
        hashes.append(sampler.state_hash_after(token))
        sampler.commit(token)
        tokens.append(token)
        previous = token
    return {"name": name, "tokens": tokens, "via_candidates": via_candidates,
            "state_hash": sampler.state_hash(),
            "hash_chain": hashlib.sha256("".join(hashes).encode()).hexdigest()}


def reference_run() -> dict:
    """Run every case; the result is plain JSON-able data plus a digest over all of it."""
    vector = [v.hex() for v in exp_array(np.array(EXP_SAMPLES)).tolist()]
    result = {
        "format": FORMAT,
        "cases": [_run_case(*case) for case in CASES],
        "exp": vector,
        "exp_scalar_equal": [exp_scalar(x).hex() for x in EXP_SAMPLES] == vector,
        "uniform": [rng.uniform(seed, position).hex()
                    for seed, position in ((0, 0), (42, 1), (_M64, 2**40 + 3))],
    }
    canonical = json.dumps(result, sort_keys=True, separators=(",", ":"))
    result["digest"] = hashlib.sha256(canonical.encode()).hexdigest()
    return result


if __name__ == "__main__":
    print(json.dumps(reference_run(), indent=1))
