"""The canonical sampler: which token is chosen, identically in CPython and in Pyodide.

Everything that decides a choice uses only integer arithmetic, IEEE-754 basic operations on
float64 (+ - * /, comparisons; numpy's elementwise versions are exactly rounded too), floor,
and order-fixed sequential sums (np.cumsum). Never libm (math.exp, np.exp differ between
glibc and musl/wasm and between numpy's SIMD paths) and never numpy reductions (np.sum's
blocking depends on the build). docs/sampler.md is the specification; this file follows it
step for step, and the section numbers below refer to it. The settings (section 1) are
sampler_settings.py's, the stop sequences (section 9) stop_sequences.py's; both stay importable
from here.

The engine's loop, per position:

    if sampler.needs_full_logits(K): token = sampler.choose(full_logits, pos)
    else:                            token = sampler.choose_from_candidates(ids, vals, pos)
    record = ledger.offer(epoch, pos, token, sampler.state_hash_after(token), text_delta)
    if record is not None: sampler.commit(token)

The sampler never commits by itself: a choice whose result is dropped (stale epoch, cancel)
must leave no trace, and re-choosing the same position gives the same token.
"""
from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from . import rng
from .sampler_settings import MAX_U32, MAX_U64, RESPONSE_FORMATS, SamplerError, SamplerSettings, _integer
# The settings' other names and the stop sequences, importable from here as before the split:
from .sampler_settings import CODES, MAX_BIAS, MAX_BIASED_TOKENS, MAX_TOP_LOGPROBS  # noqa: F401
from .stop_sequences import StopMatcher, StopStep  # noqa: F401

# == 2. Deterministic exp =====================================================================
# fdlibm's e_exp.c algorithm (Sun, 1993) without its branches: x = k*ln2 + r with ln2 split
# in two so that k*LN2_HI is exact, a degree-5 Remez rational approximation for exp(r) on
# |r| <= ln2/2, then y * 2**k. Only + - * / and floor, so every IEEE-754 platform gives the
# same bits; measured error against glibc's correctly rounded exp is at most 1 ulp.

LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # low 21 bits zero: k*LN2_HI exact for |k| < 2**11
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
INV_LN2 = float.fromhex("0x1.71547652b82fep+0")
P1 = float.fromhex("0x1.555555555553ep-3")
P2 = float.fromhex("-0x1.6c16c16bebd93p-9")
P3 = float.fromhex("0x1.1566aaf25de2cp-14")
P4 = float.fromhex("-0x1.bbd41c5d26bf1p-20")
P5 = float.fromhex("0x1.6376972bea4d0p-25")
# Clamping bounds: exp(710) overflows and exp(-746) underflows to 0 through the arithmetic
# itself; clamping keeps k small enough that both 2**a factors below are normal numbers.
EXP_X_MAX = 710.0
EXP_X_MIN = -746.0


def exp_scalar(x: float) -> float:
    """Deterministic exp of one float64 (bit-identical to exp_array on the same value)."""
    x = float(x)
    if x != x:
        return x
    x = min(max(x, EXP_X_MIN), EXP_X_MAX)
    k = math.floor(x * INV_LN2 + 0.5)
    hi = x - k * LN2_HI
    lo = k * LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * (P1 + t * (P2 + t * (P3 + t * (P4 + t * P5))))
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    # 2**k as two exact powers of two: y * 2**a stays normal, so only the last multiply rounds
    # (once, correctly, also into the subnormal range) or overflows to inf.
    a = k // 2
    return (y * math.ldexp(1.0, a)) * math.ldexp(1.0, k - a)


def _pow2_array(n: np.ndarray) -> np.ndarray:
    """2.0**n for int64 n in the normal range, built from the exponent bits (exact, no libm)."""
    return ((n + 1023) << 52).view(np.float64)


def exp_array(x) -> np.ndarray:
    """Deterministic elementwise exp of a float64 array: the formula of exp_scalar, op for op."""
    x = np.asarray(x, dtype=np.float64)
    nan = np.isnan(x)
    xc = np.clip(np.where(nan, 0.0, x), EXP_X_MIN, EXP_X_MAX)
    k = np.floor(xc * INV_LN2 + 0.5)
    hi = xc - k * LN2_HI
    lo = k * LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * (P1 + t * (P2 + t * (P3 + t * (P4 + t * P5))))
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    ki = k.astype(np.int64)
    a = ki // 2  # numpy's // floors, like Python's
    with np.errstate(over="ignore"):  # overflow to inf is the correct result above ~709.78
        out = (y * _pow2_array(a)) * _pow2_array(ki - a)
    return np.where(nan, x, out)


# == 3-6. The decision ========================================================================

def _as_logits(name: str, values, length: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype not in (np.float32, np.float64) or arr.shape != (length,):
        raise SamplerError("bad-logits", name,
                           f"must be a float32/float64 array of shape ({length},), "
                           f"not {arr.dtype} {arr.shape}")
    arr = arr.astype(np.float64)  # exact: every float32 is a float64; always a private copy
    if np.isnan(arr).any() or (arr == np.inf).any():
        raise SamplerError("bad-logits", name, "contains NaN or +inf")
    return arr


def _penalize(ids: np.ndarray, logits: np.ndarray, seen: np.ndarray, counts: np.ndarray,
              s: SamplerSettings) -> None:
    """Section 3, in place: for each id seen c >= 1 times in the window, the repetition penalty
    (divide a positive logit, multiply a negative one), then subtract c*frequency + presence."""
    if not s.penalties_active or seen.size == 0:
        return
    slot = np.searchsorted(seen, ids)
    hit = slot < seen.size
    hit[hit] = seen[slot[hit]] == ids[hit]
    where = np.flatnonzero(hit)
    if where.size == 0:
        return
    values = logits[where]
    with np.errstate(over="ignore", invalid="ignore"):  # checked below, with a typed error
        if s.repetition_penalty != 1.0:
            values = np.where(values > 0.0, values / s.repetition_penalty,
                              values * s.repetition_penalty)
        if s.frequency_penalty != 0.0 or s.presence_penalty != 0.0:
            c = counts[slot[where]].astype(np.float64)
            values = values - (c * s.frequency_penalty + s.presence_penalty)
    logits[where] = values
    if np.isnan(values).any() or (values == np.inf).any():
        raise SamplerError("bad-logits", "penalties", "a penalty produced NaN or +inf")


def _add_bias(ids: np.ndarray, logits: np.ndarray, s: SamplerSettings) -> None:
    """Section 3, first, in place: logits[t] += logit_bias[t] for the biased tokens among ids
    (ascending). -inf bans a token; a bias on a -inf logit leaves it -inf."""
    if not s.logit_bias:
        return
    biased = np.array([t for t, _ in s.logit_bias], dtype=np.int64)
    slot = np.searchsorted(ids, biased)
    hit = slot < ids.size
    hit[hit] = ids[slot[hit]] == biased[hit]
    bias = np.array([b for _, b in s.logit_bias], dtype=np.float64)
    logits[slot[hit]] = logits[slot[hit]] + bias[hit]


def _process(ids: np.ndarray, logits: np.ndarray, seen: np.ndarray, counts: np.ndarray,
             s: SamplerSettings) -> None:
    """Section 3, in place: the logit bias, then the penalties."""
    _add_bias(ids, logits, s)
    _penalize(ids, logits, seen, counts, s)


def _decide(ids: np.ndarray, logits: np.ndarray, seen: np.ndarray, counts: np.ndarray,
            s: SamplerSettings, position: int) -> int:
    """The whole decision on a token set given in ascending id order (the full vocabulary, or
    candidates). Position i of the arrays is token ids[i]; logits is a private float64 copy."""
    _process(ids, logits, seen, counts, s)

    if s.greedy:  # section 4: argmax, lowest id on ties (np.argmax returns the first maximum)
        best = int(np.argmax(logits))
        if logits[best] == -np.inf:
            raise SamplerError("no-token", "logits", "every logit is -inf")
        return int(ids[best])

    # Section 5: the rank order, by penalized logit descending then id ascending, over the
    # finite logits, cut to the top k. Ranking before temperature scaling means rounding in
    # (l - max) / T can never reorder or tie two tokens; mathematically the order is the same.
    finite = np.flatnonzero(logits > -np.inf)
    n = finite.size
    if n == 0:
        raise SamplerError("no-token", "logits", "every logit is -inf")
    values = logits[finite] + 0.0  # -0.0 -> 0.0, so no sort can tell the two zeros apart
    if 0 < s.top_k < n:
        kth = np.partition(values, n - s.top_k)[n - s.top_k]  # the k-th largest value
        above = np.flatnonzero(values > kth)
        tied = np.flatnonzero(values == kth)[: s.top_k - above.size]  # lowest ids win the tie
        keep = np.sort(np.concatenate([above, tied]))
    else:
        keep = np.arange(n)
    rank = keep[np.argsort(-values[keep], kind="stable")]  # stable: ties stay in id order
    ranked = values[rank]
    tokens = ids[finite[rank]]

    # Section 6: weights w = exp((l - l_max) / T); w[0] = exp(0) = 1 exactly, so sums are >= 1.
    w = exp_array((ranked - ranked[0]) / s.temperature)
    if s.top_p < 1.0:  # the shortest rank prefix whose cumulative probability reaches top_p
        q = np.cumsum(w)
        q = q / q[-1]
        cut = int(np.searchsorted(q, s.top_p, side="left"))  # first q >= top_p; q[-1] = 1
        w, tokens = w[: cut + 1], tokens[: cut + 1]
    if s.min_p > 0.0:  # p >= min_p * p_max  <=>  w >= min_p * w[0] = min_p
        kept = w >= s.min_p
        w, tokens = w[kept], tokens[kept]
    cdf = np.cumsum(w)
    cdf = cdf / cdf[-1]  # renormalized; non-decreasing, and cdf[-1] == 1.0 exactly
    u = rng.uniform(s.seed, position, rng.STREAM_SAMPLE)
    return int(tokens[int(np.searchsorted(cdf, u, side="right"))])  # first cdf > u (u < 1)


def canonical_top_k(logits, k: int) -> np.ndarray:
    """The candidate-set contract (section 7): the first k ids in the order (logit descending,
    id ascending), in that order. A GPU top-K reduction must return exactly this set."""
    arr = np.asarray(logits, dtype=np.float64) + 0.0
    return np.argsort(-arr, kind="stable")[:k]


# == 8. Checkpoint and state hash =============================================================

STATE_MAGIC = b"WSLMSMP1"
# The second format: the first's head, then logit_bias and logprobs. Used only when one of them
# is on, so that every hash of the first format (settings without them) stays what it was.
STATE_MAGIC_EXTENDED = b"WSLMSMP2"


def _settings_bytes(s: SamplerSettings, vocab_size: int) -> bytes:
    """The self-delimiting head of the state serialization (big-endian; docs/sampler.md 8)."""
    out = [STATE_MAGIC_EXTENDED if s.extended else STATE_MAGIC,
           struct.pack(">dIddddd", s.temperature, s.top_k, s.top_p, s.min_p,
                       s.repetition_penalty, s.frequency_penalty, s.presence_penalty),
           struct.pack(">IIQI", s.penalty_window, s.max_tokens, s.seed, len(s.stop))]
    for stop in s.stop:
        raw = stop.encode("utf-8")
        out.append(struct.pack(">I", len(raw)) + raw)
    if s.extended:
        out.append(struct.pack(">I", len(s.logit_bias)))
        out.extend(struct.pack(">Id", token, bias) for token, bias in s.logit_bias)
        out.append(struct.pack(">BIB", s.logprobs, s.top_logprobs, RESPONSE_FORMATS.index(s.response_format)))
        if s.response_format == "json_schema":         # the schema's text, by its sha256
            out.append(hashlib.sha256(s.json_schema.encode("utf-8")).digest())
        if s.response_format == "grammar":             # the grammar's text, by its sha256
            out.append(hashlib.sha256(s.grammar.encode("utf-8")).digest())
    out.append(struct.pack(">I", vocab_size))
    return b"".join(out)


@dataclass(frozen=True)
class SamplerCheckpoint:
    """Everything that determines the sampler's future choices, given future logits."""
    settings: SamplerSettings
    vocab_size: int
    history: tuple[int, ...]
    position: int


class Sampler:
    """Chooses tokens for one generation. history is what the penalties see (the engine may
    seed it with the prompt, as llama.cpp and Hugging Face do, or leave it empty); position is
    the absolute position of the next token, the RNG counter (default: len(history), i.e. the
    history is the whole sequence so far)."""

    def __init__(self, settings: SamplerSettings, vocab_size: int, *, position: int | None = None,
                 history: Iterable[int] = ()):
        if not isinstance(settings, SamplerSettings):
            raise SamplerError("bad-type", "settings", "must be a SamplerSettings")
        self._settings = settings
        self._vocab_size = _integer("vocab_size", vocab_size, low=1, high=MAX_U32)
        for token, _ in settings.logit_bias:
            if token >= self._vocab_size:
                raise SamplerError("bad-token", "logit_bias", f"{token} is not in [0, {self._vocab_size})")
        self._history: list[int] = []
        # The hash streams: head, then one u32 per history token; state_hash() appends the
        # tail to a copy, so recording the hash after every token costs O(1).
        self._hasher = hashlib.sha256(_settings_bytes(settings, self._vocab_size))
        for token in history:
            self._append(token)
        if position is None:
            position = len(self._history)
        self._position = _integer("position", position, low=0, high=MAX_U64)

    # -- state ---------------------------------------------------------------------------------

    @property
    def settings(self) -> SamplerSettings:
        return self._settings

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def position(self) -> int:
        return self._position

    @property
    def history(self) -> tuple[int, ...]:
        return tuple(self._history)

    def _token(self, token, where: str) -> int:
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
            raise SamplerError("bad-type", where, f"a token id must be an integer, not {token!r}")
        token = int(token)
        if not 0 <= token < self._vocab_size:
            raise SamplerError("bad-token", where, f"{token} is not in [0, {self._vocab_size})")
        return token

    def _append(self, token) -> None:
        token = self._token(token, "history")
        self._history.append(token)
        self._hasher.update(struct.pack(">I", token))

    def commit(self, token: int) -> None:
        """The engine committed token at self.position (the ledger accepted it)."""
        if self._position == MAX_U64:
            raise SamplerError("out-of-range", "position", "the position counter is exhausted")
        self._append(token)
        self._position += 1

    def _tail(self, n_history: int, position: int) -> bytes:
        return struct.pack(">QQ", n_history, position)

    def state_hash(self) -> str:
        """sha256 (hex) of the canonical serialization of checkpoint() (docs/sampler.md 8)."""
        h = self._hasher.copy()
        h.update(self._tail(len(self._history), self._position))
        return h.hexdigest()

    def state_hash_after(self, token: int) -> str:
        """state_hash() as it will be after commit(token), without committing."""
        token = self._token(token, "token")
        h = self._hasher.copy()
        h.update(struct.pack(">I", token) + self._tail(len(self._history) + 1, self._position + 1))
        return h.hexdigest()

    def checkpoint(self) -> SamplerCheckpoint:
        return SamplerCheckpoint(self._settings, self._vocab_size, tuple(self._history), self._position)

    @classmethod
    def restore(cls, checkpoint: SamplerCheckpoint) -> "Sampler":
        if not isinstance(checkpoint, SamplerCheckpoint):
            raise SamplerError("bad-type", "checkpoint", "must be a SamplerCheckpoint")
        return cls(checkpoint.settings, checkpoint.vocab_size, position=checkpoint.position,
                   history=checkpoint.history)

    def _window(self) -> tuple[np.ndarray, np.ndarray]:
        """Distinct ids in the penalty window (ascending) and how often each occurs."""
        n = self._settings.penalty_window
        window = self._history[-n:] if n else self._history
        if not self._settings.penalties_active or not window:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.unique(np.asarray(window, dtype=np.int64), return_counts=True)

    def _check_position(self, position) -> int:
        position = _integer("position", position, low=0, high=MAX_U64)
        if position != self._position:
            raise SamplerError("position-mismatch", "position",
                               f"asked for {position}, the next position is {self._position}")
        return position

    # -- choosing ------------------------------------------------------------------------------

    def choose(self, logits, position: int, allowed=None) -> int:
        """The token for position from the full logits [vocab_size] (float32 or float64).
        allowed (bool [vocab_size], or None for all): a mask of the tokens that may be
        chosen (JSON mode's); the others count as -inf."""
        position = self._check_position(position)
        full = self._masked(_as_logits("logits", logits, self._vocab_size), allowed)
        seen, counts = self._window()
        return _decide(np.arange(self._vocab_size, dtype=np.int64), full, seen, counts,
                       self._settings, position)

    def _masked(self, full: np.ndarray, allowed) -> np.ndarray:
        if allowed is None:
            if self._settings.response_format != "text":
                raise SamplerError("bad-type", "allowed", f"{self._settings.response_format} needs the token mask")
            return full
        allowed = np.asarray(allowed)
        if allowed.dtype != np.bool_ or allowed.shape != (self._vocab_size,):
            raise SamplerError("bad-type", "allowed", f"must be a bool array of shape ({self._vocab_size},)")
        full[~allowed] = -np.inf
        return full

    def _need(self) -> int | None:
        """How many tokens must provably outrank every non-candidate; None = no finite bound."""
        if self._settings.greedy:
            return 1
        return self._settings.top_k or None

    def needs_full_logits(self, k: int) -> bool:
        """Whether a canonical top-k candidate set (canonical_top_k) may be insufficient at the
        next position, so that the engine must fetch the full logits (docs/sampler.md 7)."""
        k = _integer("k", k, low=0, high=MAX_U32)
        if k >= self._vocab_size:
            return False
        need = self._need()
        if need is None or self._settings.logprobs or self._settings.response_format != "text":
            return True               # logprobs: the softmax over every token; a mask: any token
        seen, _ = self._window()
        if (seen.size and self._settings.penalties_can_raise) or self._settings.bias_can_raise:
            return True
        return k - self._touched(seen).size < need

    def _touched(self, seen: np.ndarray) -> np.ndarray:
        """The tokens whose logit section 3 may change: the penalized and the biased."""
        if not self._settings.logit_bias:
            return seen
        return np.union1d(seen, np.array([t for t, _ in self._settings.logit_bias], dtype=np.int64))

    def choose_from_candidates(self, ids, logits, position: int) -> int:
        """The token for position from a canonical top-K candidate set: ids (K distinct token
        ids) and their logits, exactly as in the full logits. Equal to choose() on the full
        logits; raises candidates-insufficient where that cannot be proven."""
        position = self._check_position(position)
        ids = np.asarray(ids)
        if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
            raise SamplerError("bad-candidates", "ids", "must be a 1-D integer array")
        ids = ids.astype(np.int64)
        if ids.size == 0 or ids.min() < 0 or ids.max() >= self._vocab_size:
            raise SamplerError("bad-candidates", "ids", f"must be non-empty ids in [0, {self._vocab_size})")
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        if (ids[1:] == ids[:-1]).any():
            raise SamplerError("bad-candidates", "ids", "contains a duplicate id")
        values = _as_logits("candidate logits", logits, ids.size)[order]
        seen, counts = self._window()
        if ids.size < self._vocab_size:
            self._check_sufficient(ids, seen)
        return _decide(ids, values, seen, counts, self._settings, position)

    def _check_sufficient(self, ids: np.ndarray, seen: np.ndarray) -> None:
        if self._settings.response_format != "text":
            raise SamplerError("candidates-insufficient", "response_format",
                               "a token mask may leave none of the candidates")
        need = self._need()
        if need is None:
            raise SamplerError("candidates-insufficient", "settings",
                               "sampling without top_k needs the full distribution")
        s = self._settings
        touched = np.isin(ids, self._touched(seen))
        if s.penalties_can_raise and not np.isin(seen, ids).all():
            raise SamplerError("candidates-insufficient", "penalties",
                               "a penalty may raise a token outside the candidates")
        raised = np.array([t for t, bias in s.logit_bias if bias > 0.0], dtype=np.int64)
        if not np.isin(raised, ids).all():
            raise SamplerError("candidates-insufficient", "logit_bias",
                               "a positive bias may raise a token outside the candidates")
        if int(ids.size - touched.sum()) < need:
            raise SamplerError("candidates-insufficient", "candidates",
                               f"fewer than {need} unpenalized, unbiased candidates")

    # -- reporting -----------------------------------------------------------------------------

    def logprobs(self, logits, token: int, top: int = 0, allowed=None) -> tuple[float, list[tuple[int, float]]]:
        """The log-probability of `token` at the next position, and the `top` most likely
        tokens with theirs (log-probability descending, then id ascending; banned tokens
        left out): the log-softmax of the full logits after the bias and the penalties, at
        the request's temperature (1 when greedy), before top-k, top-p and min-p cut it
        (with JSON mode's mask `allowed`, over the allowed tokens).
        Reported, never decisive: the normalizer's log is libm's, so the last bit may
        differ between platforms (the choice does not depend on it). Call it before
        commit(token): it sees the history the choice saw."""
        full = self._masked(_as_logits("logits", logits, self._vocab_size), allowed)
        token = self._token(token, "token")
        seen, counts = self._window()
        _process(np.arange(self._vocab_size, dtype=np.int64), full, seen, counts, self._settings)
        finite = full > -np.inf
        if not finite.any():
            raise SamplerError("no-token", "logits", "every logit is -inf")
        temperature = self._settings.temperature or 1.0
        z = (full - full[finite].max()) / temperature       # max: exact in any order
        normalizer = math.log(float(np.cumsum(exp_array(z))[-1]))   # exp(-inf) = 0
        logprobs = z - normalizer
        ranked = [int(i) for i in np.argsort(-logprobs, kind="stable")[:top] if finite[i]]
        return float(logprobs[token]), [(i, float(logprobs[i])) for i in ranked]
