"""Counter-based random numbers for the sampler: Philox4x32-10, keyed by the 64-bit seed.

A draw is a pure function of (seed, position, stream): there is no generator state to save,
advance, or lose. Replaying a generation after a device loss, restoring a checkpoint, or
re-choosing a token whose first result was dropped as stale all give the same draw. Only
integer arithmetic is used, so CPython and Pyodide agree bit for bit. docs/sampler.md
specifies the layout precisely enough to re-implement it (Rust, JS, WGSL).
"""
from __future__ import annotations

MASK32 = 0xFFFF_FFFF
MASK64 = 0xFFFF_FFFF_FFFF_FFFF

# Philox4x32 constants (Salmon et al., SC'11; Random123): the two round multipliers and the
# Weyl key increments (golden ratio and sqrt(3) - 1, as 32-bit fractions).
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10

# Streams separate independent uses of the same (seed, position). Only token sampling exists
# today; a new use takes a new stream id and never changes the meaning of an old one.
STREAM_SAMPLE = 0

_TWO_POW_MINUS_53 = 2.0 ** -53  # exact: a power of two


def philox4x32_10(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    """Philox4x32 with 10 rounds on a 128-bit counter (four u32) and 64-bit key (two u32).

    Matches Random123's philox4x32_R(10, ctr, key): a round, then (for rounds 2..10) the key is
    bumped by the Weyl constants before the next round."""
    c0, c1, c2, c3 = (w & MASK32 for w in counter)
    k0, k1 = (w & MASK32 for w in key)
    for round_index in range(PHILOX_ROUNDS):
        if round_index:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        p0 = PHILOX_M0 * c0  # full 64-bit products: Python ints are exact
        p1 = PHILOX_M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32)
    return c0, c1, c2, c3


def _check_u64(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MASK64:
        raise ValueError(f"{name} must be an integer in [0, 2**64), not {value!r}")
    return value


def random_words(seed: int, position: int, stream: int = STREAM_SAMPLE) -> tuple[int, int, int, int]:
    """The four u32 words for (seed, position, stream).

    key = (seed & 0xFFFFFFFF, seed >> 32); counter = (position & 0xFFFFFFFF, position >> 32,
    stream, 0)."""
    _check_u64("seed", seed)
    _check_u64("position", position)
    if isinstance(stream, bool) or not isinstance(stream, int) or not 0 <= stream <= MASK32:
        raise ValueError(f"stream must be an integer in [0, 2**32), not {stream!r}")
    return philox4x32_10((position & MASK32, position >> 32, stream, 0), (seed & MASK32, seed >> 32))


def random_u64(seed: int, position: int, stream: int = STREAM_SAMPLE) -> int:
    """x = w0 | (w1 << 32) from the first two output words (w2, w3 are unused)."""
    w0, w1, _, _ = random_words(seed, position, stream)
    return w0 | (w1 << 32)


def uniform(seed: int, position: int, stream: int = STREAM_SAMPLE) -> float:
    """A float64 uniform on [0, 1): (x >> 11) * 2**-53, the top 53 bits of x.

    Exact: an integer below 2**53 converts to float64 without rounding, and scaling by a power
    of two only changes the exponent. Every value is a multiple of 2**-53; 1.0 is impossible."""
    return (random_u64(seed, position, stream) >> 11) * _TWO_POW_MINUS_53
